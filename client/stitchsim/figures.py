"""Every figure a check reports, each by one name: what a calibrated gate (stitchsim.calibration)
measures over benign retrains and tests a candidate on.

A figure is a kind ("agreement", "similarity", "accuracy", "endpoint_agreement", or a measure
such as "cka") and labels that say where it was read ("protocol", "direction", "point",
"input"; a probe set adds "probe"). Its name is the kind with its labels sorted, Prometheus
style: `agreement{direction=front_to_back,point=layer2->layer2,protocol=standard}`. A new
family of rows (probe sets, say) is one more source in FIGURE_SOURCES yielding figures with one
more label: the gate file, the statistics and the check need no change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from stitchsim.models import Report, ResultRow

Bad = Literal["low", "high"]
"""Which side of a figure is drift: every figure a check reports today is an agreement or a
similarity, so low is bad; a figure where high is bad (an excess) says so in BAD_SIDE."""

BAD_SIDE: dict[str, Bad] = {}
"""Kinds whose bad side is high; every other kind: low."""


@dataclass(frozen=True)
class NamedFigure:
    kind: str
    labels: tuple[tuple[str, str], ...]
    """(label, value) pairs, sorted by label."""
    value: float

    @property
    def name(self) -> str:
        return figure_name(self.kind, dict(self.labels))

    @property
    def bad(self) -> Bad:
        return BAD_SIDE.get(self.kind, "low")


def figure_name(kind: str, labels: dict[str, str]) -> str:
    if not labels:
        return kind
    return kind + "{" + ",".join(f"{k}={labels[k]}" for k in sorted(labels)) + "}"


def named(kind: str, value: float, **labels: str) -> NamedFigure:
    return NamedFigure(kind, tuple(sorted(labels.items())), float(value))


def _point(front: str, back: str) -> str:
    return f"{front}->{back}"


def _agreements(report: Report) -> Iterator[NamedFigure]:
    """Per protocol, direction and stitch point (and alpha, for adversarial arms): the mean
    agreement over objectives, the figure the similarity averages."""
    return _pooled_agreements(report.results, {})


def _pooled_agreements(rows: list[ResultRow], extra: dict[str, str]) -> Iterator[NamedFigure]:
    pooled: dict[tuple[tuple[str, str], ...], list[float]] = {}
    for r in rows:
        labels = {**extra, "protocol": r.protocol, "direction": r.direction,
                  "point": _point(r.front_layer, r.back_layer)}
        if r.alpha is not None:
            labels["alpha"] = f"{r.alpha:g}"
        pooled.setdefault(tuple(sorted(labels.items())), []).append(r.agreement)
    for labels, values in pooled.items():
        yield NamedFigure("agreement", labels, sum(values) / len(values))


def _similarity(report: Report) -> Iterator[NamedFigure]:
    yield named("similarity", report.summary.similarity)


def _accuracy(report: Report) -> Iterator[NamedFigure]:
    """The candidate's own accuracy (the back model of a check); none without labels."""
    if report.back.accuracy is not None:
        yield named("accuracy", report.back.accuracy)


def _endpoints(report: Report) -> Iterator[NamedFigure]:
    """The two whole models against each other, no stitch, per direction."""
    for row in report.unstitched_agreement:
        yield named("endpoint_agreement", row.agreement, direction=row.direction)


def _measures(report: Report) -> Iterator[NamedFigure]:
    """Representation similarity (CKA ...) per stitch pair and input kind; on real inputs the
    two directions carry one value, so it is named once."""
    seen: set[str] = set()
    for m in report.measures:
        if m.control is not None:
            continue
        labels = {"input": m.input, "point": _point(m.front_layer, m.back_layer)}
        if m.input != "real":
            labels["direction"] = m.direction
        elif m.direction != "front_to_back":
            labels["point"] = _point(m.back_layer, m.front_layer)
        figure = named(m.measure, m.value, **labels)
        if figure.name not in seen:
            seen.add(figure.name)
            yield figure


def _probes(report: Report) -> Iterator[NamedFigure]:
    """Each probe set's figures, labelled with its name: the agreements as on the clean set,
    the endpoint per direction and the candidate's accuracy on the probe (where labelled)."""
    for probe in report.probes:
        yield from _pooled_agreements(probe.results, {"probe": probe.name})
        for row in probe.unstitched_agreement:
            yield named("endpoint_agreement", row.agreement, direction=row.direction,
                        probe=probe.name)
        if probe.back_accuracy is not None:
            yield named("accuracy", probe.back_accuracy, probe=probe.name)


FigureSource = Callable[[Report], Iterable[NamedFigure]]
FIGURE_SOURCES: list[FigureSource] = [_agreements, _similarity, _accuracy, _endpoints,
                                      _measures, _probes]
"""Where figures come from, in the order they are listed."""


def report_figures(report: Report) -> dict[str, NamedFigure]:
    """Every named figure of a report (name -> figure), in FIGURE_SOURCES order."""
    out: dict[str, NamedFigure] = {}
    for source in FIGURE_SOURCES:
        for figure in source(report):
            out[figure.name] = figure
    return out
