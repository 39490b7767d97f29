"""Calibrated gates (issue 46) from reports built by hand: the figures a report is read as,
the prediction bound against a hand computation, a check that fails exactly the figure that
moved, gates refused for each field that differs, and gate files edited, truncated or hostile
(the real service: test_calibration_e2e.py)."""

from __future__ import annotations

import json
import math
import statistics
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from stitchsim.calibration import (
    DEFAULT_FALSE_ALARM_RATE,
    GateFile,
    calibrate,
    flat_figures,
    prediction_factor,
    sealed_gate,
    width_warning,
)
from stitchsim.cli import main
from stitchsim.errors import UsageError
from stitchsim.figures import report_figures
from stitchsim.gatefile import GateRefused, evaluate, precheck, read_gate
from stitchsim.junit import report_to_junit
from stitchsim.markdown import outcome_markdown
from stitchsim.models import Figure, MethodRecord, Report
from stitchsim_worker.engine.core.method import method_record

from tests.client.fake_service import FakeService
from tests.client.files import write_safetensors
from tests.client.reports import make_report

REF = "sha256:" + "a" * 64
DIRS = ("front_to_back", "back_to_front")
POINT = "agreement{direction=front_to_back,point=layer2->layer2,protocol=standard}"
# Benign spread: each retrain's standard agreement, invariance-aware agreement and accuracy.
BENIGN = [(0.95, 0.70, 0.90), (0.94, 0.66, 0.91), (0.96, 0.73, 0.89), (0.95, 0.61, 0.90),
          (0.93, 0.69, 0.92), (0.955, 0.72, 0.90), (0.945, 0.64, 0.91), (0.952, 0.68, 0.895)]


def spec(back: str, **extra: Any) -> dict[str, Any]:
    return {"front": {"checkpoint": REF}, "back": {"checkpoint": back}, "dataset": "digits",
            "layers": [{"front": "layer1", "back": "layer1"},
                       {"front": "layer2", "back": "layer2"}], "objectives": ["slm"], **extra}


def retrain(i: int, standard: float, aware: float, accuracy: float, **extra: Any) -> Report:
    made = make_report(spec("sha256:" + f"{i:x}" * 64, **extra),
                       {("standard", d): standard for d in DIRS}
                       | {("invariance_aware", d): aware for d in DIRS}, job_id=f"job-{i}")
    back = made.back.model_copy(update={"accuracy": accuracy})
    return made.model_copy(update={"back": back, "method": method_record(made.spec)})


def benign() -> list[Report]:
    return [retrain(i + 1, *figures) for i, figures in enumerate(BENIGN)]


def moved(report: Report, name: str, by: float) -> Report:
    """The report with the rows behind one agreement figure moved by `by`."""
    labels = dict(part.split("=") for part in name[name.index("{") + 1:-1].split(","))
    rows = []
    for r in report.results:
        if (r.protocol, r.direction, f"{r.front_layer}->{r.back_layer}") == (
                labels["protocol"], labels["direction"], labels["point"]):
            r = r.model_copy(update={"figures": {**r.figures, "agreement": Figure(
                value=r.agreement + by, ci=None)}})
        rows.append(r)
    return report.model_copy(update={"results": rows})


# ------------------------------------------------------------------ the figures of a report


def test_every_figure_of_a_report_has_one_name_with_its_labels() -> None:
    figures = report_figures(benign()[0])
    agreement = [n for n in figures if n.startswith("agreement{")]
    # 2 protocols x 2 directions x 2 points, each the mean over its objectives.
    assert len(agreement) == 8 and POINT in figures
    assert figures[POINT].value == pytest.approx(0.95 + 0.01)  # layer2 sits +spread/2
    assert figures["similarity"].value == pytest.approx(0.70)
    assert figures["accuracy"].value == pytest.approx(0.90)
    assert {f.bad for f in figures.values()} == {"low"}
    # A probe set would add a label and nothing else: the name carries it, sorted.
    from stitchsim.figures import named
    probe = named("agreement", 0.5, probe="cue_conflict", protocol="standard")
    assert probe.name == "agreement{probe=cue_conflict,protocol=standard}"


# ------------------------------------------------------------------ the bound


def test_the_limit_is_the_student_t_prediction_bound_computed_by_hand() -> None:
    # Accuracy alone gated: m = 1, so the quantile is t(0.99, 7) = 2.998 (tables).
    gate = calibrate(benign(), gate=["accuracy"])
    accuracies = [a for _, _, a in BENIGN]
    mean = sum(accuracies) / 8
    sd = math.sqrt(sum((a - mean) ** 2 for a in accuracies) / 7)
    band = gate.figures["accuracy"]
    assert (band.n, band.mean, band.sd) == (8, pytest.approx(mean), pytest.approx(sd))
    assert (band.min, band.max) == (0.89, 0.92) and band.gated
    assert gate.t_quantile == pytest.approx(2.998, abs=1e-3)
    assert band.limit == pytest.approx(mean - 2.998 * sd * math.sqrt(1 + 1 / 8), abs=1e-5)
    assert gate.gated_figures == 1 and gate.per_figure_rate == DEFAULT_FALSE_ALARM_RATE
    # The rest are recorded with their bands, not gated.
    assert not gate.figures["similarity"].gated

    # The default gates standard agreement at every point and direction (4) and accuracy:
    # the 1 % split five ways: t(1 - 0.002, 7), between the tables' t(0.995, 7) = 3.499 and
    # t(0.999, 7) = 4.785.
    default = calibrate(benign())
    assert default.gated_figures == 5 and default.per_figure_rate == pytest.approx(0.002)
    assert 3.499 < default.t_quantile < 4.785
    assert [k for k, b in default.figures.items() if b.gated] == [
        n for n in default.figures if "protocol=standard" in n] + ["accuracy"]
    assert "Student t prediction bound" in default.statistic


def test_few_retrains_are_refused_below_three_and_warned_below_eight() -> None:
    with pytest.raises(UsageError, match="at least 3 benign retrains, got 2"):
        calibrate(benign()[:2])
    four = calibrate(benign()[:4], gate=["accuracy"])
    t3 = 4.541  # t(0.99, 3), tables
    assert four.limit_in_sd == pytest.approx(t3 * math.sqrt(1.25), abs=1e-3)
    warning = width_warning(four)
    assert warning is not None and "4 benign retrains: each limit sits 5.1 benign sd" in warning
    assert "8 retrains would bring it to 3.2 sd" in warning
    assert width_warning(calibrate(benign(), gate=["accuracy"])) is None
    # A figure with no spread is named: its limit is its one value.
    same = [retrain(i + 1, s, a, 0.9) for i, (s, a, _) in enumerate(BENIGN)]
    assert flat_figures(calibrate(same)) == ["accuracy"]
    assert flat_figures(calibrate(benign())) == []
    # The same model twice is not two retrains.
    with pytest.raises(UsageError, match="distinct models"):
        calibrate([*benign()[:3], benign()[0]])


def test_prediction_factor_tracks_scipy_and_shrinks_with_n() -> None:
    t, k = prediction_factor(8, 0.01)
    assert t == pytest.approx(2.998, abs=1e-3) and k == pytest.approx(t * math.sqrt(9 / 8))
    assert prediction_factor(16, 0.01)[1] < k < prediction_factor(4, 0.01)[1]


# ------------------------------------------------------------------ the gate on a new check


def test_a_calibrated_check_fails_exactly_the_figure_that_moved() -> None:
    gate = calibrate(benign())
    typical = retrain(20, 0.948, 0.67, 0.90)
    assert evaluate(typical, gate).status == "pass"

    band = gate.figures[POINT]
    # Below every benign retrain but within the bound: a new benign model lands there about
    # 1 time in n + 1, so a gate at the lowest benign figure would fail it; this one passes.
    value = report_figures(typical)[POINT].value
    assert band.limit < band.min - 0.003
    assert evaluate(moved(typical, POINT, band.min - 0.003 - value), gate).status == "pass"
    drifted = moved(typical, POINT, band.limit - value - 0.01)
    outcome = evaluate(drifted, gate, source="file gate.json")
    failed = [g for g in outcome.gates if g.status == "fail"]
    assert [g.name for g in failed] == [f"calibrated {POINT}"]
    assert failed[0].figure is not None and failed[0].figure < band.limit
    sds = (band.mean - failed[0].figure) / band.sd
    assert f"< limit {band.limit:.4f}: {sds:.1f} benign sd below the benign mean" in (
        failed[0].message)
    # A large move of an ungated figure (the invariance-aware mean) fails nothing.
    aware = "agreement{direction=front_to_back,point=layer2->layer2,protocol=invariance_aware}"
    assert evaluate(moved(typical, aware, -0.3), gate).status == "pass"

    md = outcome_markdown(drifted, outcome).replace("\\|", "|")
    assert f"| calibrated {POINT} | ❌ FAIL |" in md
    # Under the gates, each figure against its benign band.
    assert (f"| {POINT} | {failed[0].figure:.4f} | {band.min:.4f} – {band.max:.4f} | "
            f"{band.mean:.4f} ± {band.sd:.4f} (8) | {band.limit:.4f} | ❌ FAIL |") in md
    root = ET.fromstring(report_to_junit(drifted, outcome=outcome))
    assert root.get("failures") == "1"
    failing = [c.get("name") for c in root.iter("testcase") if c.find("failure") is not None]
    assert failing == [f"calibrated {POINT}"]


# ------------------------------------------------------------------ gates that do not fit


@pytest.mark.parametrize(("changed", "named"), [
    ("reference", "reference model: gate sha256:a"),
    ("dataset", "dataset: gate digits, this check digits_digit_only"),
    ("setting", "train.epochs: gate 10, this check 3"),
    ("engine", "this check 2020.1"),
    ("measures", "measures: gate [], this check ['cka']"),
])
def test_a_gate_of_another_reference_dataset_spec_or_method_is_refused(
        changed: str, named: str) -> None:
    gate = calibrate(benign())
    new = retrain(30, 0.95, 0.7, 0.9)
    if changed == "reference":
        new = new.model_copy(update={"front": new.front.model_copy(
            update={"checkpoint": "sha256:" + "e" * 64})})
    elif changed == "dataset":
        new = retrain(30, 0.95, 0.7, 0.9, dataset="digits_digit_only")
    elif changed == "setting":
        new = retrain(30, 0.95, 0.7, 0.9, train={"epochs": 3})
    elif changed == "engine":
        assert new.method is not None
        new = new.model_copy(update={"method": MethodRecord(engine="2020.1",
                                                            settings=new.method.settings)})
    else:
        new = retrain(30, 0.95, 0.7, 0.9, measures=["cka"])
    with pytest.raises(GateRefused, match="calibrated for another check") as refused:
        evaluate(new, gate, source="file gate.json")
    assert named in str(refused.value)


def test_a_gate_is_refused_before_the_check_runs_where_the_client_can_tell() -> None:
    gate = calibrate(benign())
    settings = dict(gate.method.settings)
    precheck(gate, "g", REF, "digits", settings, {})
    for reference, dataset, planned, fields, named in [
        ("sha256:" + "e" * 64, "digits", settings, {}, "reference model"),
        (REF, "cifar10", settings, {}, "dataset: gate digits, this check cifar10"),
        (REF, "digits", {**settings, "train.epochs": 2}, {}, "train.epochs: gate 10"),
        (REF, "digits", settings, {"measures": ["cka"]}, "measures"),
    ]:
        with pytest.raises(GateRefused, match=named):
            precheck(gate, "g", reference, dataset, planned, fields)


# ------------------------------------------------------------------ gate files


def _written(tmp_path: Path, gate: GateFile | None = None) -> Path:
    path = tmp_path / "gate.json"
    path.write_text((gate or calibrate(benign())).model_dump_json(indent=1))
    return path


def test_a_gate_file_reads_back_and_an_edit_is_detected(tmp_path: Path) -> None:
    path = _written(tmp_path)
    gate = read_gate(path.read_text(), "file gate.json")
    assert gate == GateFile.model_validate_json(path.read_text())
    data = json.loads(path.read_text())
    data["figures"]["accuracy"]["limit"] = 0.5  # loosened by hand
    with pytest.raises(GateRefused, match="changed after `stitchsim calibrate` wrote it"):
        read_gate(json.dumps(data), "file gate.json")


def test_hostile_or_broken_gate_files_are_refused(tmp_path: Path) -> None:
    text = _written(tmp_path).read_text()
    cases = {
        "truncated": (text[: len(text) // 2], "not valid JSON"),
        "NaN": (text.replace('"limit": ', '"limit": NaN, "x": ', 1),
                "limit is nan: only finite numbers"),
        "deep": ("[" * 5000 + "]" * 5000, "nested more than 32 levels"),
        "nested": ('{"a": ' + "[" * 40 + "]" * 40 + "}", "nested more than 32"),
        "not an object": ("[1, 2]", "must hold a JSON object"),
        "a report": ('{"format": "x"}', "not a stitchsim gate file"),
    }
    for label, (broken, message) in cases.items():
        with pytest.raises(GateRefused, match=message):
            read_gate(broken, "file gate.json")
        assert label
    # n = 2, sealed as if calibrated: the file's own bound refuses it.
    gate = calibrate(benign()[:3])
    small = sealed_gate(gate.model_copy(update={"n": 2}))
    with pytest.raises(GateRefused, match="n.*greater than or equal to 3"):
        read_gate(small.model_dump_json(), "file gate.json")
    # Counts that disagree, sealed anew by another program.
    gate = calibrate(benign())
    wrong = sealed_gate(gate.model_copy(update={"benign": gate.benign[:5]}))
    with pytest.raises(GateRefused, match="counts disagree"):
        read_gate(wrong.model_dump_json(), "file gate.json")


def test_check_refuses_a_bad_gate_file_with_exit_2_before_any_request(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _written(tmp_path)
    path.write_text(path.read_text().replace('"accuracy"', '"accuracy2"', 1))
    ref, cand = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    # No service at this URL: a request would exit 3, not 2.
    code = main(["check", str(ref), str(cand), "--url", "http://127.0.0.1:9", "--gate",
                 str(path), "--dataset", "digits", "-q", "--progress", "none"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "gate file" in err and "Traceback" not in err
    code = main(["check", str(ref), str(cand), "--url", "http://127.0.0.1:9", "--gate",
                 str(tmp_path / "none.json"), "-q"])
    assert code == 2 and "no such file" in capsys.readouterr().err


def test_calibrate_refuses_twins_and_too_few_before_any_request(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = []
    for i, body in enumerate([b"x", b"y", b"x"]):
        (tmp_path / f"m{i}.safetensors").write_bytes(body)
        files.append(str(tmp_path / f"m{i}.safetensors"))
    out = tmp_path / "gate.json"
    base = ["--url", "http://127.0.0.1:9", "-q", "-o", str(out)]
    assert main(["calibrate", files[0], files[1], files[2], "sha256:" + "1" * 64, *base]) == 2
    assert "are the same model" in capsys.readouterr().err
    assert main(["calibrate", files[0], files[1], *base]) == 2
    assert "at least 3 benign retrains, got 1" in capsys.readouterr().err
    bodies = [files[1], files[0], "sha256:" + "2" * 64, "sha256:" + "3" * 64]
    assert main(["calibrate", *bodies, *base, "--gate-figures", "standard,ckaa"]) == 2
    assert "--gate-figures: ckaa is not a figure kind" in capsys.readouterr().err
    assert not out.exists()


def test_statistics_module_agrees_with_the_stored_band() -> None:
    gate = calibrate(benign())
    band = gate.figures[POINT]
    assert band.sd == pytest.approx(statistics.stdev(band.values))
    assert band.limit == pytest.approx(band.mean - gate.limit_in_sd * band.sd)


def test_max_drop_auto_states_its_false_alarm_rate_and_points_to_calibration(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--help"]) == 0
    helped = " ".join(capsys.readouterr().out.split())
    assert ("false-alarms on up to 27% of benign retrains (15 of 56 benign pairs of the demo "
            "recipe, 0 of 56 of convnext: an estimate") in helped
    ref, cand = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    main(["check", str(ref), str(cand), "--url", "http://127.0.0.1:9", "--retries", "0",
          "--baseline", str(tmp_path / "none.json"), "--max-drop", "auto", "--progress",
          "none"])
    hint = [line for line in capsys.readouterr().err.splitlines() if "hint: --max-drop" in line]
    assert len(hint) == 1 and "stitchsim calibrate REF B1 B2" in hint[0]


def test_calibrate_names_every_benign_model_that_gave_no_report_and_writes_nothing(
        fake: FakeService, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Against the scripted stand-in of the service (test_calibration_e2e.py: the real one).
    ref = write_safetensors(tmp_path / "ref.safetensors", b"reference")
    good = [str(write_safetensors(tmp_path / f"b{i}.safetensors", f"retrain {i}".encode()))
            for i in range(3)]
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\x00" * 7)  # shorter than a header
    out = tmp_path / "gate.json"
    code = main(["calibrate", str(ref), *good, str(broken), str(tmp_path / "gone.safetensors"),
                 "--url", fake.url, "--progress", "none", "--layers", "layer1,layer2",
                 "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "2 benign check(s) gave no report, so no gate was written" in err
    assert f"{broken}: " in err and "gone.safetensors: " in err and "Traceback" not in err
    assert not out.exists()

    # The same retrains alone make a gate; every check's figure is the same on the stand-in,
    # so the gated figures have no spread, which calibrate says.
    code = main(["calibrate", str(ref), *good, "--url", fake.url, "--progress", "none",
                 "--layers", "layer1,layer2", "-o", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    gate = read_gate(out.read_text(), "gate.json")
    assert gate.n == 3 and [b.given_as for b in gate.benign] == good
    assert "the same value on every benign retrain" in captured.err
    assert "3 benign retrains: each limit sits" in captured.err
    assert f"wrote {out}: {gate.gated_figures} gated figures" in captured.out


def test_the_async_client_calibrates_the_same_gate(fake: FakeService, tmp_path: Path) -> None:
    import asyncio

    from stitchsim import AsyncClient, Client
    from stitchsim.sdk.calibrate import CalibrationFailed

    ref = write_safetensors(tmp_path / "ref.safetensors", b"reference")
    good = [write_safetensors(tmp_path / f"b{i}.safetensors", f"retrain {i}".encode())
            for i in range(3)]
    fields = {"layers": [{"front": "layer1", "back": "layer1"}], "dataset": "digits"}

    async def run(models: list[Path]) -> GateFile:
        async with AsyncClient(fake.url) as client:
            return await client.calibrate(ref, models, **fields)

    gate = asyncio.run(run(good))
    with Client(fake.url) as client:
        again = client.calibrate(ref, good, **fields)
    assert [b.given_as for b in gate.benign] == [str(g) for g in good]
    assert gate.figures.keys() == again.figures.keys() and gate.n == again.n == 3
    with pytest.raises(CalibrationFailed, match="1 benign check.*gone.safetensors"):
        asyncio.run(run([*good, tmp_path / "gone.safetensors"]))
