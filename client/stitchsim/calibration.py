"""A gate calibrated on the user's own benign retrains: per figure, the benign band and a limit
that one new benign model crosses with a known, small probability.

`calibrate(reports)` reads every figure of every benign check (stitchsim.figures), and sets
each figure's limit at a one-sided Student t prediction bound for ONE new model of the same
population: mean - t(1 - a/m, n - 1) * sd * sqrt(1 + 1/n) (mean + ... where high is bad), with
sd the sample standard deviation (n - 1 in the denominator), a the family-wise false-alarm
rate and m the number of gated figures (Bonferroni: a benign model trips some gated figure
with probability at most a, if the figures are roughly normal across retrains). A limit at
"the lowest benign figure" would false-alarm on about 1/(n+1) of new benign models; the
prediction bound widens with small n instead.

The gate file is sealed as a report is (`digest` over its canonical JSON, report_digest):
an edit by hand is detected, not a forgery. The file reading, the refusal of a gate that does
not fit a check, and the evaluation are in stitchsim.gatefile.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from stitchsim import __version__, catalogue
from stitchsim.errors import MissingExtra, UsageError
from stitchsim.figures import Bad, NamedFigure, report_figures
from stitchsim.gates import method_of
from stitchsim.models import MethodRecord, Report
from stitchsim.models.report import report_digest

GATE_FORMAT = "stitchsim-gate/1"
STATISTIC = ("one-sided Student t prediction bound for one new benign model, Bonferroni over "
             "the gated figures: limit = mean - t(1 - a/m, n - 1) * sd * sqrt(1 + 1/n) (mean + "
             "... where high is bad); sd: sample standard deviation (n - 1); a: the "
             "false-alarm rate; m: the number of gated figures")
DEFAULT_FALSE_ALARM_RATE = 0.01
MIN_MODELS = 3
"""Below 3 a t bound at 1 % is tens of sd wide: no gate."""
ADVISED_MODELS = 8

ALL = "all"
DEFAULT_GATED = ("standard", "accuracy")
"""Decided from the calibration-set series of bench/results/drift_power.2026-12-0[67]
(bench/gate_choice.py; docs/client.md, "Choosing a gate"), pending the held-out measurement of
bench/drift_power.py --held-out: per-point standard agreement catches the most harmful models
at no leave-one-out false alarm, accuracy adds the class-dropping fine-tune; the
invariance-aware figures do not fall with the dose; the endpoint agreement is not in those
series, so it is recorded, not gated, until measured. Where the check runs no standard
protocol, its similarity's protocol stands in."""

Finite = Annotated[float, Field(allow_inf_nan=False)]


class FigureBand(BaseModel):
    """One figure over the benign checks, and its limit."""

    model_config = ConfigDict(extra="forbid")
    kind: str
    labels: dict[str, str]
    bad: Bad
    gated: bool = Field(description="tested by `check --gate`; the others are recorded only")
    n: int = Field(ge=MIN_MODELS)
    values: list[Finite] = Field(description="each benign model's figure, in `benign` order")
    mean: Finite
    sd: Finite = Field(ge=0.0)
    min: Finite
    max: Finite
    limit: Finite


class ModelRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    checkpoint: str
    arch: str
    given_as: str = Field(default="", description="the path or id the calibration was given")
    job_id: str | None = None


class GateFile(BaseModel):
    """What `stitchsim calibrate` writes and `stitchsim check --gate` reads."""

    model_config = ConfigDict(extra="forbid")
    format: Literal["stitchsim-gate/1"] = GATE_FORMAT
    statistic: str = STATISTIC
    false_alarm_rate: Finite = Field(gt=0.0, lt=0.5, description="family-wise, per new "
                                     "benign model")
    gated_figures: int = Field(ge=1, description="m: the figures the rate is split over")
    per_figure_rate: Finite = Field(gt=0.0, lt=0.5)
    t_quantile: Finite = Field(gt=0.0, description="t(1 - a/m, n - 1)")
    limit_in_sd: Finite = Field(gt=0.0, description="t(1 - a/m, n - 1) * sqrt(1 + 1/n): how "
                                "many benign sd a limit sits from the benign mean")
    gate: list[str] = Field(description="the figure kinds or protocols gated (`--gate-figures`)")
    n: int = Field(ge=MIN_MODELS)
    reference: ModelRecord
    dataset: str
    spec: dict[str, Any] = Field(description="the checks' spec, models left out")
    method: MethodRecord
    benign: list[ModelRecord]
    figures: dict[str, FigureBand]
    client: str = __version__
    digest: str | None = None


# ------------------------------------------------------------------ statistics


def prediction_factor(n: int, rate: float) -> tuple[float, float]:
    """(t(1 - rate, n - 1), the limit's distance from the mean in sd: t * sqrt(1 + 1/n))."""
    try:
        from scipy import stats
    except ImportError:
        raise MissingExtra("calibrating a gate needs scipy: pip install 'stitchsim[calibrate]'"
                           ) from None
    t = float(stats.t.ppf(1.0 - rate, n - 1))
    return t, t * math.sqrt(1.0 + 1.0 / n)


def band(figures: Sequence[NamedFigure], factor: float, gated: bool) -> FigureBand:
    values = [f.value for f in figures]
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    first = figures[0]
    limit = mean - factor * sd if first.bad == "low" else mean + factor * sd
    return FigureBand(kind=first.kind, labels=dict(first.labels), bad=first.bad, gated=gated,
                      n=len(values), values=values, mean=mean, sd=sd, min=min(values),
                      max=max(values), limit=limit)


def gate_kinds(selectors: Sequence[str] | None, report: Report) -> list[str]:
    """The selectors a gate tests: the default's, `all`, or the user's, checked."""
    protocols = list(report.spec.protocols)
    if selectors is None:
        first = "standard" if "standard" in protocols else report.summary.similarity_protocol
        return [first, *DEFAULT_GATED[1:]]
    known = {ALL, "similarity", "accuracy", "endpoint_agreement", "agreement", *protocols,
             *(m.measure for m in report.measures)}
    unknown = [s for s in selectors if s not in known]
    if unknown:
        raise UsageError(f"--gate-figures: {', '.join(unknown)} not among the figures these "
                         f"checks report ({', '.join(sorted(known))})")
    return list(selectors)


def check_kinds(selectors: Sequence[str] | None) -> None:
    """Refuse, before any check runs, a selector that names no figure any check reports."""
    known = {ALL, "agreement", "similarity", "accuracy", "endpoint_agreement",
             *catalogue.PROTOCOLS.names, *catalogue.MEASURES.names}
    unknown = [s for s in selectors or () if s not in known]
    if unknown:
        raise UsageError(f"--gate-figures: {', '.join(unknown)} is not a figure kind; "
                         f"known: {', '.join(sorted(known))}")


def is_gated(figure: NamedFigure, kinds: Sequence[str]) -> bool:
    if ALL in kinds or figure.kind in kinds:
        return True
    return figure.kind == "agreement" and dict(figure.labels).get("protocol") in kinds


def calibrate(reports: Sequence[Report], *, false_alarm_rate: float = DEFAULT_FALSE_ALARM_RATE,
              gate: Sequence[str] | None = None, given_as: Sequence[str] = ()) -> GateFile:
    """The gate of the benign checks' figures (each a check of the same reference, under one
    spec, against one benign retrain). Raises UsageError below MIN_MODELS, for checks that do
    not share a reference, a dataset and a method, or when no figure would be gated."""
    n = len(reports)
    if n < MIN_MODELS:
        raise UsageError(f"calibrate needs at least {MIN_MODELS} benign retrains, got {n}: "
                         f"with fewer the bound is unusable; {ADVISED_MODELS} or more advised")
    if not 0.0 < false_alarm_rate < 0.5:
        raise UsageError(f"--false-alarm-rate must be in (0, 0.5), got {false_alarm_rate}")
    first = reports[0]
    _same_setting(reports)
    per_report = [report_figures(r) for r in reports]
    common = [name for name in per_report[0] if all(name in f for f in per_report[1:])]
    kinds = gate_kinds(gate, first)
    gated = [name for name in common if is_gated(per_report[0][name], kinds)]
    if not gated:
        raise UsageError(f"--gate-figures {','.join(kinds)}: no figure of these checks is "
                         "gated")
    rate = false_alarm_rate / len(gated)
    t, factor = prediction_factor(n, rate)
    figures = {name: band([f[name] for f in per_report], factor, name in gated)
               for name in common}
    names = list(given_as) or [""] * n
    return sealed_gate(GateFile(
        false_alarm_rate=false_alarm_rate, gated_figures=len(gated), per_figure_rate=rate,
        t_quantile=t, limit_in_sd=factor, gate=kinds, n=n,
        reference=ModelRecord(checkpoint=first.front.checkpoint, arch=first.front.arch),
        dataset=dataset_of(first), spec=spec_of(first), method=method_of(first),
        benign=[ModelRecord(checkpoint=r.back.checkpoint, arch=r.back.arch, given_as=g,
                            job_id=r.job_id) for r, g in zip(reports, names, strict=True)],
        figures=figures))


def _same_setting(reports: Sequence[Report]) -> None:
    first = reports[0]
    for r in reports[1:]:
        if (r.front.checkpoint, dataset_of(r), method_of(r)) != (
                first.front.checkpoint, dataset_of(first), method_of(first)):
            raise UsageError(f"benign check {r.job_id or r.back.checkpoint} is not of the "
                             "same reference, dataset and method as the first: a gate is "
                             "calibrated under one spec")
    checkpoints = [r.back.checkpoint for r in reports]
    twins = sorted({c for c in checkpoints if checkpoints.count(c) > 1})
    if twins or first.front.checkpoint in checkpoints:
        raise UsageError("benign retrains must be distinct models, other than the reference: "
                         + ", ".join(twins or [first.front.checkpoint]) + " given twice")


def dataset_of(report: Report) -> str:
    return str(report.dataset.get("id") or report.spec.dataset)


def spec_of(report: Report) -> dict[str, Any]:
    """The spec the figures rest on: the models and the pass threshold left out."""
    return report.spec.model_dump(mode="json", exclude={"front", "back", "threshold"})


def sealed_gate(gate: GateFile) -> GateFile:
    """The gate with its digest over exactly the JSON it is written as."""
    body = json.loads(gate.model_copy(update={"digest": None}).model_dump_json())
    return gate.model_copy(update={"digest": report_digest(body)})


def width_warning(gate: GateFile) -> str | None:
    """Below ADVISED_MODELS: how wide the bound is and what more retrains would buy."""
    if gate.n >= ADVISED_MODELS:
        return None
    more = {m: prediction_factor(m, gate.per_figure_rate)[1] for m in (ADVISED_MODELS, 16)}
    return (f"{gate.n} benign retrains: each limit sits {gate.limit_in_sd:.1f} benign sd "
            f"from the benign mean (t bound at {gate.per_figure_rate:.2%} per figure); "
            + ", ".join(f"{m} retrains would bring it to {k:.1f} sd" for m, k in more.items())
            + ", so a smaller drift would fail the gate")


def flat_figures(gate: GateFile) -> list[str]:
    """Gated figures with no spread over the benign retrains (all equal, as an accuracy of a
    small test split can be): their limit is that value, so any new benign model that differs
    at all fails them."""
    return [name for name, b in gate.figures.items() if b.gated and b.sd == 0.0]
