"""A finished report that names every entry of the catalogue as it is when it is built (an
entry a test registers at run time included): every objective under every protocol at two
stitch points (in one direction: the page's cost is its plots), every control (the one that
paints cues with every cue), every measure on every input with its ceiling and floor. The
summary is the engine's own."""

from __future__ import annotations

from stitchsim import catalogue
from stitchsim.models import MeasureRow, Report, ResultRow, Spec
from stitchsim_worker.engine.measures.summary import verdict

from tests.report.sample import _row, make_sample_report, summarise

PAIRS = (("layer1", "layer1"), ("layer3", "layer3"))
DIRECTIONS = ("front_to_back",)


def _results() -> list[ResultRow]:
    rows = []
    for direction in DIRECTIONS:
        for k, (fl, bl) in enumerate(PAIRS):
            for objective in catalogue.OBJECTIVES.names:
                for protocol in catalogue.PROTOCOLS.names:
                    row = _row(direction, k, len(PAIRS), objective, protocol, fl, bl, 0.0)
                    if catalogue.PROTOCOLS[protocol].uses_iris and row.iri is None:
                        row = row.model_copy(update={"iri": _row(
                            direction, k, len(PAIRS), objective, "invariance_aware", fl, bl,
                            0.0).iri})
                    rows.append(row)
    return rows


def _controls(results: list[ResultRow]) -> list[ResultRow]:
    rows = []
    first = [r for r in results if (r.front_layer, r.back_layer) == PAIRS[0]]
    for entry in catalogue.CONTROLS:
        cues = catalogue.CUES.names if entry.paints_cues else (None,)
        for r in first:
            for cue in cues:
                excess = {"cue": cue, "rolled_agreement": r.agreement - 0.2,
                          "excessive_agreement": 0.2} if cue else {}
                rows.append(r.model_copy(update={"control": entry.name, "iri": None,
                                                 **excess}))
    return rows


def _measures() -> tuple[list[MeasureRow], list[MeasureRow]]:
    rows, controls = [], []
    for direction in DIRECTIONS:
        for k, (fl, bl) in enumerate(PAIRS):
            for measure in catalogue.MEASURES.names:
                for j, kind in enumerate(catalogue.MEASURE_INPUTS.names):
                    common = dict(direction=direction, front_layer=fl, back_layer=bl,
                                  measure=measure, input=kind, samples=100, split="test")
                    value = 0.9 - 0.2 * j - 0.1 * k
                    rows.append(MeasureRow(**common, value=value, ci=(value - 0.02,  # type: ignore[arg-type]
                                                                      value + 0.02)))
                    for band in (c for c in catalogue.CONTROLS if c.band is not None):
                        level = 1.0 if band.name == "identity" else 0.2
                        controls.append(MeasureRow(**common, value=level,  # type: ignore[arg-type]
                                                   ci=(level - 0.01, level), control=band.name))
    return rows, controls


def report_with_every_entry() -> Report:
    base = make_sample_report()
    spec = Spec.model_validate({
        **base.spec.model_dump(),
        "objectives": list(catalogue.OBJECTIVES.names),
        "protocols": list(catalogue.PROTOCOLS.names),
        "controls": list(catalogue.CONTROLS.names),
        "measures": list(catalogue.MEASURES.names),
        "layers": [{"front": f, "back": b} for f, b in PAIRS], "directions": DIRECTIONS[0],
    })
    results = _results()
    controls = _controls(results)
    measures, measure_controls = _measures()
    summary = summarise(spec, results, controls, measures)
    return Report.model_validate({
        **base.model_dump(), "spec": spec, "results": results,
        "controls": controls, "measures": measures, "measure_controls": measure_controls,
        "summary": summary, "verdict": verdict(summary), "verdict_caveats": [],
    })
