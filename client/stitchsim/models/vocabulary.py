"""The vocabulary a spec and a report are written in: the catalogue's names (validated
against the catalogue as it is when a value is read, so an entry a plug-in registers is valid
from then on; the OpenAPI document lists the names), and the few enumerations that are states
rather than choices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from stitchsim import catalogue
from stitchsim.datasets import BUILTIN_DATASETS as BUILTIN_DATASETS


@dataclass(frozen=True)
class OneOf:
    """A str that must be a name of one catalogue kind: checked against the kind's entries at
    validation time, and listed as the schema's enum when a schema is made."""

    kind: catalogue.Kind[Any]

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler
                                     ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return {**handler(schema), "enum": list(self.kind.names)}

    def check(self, value: str) -> str:
        if value not in self.kind:
            # The words and type pydantic gives a Literal, so messages read as they did.
            names = [repr(n) for n in self.kind.names]
            expected = " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1
                                   else names)
            raise PydanticCustomError("literal_error", "Input should be {expected}",
                                      {"expected": expected})
        return value


Objective = Annotated[str, OneOf(catalogue.OBJECTIVES)]
Protocol = Annotated[str, OneOf(catalogue.PROTOCOLS)]
Control = Annotated[str, OneOf(catalogue.CONTROLS)]
Cue = Annotated[str, OneOf(catalogue.CUES)]
Attack = Annotated[str, OneOf(catalogue.ATTACKS)]
Measure = Annotated[str, OneOf(catalogue.MEASURES)]
MeasureInput = Annotated[str, OneOf(catalogue.MEASURE_INPUTS)]
IRIMethod = Annotated[str, OneOf(catalogue.IRI_METHODS)]
OutputKind = Annotated[str, OneOf(catalogue.OUTPUT_KINDS)]
CaveatCode = Annotated[str, OneOf(catalogue.CAVEATS)]
Budget = Annotated[str, OneOf(catalogue.BUDGETS)]
Resolution = Annotated[str, OneOf(catalogue.RESOLUTIONS)]
Direction = Literal["front_to_back", "back_to_front"]
Directions = Literal["front_to_back", "back_to_front", "both"]
JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
Verdict = Literal["similar", "dissimilar"]
Preprocessing = Literal["auto", "timm", "none", "inception"]
"""How pixels in [0,1] reach a model: `timm` normalises with the architecture's pretrained
config (ImageNet mean/std for most), `none` feeds plain [0,1] pixels, `inception` maps them to
[-1,1] (mean = std = 0.5), and `auto` (the default) takes the checkpoint's metadata, else
measures the candidates on labelled samples and keeps the best-predicting one."""
PreprocessSource = Literal["spec", "metadata", "config", "measured", "default", "undetermined"]

# The one ordering of each enumeration that is not a catalogue kind (those are in theirs).
DIRECTIONS: tuple[Direction, ...] = get_args(Direction)
JOB_STATES: tuple[JobState, ...] = get_args(JobState)
ACTIVE_STATES: tuple[JobState, ...] = ("queued", "running")
TERMINAL_STATES: tuple[JobState, ...] = tuple(s for s in JOB_STATES if s not in ACTIVE_STATES)
