"""The report: tidy rows of figures, the summary and the verdict."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, Field, computed_field, model_validator

from stitchsim import catalogue
from stitchsim.models.settings import AdversarialSettings, IRISettings
from stitchsim.models.spec import Spec
from stitchsim.models.vocabulary import (
    Attack,
    CaveatCode,
    Control,
    Cue,
    Direction,
    IRIMethod,
    Measure,
    MeasureInput,
    Objective,
    OutputKind,
    PreprocessSource,
    Protocol,
    Resolution,
    Verdict,
)

# ---------------------------------------------------------------- report


class IRIStats(BaseModel):
    method: IRIMethod | None = Field(
        default=None, description="the IRI method (iri.method) they were made with; null in "
        "reports from before methods were named")
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
    pixel_rms: float | None = Field(
        default=None, description="the IRIs' distance from their inputs in pixels: the root "
        "mean square of x' - x over every pixel of every IRI, in [0,1] units (1/255: one grey "
        "level)")
    pixel_median: float | None = Field(
        default=None, description="the median over IRIs of each one's RMS pixel distance from "
        "its input")


class RobustStats(BaseModel):
    """The stitched and the back model on test inputs crafted (by `attack`) against the
    stitched one. Robust agreement mixes two things: how similar the models are and how far
    the attack transfers to the back model; `transfer_rate` gives the second apart."""

    agreement: float
    agreement_ci: tuple[float, float]
    hard_agreement: float
    accuracy: float = Field(description="the stitched model's accuracy on the attacked inputs")
    back_accuracy: float = Field(description="the back model's accuracy on the same inputs")
    epsilon: float
    steps: int = Field(description="the attack's iterations (each loss's, for the APGD "
                       "attacks)")
    attack: Attack = Field(default="pgd", description="the attack that crafted the inputs")
    step_size: float | None = Field(
        default=None, description="the attack's (first) step in [0,1] pixels; unset for apgd, "
        "whose first step is 2 epsilon (and in reports from before it was recorded)")
    success_rate: float | None = Field(
        default=None, description="how often the attack fools the stitched model: the share "
        "of the test inputs it classifies right whose attacked version it gets wrong")
    transfer_rate: float | None = Field(
        default=None, description="how often the same attacked inputs fool the back model "
        "(the share of the inputs it classifies right that it gets wrong once attacked)")


class ImageGrid(BaseModel):
    """Sample outputs of an image model beside its inputs: one PNG, one row of samples per
    label (the inputs, the back model's outputs on them, the target when it is not that
    output, the stitched model's outputs)."""

    labels: list[str] = Field(max_length=8)
    samples: int = Field(ge=1, le=32)
    width: int = Field(ge=1, le=4096, description="of the PNG, in pixels")
    height: int = Field(ge=1, le=4096)
    png: str = Field(max_length=400_000, description="base64 of the PNG")


class Figure(BaseModel):
    """One figure of a row: its value and its 95% interval (a bootstrap over the test
    samples, or a t-interval over seeds)."""

    value: float
    ci: tuple[float, float] | None = None


FORMAT_1_FIGURES = ("agreement", "hard_agreement", "correct_agreement", "accuracy",
                    "error_consistency", "soft_kappa", "psnr")
"""The figures a report of format 1 wrote as flat fields (`name`, `name_ci`); a row read from
one lifts them into `figures`. Frozen: a figure added since lives in `figures` only."""


def _lift_flat_figures(data: Any) -> Any:
    """A format-1 row's flat figures as `figures` (a row that has `figures` keeps its own)."""
    if not isinstance(data, dict) or "figures" in data:
        return data
    data = dict(data)
    figures = {}
    for name in FORMAT_1_FIGURES:
        value, ci = data.pop(name, None), data.pop(f"{name}_ci", None)
        if value is not None:
            figures[name] = Figure(value=value, ci=ci)
    return {**data, "figures": figures}


class FigureRow(BaseModel):
    """A row's figures by catalogue name (stitchsim.catalogue.ROW_FIGURES), each with its
    interval; a figure the row's output kind does not score is absent. The read-only fields
    below restate the figures that readers of format 1 require, so a client of that format
    reads these reports too; the engine and the view read `figures`."""

    figures: dict[str, Figure] = Field(
        description="row figure (catalogue ROW_FIGURES name) -> value and 95% interval; "
        "absent: the back model's output kind does not score it")

    _lift = model_validator(mode="before")(_lift_flat_figures)

    def value(self, name: str) -> float | None:
        figure = self.figures.get(name)
        return None if figure is None else figure.value

    def interval(self, name: str) -> tuple[float, float] | None:
        figure = self.figures.get(name)
        return None if figure is None else figure.ci

    @computed_field  # type: ignore[prop-decorator]
    @property
    def agreement(self) -> float:
        return self.figures["agreement"].value

    @computed_field  # type: ignore[prop-decorator]
    @property
    def agreement_ci(self) -> tuple[float, float] | None:
        return self.interval("agreement")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def hard_agreement(self) -> float | None:
        return self.value("hard_agreement")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def hard_agreement_ci(self) -> tuple[float, float] | None:
        return self.interval("hard_agreement")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def accuracy(self) -> float | None:
        return self.value("accuracy")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def accuracy_ci(self) -> tuple[float, float] | None:
        return self.interval("accuracy")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def error_consistency(self) -> float | None:
        return self.value("error_consistency")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def error_consistency_ci(self) -> tuple[float, float] | None:
        return self.interval("error_consistency")


class ResultRow(FigureRow):
    direction: Direction
    front_layer: str
    back_layer: str
    objective: Objective
    protocol: Protocol
    stitching_penalty: float | None = Field(
        description="the back model's accuracy minus the stitched model's; null without "
        "classes")
    output: OutputKind = Field(
        default="logits", description="the back model's output kind: which figures the row "
        "has and what agreement and hard_agreement measure (catalogue OUTPUT_KINDS)")
    grid: ImageGrid | None = Field(
        default=None, description="image outputs: test inputs, the back model's outputs and "
        "the stitched model's, side by side (the first objective of each stitch and protocol)")
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
    alpha: float | None = Field(
        default=None, description="adversarial protocols: the share of each training batch "
        "that was attacked (adversarial.alphas runs several; 0 is the clean arm)")


class UnstitchedRow(FigureRow):
    """The model in front position against the model the stitched network ends in, whole and
    with no stitch, on the same test split and in the same figures as the rows: the endpoint
    of every agreement-versus-depth curve (the paper's plots end in it). A stitch that agrees
    with the end model far above it took more than the front model's own function; its
    accuracy figure is the front-position model's."""

    direction: Direction
    output: OutputKind = Field(default="logits", description="the end model's output kind: "
                               "which figures the row has")
    samples: int


class ProbeResult(BaseModel):
    """One probe set (spec.probes): the stitches, fitted on the clean training split as
    without it, evaluated on the probe's test split, with the two models on it. A latent
    shortcut shows here, where its cue is present, and not on the clean rows."""

    name: str = Field(description="the probe's name (stitchsim.models.spec.probe_name)")
    dataset: dict[str, Any] = Field(description="the probe set, described as `dataset` is")
    front_accuracy: float | None = Field(
        default=None, description="the front model alone on the probe; null without labels "
        "or classes")
    back_accuracy: float | None = Field(
        default=None, description="the back model alone on the probe; null without labels "
        "or classes")
    unstitched_agreement: list[UnstitchedRow] = Field(
        default=[], description="per direction: the two whole models against each other on "
        "the probe (the endpoint)")
    results: list[ResultRow] = Field(
        default=[], description="one row per direction, stitch pair, objective and protocol, "
        "as the clean results (no controls, measures or attacks on probes)")


class PreprocessCandidate(BaseModel):
    name: str
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    accuracy: float | None = Field(
        default=None, description="accuracy on the labelled samples it was measured on; null "
        "without labels")
    stats_distance: float | None = Field(
        default=None, description="label-free: mean KL divergence of its inputs' batch "
        "statistics from the running statistics of the model's first normalisation layer "
        "(lower is closer to training); measured when accuracy does not tell the candidates "
        "apart")


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
    accuracy: float | None = Field(
        description="test accuracy; null for a model whose output kind has no classes or on "
        "an unlabelled dataset")
    accuracy_ci: tuple[float, float] | None
    output: OutputKind = Field(default="logits", description="what the model outputs")
    output_source: Literal["spec", "metadata", "detected"] = "detected"
    input_size: int
    layers: list[str] = Field(default=[], description="stitch points used on this model")
    preprocess: PreprocessInfo | None = None
    source: str = Field(default="timm", description="the model source that built it (a "
                        "catalogue name: timm, torchvision, transformers, stitchsim, plugin)")
    source_metadata: dict[str, str] = Field(
        default={}, description="where the architecture came from: a model folder's layout, "
        "its config file, the class or the preprocessing it gave")
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
                        "engine that moves figures (stitchsim_worker.engine.core.method)")
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
    unstitched_agreement: list[UnstitchedRow] = Field(
        default=[], description="per direction: the two whole models against each other, no "
        "stitch (the endpoint of the agreement plots); empty when their outputs are not in one "
        "class space (cross-task pairing)")
    probes: list[ProbeResult] = Field(
        default=[], description="with spec.probes: each probe set's rows, in the spec's order")
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
    iri_settings: IRISettings | None = Field(
        default=None, description="the IRI method and its effective settings (the method's "
        "preset under the fields the spec set), when any figure of the job was computed on "
        "IRIs; null otherwise). step_size is the one that ran: the spec's, else the input "
        "resolution's (`resolution`)")
    adversarial_settings: AdversarialSettings | None = Field(
        default=None, description="the adversarial settings that ran, epsilon and step_size "
        "resolved (the spec's, else the input resolution's), when the job crafted attacked "
        "inputs (an adversarial protocol, adversarial.evaluate); null otherwise and in reports "
        "from before they were recorded")
    resolution: Resolution = Field(
        default="low", description="the input-resolution preset the step sizes the spec left "
        "unset came from: " + catalogue.RESOLUTIONS.describe() + " (reports from before "
        "presets by resolution read low: their jobs used the 32 px values at every size)")
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
    digest: str | None = Field(
        default=None, description="sha256 of the report's content as the engine wrote it "
        "(every other field, canonical JSON: report_digest); a report file edited by hand no "
        "longer matches it. Not a signature: it detects edits, not forgery (null: a report of "
        "a service before digests were recorded)")

    def to_pandas(self, table: str = "results") -> Any:
        """One tidy table of the report as a pandas DataFrame (the `pandas` extra):
        "results" (one row per direction, stitch pair, objective and protocol), "controls",
        "measures" or "summary" (mean agreement per protocol, direction and objective)."""
        from stitchsim.frames import report_frame

        return report_frame(self, table)

    def _repr_html_(self) -> str:
        from stitchsim.frames import report_html

        return report_html(self)


def report_digest(data: dict[str, Any]) -> str:
    """The digest of a report's JSON object: every field but `digest`, as canonical JSON
    (sorted keys, no spaces), so formatting does not matter and any changed value does. Taken
    from the parsed JSON, not the model, so a client of another version (fields added with
    defaults) computes the same digest over the same file."""
    body = {k: v for k, v in data.items() if k != "digest"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def sealed(report: Report) -> Report:
    """The report with its digest, over exactly the JSON it is written as."""
    return report.model_copy(update={"digest": report_digest(json.loads(
        report.model_copy(update={"digest": None}).model_dump_json()))})
