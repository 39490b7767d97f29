"""The report: tidy rows of figures, the summary and the verdict."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from stitchsim.models.spec import (
    Spec,
)
from stitchsim.models.vocabulary import (
    CaveatCode,
    Control,
    Cue,
    Direction,
    Measure,
    MeasureInput,
    Objective,
    PreprocessSource,
    Protocol,
    Verdict,
)

# ---------------------------------------------------------------- report


class IRIStats(BaseModel):
    start_median: float
    median: float
    p90: float
    max: float
    converged: bool
    cache_hit: bool
    n: int
    seconds: float
    converged_below: float = Field(default=0.25, description="the convergence line used")
    steps: int = Field(default=0, description="the step budget per sample (with extra rounds)")
    steps_used: float | None = Field(
        default=None, description="mean steps a sample actually took (early stopping)"
    )


class RobustStats(BaseModel):
    """The stitched and the back model on PGD test inputs crafted against the stitched one."""

    agreement: float
    agreement_ci: tuple[float, float]
    hard_agreement: float
    accuracy: float = Field(description="the stitched model's accuracy on the attacked inputs")
    back_accuracy: float = Field(description="the back model's accuracy on the same inputs")
    epsilon: float
    steps: int


class ResultRow(BaseModel):
    direction: Direction
    front_layer: str
    back_layer: str
    objective: Objective
    protocol: Protocol
    agreement: float
    agreement_ci: tuple[float, float]
    hard_agreement: float
    hard_agreement_ci: tuple[float, float]
    accuracy: float
    accuracy_ci: tuple[float, float]
    stitching_penalty: float
    error_consistency: float
    error_consistency_ci: tuple[float, float]
    train_loss: float
    seconds: float
    iri: IRIStats | None = None
    stitch: str = Field(default="", description="how T maps the front tensor to the back one")
    control: Control | None = None
    sigma: float | None = None
    excessive_agreement: float | None = None
    rolled_agreement: float | None = None
    cue: Cue | None = Field(default=None, description="shortcut control: the unseen cue")
    robust: RobustStats | None = Field(
        default=None, description="with adversarial.evaluate: figures on attacked test inputs"
    )


class PreprocessCandidate(BaseModel):
    name: str
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    accuracy: float = Field(description="accuracy on the labelled samples it was measured on")


class PreprocessInfo(BaseModel):
    """The preprocessing a model was evaluated with, and how it was chosen."""

    name: str = Field(description="timm | none | inception | custom")
    input_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    source: PreprocessSource
    note: str = Field(default="", description="how it was chosen, in words")
    candidates: list[PreprocessCandidate] = Field(
        default=[], description="what was measured when source is 'measured'"
    )
    samples: int = Field(default=0, description="labelled samples the candidates were scored on")


class ModelSummary(BaseModel):
    checkpoint: str
    arch: str
    arch_kwargs: dict[str, Any] = {}
    accuracy: float
    accuracy_ci: tuple[float, float]
    input_size: int
    layers: list[str] = Field(default=[], description="stitch points used on this model")
    preprocess: PreprocessInfo | None = None
    chance_accuracy: float | None = Field(
        default=None, description="1 / number of classes of the dataset"
    )
    near_chance: bool = Field(
        default=False, description="accuracy indistinguishable from guessing: figures unreliable"
    )
    chance_warning: str | None = Field(
        default=None, description="with near_chance: the engine's warning (what the figures "
        "are worth, what to check); written once, here, and shown as written"
    )


class SummaryRow(BaseModel):
    protocol: Protocol
    direction: Direction
    objective: Objective
    mean_agreement: float


class DropRow(BaseModel):
    """Standard minus invariance-aware agreement: what the standard protocol hides. Rows with
    front_layer/back_layer null are the means over stitch points."""

    direction: Direction
    objective: Objective
    front_layer: str | None = None
    back_layer: str | None = None
    standard: float
    invariance_aware: float
    drop: float


class ExcessRow(BaseModel):
    """The shortcut control's excessive agreement, maximised over stitch points as the paper
    reports it."""

    direction: Direction
    cue: Cue
    protocol: Protocol
    objective: Objective
    max_excessive_agreement: float
    front_layer: str = Field(description="the stitch point of the maximum")
    back_layer: str


class MeasureRow(BaseModel):
    """One representation similarity figure: a measure between the two models' activations at
    one stitch pair, on one kind of input. Tidy: one row per direction, pair, measure and
    input kind (on real inputs both directions carry the same value; on IRIs each direction
    reads the IRIs of the model in front position)."""

    direction: Direction
    front_layer: str
    back_layer: str
    measure: Measure
    input: MeasureInput
    value: float
    ci: tuple[float, float] = Field(description="95% bootstrap interval over samples")
    samples: int = Field(description="samples the measure was computed on")
    split: Literal["train", "test"] = Field(description="the split the inputs come from")
    control: Control | None = Field(
        default=None, description="identity: the end model with itself (the ceiling); "
        "clustered_noise: the end model against class-clustered noise (the floor)",
    )
    sigma: float | None = None
    seconds: float = 0.0


class MeasureSummaryRow(BaseModel):
    """Mean of one measure over stitch points in one direction, on real inputs and on IRIs;
    gap = real - iri (what the real-input figure owes to invariances not shared)."""

    direction: Direction
    measure: Measure
    real: float | None = None
    iri: float | None = None
    gap: float | None = None


class Summary(BaseModel):
    rows: list[SummaryRow]
    by_direction: dict[str, dict[str, float]] = Field(
        default={},
        description="protocol -> direction -> mean agreement over stitch points and objectives",
    )
    by_protocol: dict[str, float] = Field(
        description="per protocol: minimum over directions of the mean agreement"
    )
    similarity: float
    similarity_protocol: Protocol
    weaker_direction: Direction | None = Field(
        default=None, description="the direction whose figure is the similarity"
    )
    threshold: float | None
    drops: list[DropRow] = Field(
        default=[], description="per direction and objective: the mean over stitch points "
        "(layers null), then each stitch point; only when both protocols ran"
    )
    excessive_agreement: list[ExcessRow] = Field(
        default=[], description="shortcut control: maximum over stitch points per cue"
    )
    measures: list[MeasureSummaryRow] = Field(
        default=[], description="per direction and measure: means over stitch points"
    )
    measure_weaker_direction: dict[str, Direction] = Field(
        default={}, description="per measure, with both directions: the direction whose IRI "
        "figure is lower (the weaker conditional: the back model given the front one's IRIs)",
    )


class MethodRecord(BaseModel):
    """How the figures were made: what must be equal for two reports' figures to compare
    (a CI baseline and a new run)."""

    engine: str = Field(description="the engine's method version: bumped by any change of the "
                        "engine that moves figures (stitchsim_worker.engine.method)")
    settings: dict[str, Any] = Field(
        default={}, description="every spec setting that moves the similarity figure, by "
        "dotted path (iri.steps, train.epochs, protocols ...): stitchsim.method")


class Caveat(BaseModel):
    """One thing that weakens the figures, by code (catalogue.CAVEATS), beside its prose."""

    code: CaveatCode
    where: str = Field(default="", description="the model side or stitch point it concerns")
    message: str


class Report(BaseModel):
    job_id: str | None = None
    spec: Spec
    front: ModelSummary
    back: ModelSummary
    dataset: dict[str, Any]
    results: list[ResultRow]
    controls: list[ResultRow] = []
    measures: list[MeasureRow] = Field(default=[], description="with spec.measures")
    measure_controls: list[MeasureRow] = Field(
        default=[], description="the measures' ceiling (identity) and floor (clustered noise)"
    )
    summary: Summary
    verdict: Verdict | None
    verdict_reason: str | None = Field(
        default=None, description="why there is no verdict although a threshold was given, "
        "as a clause every rendering leads in with its own words (\"no verdict: ...\")"
    )
    verdict_caveats: list[str] = Field(
        default=[], description="what the verdict's figure rests on that weakens it"
    )
    warnings: list[str] = []
    notes: list[str] = Field(
        default=[], description="how to read figures of this job (e.g. cross-task pairing)"
    )
    environment: dict[str, Any] = {}
    method: MethodRecord | None = Field(
        default=None, description="the engine's method version and the settings that move "
        "figures (null: a report of a service before they were recorded)")
    caveats: list[Caveat] | None = Field(
        default=None, description="what weakens the figures, by code (null: not recorded; "
        "stitchsim.caveats finds them from the figures)")

    def to_pandas(self, table: str = "results") -> Any:
        """One tidy table of the report as a pandas DataFrame (the `pandas` extra):
        "results" (one row per direction, stitch pair, objective and protocol), "controls",
        "measures" or "summary" (mean agreement per protocol, direction and objective)."""
        from stitchsim.frames import report_frame

        return report_frame(self, table)

    def _repr_html_(self) -> str:
        from stitchsim.frames import report_html

        return report_html(self)
