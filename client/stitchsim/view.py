"""The report as it is shown: the one view that the terminal table (`table.py`), the JUnit file
(`junit.py`) and the HTML page (the gateway's `pages`) all render.

It holds what directions and preprocessing sources are called (what objectives, protocols,
controls, cues and measures are called, their order and their plot styles are the catalogue's,
stitchsim.catalogue), how figures are written, and it reads the figures the engine computed
(similarity, weaker direction, drops, verdict and why there is none) from the report: nothing
here computes a summary. Standard library and contract only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from stitchsim import catalogue
from stitchsim.models import (
    DIRECTIONS,
    Direction,
    DropRow,
    FigureRow,
    Measure,
    MeasureRow,
    MeasureSummaryRow,
    ModelSummary,
    Objective,
    PreprocessInfo,
    Protocol,
    Report,
    ResultRow,
    UnstitchedRow,
)

# What objectives, protocols, controls, cues and measures are called, and how they are drawn,
# is the catalogue's (stitchsim.catalogue); the states below are not catalogue names.
DIRECTION_LABEL: dict[str, str] = {"front_to_back": "front → back", "back_to_front": "back → front"}
DIRECTION_ASCII: dict[str, str] = {"front_to_back": "front->back", "back_to_front": "back->front"}
PREPROCESS_SOURCE_LABEL: dict[str, str] = {
    "spec": "set in the spec",
    "metadata": "from the checkpoint's metadata",
    "config": "from the model's own config (config.json, preprocessor_config.json)",
    "measured": "measured on samples (accuracy, else normalisation statistics)",
    "default": "the default",
    "undetermined": "UNDETERMINED: no measurement told the candidates apart",
}


def control_name(row: ResultRow) -> str:
    """A control's label, with its cue for the unseen-cue suite."""
    name = catalogue.CONTROLS.label(row.control or "")
    return f"{name}: {catalogue.CUES.label(row.cue)}" if row.cue else name


def has_robust(report: Report) -> bool:
    return any(r.robust is not None for r in report.results)


def unstitched(report: Report, direction: Direction) -> UnstitchedRow | None:
    """The endpoint of a direction: the two whole models against each other, no stitch."""
    return next((u for u in report.unstitched_agreement if u.direction == direction), None)


def robust_agreement(row: ResultRow) -> str:
    return fmt(row.robust.agreement) if row.robust is not None else ""


def transfer_rate(row: ResultRow) -> str:
    """How often the attack fooled the back model (robust agreement mixes it in)."""
    rate = row.robust.transfer_rate if row.robust is not None else None
    return fmt(rate) if rate is not None else ""


def protocol_name(row: ResultRow) -> str:
    """The protocol, with its alpha where an adversarial protocol ran at several."""
    return row.protocol if row.alpha is None else f"{row.protocol} a={row.alpha:g}"


def robust_caption(report: Report) -> str:
    """What crafted the robust rows' inputs, in words (the attack, its budget, its steps)."""
    seen = {(r.robust.attack, r.robust.epsilon, r.robust.steps, r.robust.step_size or 0.0)
            for r in report.results if r.robust is not None}
    parts = [f"{catalogue.ATTACKS.label(a)} at epsilon {e * 255:.3g}/255, {n} steps"
             + (f" of {s * 255:.3g}/255" if s else "") for a, e, n, s in sorted(seen)]
    return ("robust agr: agreement on test inputs crafted against the stitched model by "
            + "; ".join(parts) + "; transfer: how often those inputs fool the back model")


# ------------------------------------------------------------------ figures in words


def fmt(value: float | None, digits: int = 3) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:.{digits}f}"


def fmt_signed(value: float | None, digits: int = 3) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:+.{digits}f}"


def fmt_ci(ci: Sequence[float] | None, digits: int = 3) -> str:
    if not ci:
        return ""
    return f"[{fmt(ci[0], digits)}, {fmt(ci[1], digits)}]"


def fmt_triple(values: Sequence[float]) -> str:
    return "(" + ", ".join(f"{v:.3g}" for v in values) + ")"


# ------------------------------------------------------------------ row figures


def figure_columns(rows: Iterable[FigureRow]) -> list[catalogue.RowFigureEntry]:
    """One column per figure some of the rows carry, in catalogue order (ROW_FIGURES); a
    figure of a newer service that this client does not know comes last, under its name."""
    carried = catalogue.ROW_FIGURES.ordered(name for row in rows for name in row.figures)
    return [catalogue.ROW_FIGURES.get(name) or catalogue.RowFigureEntry(
        name, name, "a figure this client does not know", column=name) for name in carried]


def figure_header(column: catalogue.RowFigureEntry) -> str:
    return column.column or column.label


def figure_text(row: FigureRow, column: catalogue.RowFigureEntry) -> str:
    """The row's figure in its column's digits; "n/a" where the row does not carry it."""
    return fmt(row.value(column.name), column.digits)


def figure_glossary(columns: Sequence[catalogue.RowFigureEntry]) -> str:
    """What each column means, in the catalogue's words: "hard agr: the share of ...; ..."."""
    return "; ".join(f"{figure_header(c)}: {c.description}" for c in columns) + "."


def figure_records(row: FigureRow) -> dict[str, float | None]:
    """The row's figures as flat columns: name, name_ci_low, name_ci_high (a data frame's)."""
    out: dict[str, float | None] = {}
    for name, figure in row.figures.items():
        low, high = figure.ci if figure.ci is not None else (None, None)
        out.update({name: figure.value, f"{name}_ci_low": low, f"{name}_ci_high": high})
    return out


# ------------------------------------------------------------------ what the report holds, in order


def stitch_order(front_layer: str, back_layer: str, direction: Direction) -> tuple[str, str]:
    """(layer the stitch reads from, layer it feeds into). Rows name layers by model (the
    spec's front and back), so back → front stitches the back model's layer into the front
    model's."""
    if direction == "front_to_back":
        return front_layer, back_layer
    return back_layer, front_layer


def stitch_label(row: ResultRow, arrow: str = "→") -> str:
    """The stitch in reading order: "layer it reads from → layer it feeds into"."""
    source, target = stitch_order(row.front_layer, row.back_layer, row.direction)
    return f"{source} {arrow} {target}"


def directions(report: Report) -> list[Direction]:
    present = {r.direction for r in report.results}
    return [d for d in DIRECTIONS if d in present]


def protocols(rows: Iterable[ResultRow]) -> list[Protocol]:
    return catalogue.PROTOCOLS.ordered(r.protocol for r in rows)


def objectives(rows: Iterable[ResultRow], direction: Direction) -> list[Objective]:
    return catalogue.OBJECTIVES.ordered(r.objective for r in rows if r.direction == direction)


def stitch_points(rows: Iterable[ResultRow], direction: Direction) -> list[tuple[str, str]]:
    """The spec's layer pairs (front model's layer, back model's layer) of one direction, in
    the order the engine reports them: the depth order."""
    pairs = ((r.front_layer, r.back_layer) for r in rows if r.direction == direction)
    return list(dict.fromkeys(pairs))


def count_points(report: Report) -> int:
    return max((len(stitch_points(report.results, d)) for d in directions(report)), default=0)


def ordered(rows: Sequence[ResultRow]) -> list[ResultRow]:
    """Direction, then depth (report order of the stitch pairs), then objective, protocol, so
    the standard and invariance-aware lines of one stitch point sit together."""
    depth: dict[tuple[str, str, str], int] = {}
    for r in rows:
        depth.setdefault((r.direction, r.front_layer, r.back_layer), len(depth))
    return sorted(rows, key=lambda r: (
        DIRECTIONS.index(r.direction), depth[(r.direction, r.front_layer, r.back_layer)],
        catalogue.OBJECTIVES.position(r.objective), catalogue.PROTOCOLS.position(r.protocol),
        -1 if r.alpha is None else r.alpha,
    ))


def iri_rows(report: Report, direction: Direction) -> list[ResultRow]:
    """One row per source layer: IRIs depend only on the model in front position and the
    layer the stitch reads from."""
    seen: dict[str, ResultRow] = {}
    for r in report.results:
        if r.direction == direction and r.iri is not None:
            seen.setdefault(stitch_order(r.front_layer, r.back_layer, direction)[0], r)
    return list(seen.values())


def iri_method(report: Report) -> str | None:
    """How the report's IRIs were made, in words: "paper (the paper's code)", with the fields
    the spec changed ("paper (steps 50) (the paper's code)"); None when no figure used IRIs
    or the report predates named methods."""
    settings = report.iri_settings
    if settings is not None:
        return (f"{settings.described(report.resolution)} "
                f"({catalogue.IRI_METHODS.label(settings.method)})")
    named = next((r.iri.method for r in report.results if r.iri and r.iri.method), None)
    return f"{named} ({catalogue.IRI_METHODS.label(named)})" if named else None


def model_names(report: Report) -> tuple[str, str]:
    front, back = report.front.arch, report.back.arch
    if front == back:
        return f"{front} (front)", f"{back} (back)"
    return front, back


def end_model(report: Report, direction: Direction) -> str:
    """The model a stitched network of this direction ends in."""
    return model_names(report)[1 if direction == "front_to_back" else 0]


def direction_title(report: Report, direction: Direction) -> str:
    front, back = model_names(report)
    first, second = (front, back) if direction == "front_to_back" else (back, front)
    return f"{DIRECTION_LABEL[direction]}: {first} up to the stitch, then {second}"


def dataset_name(report: Report) -> str:
    ds = report.spec.dataset
    spec_name = ds if isinstance(ds, str) else ds.path
    return str(report.dataset.get("name") or report.dataset.get("id") or spec_name)


def models(report: Report) -> list[tuple[str, ModelSummary]]:
    return [("front", report.front), ("back", report.back)]


# ------------------------------------------------------------------ output kinds

OUTPUT_SOURCE_LABEL: dict[str, str] = {
    "spec": "set in the spec", "metadata": "from the checkpoint's metadata",
    "detected": "detected from its output",
}


def output_text(m: ModelSummary) -> str:
    """"image (from the checkpoint's metadata)": what a model outputs and how that is known."""
    return (f"{catalogue.OUTPUT_KINDS.label(m.output)} "
            f"({OUTPUT_SOURCE_LABEL.get(m.output_source, m.output_source)})")


def output_kinds(report: Report) -> list[str]:
    """The back models' output kinds among the rows, in catalogue order."""
    return catalogue.OUTPUT_KINDS.ordered(r.output for r in [*report.results,
                                                             *report.controls])


def classless(report: Report) -> bool:
    """Whether some row's back model has no classes (its accuracy columns are empty)."""
    kinds = catalogue.OUTPUT_KINDS
    return any(not kinds[k].classes for k in output_kinds(report) if k in kinds)


def agreement_name(report: Report) -> str:
    """What the agreement axis measures: "agreement", or the one non-logits kind's figure
    ("cosine similarity", "1 - relative error")."""
    kinds = [catalogue.OUTPUT_KINDS.get(k) for k in output_kinds(report)]
    if len(kinds) == 1 and kinds[0] is not None and not kinds[0].classes:
        return kinds[0].agreement
    return "agreement"


def output_readings(report: Report) -> list[str]:
    """For each non-logits output kind in the report: what agreement and hard agreement are
    (a sentence each, from the catalogue), so a figure is not read as a softmax agreement."""
    kinds = catalogue.OUTPUT_KINDS
    return [f"{kinds[k].label} outputs: agreement is the {kinds[k].agreement}, hard agreement "
            f"the {kinds[k].hard_agreement}"
            + (", with the PSNR beside them" if kinds[k].psnr else "")
            + f" ({kinds[k].description})"
            for k in output_kinds(report) if k in kinds and not kinds[k].classes]


# ------------------------------------------------------------------ the engine's summary


@dataclass(frozen=True)
class SummaryLine:
    """Mean agreement over stitch points of one direction and objective under the drop's two
    protocols (catalogue.drop_protocols), and the drop between them (the engine's DropRow)."""

    direction: Direction
    objective: Objective
    baseline: float | None
    iri: float | None
    drop: float | None


def _mean_drops(report: Report) -> dict[tuple[str, str], DropRow]:
    return {(d.direction, d.objective): d for d in report.summary.drops if d.front_layer is None}


def summary_lines(report: Report) -> list[SummaryLine]:
    by_key: dict[tuple[Direction, Objective], dict[str, float]] = {}
    for row in report.summary.rows:
        by_key.setdefault((row.direction, row.objective), {})[row.protocol] = row.mean_agreement
    drops = _mean_drops(report)
    baseline, iri = catalogue.drop_protocols()
    out = []
    for (direction, objective), means in by_key.items():
        drop = drops.get((direction, objective))
        out.append(SummaryLine(direction, objective, means.get(baseline), means.get(iri),
                               drop.drop if drop else None))
    return out


def mean_drop(report: Report, direction: Direction, objective: Objective) -> float | None:
    drop = _mean_drops(report).get((direction, objective))
    return drop.drop if drop else None


def point_drops(report: Report) -> dict[tuple[str, str, str, str], float]:
    """(direction, objective, front layer, back layer) -> drop at that stitch point."""
    return {(d.direction, d.objective, d.front_layer, d.back_layer or ""): d.drop
            for d in report.summary.drops if d.front_layer is not None}


@dataclass(frozen=True)
class ComparedFigure:
    """One of the per-direction figures whose minimum is the similarity."""

    protocol: Protocol
    direction: Direction
    mean_agreement: float
    rows: list[ResultRow]


def compared_figures(report: Report) -> list[ComparedFigure]:
    s = report.summary
    means = s.by_direction.get(s.similarity_protocol, {})
    return [
        ComparedFigure(s.similarity_protocol, d, value,  # type: ignore[arg-type]
                       [r for r in report.results
                        if r.protocol == s.similarity_protocol and r.direction == d])
        for d, value in means.items()
    ]


def overall_line(report: Report, label: Callable[[str], str] = str) -> str:
    """Per protocol, the weaker direction's mean agreement: "standard 0.951, ..."."""
    return ", ".join(f"{label(p)} {fmt(v)}" for p, v in report.summary.by_protocol.items())


# ------------------------------------------------------------------ the verdict


@dataclass(frozen=True)
class VerdictView:
    word: str
    """The JSON verdict, or "none"."""
    sentence: str
    reason: str | None
    """Why there is no verdict although a threshold was given (the engine's words)."""
    caveats: list[str]


def verdict_view(report: Report) -> VerdictView:
    s = report.summary
    meaning = (
        "Similarity is the stitched models' mean agreement with the model they end in, over the "
        f"stitch points, under the {catalogue.PROTOCOLS.label(s.similarity_protocol)} "
        "protocol, in the "
        "weaker direction."
    )
    caveats = list(report.verdict_caveats)
    if report.verdict is None:
        reason = report.verdict_reason
        why = (reason or "the spec set no threshold").rstrip(".")
        return VerdictView("none", f"No verdict: {why}. The similarity is {s.similarity:.3f}. "
                           + meaning, reason, caveats)
    threshold = s.threshold if s.threshold is not None else float("nan")
    if report.verdict == "similar":
        sentence = (f"The two models are functionally similar: their similarity, "
                    f"{s.similarity:.3f}, reaches the threshold of {threshold:.3f}. ")
    else:
        sentence = (f"The two models are functionally different: their similarity, "
                    f"{s.similarity:.3f}, is below the threshold of {threshold:.3f}. ")
    return VerdictView(report.verdict, sentence + meaning, None, caveats)


def no_verdict_despite_threshold(report: Report) -> bool:
    """A threshold was given, but the engine withheld the verdict and said why."""
    return report.verdict is None and report.verdict_reason is not None


# ------------------------------------------------------------------ the models' inputs


def near_chance_messages(report: Report) -> list[str]:
    """The engine's warning for each model at chance, as it wrote it."""
    return [m.chance_warning for _, m in models(report) if m.chance_warning]


def warnings(report: Report) -> list[str]:
    """Every warning of the report: the models' at chance first, then the job's."""
    return [*near_chance_messages(report), *report.warnings]


def preprocess_text(p: PreprocessInfo) -> str:
    """One line: what was used and how it was chosen."""
    text = (f"{p.name} at {p.input_size}px, mean {fmt_triple(p.mean)}, std "
            f"{fmt_triple(p.std)}, {PREPROCESS_SOURCE_LABEL.get(p.source, p.source)}")
    if p.candidates:
        tried = ", ".join(
            f"{c.name} {fmt(c.accuracy)}"
            + (f" / stats {fmt(c.stats_distance)}" if c.stats_distance is not None else "")
            for c in p.candidates)
        samples = f" on {p.samples} samples" if p.samples else ""
        text += f" (accuracy{samples}: {tried})"
    return text + (f"; {p.note}" if p.note else "")


# ------------------------------------------------------------------ similarity measures

MEASURE_GAP_MEANING = (
    "A measure compares the two models' activations at a stitch pair directly, with nothing "
    "fitted: on real test images, and on IRIs (inputs the front model cannot tell apart from "
    "real ones at its stitch point). A measure that is high on real inputs but lower on IRIs "
    "says the representations align on natural images without the end model sharing the "
    "front model's invariances: the real-input figure overstates the similarity, as the "
    "standard stitching protocol does. A small gap says the alignment also holds on inputs "
    "built to expose invariances. Read each figure against the identity ceiling (1) and the "
    "clustered-noise floor (what class clusters alone score)."
)


def measures_of(report: Report) -> list[Measure]:
    return catalogue.MEASURES.ordered(m.measure for m in report.measures)


def ordered_measures(rows: Sequence[MeasureRow]) -> list[MeasureRow]:
    """Direction, depth (report order of the pairs), measure, input kind, then sigma."""
    depth: dict[tuple[str, str, str], int] = {}
    for r in rows:
        depth.setdefault((r.direction, r.front_layer, r.back_layer), len(depth))
    return sorted(rows, key=lambda r: (
        DIRECTIONS.index(r.direction), depth[(r.direction, r.front_layer, r.back_layer)],
        catalogue.MEASURES.position(r.measure), catalogue.MEASURE_INPUTS.position(r.input),
        r.control or "",
        r.sigma or 0.0,
    ))


def measure_stitch_label(row: MeasureRow, arrow: str = "→") -> str:
    source, target = stitch_order(row.front_layer, row.back_layer, row.direction)
    return f"{source} {arrow} {target}"


def measure_summary(report: Report) -> list[MeasureSummaryRow]:
    return sorted(report.summary.measures, key=lambda m: (
        DIRECTIONS.index(m.direction), catalogue.MEASURES.position(m.measure)))


def measure_sentence(report: Report) -> str:
    """What the measures found, in words: per direction and measure, real against IRI means
    over stitch points, and the weaker conditional when both directions ran."""
    parts = [
        f"{DIRECTION_LABEL[m.direction]}: {catalogue.MEASURES.label(m.measure)} {fmt(m.real)} "
        "on real "
        f"inputs, {fmt(m.iri)} on IRIs (gap {fmt_signed(m.gap)})"
        for m in measure_summary(report)
    ]
    if not parts:
        return ""
    text = "Mean over stitch points: " + "; ".join(parts) + "."
    weaker = report.summary.measure_weaker_direction
    if weaker:
        text += " Weaker conditional on IRIs: " + ", ".join(
            f"{catalogue.MEASURES.label(m)} {DIRECTION_LABEL[d]}" for m, d in weaker.items()
        ) + "."
    return text


@dataclass(frozen=True)
class ProbeLine:
    """One probe set in a line: the two models alone on it, their endpoint agreement (the
    weaker direction) and the stitches' mean agreement per protocol (each direction's mean,
    the weaker one), as every rendering shows it."""

    name: str
    samples: int
    reference_accuracy: float | None
    candidate_accuracy: float | None
    endpoint: float | None
    by_protocol: dict[str, float]


def probe_lines(report: Report) -> list[ProbeLine]:
    out = []
    for p in report.probes:
        ends = [u.agreement for u in p.unstitched_agreement]
        means: dict[str, dict[str, list[float]]] = {}
        for r in p.results:
            means.setdefault(r.protocol, {}).setdefault(r.direction, []).append(r.agreement)
        by_protocol = {proto: min(sum(v) / len(v) for v in per.values())
                       for proto, per in means.items()}
        out.append(ProbeLine(p.name, int(p.dataset.get("n_test", 0)), p.front_accuracy,
                             p.back_accuracy, min(ends) if ends else None, by_protocol))
    return out


def probe_text(line: ProbeLine) -> str:
    """The probe's line in words, for the JUnit output and the Markdown."""
    stitched = ", ".join(f"{catalogue.PROTOCOLS.label(k)} {v:.3f}"
                         for k, v in line.by_protocol.items())
    return (f"probe {line.name} ({line.samples} images): accuracy reference "
            f"{fmt(line.reference_accuracy)}, candidate {fmt(line.candidate_accuracy)}; "
            f"endpoint agreement {fmt(line.endpoint)}; mean stitched agreement {stitched}")
