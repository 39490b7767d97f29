"""The sections of the report page, in reading order: header, verdict, alerts and warnings,
models and how their inputs were prepared, summary, agreement plots, controls, IRI
convergence, every result, run details. Each renders the report's view (stitchsim.view)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from stitchsim import catalogue, view
from stitchsim.models import FigureRow, ModelSummary, Report, ResultRow
from stitchsim.view import (
    DIRECTION_LABEL,
    PREPROCESS_SOURCE_LABEL,
    fmt,
    fmt_ci,
    fmt_signed,
    fmt_triple,
)
from stitchsim_service.gateway.pages.html import (
    Col,
    code,
    esc,
    figure,
    plain,
    stitch_cell,
    table,
)
from stitchsim_service.gateway.pages.plots import Plot

PROTOCOLS = catalogue.PROTOCOLS


def _figure(plot: Plot, caption: str) -> str:
    return figure(plot.plot_id, plot.svg, len(plot.series), caption)


def header(report: Report) -> str:
    front, back = view.model_names(report)
    job = f"job {code(report.job_id)} · " if report.job_id else ""
    return (
        "<header><h1>Functional similarity report</h1>"
        f'<p class="sub">{esc(front)} versus {esc(back)} on {esc(view.dataset_name(report))} · '
        f"{job}stitch points: {view.count_points(report)}"
        f" · objectives: {esc(', '.join(report.spec.objectives))}</p></header>"
    )


def verdict_section(report: Report) -> str:
    v = view.verdict_view(report)
    extra = ""
    if v.caveats:
        items = "".join(f"<li>{esc(c)}</li>" for c in v.caveats)
        extra += f'<p>The verdict rests on:</p><ul id="verdict-caveats">{items}</ul>'
    baseline, iri = catalogue.drop_protocols()
    if report.summary.similarity_protocol == baseline:
        extra += (
            f"<p>Only the {esc(PROTOCOLS.label(baseline))} protocol ran. It can score networks "
            "as similar that process their inputs differently; read it against the "
            f"clustered-noise floor, or run the {esc(PROTOCOLS.label(iri))} protocol.</p>"
        )
    return (
        f'<section class="verdict {v.word}" id="verdict" data-verdict="{v.word}" '
        'aria-label="Verdict">'
        f'<p>Verdict: <span class="word" id="verdict-word">{v.word}</span></p>'
        f'<p id="verdict-text">{esc(v.sentence)}</p>{extra}</section>'
    )


def _box(attrs: str, title: str, body: str) -> str:
    return f"<section {attrs}><strong>{title}</strong>{body}</section>"


def _bullets(texts: Sequence[str]) -> str:
    # The engine may say the same thing for a result and for its control: say it once.
    return "<ul>" + "".join(f"<li>{esc(t)}</li>" for t in dict.fromkeys(texts)) + "</ul>"


def near_chance_section(report: Report) -> str:
    """A loud box per model that predicts at chance: its figures mean nothing."""
    messages = view.near_chance_messages(report)
    if not messages:
        return ""
    return _box('class="alert" id="near-chance" role="alert" aria-label="Model at chance"',
                "A model predicts at chance", "".join(f"<p>{esc(m)}</p>" for m in messages))


def warnings_section(report: Report) -> str:
    if not report.warnings:
        return ""
    return _box('class="warnings" id="warnings" aria-label="Warnings"', "Warnings",
                _bullets(report.warnings))


def notes_section(report: Report) -> str:
    """What a protocol's figures mean (cross-task compatibility is not shared meaning)."""
    if not report.notes:
        return ""
    return _box('id="notes" aria-label="Notes"', "Read with care", _bullets(report.notes))


def _preprocess_row(role: str, m: ModelSummary) -> list[str]:
    p = m.preprocess
    if p is None:
        return [role, "—", str(m.input_size), "—", "—", "not reported", ""]
    return [role, esc(p.name), str(p.input_size), esc(fmt_triple(p.mean)),
            esc(fmt_triple(p.std)), esc(PREPROCESS_SOURCE_LABEL.get(p.source, p.source)),
            esc(p.note)]


def _candidates_table(role: str, m: ModelSummary) -> str:
    p = m.preprocess
    if p is None or not p.candidates:
        return ""
    rows = [[esc(c.name) + (" (chosen)" if c.name == p.name else ""), esc(fmt_triple(c.mean)),
             esc(fmt_triple(c.std)), fmt(c.accuracy), fmt(c.stats_distance)]
            for c in p.candidates]
    labelled = any(c.accuracy is not None for c in p.candidates)
    samples = f" on {p.samples} {'labelled ' if labelled else ''}samples" if p.samples else ""
    cols = [Col("candidate"), Col("mean"), Col("std"), Col("accuracy", True),
            Col("normalisation-stats distance", True)]
    return (f"<p>{esc(role)} model: the candidates tried{esc(samples)}.</p>"
            + table(cols, rows, f"preprocess-{role}-candidates"))


def preprocess_section(report: Report) -> str:
    cols = [Col("model"), Col("preprocessing"), Col("input size", True), Col("mean"),
            Col("std"), Col("chosen"), Col("how")]
    rows = [_preprocess_row(role, m) for role, m in view.models(report)]
    candidates = "".join(_candidates_table(role, m) for role, m in view.models(report))
    return (
        "<h3>How each model's input was prepared</h3>"
        "<p>Images in [0, 1] are resized to the model's input size and normalised with its "
        "mean and std before they reach the model.</p>"
        + table(cols, rows, "preprocess-table") + candidates
    )


def models_section(report: Report) -> str:
    cols = [Col("model"), Col("architecture"), Col("checkpoint"), Col("input size", True),
            Col("output"), Col("accuracy", True), Col("CI", True), Col("chance", True),
            Col("stitch points")]
    rows = []
    for role, m in view.models(report):
        kwargs = ", ".join(f"{k}={v}" for k, v in m.arch_kwargs.items())
        arch = esc(m.arch) + (f' <span class="kw">({esc(kwargs)})</span>' if kwargs else "")
        accuracy = fmt(m.accuracy)
        if m.near_chance:
            accuracy = f'<span class="bad">{accuracy} (at chance)</span>'
        rows.append([
            role, arch, f'<span class="mono">{esc(m.checkpoint)}</span>', str(m.input_size),
            esc(view.output_text(m)), accuracy, fmt_ci(m.accuracy_ci),
            fmt(m.chance_accuracy) if m.chance_accuracy is not None else "—",
            ", ".join(code(x) for x in m.layers) or "—",
        ])
    return (
        '<section id="models"><h2>Models and data</h2>'
        "<p>Each model's own accuracy on the test split, the baseline every stitched model is "
        "compared with.</p>"
        + table(cols, rows, "models-table")
        + preprocess_section(report)
        + _dataset_table(report.dataset)
        + "</section>"
    )


def _dataset_table(dataset: dict[str, Any]) -> str:
    if not dataset:
        return ""
    rows = [[esc(k), esc(plain(v))] for k, v in dataset.items()]
    return "<h3>Dataset</h3>" + table([Col("field"), Col("value")], rows, "dataset-table")


def _legend_in_words(report: Report) -> str:
    """What each line and band of the agreement plots is, in the catalogue's styles and words."""
    parts = []
    for name in view.protocols(report.results):
        entry = PROTOCOLS.get(name)
        if entry is not None:
            parts.append(f"<strong>{esc(entry.style.in_words().capitalize())}:</strong> "
                         f"{esc(entry.label)} protocol ({esc(entry.description)}).")
    for control in catalogue.CONTROLS:
        if control.band is not None:
            parts.append(f"<strong>{esc(control.band.in_words().capitalize())}:</strong> "
                         f"{esc(control.band.label)} ({esc(control.description)}).")
    if report.unstitched_agreement:
        end = catalogue.UNSTITCHED
        parts.append(f"<strong>Black X at the deep end, dotted line across:</strong> "
                     f"{esc(end.label)} ({esc(end.description)}), with its interval.")
    baseline, iri = (esc(PROTOCOLS.label(p)) for p in catalogue.drop_protocols())
    parts.append(f"The gap between the {baseline} and the {iri} line is the functional "
                 f"difference the {baseline} protocol hides; a score near the floor says little.")
    return " ".join(parts)


def agreement_section(report: Report, plots: Sequence[Plot]) -> str:
    intro = (
        "<p>How well the stitched model's predictions agree with those of the model it ends "
        "in (the end model), at each "
        "stitch point from shallow to deep; shaded around each line: its confidence interval. "
        f"{_legend_in_words(report)}</p>"
    )
    figures = "".join(
        _figure(p, esc(view.direction_title(report, d)) + ".")
        for p, d in zip(plots, view.directions(report), strict=True)
    )
    return (f'<section id="agreement"><h2>Agreement versus depth</h2>{intro}{figures}'
            f"{_unstitched_table(report)}</section>")


def _figure_cols(columns: Sequence[catalogue.RowFigureEntry]) -> list[Col]:
    """A column per figure; the one whose interval is shown is followed by it."""
    cols = []
    for c in columns:
        cols += [Col(view.figure_header(c), True), *([Col("CI", True)] if c.interval_shown
                                                      else [])]
    return cols


def _figure_cells(row: FigureRow, columns: Sequence[catalogue.RowFigureEntry]) -> list[str]:
    cells = []
    for c in columns:
        cells += [view.figure_text(row, c),
                  *([fmt_ci(row.interval(c.name))] if c.interval_shown else [])]
    return cells


def _unstitched_table(report: Report) -> str:
    """The endpoint in every figure the rows carry, per direction."""
    if not report.unstitched_agreement:
        return ""
    columns = view.figure_columns(report.unstitched_agreement)
    cols = [Col("direction"), *_figure_cols(columns), Col("samples", True)]
    rows = [[DIRECTION_LABEL[u.direction], *_figure_cells(u, columns), str(u.samples)]
            for u in report.unstitched_agreement]
    return (f"<p>{esc(catalogue.UNSTITCHED.label.capitalize())}: "
            f"{esc(catalogue.UNSTITCHED.description)}.</p>"
            + table(cols, rows, "unstitched-table"))


def probes_section(report: Report) -> str:
    """Each probe set: the models alone and whole on it, then every stitch's figures on it."""
    lines = view.probe_lines(report)
    if not lines:
        return ""
    cols = [Col("probe"), Col("images", True), Col("reference accuracy", True),
            Col("candidate accuracy", True), Col("endpoint agreement", True),
            *[Col(f"{PROTOCOLS.label(k)} agreement", True) for k in lines[0].by_protocol]]
    rows = [[esc(p.name), str(p.samples), _maybe(p.reference_accuracy),
             _maybe(p.candidate_accuracy), _maybe(p.endpoint),
             *[fmt(v) for v in p.by_protocol.values()]] for p in lines]
    parts = [table(cols, rows, "probes-table")]
    for k, probe in enumerate(report.probes):
        columns = view.figure_columns(probe.results)
        rcols = [Col("direction"), Col("stitch point"), Col("objective"), Col("protocol"),
                 *_figure_cols(columns)]
        rrows = [[DIRECTION_LABEL[r.direction], stitch_cell(r), r.objective, _protocol_cell(r),
                  *_figure_cells(r, columns)] for r in probe.results]
        parts.append(f"<h3>Probe {esc(probe.name)}</h3>"
                     + table(rcols, rrows, f"probe-{k}-results", wide=True))
    return ('<section id="probes"><h2>Probe sets</h2><p>The same stitches, trained on the '
            "dataset as above, evaluated on each probe set: inputs where a latent shortcut "
            "would show (a cue the clean test split lacks). Endpoint agreement: the two whole "
            "models on the probe, the weaker direction; agreement per protocol: the mean over "
            "stitch points, the weaker direction.</p>" + "".join(parts) + "</section>")


def controls_section(report: Report) -> str:
    if not report.controls:
        bands = json.dumps([c.name for c in catalogue.CONTROLS if c.band is not None])
        return (
            '<section id="controls"><h2>Controls</h2><p>No controls ran. Add '
            f'<code>"controls": {esc(bands)}</code> to the spec to draw the '
            "ceiling and the floor.</p></section>"
        )
    columns = view.figure_columns(report.controls)
    cols = [Col("control"), Col("σ", True), Col("direction"), Col("stitch point"),
            Col("objective"), Col("protocol"), *_figure_cols(columns), Col("excess agr.", True)]
    rows = [
        [esc(view.control_name(c)),
         f"{c.sigma:g}" if c.sigma is not None else "", DIRECTION_LABEL[c.direction],
         stitch_cell(c), c.objective, PROTOCOLS.label(c.protocol), *_figure_cells(c, columns),
         fmt(c.excessive_agreement) if c.excessive_agreement is not None else ""]
        for c in report.controls
    ]
    return (
        '<section id="controls"><h2>Controls</h2>'
        "<p>Identity: the end model (the back model, or the front model in the back → front "
        "direction) stitched into itself at the same layer (expect agreement near 1). "
        "Clustered noise: one random centre per class plus Gaussian noise of scale σ, fed "
        "through the stitch into the end model; the agreement such a contentless input "
        "reaches is the floor for reading a standard-protocol score. Unseen cues: a class "
        "marker neither model saw is painted onto the stitch-training inputs; excess agr. is "
        "the agreement with the right markers minus with markers rolled by one class (the "
        "random-colour cue carries no class and should give about 0).</p>"
        + table(cols, rows, "controls-table", wide=True)
        + _excess_table(report)
        + "</section>"
    )


def _excess_table(report: Report) -> str:
    if not report.summary.excessive_agreement:
        return ""
    cols = [Col("direction"), Col("cue"), Col("protocol"), Col("objective"),
            Col("max excess agr.", True), Col("at layer")]
    rows = [
        [DIRECTION_LABEL[e.direction], esc(catalogue.CUES.label(e.cue)),
         PROTOCOLS.label(e.protocol), e.objective, fmt(e.max_excessive_agreement),
         code(e.front_layer)]
        for e in report.summary.excessive_agreement
    ]
    return ("<p>Excessive agreement, the maximum over stitch points (as the unseen-cue paper "
            "reports it):</p>" + table(cols, rows, "excess-table"))


def _maybe(value: float | None) -> str:
    """A figure a report from before it existed lacks: a dash."""
    return "—" if value is None else fmt(value)


def iri_section(report: Report, plots: Sequence[Plot]) -> str:
    if not plots:
        return ""
    cols = [Col("direction"), Col("from layer"), Col("start median", True),
            Col("median", True), Col("p90", True), Col("max", True), Col("converged"),
            Col("pixel rms", True), Col("pixel median", True), Col("cache"),
            Col("samples", True), Col("seconds", True)]
    rows = []
    for direction in view.directions(report):
        for r in view.iri_rows(report, direction):
            s = r.iri
            assert s is not None  # iri_rows keeps rows with stats only
            ok = '<span class="ok">yes</span>' if s.converged else '<span class="bad">no</span>'
            source = view.stitch_order(r.front_layer, r.back_layer, direction)[0]
            rows.append([DIRECTION_LABEL[direction], code(source),
                         fmt(s.start_median), fmt(s.median), fmt(s.p90), fmt(s.max), ok,
                         _maybe(s.pixel_rms), _maybe(s.pixel_median),
                         "hit" if s.cache_hit else "computed", str(s.n), fmt(s.seconds, 1)])
    caption = esc(
        "How closely the synthesised inputs (IRIs) match their source images in the front "
        "model's representation at each stitch point. If they did not converge, the "
        "invariance-aware score is not trustworthy at that point."
    )
    method = view.iri_method(report)
    made = (f"<p>IRI method: <code>{esc(method)}</code>. Pixel distances are RMS over the "
            "image in [0,1] units (1/255 is one grey level): IRIs start from noise, so they "
            "stay far from their inputs in pixels while close in features.</p>"
            if method else "")
    figures = "".join(_figure(p, caption) for p in plots)
    return (
        '<section id="iri"><h2>IRI convergence</h2>'
        f"{made}{figures}{table(cols, rows, 'iri-table')}</section>"
    )


def _protocol_cell(r: ResultRow) -> str:
    label = PROTOCOLS.label(r.protocol)
    return label if r.alpha is None else f"{label}, α = {r.alpha:g}"


def results_section(report: Report) -> str:
    columns = view.figure_columns(report.results)
    robust = view.has_robust(report)
    cols = [Col("direction"), Col("stitch point"), Col("objective"), Col("protocol"),
            *_figure_cols(columns), Col("drop", True), Col("penalty", True),
            *([Col("robust agr.", True), Col("transfer", True)] if robust else []),
            Col("train loss", True), Col("seconds", True), Col("stitch")]
    drops = view.point_drops(report)
    iri = catalogue.drop_protocols()[1]

    def drop(r: ResultRow) -> str:
        # Shown once per stitch point and objective, on its IRI protocol's row.
        value = drops.get((r.direction, r.objective, r.front_layer, r.back_layer))
        return fmt(value) if value is not None and r.protocol == iri else ""

    rows = [
        [DIRECTION_LABEL[r.direction], stitch_cell(r), r.objective, _protocol_cell(r),
         *_figure_cells(r, columns), drop(r), fmt_signed(r.stitching_penalty),
         *([view.robust_agreement(r), view.transfer_rate(r)] if robust else []),
         fmt(r.train_loss, 4), fmt(r.seconds, 1), esc(r.stitch)]
        for r in report.results
    ]
    return (
        '<section id="results"><h2>All results</h2>'
        "<p>One row per direction, stitch point, objective and protocol. Stitch point: the "
        "layer the stitch reads from → the layer it feeds into (in the back → front "
        "direction, a back-model layer into a front-model layer). Drop: standard minus "
        "invariance-aware agreement at that point. Penalty: the receiving "
        "model's accuracy minus the stitched model's. "
        + esc(view.figure_glossary(columns))
        + (" " + esc(view.robust_caption(report)).replace("robust agr:", "Robust agr.:")
           .replace("; transfer:", ". Transfer:") + "."
           if robust else "")
        + "</p>"
        + table(cols, rows, "results-table", wide=True)
        + "</section>"
    )


def details_section(report: Report) -> str:
    env = "".join(
        f'<tr><th scope="row">{esc(k)}</th><td><span class="mono">{esc(plain(v))}'
        "</span></td></tr>"
        for k, v in report.environment.items()
    )
    spec = json.dumps(report.spec.model_dump(mode="json"), indent=2)
    return (
        '<section id="details"><h2>Run details</h2>'
        f"<details><summary>Environment</summary><table>{env}</table></details>"
        f"<details><summary>Spec (every default filled in)</summary><pre>{esc(spec)}</pre>"
        "</details></section>"
    )


def summary_section(report: Report) -> str:
    baseline, iri = catalogue.drop_protocols()
    cols = [Col("direction"), Col("objective"), Col(PROTOCOLS.label(baseline), True),
            Col(PROTOCOLS.label(iri), True), Col("drop", True)]
    rows = [
        [DIRECTION_LABEL[line.direction], line.objective,
         fmt(line.baseline) if line.baseline is not None else "—",
         fmt(line.iri) if line.iri is not None else "—",
         fmt(line.drop) if line.drop is not None else "—"]
        for line in view.summary_lines(report)
    ]
    overall = esc(view.overall_line(report, PROTOCOLS.label))
    return (
        '<section id="summary"><h2>Summary</h2>'
        "<p>Mean agreement over stitch points (rAuA). The drop is "
        f"{esc(PROTOCOLS.label(baseline))} minus {esc(PROTOCOLS.label(iri))}: how much of "
        "the plain score came from features the end model does not share with the front "
        "model.</p>"
        + table(cols, rows, "summary-table")
        + f"<p>Per protocol, weaker direction: {overall}.</p></section>"
    )
