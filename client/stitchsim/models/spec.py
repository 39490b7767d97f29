"""The spec: what a job compares and how (every default lives here)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    Field,
    PositiveFloat,
    field_validator,
)

from stitchsim import catalogue
from stitchsim.models.settings import (
    AdversarialSettings,
    ControlSettings,
    FulaSettings,
    IRISettings,
    MeasureSettings,
    StrictModel,
    TrainSettings,
    Unique,
)
from stitchsim.models.vocabulary import (
    Budget,
    Control,
    Direction,
    Directions,
    Measure,
    Objective,
    OutputKind,
    Preprocessing,
    Protocol,
)


class LocalPath(StrictModel):
    """A file on the machine that runs the job (only for `stitchsim-server run`)."""

    path: str


MAX_PROBES = 8
"""Probe sets a job may name: each adds a pass of both models and of every stitch."""


def probe_name(ref: str | LocalPath) -> str:
    """The name a probe's rows and figures carry: a built-in's own name, an upload's id cut to
    12 hex digits (enough to tell a key's datasets apart, short enough for a figure name), a
    local file's name."""
    if isinstance(ref, LocalPath):
        return ref.path.replace("\\", "/").rsplit("/", 1)[-1]
    if ref.startswith("sha256:"):
        return ref[: len("sha256:") + 12]
    return ref


class ModelRef(StrictModel):
    checkpoint: str | LocalPath = Field(
        description='"sha256:<hex>" of an uploaded checkpoint, or {"path": ...} for local runs'
    )
    arch: str | None = Field(
        default=None, json_schema_extra={"pattern": catalogue.ARCH_PATTERN},
        description="a timm name, or SOURCE:NAME of another model source ("
        + ", ".join(catalogue.MODEL_SOURCES.names) + "); else the checkpoint's metadata or "
        "config.json"
    )
    arch_kwargs: dict[str, Any] | None = Field(
        default=None, description="create_model kwargs; else the checkpoint's metadata"
    )
    input_size: int | None = Field(
        default=None, ge=8, le=1024, description="square side the images are resized to"
    )
    preprocess: Preprocessing = Field(
        default="auto",
        description="auto: metadata, else the model's own config, else measured (accuracy, "
        "else normalisation statistics; undetermined when neither decides); timm | none | "
        "inception force one; explicit mean/std win over all of these",
    )
    mean: tuple[float, float, float] | None = None
    std: tuple[PositiveFloat, PositiveFloat, PositiveFloat] | None = None
    output: OutputKind | None = Field(
        default=None,
        description="what the model outputs: " + catalogue.OUTPUT_KINDS.describe() + ". "
        "Else the checkpoint's metadata 'output', else detected: an image-shaped output is an "
        "image, a vector from a model with classes (num_classes > 0) logits, else an embedding",
    )

    @field_validator("arch")
    @classmethod
    def _registry_name(cls, v: str | None) -> str | None:
        # hf-hub:/local-dir: names make timm download or read arbitrary paths.
        if v is not None and not catalogue.arch_name_ok(v):
            prefixes = ", ".join(f"{e.prefix}:" for e in catalogue.MODEL_SOURCES)
            raise ValueError(f"arch must be a plain timm model name or SOURCE:NAME with a "
                             f"source prefix of {prefixes} got {v!r}")
        return v


class LayerPair(StrictModel):
    front: str = Field(min_length=1, max_length=200)
    back: str = Field(min_length=1, max_length=200)


T = TypeVar("T")


def thin_points(points: list[T], at_most: int) -> list[T]:
    """At most `at_most` of the points: the first, the last and evenly spaced ones between
    (a budget's points: the shallowest and the deepest keep the depth range)."""
    if len(points) <= at_most:
        return list(points)
    if at_most == 1:
        return [points[-1]]
    step = (len(points) - 1) / (at_most - 1)
    return [points[round(i * step)] for i in range(at_most)]


class Spec(StrictModel):
    front: ModelRef
    back: ModelRef
    dataset: str | LocalPath = Field(
        default="digits", description="built-in name, uploaded dataset id, or {path} in run"
    )
    front_dataset: str | LocalPath | None = Field(
        default=None,
        description="cross_task protocol: the front model's own dataset (the back model's is "
        "`dataset`); both need the same number of classes, paired by `class_pairing`",
    )
    probes: list[str | LocalPath] = Field(
        default=[], max_length=MAX_PROBES,
        description="probe sets beside the clean dataset (built-in name, uploaded dataset id, "
        "or {path} in run): every stitch, trained as without them, is also evaluated on each "
        "probe's test split, which must have the dataset's image shape; each probe gets its "
        "own rows in the report (report.probes), named by probe_name",
    )
    class_pairing: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None, max_length=10_000, json_schema_extra={"uniqueItems": True},
        description="cross_task: back-model class of each front-model class (default: by index)",
    )
    layers: Annotated[list[LayerPair], Field(min_length=1, max_length=64)] | Literal["auto"] = (
        "auto")
    objectives: Unique[Objective] = Field(
        default=list(catalogue.OBJECTIVES.where(default=True)), min_length=1,
        description="how each stitch is fitted: " + catalogue.OBJECTIVES.describe(),
    )
    protocols: Unique[Protocol] = Field(
        default=list(catalogue.PROTOCOLS.where(default=True)), min_length=1,
        description="what each stitch is trained on: " + catalogue.PROTOCOLS.describe(),
    )
    directions: Directions = "both"
    train: TrainSettings = TrainSettings()
    iri: IRISettings = IRISettings()
    controls: Unique[Control] = Field(
        default=[], description="reference runs: " + catalogue.CONTROLS.describe(),
    )
    control_settings: ControlSettings = ControlSettings()
    adversarial: AdversarialSettings = AdversarialSettings()
    measures: Unique[Measure] = Field(
        default=[],
        description="representation similarity measures on the same activations, on real "
        "inputs and on IRIs (opt-in: they need the back model's activations and IRIs): "
        + catalogue.MEASURES.describe(),
    )
    measure_settings: MeasureSettings = MeasureSettings()
    fula: FulaSettings = FulaSettings()
    budget: Budget = Field(
        default="full", description="a named preset of samples and stitch points: "
        + catalogue.BUDGETS.describe())
    threshold: float | None = Field(default=None, ge=0, le=1)
    device: str = Field(default="auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")

    @field_validator("class_pairing")
    @classmethod
    def _a_permutation(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and sorted(v) != list(range(len(v))):
            raise ValueError("class_pairing must list each back-model class exactly once "
                             "(a permutation of 0..n-1)")
        return v

    @field_validator("probes")
    @classmethod
    def _probe_names_unique(cls, v: list[str | LocalPath]) -> list[str | LocalPath]:
        names = [probe_name(p) for p in v]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"probe {repeated[0]!r} is named more than once; name each "
                             "probe set once")
        return v

    def at(self, resolution: str) -> Spec:
        """The spec with every field left to the input resolution filled from its preset
        (catalogue.RESOLUTIONS): what a job runs with."""
        return self.model_copy(update={"iri": self.iri.at(resolution),
                                       "adversarial": self.adversarial.at(resolution)})

    def direction_list(self) -> list[Direction]:
        if self.directions == "both":
            return ["front_to_back", "back_to_front"]
        return [self.directions]
