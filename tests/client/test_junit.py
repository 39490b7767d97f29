"""JUnit XML: parses, one test case per figure compared with the threshold, counts agree."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from stitchsim.junit import compared_figures, error_to_junit, report_to_junit

from tests.client.reports import make_report

A = "sha256:" + "a" * 64
B = "sha256:" + "b" * 64
SPEC = {
    "front": {"checkpoint": A},
    "back": {"checkpoint": B},
    "layers": [{"front": "layer1", "back": "layer1"}, {"front": "layer2", "back": "layer2"}],
    "objectives": ["slm", "fula"],
    "threshold": 0.8,
}


def parse(text: str) -> ET.Element:
    assert text.startswith('<?xml version="1.0" encoding="UTF-8"?>')
    root = ET.fromstring(text.encode())
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert len(suites) == 1
    suite = suites[0]
    cases = suite.findall("testcase")
    # The counts a CI tool shows must match the elements.
    assert int(suite.get("tests")) == len(cases) == int(root.get("tests"))
    failures = sum(1 for c in cases if c.find("failure") is not None)
    errors = sum(1 for c in cases if c.find("error") is not None)
    assert int(suite.get("failures")) == failures == int(root.get("failures"))
    assert int(suite.get("errors")) == errors
    assert suite.get("skipped") == "0"
    for case in cases:
        assert case.get("classname") and case.get("name")
        float(case.get("time"))
    float(suite.get("time"))
    return suite


def test_one_case_per_compared_figure_with_failures_below_threshold() -> None:
    report = make_report(
        SPEC,
        {
            ("standard", "front_to_back"): 0.97,
            ("standard", "back_to_front"): 0.96,
            ("invariance_aware", "front_to_back"): 0.61,
            ("invariance_aware", "back_to_front"): 0.88,
        },
    )
    suite = parse(report_to_junit(report, time_s=12.5))
    cases = suite.findall("testcase")

    # invariance-aware ran, so its per-direction means are what was compared.
    figures = compared_figures(report)
    assert len(cases) == len(figures) == 2
    assert min(f.mean_agreement for f in figures) == pytest.approx(report.summary.similarity)
    assert [(c.get("classname"), c.get("name")) for c in cases] == [
        ("stitchsim.invariance_aware", "front_to_back mean agreement"),
        ("stitchsim.invariance_aware", "back_to_front mean agreement"),
    ]
    failure = cases[0].find("failure")
    assert failure is not None and cases[1].find("failure") is None
    assert failure.get("message") == (
        "mean agreement 0.6100 < threshold 0.8000 (invariance_aware, front_to_back)"
    )

    # Each case breaks its figure down by objective and stitch point.
    out = cases[0].find("system-out").text
    assert out.startswith("mean agreement 0.6100 (threshold 0.8000)\n")
    assert "slm: mean agreement 0.6100" in out and "fula: mean agreement 0.6100" in out
    assert out.count(" -> ") == 4 and "slm layer1 -> layer1: agreement 0.6000" in out
    assert suite.get("time") == "12.500"
    assert {c.get("time") for c in cases} == {"6.000"}  # 4 stitch runs at 1.5 s

    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["similarity"] == "0.6100"
    assert props["verdict"] == "dissimilar"
    assert props["similarity_protocol"] == "invariance_aware"
    assert props["mean_agreement.standard"] == "0.9600"
    assert props["front_checkpoint"] == A and props["job_id"] == "job-1"


def test_objectives_are_pooled_like_the_verdict() -> None:
    # slm at 0.70 and fula at 0.90 pool to 0.80: the figure reaches the threshold, although
    # one objective alone would not, and the service's verdict agrees.
    report = make_report(SPEC, {("invariance_aware", "front_to_back"): 0.8}, objective_spread=0.2)
    assert report.verdict == "similar"
    suite = parse(report_to_junit(report))
    assert suite.get("failures") == "0" and len(suite.findall("testcase")) == 2
    assert "slm: mean agreement 0.7000" in suite.find("testcase/system-out").text


def test_all_cases_pass_when_similar() -> None:
    report = make_report(SPEC, {})  # 0.95 everywhere
    assert report.verdict == "similar"
    suite = parse(report_to_junit(report))
    assert len(suite.findall("testcase")) == 2
    assert suite.get("failures") == "0"


def test_standard_only_compares_standard_rows() -> None:
    report = make_report(
        {**SPEC, "protocols": ["standard"], "directions": "front_to_back", "objectives": ["slm"]},
        {("standard", "front_to_back"): 0.7},
    )
    suite = parse(report_to_junit(report))
    [case] = suite.findall("testcase")
    assert case.get("classname") == "stitchsim.standard"
    assert case.find("failure") is not None


def test_a_dissimilar_verdict_never_yields_a_passing_file() -> None:
    # A service whose verdict disagrees with the per-row figures (e.g. another aggregation)
    # must still fail the JUnit file, since the exit code follows the verdict.
    report = make_report(SPEC, {})
    report.verdict = "dissimilar"
    suite = parse(report_to_junit(report))
    assert suite.get("failures") == "1"
    assert suite.findall("testcase")[-1].get("name") == "verdict"


def test_no_threshold_means_nothing_fails() -> None:
    report = make_report({**SPEC, "threshold": None}, {("invariance_aware", "front_to_back"): 0.1})
    suite = parse(report_to_junit(report))
    assert suite.get("failures") == "0" and len(suite.findall("testcase")) == 2


@pytest.mark.parametrize("kind", ["ConnectionFailed", "WaitTimeout"])
def test_errors_become_one_erroring_case(kind: str) -> None:
    suite = parse(error_to_junit("cannot reach <http://x> & co", kind=kind))
    [case] = suite.findall("testcase")
    err = case.find("error")
    assert err.get("type") == kind and err.get("message") == "cannot reach <http://x> & co"


def test_no_verdict_at_chance_is_an_error_not_a_pass_or_a_failure() -> None:
    report = make_report(SPEC, {("invariance_aware", "front_to_back"): 0.2}, near_chance="back")
    assert report.verdict is None and report.verdict_reason
    suite = parse(report_to_junit(report))
    assert suite.get("failures") == "0" and suite.get("errors") == "1"
    case = suite.findall("testcase")[-1]
    error = case.find("error")
    assert case.get("name") == "verdict" and error.get("type") == "NoVerdict"
    assert error.get("message").startswith("no verdict: the back model (test_resnet) scores at")
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["verdict_reason"] == report.verdict_reason and "verdict" not in props


def test_figures_and_caveats_come_from_the_report() -> None:
    report = make_report(SPEC, {}, caveats=["rests on unconverged IRIs"])
    report.summary.by_direction["invariance_aware"]["back_to_front"] = 0.5
    suite = parse(report_to_junit(report))
    cases = suite.findall("testcase")
    assert cases[1].find("failure").get("message").startswith("mean agreement 0.5000 < ")
    assert "caveat: rests on unconverged IRIs" in cases[0].find("system-out").text
