"""The HTML pages without a browser: structure, escaping, self-containment, edge cases."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from stitchsim.models import ErrorInfo, JobStatus, Progress, Report, Spec
from stitchsim_service.gateway.pages import (
    REFRESH_SECONDS,
    render_job_page,
    render_progress_page,
    render_report_page,
)
from stitchsim_service.gateway.pages.plots import control_band

from tests.report.pagecheck import expected_series
from tests.report.sample import make_sample_report, summarise

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = '<img src=x onerror=alert(1)>"\'&$x$'


@pytest.fixture(scope="module")
def page() -> str:
    return render_report_page(make_sample_report(warnings=["IRIs at layer3 did not converge"]))


# A page costs seconds of matplotlib on two cores: the tests that read the default sample's
# page share one rendering. Rendering is deterministic (test_report_round_trips_through_json).
@pytest.fixture(scope="module")
def sample() -> Report:
    return make_sample_report()


@pytest.fixture(scope="module")
def sample_html(sample: Report) -> str:
    return render_report_page(sample)


def _ids(html: str, prefix: str) -> list[str]:
    return re.findall(rf'id="({prefix}[^"]*)"', html)


def test_one_series_per_direction_objective_and_protocol(page: str) -> None:
    report = make_sample_report()
    expected = expected_series(report.model_dump(mode="json"))
    assert sorted(_ids(page, "series-")) == sorted(s for p in expected.values() for s in p)
    for plot_id, series in expected.items():
        assert f'id="{plot_id}" data-series="{len(series)}"' in page
    assert len(_ids(page, "ref-identity-")) == 4 and len(_ids(page, "ref-clustered_noise-")) == 8


def test_page_is_self_contained(page: str) -> None:
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page and "<link" not in page and "<img" not in page
    assert not re.search(r'(src|href)="(https?:)?//', page)
    assert all(ref.startswith("#") for ref in re.findall(r"url\(([^)]*)\)", page))
    assert "<?xml" not in page and "<!DOCTYPE svg" not in page
    assert "default-src 'none'" in page
    assert page.count("<svg") == 4  # agreement and IRI plots, both directions


def test_plots_are_accessible(page: str) -> None:
    for svg in re.findall(r"<svg [^>]*>", page):
        assert 'role="img"' in svg and "aria-labelledby=" in svg
    titles = re.findall(r'<title id="(plot-[^"]+)-title">([^<]+)</title>', page)
    assert [t[0] for t in titles] == ["plot-agreement-front_to_back",
                                      "plot-agreement-back_to_front",
                                      "plot-iri-front_to_back", "plot-iri-back_to_front"]
    # Axis labels as real text, naming the model the stitched network ends in.
    assert "agreement with resnet26, 0–1" in page and "agreement with resnet18, 0–1" in page
    assert "stitch point: from layer → into layer" in page


def test_verdict_in_plain_words(page: str) -> None:
    assert 'data-verdict="dissimilar"' in page
    assert '<span class="word" id="verdict-word">dissimilar</span>' in page
    assert "functionally different" in page and "below the threshold of 0.750" in page
    assert "IRIs at layer3 did not converge" in page
    similar = render_report_page(make_sample_report(threshold=0.7))
    assert 'data-verdict="similar"' in similar and "reaches the threshold of 0.700" in similar
    unset = render_report_page(make_sample_report(threshold=None))
    assert 'data-verdict="none"' in unset and "No verdict: the spec set no threshold" in unset


def test_user_strings_are_escaped() -> None:
    report = make_sample_report(front_layers=(HOSTILE, "b", "c"), warnings=[HOSTILE])
    report.front.arch = "<b>arch</b>"
    report.dataset["name"] = "<i>data</i>"
    html = render_report_page(report)
    assert "<img" not in html and "<b>arch" not in html and "<i>data" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "$x$" in html  # shown as typed, not as math text


def test_back_to_front_reads_from_the_back_model() -> None:
    html = render_report_page(make_sample_report(front_layers=("f1", "f2", "f3"),
                                                 back_layers=("b1", "b2", "b3")))
    results = html[html.index('id="results-table"'):]
    assert "<code>f1</code> → <code>b1</code>" in results
    assert "<code>b1</code> → <code>f1</code>" in results
    svg = html[html.index('id="plot-agreement-back_to_front"'):]
    assert "0: b1" in svg[: svg.index("</svg>")]  # tick labels in stitch order


def test_reference_bands_follow_the_layer_pair() -> None:
    report = make_sample_report()
    points = [("layer1", "layer1"), ("layer2", "layer2"), ("layer3", "layer3")]
    noise = control_band(report.controls, "clustered_noise", "front_to_back", "slm", points)
    assert noise is not None
    assert noise.lo == pytest.approx([0.35, 0.30, 0.25]) and noise.hi == pytest.approx(
        [0.55, 0.50, 0.45])
    assert "σ 0.1, 0.3" in noise.label
    # A control reported once, not per layer, still draws a (flat) band.
    single = [report.controls[0].model_copy(update={"back_layer": "elsewhere"})]
    flat = control_band(single, "identity", "back_to_front", "fula", points)
    assert flat is not None and len(set(flat.lo)) == 1


def test_standard_protocol_only_without_controls() -> None:
    full = make_sample_report()
    rows = [r for r in full.results
            if r.protocol == "standard" and r.direction == "front_to_back"]
    spec = full.spec.model_copy(update={"protocols": ["standard"], "directions": "front_to_back",
                                        "controls": [], "threshold": 0.9})
    report = full.model_copy(update={"spec": spec, "results": rows, "controls": [],
                                     "summary": summarise(spec, rows)})
    html = render_report_page(report)
    # Two objectives: a standard line and the unstitched endpoint in each panel.
    assert len(_ids(html, "series-agreement-")) == 2
    assert len(_ids(html, "series-unstitched-")) == 2
    assert "plot-iri" not in html and "ref-identity" not in html
    assert "Only the standard protocol ran" in html and "No controls ran" in html


def test_many_stitch_points_render() -> None:
    layers = tuple(f"blocks.{i}" for i in range(24))
    html = render_report_page(make_sample_report(front_layers=layers, back_layers=layers))
    assert len(_ids(html, "series-agreement-")) == 8


def _job(state: str, **extra: object) -> JobStatus:
    spec = Spec.model_validate({"front": {"checkpoint": "sha256:" + "a" * 64, "arch": "resnet18"},
                                "back": {"checkpoint": "sha256:" + "b" * 64}})
    return JobStatus.model_validate({
        "id": "job_42", "state": state, "spec": spec,
        "created_at": datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc), **extra,
    })


def test_progress_page_refreshes_while_running() -> None:
    job = _job("running", progress=Progress(stage="iri", done=30, total=120, eta_s=200.0),
               started_at=datetime(2025, 1, 2, 3, 5, tzinfo=timezone.utc))
    html = render_progress_page(job)
    assert f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">' in html
    assert '<progress id="progress" value="30" max="120"' in html
    assert "30 of 120 (25%)" in html and "about 3 min 20 s" in html
    assert 'id="stage">iri<' in html and "resnet18" in html and "from checkpoint metadata" in html
    queued = render_progress_page(_job("queued"))
    assert 'http-equiv="refresh"' in queued and "not known yet" in queued
    assert '<progress id="progress" aria-label' in queued  # indeterminate until a total exists


def test_progress_page_stops_refreshing_when_done() -> None:
    failed = render_progress_page(_job("failed", error=ErrorInfo(code="oom", message=HOSTILE)))
    assert 'http-equiv="refresh"' not in failed
    assert "&lt;img src=x" in failed and "<img" not in failed
    done = render_progress_page(_job("succeeded"))
    assert 'http-equiv="refresh"' not in done and 'href="report.html"' in done


def test_rendering_needs_no_torch(tmp_path: Path) -> None:
    # The gateway image has no torch: importing and rendering must not pull it (or the worker).
    report = tmp_path / "report.json"
    report.write_text(make_sample_report().model_dump_json())
    code = (
        "import sys, types, importlib.util\n"
        f"sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'client')!r}]\n"
        "if importlib.util.find_spec('stitchsim_service') is None:\n"
        "    m = types.ModuleType('stitchsim_service')\n"
        f"    m.__path__ = [{str(ROOT / 'service')!r}]\n"
        "    sys.modules['stitchsim_service'] = m\n"
        "from stitchsim.models import Report\n"
        "from stitchsim_service.gateway.pages import render_report_page\n"
        f"render_report_page(Report.model_validate_json(open({str(report)!r}).read()))\n"
        "bad = {'torch', 'timm', 'stitchsim_worker', 'celery'} & set(sys.modules)\n"
        "assert not bad, bad\n"
    )
    env = {**os.environ, "MPLBACKEND": ""}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=ROOT, timeout=120)


def test_report_round_trips_through_json(sample: Report, sample_html: str) -> None:
    # The service renders what it stored: a report parsed back from JSON renders the same.
    again = Report.model_validate_json(sample.model_dump_json())
    assert render_report_page(again) == sample_html


def test_every_plot_has_the_same_width() -> None:
    # Text must come out the same size in every figure, also with a single objective and a
    # single stitch point (a narrow figure used to be blown up and clipped).
    full = make_sample_report(front_layers=("layer2",), back_layers=("layer2",))
    rows = [r for r in full.results if r.objective == "slm"]
    spec = full.spec.model_copy(update={"objectives": ["slm"], "threshold": 0.5})
    one = full.model_copy(update={"spec": spec, "results": rows,
                                  "summary": summarise(spec, rows)})
    widths = set(re.findall(r'<svg [^>]*width="([^"]+)"', render_report_page(one)))
    widths |= set(re.findall(r'<svg [^>]*width="([^"]+)"', render_report_page(full)))
    assert len(widths) == 1, widths


def test_job_page_is_the_report_once_there_is_one(sample: Report, sample_html: str) -> None:
    assert render_job_page(_job("succeeded"), sample) == sample_html
    running = _job("running")
    assert render_job_page(running, None) == render_progress_page(running)


def test_a_model_at_chance_gets_a_loud_warning_and_no_verdict(sample_html: str) -> None:
    report = make_sample_report(near_chance=True)
    html = render_report_page(report)
    alert = html[html.index('id="near-chance"'):]
    alert = alert[: alert.index("</section>")]
    assert 'role="alert"' in alert
    # The engine's warning, written once (in the model's summary) and shown as written.
    warning = report.back.chance_warning
    assert warning and warning.startswith("THE BACK MODEL IS AT CHANCE: resnet26 scores 0.098")
    assert alert.count("AT CHANCE") == 1 and html.count("THE BACK MODEL IS AT CHANCE") == 1
    assert "scores 0.098 on digits (chance 0.100)" in alert
    assert 'data-verdict="none"' in html
    assert "No verdict: the back model (resnet26) scores at chance on this dataset" in html
    assert "0.098 (at chance)" in html[html.index('id="models-table"'):]
    # A healthy report has no such box.
    assert 'id="near-chance"' not in sample_html


def test_how_each_model_input_was_prepared(sample_html: str) -> None:
    html = sample_html
    table = html[html.index('id="preprocess-table"'):]
    table = table[: table.index("</table>")]
    assert "How each model's input was prepared" in html
    assert "<td>front</td><td>timm</td>" in table and "measured on samples" in table
    assert "<td>back</td><td>inception</td>" in table and "from the checkpoint&#x27;s" in table
    candidates = html[html.index('id="preprocess-front-candidates"'):]
    candidates = candidates[: candidates.index("</table>")]
    assert candidates.count("<tr>") == 4  # header and the three candidates
    assert "timm (chosen)" in candidates and "0.734" in candidates
    assert "on 256 labelled samples" in html
    assert 'id="preprocess-back-candidates"' not in html  # taken from metadata: none tried


def test_caveats_stand_under_the_verdict(sample_html: str) -> None:
    caveat = "the invariance-aware figure rests on unconverged IRIs at layer3"
    html = render_report_page(make_sample_report(caveats=[caveat]))
    verdict = html[html.index('id="verdict"'):]
    verdict = verdict[: verdict.index("</section>")]
    assert 'id="verdict-caveats"' in verdict and caveat in verdict
    # The engine's own, from the sample's unconverged deepest IRIs.
    engine = sample_html
    assert ("rests on IRIs (iri.method paper) that did not converge at back_to_front "
            "layer3-&gt;layer3") in engine
    assert "rests on IRIs made by iri.method paper (the paper&#x27;s code)" in engine
    assert 'id="verdict-caveats"' not in render_report_page(make_sample_report(caveats=[]))


def test_drops_and_similarity_are_read_from_the_report() -> None:
    # The page shows the engine's figures; it computes none of its own.
    report = make_sample_report()
    report.summary.drops = [d.model_copy(update={"drop": 0.5}) for d in report.summary.drops]
    report.summary.similarity = 0.4321
    html = render_report_page(report)
    summary = html[html.index('id="summary-table"'):]
    summary = summary[: summary.index("</table>")]
    assert summary.count("<td class=\"num\">0.500</td>") == 4  # directions x objectives
    assert "mean drop +0.500" in html
    assert "0.432" in html[html.index('id="verdict-text"'):]
    results = html[html.index('id="results-table"'):]
    assert results.count(">0.500</td>") == 12  # once per stitch point and objective


def test_the_iri_section_names_the_method_and_the_pixel_distances(sample: Report,
                                                                  sample_html: str) -> None:
    report = sample
    html = sample_html
    section = html[html.index('<section id="iri">'):]
    section = section[:section.index("</section>")]
    assert "IRI method: <code>paper (the paper&#x27;s code)</code>" in section \
        or "IRI method: <code>paper (the paper's code)</code>" in section
    assert "pixel rms" in section and "pixel median" in section
    first = next(r.iri for r in report.results if r.iri is not None)
    assert f"{first.pixel_rms:.3f}" in section
    # A report from before the methods were named shows dashes, not an error.
    old = report.model_copy(update={"results": [
        r.model_copy(update={"iri": r.iri.model_copy(update={
            "method": None, "pixel_rms": None, "pixel_median": None})}) if r.iri else r
        for r in report.results]})
    assert "IRI method" not in render_report_page(old).split('<section id="iri">')[1]
