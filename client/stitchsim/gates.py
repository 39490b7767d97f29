"""CI gates as ML teams write them (MLflow's MetricThreshold, TFMA's change thresholds,
Deepchecks' pass/warn/fail): an absolute threshold, a drop against a baseline report (absolute
and relative), per-stitch-point limits, a warn band, and caveats that may fail the check.

The evaluation is a pure function of the new report, the baseline report and the options, so
a stored pair of reports gives the same outcome as the run that made them. A baseline compares
only when it was made the same way: same reference model and dataset (`subject_differences`)
and the same method (`stitchsim.method.differences`); otherwise it is refused with the setting
that differs named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stitchsim import catalogue
from stitchsim.caveats import caveats_of
from stitchsim.errors import UsageError
from stitchsim.jsondepth import JSONInputError, parse_json
from stitchsim.method import differences, method_settings
from stitchsim.models import Caveat, MethodRecord, Report
from stitchsim.models.report import report_digest
from stitchsim.validation import field_errors, summary

Status = Literal["pass", "warn", "fail"]
PointKey = tuple[str, str, str]
"""(direction, front_layer, back_layer)"""

_EPS = 1e-9  # a drop of exactly the limit passes, whatever the float rounding

AUTO = "auto"
AUTO_K = 3.0
"""`--max-drop auto` = AUTO_K x the baseline's spread (`similarity_spread`). Chosen from
bench/drift_power.py (docs/client.md, "Choosing a gate"): the largest benign drop (reseeds,
one more epoch, another batch order, reruns) measured against the baseline's spread."""

AUTO_FALSE_ALARMS = 15 / 56
AUTO_FALSE_ALARMS_SOURCE = ("15 of 56 benign pairs of the demo recipe, 0 of 56 of convnext: "
                            "an estimate from the files bench/results/drift_power.2026-12-07.*,"
                            " each benign retrain in turn as the baseline, not yet measured on "
                            "held-out models")
"""How often `auto` fails a benign retrain when the baseline is another benign retrain: the
bootstrap half-width measures test-sample noise, not seed-to-seed spread. Shown in `check
--help`; above AUTO_HINT_ABOVE a check with auto suggests a calibrated gate."""
AUTO_HINT_ABOVE = 0.05


class BaselineRefused(UsageError):
    """The baseline was made under other settings, or of another model or dataset, or its
    file is not what the service wrote (figures out of bounds, edited by hand)."""

    code = "baseline_refused"


Figure = Annotated[float, Field(le=1.0 + _EPS, allow_inf_nan=False)]
"""An agreement or similarity: at most 1 whatever the output kind (softmax agreement, cosine
similarity, 1 - relative error); no lower bound, since 1 - relative error has none."""


class _Row(BaseModel):
    model_config = ConfigDict(extra="ignore")
    agreement: Figure
    hard_agreement: Figure


class _SummaryFigures(BaseModel):
    model_config = ConfigDict(extra="ignore")
    similarity: Figure
    by_protocol: dict[str, Figure]
    by_direction: dict[str, dict[str, Figure]] = {}
    threshold: Annotated[float, Field(ge=0.0, le=1.0)] | None = None


class _BaselineFigures(BaseModel):
    """What the gates read of a baseline, with the bounds every such figure has."""

    model_config = ConfigDict(extra="ignore")
    summary: _SummaryFigures
    results: list[_Row]
    controls: list[_Row] = []


def baseline_from_file(text: str, name: str) -> tuple[Report, bool]:
    """A baseline report file, refused when a figure is out of bounds or when it was changed
    after the engine wrote it (its `digest` no longer matches its content); (report, whether a
    digest vouched for it: False for a report of a service before digests)."""
    try:
        data: Any = parse_json(text, f"baseline {name}")
    except JSONInputError as exc:
        raise BaselineRefused(f"{exc}; use the report as the service wrote it") from None
    report = Report.model_validate(data)
    try:
        _BaselineFigures.model_validate(data)
    except ValidationError as exc:
        fields = field_errors(exc.errors())
        raise BaselineRefused(f"baseline {name} holds figures no report can have "
                              f"({summary(fields, shown=3)}); it was edited or corrupted: use "
                              "the report as the service wrote it", details=fields) from None
    if report.digest is None:
        return report, False
    if report_digest(data) != report.digest:
        raise BaselineRefused(
            f"baseline {name} was changed after the service wrote it: its content no longer "
            "matches the digest recorded with it (a figure, the spec or a setting edited by "
            "hand). Use the report as the service wrote it (`stitchsim report JOB -o FILE`), "
            "or pass the job id as --baseline")
    return report, True


@dataclass(frozen=True)
class GateOptions:
    max_drop: float | Literal["auto"] | None = None
    """Fail when the similarity falls by more than this below the baseline's (absolute);
    "auto": by more than AUTO_K x the baseline's own spread (`similarity_spread`)."""
    max_relative_drop: float | None = None
    """Fail when it falls by more than this fraction of the baseline's similarity."""
    max_drop_per_point: float | None = None
    """Fail when any stitch point's agreement falls by more than this below the baseline's."""
    min_point_agreement: float | None = None
    """Fail when any stitch point's agreement is below this."""
    warn_below: float | None = None
    """Warn (its own exit code) when the similarity is below this but no gate fails."""
    fail_on_caveat: bool = False
    """Fail on any caveat (unconverged IRIs, a model at chance)."""

    @property
    def needs_baseline(self) -> bool:
        return self.max_drop is not None or self.max_relative_drop is not None or (
            self.max_drop_per_point is not None)


@dataclass(frozen=True)
class BenignBand:
    """A calibrated gate's benign retrains at one figure (stitchsim.calibration)."""

    mean: float
    sd: float
    low: float
    high: float
    n: int


@dataclass(frozen=True)
class Gate:
    name: str
    status: Status
    message: str
    figure: float | None = None
    limit: float | None = None
    band: BenignBand | None = None
    """For a calibrated gate: the benign band the figure is drawn against."""


@dataclass(frozen=True)
class Outcome:
    gates: list[Gate]
    similarity: float
    baseline_similarity: float | None = None
    baseline_source: str | None = None
    caveats: list[Caveat] = field(default_factory=list)

    @property
    def status(self) -> Status:
        states = {g.status for g in self.gates}
        return "fail" if "fail" in states else "warn" if "warn" in states else "pass"

    @property
    def drop(self) -> float | None:
        if self.baseline_similarity is None:
            return None
        return self.baseline_similarity - self.similarity


# ------------------------------------------------------------------ figures


def point_agreements(report: Report) -> dict[PointKey, float]:
    """Per stitch point and direction: the mean agreement over objectives under the protocol
    the similarity is read from (the figure the similarity averages)."""
    used = report.summary.similarity_protocol
    sums: dict[PointKey, list[float]] = {}
    for r in report.results:
        if r.protocol == used:
            sums.setdefault((r.direction, r.front_layer, r.back_layer), []).append(r.agreement)
    return {k: sum(v) / len(v) for k, v in sums.items()}


def point_name(key: PointKey) -> str:
    direction, front, back = key
    return f"{front}->{back} ({direction})"


def similarity_spread(report: Report) -> float | None:
    """The report's own spread of its similarity: the mean half-width of the 95 % bootstrap
    intervals (over test samples) of the rows the similarity averages (its protocol, its
    weaker direction). The rows share their test samples, so their errors move together and
    the mean half-width, not a smaller pooled one, is the similarity's. None: no such rows."""
    s = report.summary
    rows = [r for r in report.results if r.protocol == s.similarity_protocol and (
        s.weaker_direction is None or r.direction == s.weaker_direction)]
    if not rows:
        return None
    return sum((r.agreement_ci[1] - r.agreement_ci[0]) / 2 for r in rows) / len(rows)


def max_drop_limit(max_drop: float | str, baseline: Report) -> tuple[float, str]:
    """The absolute limit --max-drop stands for, and how it was set (for the gate's message)."""
    if max_drop != AUTO:
        return float(max_drop), ""
    spread = similarity_spread(baseline)
    if spread is None:
        raise UsageError("--max-drop auto: the baseline has no rows under its similarity's "
                         "protocol, so no interval to scale; give --max-drop a number")
    return AUTO_K * spread, (f" (auto: {AUTO_K:g} x the baseline's interval half-width "
                             f"{spread:.4f})")


# ------------------------------------------------------------------ evaluation


def evaluate(report: Report, baseline: Report | None, options: GateOptions,
             *, baseline_source: str | None = None) -> Outcome:
    """Every gate the options ask for, on the new report (and the baseline)."""
    if options.needs_baseline and baseline is None:
        raise UsageError("--max-drop, --max-relative-drop and --max-drop-per-point need "
                         "--baseline (a report file, a job id, or self)")
    s = report.summary.similarity
    gates = [*_threshold_gates(report, options)]
    if baseline is not None:
        gates += _baseline_gates(report, baseline, options)
    gates += _point_gates(report, baseline, options)
    caveats = caveats_of(report)
    if options.fail_on_caveat:
        gates += [Gate(f"caveat {c.code}" + (f" at {c.where}" if c.where else ""),
                       "fail" if _gating(c) else "pass", c.message) for c in caveats]
    return Outcome(gates, s, None if baseline is None else baseline.summary.similarity,
                   baseline_source, caveats)


def _gating(caveat: Caveat) -> bool:
    entry = catalogue.CAVEATS.get(caveat.code)
    return entry is None or entry.gate


def _threshold_gates(report: Report, options: GateOptions) -> list[Gate]:
    s, threshold = report.summary.similarity, report.summary.threshold
    gates = []
    if threshold is not None and report.verdict is not None:
        ok = report.verdict == "similar"
        gates.append(Gate("threshold", "pass" if ok else "fail",
                          f"similarity {s:.4f} {'>=' if ok else '<'} threshold {threshold:.4f}",
                          s, threshold))
    if options.warn_below is not None:
        low = s < options.warn_below
        gates.append(Gate("warn-below", "warn" if low else "pass",
                          f"similarity {s:.4f} {'<' if low else '>='} warn line "
                          f"{options.warn_below:.4f}", s, options.warn_below))
    return gates


def _baseline_gates(report: Report, baseline: Report, options: GateOptions) -> list[Gate]:
    s, b = report.summary.similarity, baseline.summary.similarity
    drop = b - s
    gates = []
    if options.max_drop is not None:
        limit, how = max_drop_limit(options.max_drop, baseline)
        ok = drop <= limit + _EPS
        gates.append(Gate("max-drop", "pass" if ok else "fail",
                          f"similarity {s:.4f} vs baseline {b:.4f}: drop {drop:+.4f} "
                          f"{'<=' if ok else '>'} {limit:.4f}{how}", drop, limit))
    if options.max_relative_drop is not None:
        rel = drop / b if b > 0 else 0.0
        ok = rel <= options.max_relative_drop + _EPS
        gates.append(Gate("max-relative-drop", "pass" if ok else "fail",
                          f"similarity {s:.4f} vs baseline {b:.4f}: relative drop {rel:+.2%} "
                          f"{'<=' if ok else '>'} {options.max_relative_drop:.2%}", rel,
                          options.max_relative_drop))
    return gates


def _point_gates(report: Report, baseline: Report | None, options: GateOptions) -> list[Gate]:
    points = point_agreements(report)
    before = point_agreements(baseline) if baseline is not None else {}
    gates = []
    for key, value in points.items():
        name = point_name(key)
        if options.min_point_agreement is not None:
            ok = value >= options.min_point_agreement - _EPS
            gates.append(Gate(f"point {name}", "pass" if ok else "fail",
                              f"agreement {value:.4f} {'>=' if ok else '<'} "
                              f"{options.min_point_agreement:.4f}", value,
                              options.min_point_agreement))
        if options.max_drop_per_point is not None:
            if key not in before:
                gates.append(Gate(f"point drop {name}", "fail",
                                  "the baseline has no figure at this stitch point (its "
                                  "stitch points: " + ", ".join(map(point_name, before)) + ")"))
                continue
            drop = before[key] - value
            ok = drop <= options.max_drop_per_point + _EPS
            gates.append(Gate(f"point drop {name}", "pass" if ok else "fail",
                              f"agreement {value:.4f} vs baseline {before[key]:.4f}: drop "
                              f"{drop:+.4f} {'<=' if ok else '>'} "
                              f"{options.max_drop_per_point:.4f}", drop,
                              options.max_drop_per_point))
    return gates


# ------------------------------------------------------------------ is the baseline comparable


def method_of(report: Report) -> MethodRecord:
    """The report's method; for a report from before methods were recorded, its spec's
    settings under an unknown engine version (which never equals a recorded one)."""
    if report.method is not None:
        return report.method
    return MethodRecord(engine="(not recorded)", settings=method_settings(report.spec))


def subject_differences(baseline: Report, reference: str, dataset: str | None,
                        arch: str | None = None) -> list[str]:
    """What makes the baseline a comparison of another reference model or dataset."""
    found = []
    if baseline.front.checkpoint != reference:
        found.append(f"reference model: baseline {baseline.front.checkpoint}, this check "
                     f"{reference}")
    if arch is not None and baseline.front.arch != arch:
        found.append(f"reference arch: baseline {baseline.front.arch}, this check {arch}")
    was = _dataset_name(baseline)
    if dataset is not None and was != dataset:
        found.append(f"dataset: baseline {was}, this check {dataset}")
    return found


def _dataset_name(report: Report) -> str:
    return str(report.dataset.get("id") or report.spec.dataset)


def refuse_unless_comparable(baseline: Report, report: Report, source: str) -> None:
    """Raise BaselineRefused naming what differs between a baseline and the new report."""
    subject = subject_differences(baseline, report.front.checkpoint, _dataset_name(report),
                                  report.front.arch)
    if subject:
        raise BaselineRefused(f"baseline {source} compares another model or dataset: "
                              + "; ".join(subject) + ". Use a baseline of this reference on "
                              "this dataset")
    method = differences(method_of(baseline), method_of(report))
    if method:
        raise BaselineRefused(method_refusal(source, method))


def method_refusal(source: str, method: list[str]) -> str:
    return (f"baseline {source} was made under other settings, so its figures do not compare: "
            + "; ".join(method) + ". Rerun with --recompute-baseline to redo the baseline "
            "under this check's settings")
