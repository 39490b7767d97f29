"""The vocabulary a spec and a report are written in: the catalogue's names as `Literal`
types (so pydantic validates them and the OpenAPI document lists them), and the few
enumerations that are states rather than choices."""

from __future__ import annotations

from typing import Literal, get_args

from stitchsim import catalogue
from stitchsim.datasets import BUILTIN_DATASETS as BUILTIN_DATASETS

# Built from the catalogue (one entry a name): a name added there is valid here.
Objective = Literal[catalogue.OBJECTIVES.names]  # type: ignore[valid-type]
Protocol = Literal[catalogue.PROTOCOLS.names]  # type: ignore[valid-type]
Control = Literal[catalogue.CONTROLS.names]  # type: ignore[valid-type]
Cue = Literal[catalogue.CUES.names]  # type: ignore[valid-type]
Measure = Literal[catalogue.MEASURES.names]  # type: ignore[valid-type]
MeasureInput = Literal[catalogue.MEASURE_INPUTS.names]  # type: ignore[valid-type]
Direction = Literal["front_to_back", "back_to_front"]
Directions = Literal["front_to_back", "back_to_front", "both"]
JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
Verdict = Literal["similar", "dissimilar"]
Preprocessing = Literal["auto", "timm", "none", "inception"]
"""How pixels in [0,1] reach a model: `timm` normalises with the architecture's pretrained
config (ImageNet mean/std for most), `none` feeds plain [0,1] pixels, `inception` maps them to
[-1,1] (mean = std = 0.5), and `auto` (the default) takes the checkpoint's metadata, else
measures the candidates on labelled samples and keeps the best-predicting one."""
PreprocessSource = Literal["spec", "metadata", "measured", "default"]

# The one ordering of each enumeration (reports, tables and plots list them in this order).
OBJECTIVES: tuple[Objective, ...] = get_args(Objective)
PROTOCOLS: tuple[Protocol, ...] = get_args(Protocol)
DIRECTIONS: tuple[Direction, ...] = get_args(Direction)
CONTROLS: tuple[Control, ...] = get_args(Control)
CUES: tuple[Cue, ...] = get_args(Cue)
MEASURES: tuple[Measure, ...] = get_args(Measure)
MEASURE_INPUTS: tuple[MeasureInput, ...] = get_args(MeasureInput)
JOB_STATES: tuple[JobState, ...] = get_args(JobState)
ACTIVE_STATES: tuple[JobState, ...] = ("queued", "running")
TERMINAL_STATES: tuple[JobState, ...] = tuple(s for s in JOB_STATES if s not in ACTIVE_STATES)
