"""CI gates (issue 29): baseline drops, the warn band, per-point gates, caveats, and baselines
that do not compare, from stored reports and through `stitchsim check` against the fake
service (the real one: test_gates_e2e.py)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from stitchsim import catalogue
from stitchsim.cli import main
from stitchsim.errors import UsageError
from stitchsim.gates import (
    AUTO,
    AUTO_K,
    BaselineRefused,
    GateOptions,
    evaluate,
    refuse_unless_comparable,
    similarity_spread,
)
from stitchsim.markdown import MARKER, outcome_markdown
from stitchsim.method import method_settings, planned_differences
from stitchsim.models import Figure, IRIStats, MethodRecord, Report, ResultRow, Spec
from stitchsim.models.spec import thin_points
from stitchsim.sdk import file_sha256
from stitchsim_worker.engine.core.method import METHOD_VERSION, method_record

from tests.client.fake_service import FakeService
from tests.client.reports import make_report
from tests.client.test_cli import files  # noqa: F401  (fixture)

REF = "sha256:" + "a" * 64
OLD, NEW = "sha256:" + "b" * 64, "sha256:" + "c" * 64
DIRS = ("front_to_back", "back_to_front")


def spec(front: str = REF, back: str = NEW, **extra: Any) -> dict[str, Any]:
    return {"front": {"checkpoint": front}, "back": {"checkpoint": back}, "threshold": 0.8,
            "layers": [{"front": "layer1", "back": "layer1"},
                       {"front": "layer2", "back": "layer2"}], **extra}


def report(similarity: float, *, back: str = NEW, spread: float = 0.0, recorded: bool = True,
           **extra: Any) -> Report:
    """A report whose similarity (invariance-aware, weaker direction) is `similarity`; with
    the method the engine records."""
    made = make_report(spec(back=back, **extra),
                       {("invariance_aware", d): similarity for d in DIRS},
                       layer_spread=spread)
    if recorded:
        made = made.model_copy(update={"method": method_record(made.spec)})
    return made


# ------------------------------------------------------------------ the gates


def test_a_retrain_that_drops_003_passes_at_max_drop_005_and_warns_below() -> None:
    baseline, retrain = report(0.93, back=OLD), report(0.90)
    assert retrain.summary.similarity == pytest.approx(0.90)

    passed = evaluate(retrain, baseline, GateOptions(max_drop=0.05))
    assert passed.status == "pass" and passed.drop == pytest.approx(0.03)
    assert [g.name for g in passed.gates] == ["threshold", "max-drop"]

    warned = evaluate(retrain, baseline, GateOptions(max_drop=0.05, warn_below=0.92))
    assert warned.status == "warn"
    assert [g.status for g in warned.gates] == ["pass", "warn", "pass"]

    # The same drop fails a tighter gate, and 3.2 % fails a 2 % relative one; a fail wins
    # over a warning.
    assert evaluate(retrain, baseline, GateOptions(max_drop=0.02)).status == "fail"
    rel = evaluate(retrain, baseline, GateOptions(max_relative_drop=0.02, warn_below=0.92))
    assert rel.status == "fail"
    assert rel.gates[-1].figure == pytest.approx(0.03 / 0.93)
    # Without a baseline, a drop gate is a usage error, not a pass.
    with pytest.raises(Exception, match="need --baseline"):
        evaluate(retrain, None, GateOptions(max_drop=0.05))


def test_per_point_gates_name_the_stitch_point_that_fell() -> None:
    baseline = report(0.93, back=OLD)
    # Same similarity, but layer1 fell by 0.05 and layer2 rose by 0.05.
    moved = report(0.93, spread=0.10)
    outcome = evaluate(moved, baseline, GateOptions(max_drop=0.01, max_drop_per_point=0.03,
                                                    min_point_agreement=0.9))
    failed = {g.name for g in outcome.gates if g.status == "fail"}
    assert failed == {"point layer1->layer1 (front_to_back)",
                      "point drop layer1->layer1 (front_to_back)",
                      "point layer1->layer1 (back_to_front)",
                      "point drop layer1->layer1 (back_to_front)"}
    assert outcome.status == "fail"
    drop = next(g for g in outcome.gates if g.name == "point drop layer1->layer1 (front_to_back)")
    assert drop.figure == pytest.approx(0.05)


def test_caveats_fail_the_check_only_when_asked() -> None:
    shaky = report(0.95)
    row = next(i for i, r in enumerate(shaky.results) if r.protocol == "invariance_aware")
    results = list(shaky.results)
    results[row] = results[row].model_copy(update={"iri": IRIStats(
        start_median=1.0, median=0.4, p90=0.6, max=0.9, converged=False, cache_hit=False,
        n=100, seconds=1.0)})
    shaky = shaky.model_copy(update={"results": results, "caveats": None})
    assert evaluate(shaky, None, GateOptions()).status == "pass"
    outcome = evaluate(shaky, None, GateOptions(fail_on_caveat=True))
    assert outcome.status == "fail"
    assert [c.code for c in outcome.caveats] == ["iri_unconverged"]
    assert "median distance 0.400" in outcome.caveats[0].message

    chance = make_report(spec(), near_chance="back")
    assert [(c.code, c.where) for c in evaluate(chance, None, GateOptions()).caveats] == [
        ("near_chance", "back")]


# ------------------------------------------------------------------ baselines that do not compare


def test_a_baseline_of_another_model_or_method_is_refused_naming_the_difference() -> None:
    new = report(0.9)
    other_reference = make_report(spec(front="sha256:" + "d" * 64, back=OLD))
    with pytest.raises(BaselineRefused, match=r"reference model: baseline sha256:d+, this "
                                              r"check sha256:a+"):
        refuse_unless_comparable(other_reference, new, "file base.json")

    other_iri = report(0.93, back=OLD, iri={"steps": 50})
    with pytest.raises(BaselineRefused, match=r"iri\.steps: baseline 50, this check 200.*"
                                              r"--recompute-baseline"):
        refuse_unless_comparable(other_iri, new, "file base.json")

    older_engine = report(0.93, back=OLD)
    assert older_engine.method is not None
    older_engine = older_engine.model_copy(update={"method": MethodRecord(
        engine="2020.1", settings=older_engine.method.settings)})
    with pytest.raises(BaselineRefused, match=f"engine method version: baseline 2020.1, this "
                                              f"check {METHOD_VERSION}"):
        refuse_unless_comparable(older_engine, new, "job 7")
    # A setting that does not move the similarity (the threshold) keeps the baseline.
    refuse_unless_comparable(report(0.93, back=OLD, threshold=0.5), new, "job 8")


# ------------------------------------------------------------------ JUnit and Markdown


def test_junit_and_markdown_carry_the_warn_status() -> None:
    from stitchsim.junit import report_to_junit

    retrain, baseline = report(0.90), report(0.93, back=OLD)
    outcome = evaluate(retrain, baseline, GateOptions(max_drop=0.05, warn_below=0.92),
                       baseline_source="file base.json")
    root = ET.fromstring(report_to_junit(retrain, outcome=outcome))
    assert root.get("failures") == "0"
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["status"] == "warn" and props["baseline_similarity"] == "0.9300"
    outs = {c.get("name"): c.findtext("system-out") for c in root.iter("testcase")}
    assert outs["warn-below"].startswith("WARN: similarity 0.9000 < warn line 0.9200")
    assert outs["max-drop"].startswith("PASS: similarity 0.9000 vs baseline 0.9300")

    md = outcome_markdown(retrain, outcome, report_url="http://svc/jobs/1/report.html")
    assert md.startswith(MARKER) and "### stitchsim check: ⚠️ WARN" in md
    assert "baseline 0.9300 (file base.json), change -0.0300" in md
    assert "| warn-below | ⚠️ WARN |" in md and "[Full report](http://svc/jobs/1/report.html)" in md

    failing = evaluate(retrain, baseline, GateOptions(max_drop=0.01))
    root = ET.fromstring(report_to_junit(retrain, outcome=failing))
    assert root.get("failures") == "1"
    assert "❌ FAIL" in outcome_markdown(retrain, failing)


# ------------------------------------------------------------------ through the CLI


def _check(fake: FakeService, files: tuple[str, str], *extra: str) -> int:  # noqa: F811
    return main(["check", *files, "--url", fake.url, "--progress", "none", "-q",
                 "--layers", "layer1,layer2", *extra])


def _baseline_file(path: Path, files: tuple[str, str], similarity: float,  # noqa: F811
                   **extra: Any) -> str:
    made = make_report(spec(front=file_sha256(files[0]), back=OLD, **extra),
                       {("invariance_aware", d): similarity for d in DIRS})
    path.write_text(made.model_dump_json())
    return str(path)


def test_check_with_a_baseline_file_passes_warns_and_fails_by_exit_code(
    fake: FakeService, files: tuple[str, str], tmp_path: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake.agreement = {("invariance_aware", d): 0.90 for d in DIRS}
    base = _baseline_file(tmp_path / "base.json", files, 0.93)
    assert _check(fake, files, "--baseline", base, "--max-drop", "0.05") == 0
    out = capsys.readouterr().out
    assert "PASS: similarity 0.9000 (invariance-aware" in out
    assert "  pass: max-drop: similarity 0.9000 vs baseline 0.9300: drop +0.0300 <= 0.0500" in out

    code = _check(fake, files, "--baseline", base, "--max-drop", "0.05", "--warn-below", "0.92",
                  "--markdown", "summary.md", "--junit-xml", "junit.xml")
    assert code == 5
    assert "⚠️ WARN" in (tmp_path / "summary.md").read_text()
    assert ET.parse(tmp_path / "junit.xml").getroot().get("failures") == "0"

    assert _check(fake, files, "--baseline", base, "--max-drop", "0.02",
                  "--warn-below", "0.92") == 1
    capsys.readouterr()
    # A drop gate without a baseline: a usage error before anything is sent.
    posts = len(fake.calls("POST", "/similarity"))
    assert _check(fake, files, "--max-drop", "0.05") == 2
    assert "need --baseline" in capsys.readouterr().err
    assert len(fake.calls("POST", "/similarity")) == posts


def test_check_refuses_a_baseline_of_another_method_before_running_and_recomputes_it(
    fake: FakeService, files: tuple[str, str], tmp_path: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake.agreement = {("invariance_aware", d): 0.90 for d in DIRS}
    base = _baseline_file(tmp_path / "base.json", files, 0.93, iri={"steps": 50})
    assert _check(fake, files, "--baseline", base, "--max-drop", "0.05") == 2
    err = capsys.readouterr().err
    assert "iri.steps: baseline 50, this check 200" in err and "--recompute-baseline" in err
    assert fake.calls("POST", "/similarity") == []  # refused before any job ran

    other = _baseline_file(tmp_path / "other.json", files, 0.93)
    data = json.loads(Path(other).read_text())
    data["front"]["checkpoint"] = "sha256:" + "d" * 64
    Path(other).write_text(json.dumps(data))
    assert _check(fake, files, "--baseline", other, "--max-drop", "0.05") == 2
    assert "reference model: baseline sha256:ddd" in capsys.readouterr().err

    # Recomputed: the baseline's two models again under this check's settings, then gated.
    fake.checkpoints[OLD] = {"id": OLD, "size": 100, "n_tensors": 1}
    assert _check(fake, files, "--baseline", base, "--max-drop", "0.05",
                  "--recompute-baseline") == 0
    submitted = [json.loads(c.body) for c in fake.calls("POST", "/similarity")]
    assert [s["back"]["checkpoint"] for s in submitted] == [OLD, file_sha256(files[1])]
    assert all("iri" not in s for s in submitted)  # the check's settings: the defaults
    assert f"(recomputed from file {base})" in capsys.readouterr().out


# ------------------------------------------------------------------ --max-drop auto, budget ci


def test_max_drop_auto_is_k_times_the_baselines_own_interval() -> None:
    # make_report's rows carry 95 % intervals of +-0.01: the baseline's spread is 0.01.
    baseline = report(0.93, back=OLD)
    assert similarity_spread(baseline) == pytest.approx(0.01)
    limit = AUTO_K * 0.01
    inside, outside = report(0.93 - limit + 0.005), report(0.93 - limit - 0.005)
    passed = evaluate(inside, baseline, GateOptions(max_drop=AUTO))
    assert passed.status == "pass"
    gate = passed.gates[-1]
    assert gate.name == "max-drop" and gate.limit == pytest.approx(limit)
    assert f"(auto: {AUTO_K:g} x the baseline's interval half-width 0.0100)" in gate.message
    assert evaluate(outside, baseline, GateOptions(max_drop=AUTO)).status == "fail"
    # The spread is the baseline's, not the candidate's: a noisy candidate does not widen it.
    wide = outside.model_copy(update={"results": [
        _widened(r) for r in outside.results]})
    assert evaluate(wide, baseline, GateOptions(max_drop=AUTO)).status == "fail"


def _widened(row: ResultRow) -> ResultRow:
    """The row with its agreement's interval widened to [0, 1]."""
    wide = Figure(value=row.agreement, ci=(0.0, 1.0))
    return row.model_copy(update={"figures": {**row.figures, "agreement": wide}})


def test_the_spread_reads_the_rows_the_similarity_averages() -> None:
    made = report(0.9)
    # Widen the standard rows only: the similarity reads the invariance-aware ones.
    rows = [_widened(r) if r.protocol == "standard" else r for r in made.results]
    assert similarity_spread(made.model_copy(update={"results": rows})) == pytest.approx(0.01)
    empty = made.model_copy(update={"results": []})
    assert similarity_spread(empty) is None
    with pytest.raises(UsageError, match="give --max-drop a number"):
        evaluate(made, empty, GateOptions(max_drop=AUTO))


def test_check_max_drop_auto_through_the_cli(
    fake: FakeService, files: tuple[str, str], tmp_path: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake.agreement = {("invariance_aware", d): 0.90 for d in DIRS}
    near = _baseline_file(tmp_path / "near.json", files, 0.90 + AUTO_K * 0.01 - 0.005)
    far = _baseline_file(tmp_path / "far.json", files, 0.90 + AUTO_K * 0.01 + 0.005)
    assert _check(fake, files, "--baseline", near, "--max-drop", "auto") == 0
    assert "(auto: " in capsys.readouterr().out
    assert _check(fake, files, "--baseline", far, "--max-drop", "auto") == 1
    capsys.readouterr()
    assert _check(fake, files, "--baseline", near, "--max-drop", "some") == 2
    assert "expected a number or 'auto', got 'some'" in capsys.readouterr().err


def test_the_ci_budget_keeps_a_listed_layers_and_leaves_the_samples_to_the_engine() -> None:
    layers = [{"front": p, "back": p} for p in ("act1", "layer1", "layer2", "layer3")]
    ci = Spec.model_validate(spec(budget="ci", layers=layers))
    # A listed `layers` is the user's: the gate's figure is its mean, so all of it is kept.
    assert [p.front for p in ci.layers] == ["act1", "layer1", "layer2", "layer3"]
    # The training samples are resolved at the job's points (tests/engine/test_budget.py).
    assert (ci.train.max_train_samples, ci.train.max_test_samples) == (None, None)
    assert catalogue.BUDGETS["ci"].train_samples == 64
    assert method_settings(ci)["budget"] == "ci"
    # A ci baseline records the samples it ran (81 here); a ci check planned with none set
    # compares once it has run, and one that sets its own is refused before it runs.
    ran = {**method_settings(ci), "train.max_train_samples": 81}
    assert planned_differences(ran, method_settings(ci)) == []
    own = Spec.model_validate(spec(budget="ci", layers=layers, train={"max_train_samples": 64}))
    assert planned_differences(ran, method_settings(own)) == [
        "train.max_train_samples: baseline 81, this check 64"]
    full = Spec.model_validate(spec(layers=layers))
    assert len(full.layers) == 4 and full.train.max_train_samples is None
    # Off the default only: a baseline made before budgets existed still compares.
    assert "budget" not in method_settings(full)
    assert thin_points(list("abcdefg"), 3) == ["a", "d", "g"]
    with pytest.raises(ValidationError, match="'full' or 'ci'"):
        Spec.model_validate(spec(budget="cheap"))
