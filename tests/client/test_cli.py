"""The `stitchsim` command against the scripted fake service: exit codes, outputs, messages."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from stitchsim.cli import exit_code_for, main
from stitchsim.errors import (
    AuthenticationError,
    Conflict,
    ConnectionFailed,
    InvalidRequest,
    InvalidSpec,
    JobCancelled,
    JobFailed,
    NotFound,
    RateLimited,
    ServerError,
    ServiceUnavailable,
    StitchsimError,
    UsageError,
    WaitTimeout,
)
from stitchsim.models import ErrorInfo

from tests.client.fake_service import FakeService
from tests.client.files import write_safetensors


def api(cls: type, status: int) -> Exception:
    return cls("m", status_code=status, code="c")


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (UsageError("bad flag"), 2),
        (InvalidSpec("bad spec"), 2),
        (api(InvalidRequest, 422), 2),
        (api(InvalidRequest, 413), 2),
        (api(AuthenticationError, 401), 2),
        (api(NotFound, 404), 2),
        (JobFailed("j", ErrorInfo(code="invalid_spec", message="no layer x")), 2),
        (JobFailed("j", ErrorInfo(code="worker_lost", message="oom")), 3),
        (JobFailed("j", None), 3),
        (ConnectionFailed("down", "http://x"), 3),
        (api(ServiceUnavailable, 503), 3),
        (api(RateLimited, 429), 3),
        (api(ServerError, 500), 3),
        (api(Conflict, 409), 3),
        # Known codes: whose fault it is comes from the registry, whatever the class.
        (Conflict("m", status_code=409, code="idempotency_conflict"), 2),
        (Conflict("m", status_code=409, code="in_use"), 3),
        (InvalidRequest("m", status_code=413, code="quota_exceeded"), 2),
        (JobFailed("j", ErrorInfo(code="engine_error", message="a bug")), 3),
        (JobFailed("j", ErrorInfo(code="unstitchable_point", message="in place")), 2),
        (JobCancelled("cancelled", "j"), 3),
        (StitchsimError("other"), 3),
        (RuntimeError("a bug"), 3),  # never 1, which means "below threshold"
        (WaitTimeout("slow", "j"), 4),
    ],
)
def test_exit_code_mapping(exc: BaseException, code: int) -> None:
    assert exit_code_for(exc) == code


@pytest.fixture
def files(tmp_path: Path) -> tuple[str, str]:
    ref, cand = tmp_path / "reference.safetensors", tmp_path / "candidate.safetensors"
    write_safetensors(ref, b"reference weights")
    write_safetensors(cand, b"candidate weights")
    return str(ref), str(cand)


def check(fake: FakeService, files: tuple[str, str], *extra: str) -> int:
    return main(["check", *files, "--url", fake.url, "--progress", "lines", *extra])


def test_version_and_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == "stitchsim 0.1.0"
    assert main([]) == 2
    assert main(["check", "only-one-file"]) == 2
    assert "the following arguments are required: candidate" in capsys.readouterr().err


def test_check_passes_and_writes_json_and_junit(
    fake: FakeService, files: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.agreement = {("invariance_aware", "front_to_back"): 0.93}
    code = check(
        fake,
        files,
        "--threshold",
        "0.9",
        "--layers",
        "layer1",
        "--json",
        "out/report.json",
        "--junit-xml",
        "out/junit.xml",
        "--html",
        "out/report.html",
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.rstrip().splitlines()[-1] == (
        "PASS: similarity 0.9300 >= threshold 0.9000 "
        "(invariance-aware protocol, minimum over directions)"
    )
    report = json.loads((tmp_path / "out/report.json").read_text())
    assert report["verdict"] == "similar" and report["spec"]["threshold"] == 0.9
    assert ET.parse(tmp_path / "out/junit.xml").getroot().get("failures") == "0"
    assert "similar" in (tmp_path / "out/report.html").read_text()
    # Plain progress lines (not a TTY) and upload notes on stderr, none on stdout.
    assert "stitchsim: job " in err and ": queued" in err
    assert "reference.safetensors: uploading" in err
    assert "stitchsim:" not in out


def test_check_below_threshold_exits_1(
    fake: FakeService, files: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.agreement = {("invariance_aware", "back_to_front"): 0.42}
    code = check(fake, files, "--threshold", "0.9", "--junit-xml", "junit.xml", "-q")
    out, err = capsys.readouterr()
    assert code == 1, err
    assert "FAIL: similarity 0.4200 < threshold 0.9000" in out
    junit = ET.parse(tmp_path / "junit.xml").getroot()
    assert junit.get("failures") == "1" and junit.get("tests") == "2"
    assert err == ""  # -q: nothing but results and errors


def test_check_threshold_from_env_and_spec_from_config_file(
    fake: FakeService,
    files: tuple[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STITCHSIM_THRESHOLD", "0.5")
    monkeypatch.setenv("STITCHSIM_URL", fake.url)
    (tmp_path / "stitchsim.toml").write_text(
        '[spec]\nprotocols = ["standard"]\ntrain = {epochs = 2}\n'
    )
    assert main(["check", *files, "--progress", "none"]) == 0
    [job] = fake.jobs.values()
    assert job.spec["threshold"] == 0.5
    assert job.spec["protocols"] == ["standard"] and job.spec["train"] == {"epochs": 2}


def test_check_without_threshold_is_a_usage_error(
    fake: FakeService, files: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert check(fake, files) == 2
    assert "check needs a threshold" in capsys.readouterr().err
    assert fake.requests == []


def test_bad_spec_exits_2_before_upload_and_says_why(
    fake: FakeService, files: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = check(
        fake, files, "--threshold", "0.9", "--set", "train.epochs=0", "--junit-xml", "junit.xml"
    )
    err = capsys.readouterr().err
    assert code == 2
    # The one shape (stitchsim.validation), word for word what the service answers.
    assert ("stitchsim: error: invalid spec: train.epochs: Input should be greater than or "
            "equal to 1 (invalid_spec)\n") in err
    assert fake.requests == []
    error = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite/testcase/error")
    assert error is not None and error.get("type") == "InvalidSpec"


def test_spec_refused_by_the_service_exits_2_with_its_message(
    fake: FakeService, files: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    def refuse(spec: dict) -> tuple[int, dict[str, str], bytes]:
        body = {
            "error": {
                "code": "invalid_spec",
                "details": None,
                "message": "layers.0.front: no module 'layer9' in resnet18",
            }
        }
        return 422, {}, json.dumps(body).encode()

    fake.spec_check = refuse
    assert check(fake, files, "--threshold", "0.9", "--layers", "layer9") == 2
    err = capsys.readouterr().err
    assert "no module 'layer9' in resnet18 (invalid_spec)" in err


def test_no_verdict_on_unconverged_iris_exits_2_and_says_what_to_set(
    fake: FakeService, files: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 36: IRIs the front can still tell from real inputs void the verdict, as a model
    at chance does: exit 2, the points named, what to set; the table shows each point's IRIs
    and the steps they took."""
    fake.report_extra = {"iri_median": 0.56}
    assert check(fake, files, "--threshold", "0.9") == 2
    out = capsys.readouterr().out
    last = out.rstrip().splitlines()[-1]
    assert last.startswith("NO VERDICT: the invariance-aware figure rests on IRIs that did not "
                           "converge at back_to_front layer1->layer1 (median 0.56, 200 steps)")
    assert "front_to_back layer2->layer2 (median 0.56, 200 steps)" in last
    assert "iri.extra_rounds" in last and "iri.accept_unconverged true" in last
    assert "PASS" not in out and "FAIL" not in out
    iris = [line.split() for line in out.splitlines() if line.startswith("front->back  layer")]
    assert ["front->back", "layer1", "0.560", "0.560", "NO", "200", "/", "1200"] in [
        r[:8] for r in iris]
    # Converged IRIs: the verdict stands.
    fake.report_extra = {"iri_median": 0.1}
    assert check(fake, files, "--threshold", "0.9") == 0


def test_no_verdict_at_chance_exits_2_and_says_what_to_fix(
    fake: FakeService, files: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.report_extra = {"near_chance": "back"}
    assert check(fake, files, "--threshold", "0.9", "--junit-xml", "junit.xml") == 2
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-1] == (
        "NO VERDICT: the back model (test_resnet) scores at chance on this dataset, so "
        "agreement with it means nothing; check the dataset, the arch_kwargs and the "
        "preprocessing (mean/std or preprocess) of that model"
    )
    assert "PASS" not in out and "FAIL" not in out
    junit = ET.parse(tmp_path / "junit.xml").getroot()
    assert junit.get("errors") == "1" and junit.get("failures") == "0"


def test_caveats_are_printed_under_the_verdict(
    fake: FakeService, files: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    fake.report_extra = {"caveats": ["the figure rests on unconverged IRIs"]}
    assert check(fake, files, "--threshold", "0.9") == 0
    lines = capsys.readouterr().out.rstrip().splitlines()
    assert lines[-2].startswith("PASS: similarity")
    assert lines[-1] == "  caveat: the figure rests on unconverged IRIs"


def test_an_undetermined_preprocessing_is_said_loudly(
    fake: FakeService, files: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    fake.report_extra = {"undetermined": "back"}
    assert check(fake, files, "--threshold", "0.9") == 0
    out = capsys.readouterr().out
    assert ("PREPROCESSING UNDETERMINED (back model): UNDETERMINED: nothing told the "
            "candidates apart") in out
    assert "UNDETERMINED: no measurement told the candidates apart" in out  # the table's


def test_service_down_exits_3(
    files: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = main(
        [
            "check",
            *files,
            "--url",
            f"http://127.0.0.1:{port}",
            "--retries",
            "0",
            "--threshold",
            "0.9",
            "--junit-xml",
            "junit.xml",
        ]
    )
    err = capsys.readouterr().err
    assert code == 3
    assert f"cannot reach the stitchsim service at http://127.0.0.1:{port}" in err
    assert "hint: is the service running?" in err
    error = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite/testcase/error")
    assert error is not None and error.get("type") == "ConnectionFailed"


def test_job_failure_exit_code_depends_on_whose_fault(
    fake: FakeService, files: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    fake.states = [
        {"state": "failed", "error": {"code": "worker_lost", "message": "killed 3 times"}}
    ]
    assert check(fake, files, "--threshold", "0.9") == 3
    assert "killed 3 times (worker_lost)" in capsys.readouterr().err
    fake.states = [
        {
            "state": "failed",
            "error": {"code": "invalid_checkpoint", "message": "weights do not fit"},
        }
    ]
    assert check(fake, files, "--threshold", "0.9") == 2


def test_timeout_exits_4_and_cancels_the_job(
    fake: FakeService, files: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    fake.states = [{"state": "running", "progress": {"stage": "iri", "done": 1, "total": 9}}]
    assert check(fake, files, "--threshold", "0.9", "--timeout", "0.2") == 4
    err = capsys.readouterr().err
    assert "still running after 0.2s (stage iri, 1/9)" in err
    [job] = fake.jobs.values()
    assert job.cancelled and fake.calls("DELETE", f"/jobs/{job.id}")
    assert f"stitchsim jobs wait {job.id}" in err


def test_timeout_with_keep_running_leaves_the_job(
    fake: FakeService, files: tuple[str, str]
) -> None:
    fake.states = [{"state": "running"}]
    assert check(fake, files, "--threshold", "0.9", "--timeout", "0.2", "--keep-running") == 4
    assert fake.calls("DELETE", "/jobs") == []


def test_compare_jobs_and_report_commands(
    fake: FakeService, files: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = ["--url", fake.url]
    assert main(["compare", *files, *url]) == 0
    job_id = capsys.readouterr().out.strip()
    assert list(fake.jobs) == [job_id]

    assert main(["jobs", *url]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert listing[0].split() == ["JOB", "STATE", "PROGRESS", "CREATED", "FINISHED"]
    assert listing[1].split()[:2] == [job_id, "queued"]

    assert main(["jobs", "--json", *url]) == 0
    assert [j["id"] for j in json.loads(capsys.readouterr().out)["items"]] == [job_id]

    assert main(["jobs", "show", job_id, *url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == job_id


def test_report_of_unfinished_job_and_unknown_job(
    fake: FakeService, files: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    url = ["--url", fake.url]
    fake.states = [{"state": "running"}]
    assert main(["compare", *files, *url]) == 0
    job_id = capsys.readouterr().out.strip()
    assert main(["report", job_id, *url]) == 3  # 409 job_not_finished: not finished yet
    assert (f"job {job_id} is running; a report exists only once it succeeded "
            "(job_not_finished)") in capsys.readouterr().err
    assert main(["jobs", "show", "nope", *url]) == 2
    assert "job nope not found" in capsys.readouterr().err


def test_jobs_wait_and_report_formats(
    fake: FakeService, files: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = ["--url", fake.url]
    assert main(["compare", *files, *url, "--threshold", "0.5"]) == 0
    job_id = capsys.readouterr().out.strip()
    assert main(["jobs", "wait", job_id, *url, "--progress", "none", "--json", "r.json"]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["job_id"] == job_id
    assert "similar" in capsys.readouterr().out  # the table
    assert main(["report", job_id, *url]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "similar"
    assert main(["report", job_id, *url, "--format", "html", "-o", "r.html"]) == 0
    assert (tmp_path / "r.html").read_text().startswith("<html>")
    # A finished job cannot be cancelled: the service answers 409 job_finished.
    assert main(["jobs", "cancel", job_id, *url]) == 3
    assert f"job {job_id} already succeeded (job_finished)" in capsys.readouterr().err
    fake.states = [{"state": "queued"}]
    assert main(["compare", *files, *url]) == 0
    queued = capsys.readouterr().out.strip()
    assert main(["jobs", "cancel", queued, *url]) == 0
    assert capsys.readouterr().out.strip() == f"{queued}: cancelled"


def test_sigterm_cancels_the_job(fake: FakeService, files: tuple[str, str]) -> None:
    # What a CI runner does when the pipeline is cancelled.
    fake.states = [{"state": "running", "progress": {"stage": "train", "done": 1, "total": 9}}]
    proc = subprocess.Popen(
        [sys.executable, "-m", "stitchsim.cli", "check", *files, "--url", fake.url,
         "--threshold", "0.9", "--progress", "lines"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not fake.calls("GET", "/jobs/"):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    [job] = fake.jobs.values()
    assert job.cancelled
    assert f"job {job.id} cancelled" in err and "interrupted" in err
