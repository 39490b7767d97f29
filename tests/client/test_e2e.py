"""`stitchsim check` as a CI job runs it: a subprocess against a real `stitchsim-server serve`.

Jobs are tiny (one stitch point, one direction, 2 epochs on 300 samples, 20 IRI steps) so the
module stays within about three minutes on two cores. The reference is the same checkpoint in
both checks, so the second check must reuse its upload and its cached IRIs.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from stitchsim import Client
from stitchsim.models import Report
from stitchsim.models.report import report_digest

TINY = [
    "--layers", "layer2",
    "--objectives", "slm",
    "--directions", "front_to_back",
    "--dataset", "digits_marker",
    "--set", "train.epochs=2",
    "--set", "train.max_train_samples=300",
    "--set", "train.max_test_samples=200",
    "--set", "iri.method=fast",  # the threshold was measured under the fast method
    "--set", "iri.steps=20",
]  # fmt: skip
THRESHOLD = "0.9"


@dataclass
class Run:
    code: int
    out: str
    err: str
    seconds: float
    out_dir: Path | None = None


def stitchsim(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> Run:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "stitchsim.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    return Run(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)


def service_args(live_service: Any) -> list[str]:
    args = ["--url", live_service.url]
    if live_service.api_key:
        args += ["--api-key", live_service.api_key]
    return args


def check(live_service: Any, reference: Path, candidate: Path, out: Path, *extra: str) -> Run:
    return stitchsim(
        "check", str(reference), str(candidate), *service_args(live_service),
        "--threshold", THRESHOLD, *TINY,
        "--json", str(out / "report.json"), "--junit-xml", str(out / "junit.xml"),
        "--timeout", "240", *extra,
    )  # fmt: skip


@pytest.fixture(scope="module")
def identical(live_service: Any, ckpts: Any, tmp_path_factory: pytest.TempPathFactory) -> Run:
    out = tmp_path_factory.mktemp("check-identical")
    run = check(live_service, ckpts.digits_resnet, ckpts.digits_resnet, out)
    run.out_dir = out
    return run


def test_check_identical_checkpoints_exits_0(identical: Run) -> None:
    assert identical.code == 0, identical.err
    out = identical.out_dir
    assert out is not None
    report = Report.model_validate_json((out / "report.json").read_text())
    assert report.verdict == "similar"
    assert report.front.checkpoint == report.back.checkpoint
    # A model stitched into itself agrees with itself under both protocols.
    assert report.summary.by_protocol["standard"] > 0.95
    assert report.summary.by_protocol["invariance_aware"] > 0.95
    assert report.summary.similarity_protocol == "invariance_aware"

    lines = identical.out.rstrip().splitlines()
    verdict = _verdict_line(lines, report)
    assert lines[verdict].startswith("PASS: similarity ")
    assert any("VERDICT" in line or "verdict" in line.lower() for line in lines)  # the table
    # Not a terminal: plain progress lines, ending in success.
    progress = [line for line in identical.err.splitlines() if line.startswith("stitchsim: job ")]
    assert progress and progress[-1].split(": ")[2].startswith("succeeded")
    assert "\r" not in identical.err

    suite = ET.parse(out / "junit.xml").getroot().find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    # One direction, one compared figure.
    assert [c.get("name") for c in cases] == ["front_to_back mean agreement"]
    assert suite.get("failures") == "0"


def test_the_report_file_carries_the_digest_of_its_content(identical: Run) -> None:
    # The engine seals the report; the file --json writes is the service's bytes, so a
    # baseline made from it is vouched for, and an edit by hand is told (issue 38).
    out = identical.out_dir
    assert out is not None
    data = json.loads((out / "report.json").read_text())
    assert data["digest"].startswith("sha256:") and data["digest"] == report_digest(data)


def _verdict_line(lines: list[str], report: Report) -> int:
    """Where the PASS/FAIL line is: last, but for the report's caveats printed under it."""
    n = len(report.verdict_caveats)
    assert [line.removeprefix("  caveat: ") for line in lines[len(lines) - n:]] == \
        report.verdict_caveats
    return len(lines) - n - 1


def test_clean_vs_shortcut_model_exits_1_and_reuses_the_reference(
    identical: Run, live_service: Any, ckpts: Any, tmp_path: Path
) -> None:
    run = check(live_service, ckpts.digits_resnet, ckpts.marker_resnet, tmp_path)
    assert run.code == 1, run.err
    report = Report.model_validate_json((tmp_path / "report.json").read_text())
    s = report.summary
    assert report.verdict == "dissimilar"
    assert s.similarity_protocol == "invariance_aware"
    assert s.similarity < float(THRESHOLD)
    # The shortcut model's invariances differ from the clean one's: the invariance-aware
    # protocol shows a far larger gap than the standard one.
    assert s.by_protocol["invariance_aware"] < s.by_protocol["standard"] - 0.2
    lines = run.out.rstrip().splitlines()
    assert lines[_verdict_line(lines, report)].startswith(f"FAIL: similarity {s.similarity:.4f} <")

    # The reference went up in the first check: sent again by hash only, and the IRIs of the
    # reference (the front model) came from the service's cache.
    assert "digits_resnet.safetensors: already on the service" in run.err
    assert "marker_resnet.safetensors: uploading" in run.err
    [row] = [r for r in report.results if r.protocol == "invariance_aware"]
    assert row.iri is not None and row.iri.cache_hit

    junit = ET.parse(tmp_path / "junit.xml").getroot()
    [case] = junit.findall("testsuite/testcase")
    failure = case.find("failure")
    assert failure is not None
    assert failure.get("message", "").startswith(f"mean agreement {s.similarity:.4f} < threshold")


def test_bad_spec_exits_2_and_says_why(live_service: Any, ckpts: Any, tmp_path: Path) -> None:
    # The service checks stitch points against the architecture at submission.
    run = stitchsim(
        "check", str(ckpts.digits_resnet), str(ckpts.digits_resnet_b), *service_args(live_service),
        "--threshold", THRESHOLD, "--layers", "layer2:no_such_layer", "--progress", "none",
    )  # fmt: skip
    assert run.code == 2, run.err
    assert "no_such_layer" in run.err and "(unknown_layer)" in run.err

    # And a value the contract refuses fails before anything is sent.
    run = stitchsim(
        "check", str(ckpts.digits_resnet), str(ckpts.digits_resnet_b), *service_args(live_service),
        "--threshold", "1.5",
    )  # fmt: skip
    assert run.code == 2
    assert "invalid threshold: must lie in [0, 1], got 1.5" in run.err


def test_service_down_exits_3(ckpts: Any, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = stitchsim(
        "check", str(ckpts.digits_resnet), str(ckpts.digits_resnet), "--threshold", THRESHOLD,
        "--junit-xml", str(tmp_path / "junit.xml"),
        env={"STITCHSIM_URL": f"http://127.0.0.1:{port}", "STITCHSIM_RETRIES": "2"},
    )  # fmt: skip
    assert run.code == 3, run.err
    assert f"cannot reach the stitchsim service at http://127.0.0.1:{port} after 3 attempts" in (
        run.err
    )
    assert run.err.count("retrying in") == 2
    error = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite/testcase/error")
    assert error is not None and error.get("type") == "ConnectionFailed"


def test_wrong_api_key_exits_2(live_service: Any) -> None:
    run = stitchsim("jobs", "--url", live_service.url, "--api-key", "ssk_not_a_key")
    assert run.code == 2
    assert "this API key is not valid" in run.err and "(unauthorized)" in run.err


def test_jobs_and_report_commands_see_the_checks(
    identical: Run, live_service: Any, tmp_path: Path
) -> None:
    assert identical.out_dir is not None
    job_id = json.loads((identical.out_dir / "report.json").read_text())["job_id"]
    run = stitchsim("jobs", "--json", *service_args(live_service))
    assert run.code == 0, run.err
    assert job_id in [j["id"] for j in json.loads(run.out)["items"]]

    run = stitchsim("report", job_id, "--format", "html", "-o", str(tmp_path / "r.html"),
                    *service_args(live_service))  # fmt: skip
    assert run.code == 0, run.err
    page = (tmp_path / "r.html").read_text()
    assert page.lstrip().lower().startswith("<!doctype html")


def test_timeout_exits_4_and_cancels_the_job(live_service: Any, ckpts: Any, tmp_path: Path) -> None:
    run = stitchsim(
        "check", str(ckpts.digits_resnet_b), str(ckpts.digits_resnet), *service_args(live_service),
        "--threshold", THRESHOLD, *TINY, "--set", "iri.steps=2000", "--timeout", "2",
    )  # fmt: skip
    assert run.code == 4, run.err
    assert "after 2s" in run.err
    job_id = run.err.split("stitchsim jobs wait ")[1].split("`")[0]
    with Client(live_service.url, live_service.api_key) as client:
        job = client.job(job_id)
        deadline = time.monotonic() + 60
        while job.status().state not in ("cancelled", "failed", "succeeded"):
            assert time.monotonic() < deadline, job.last_status
            time.sleep(0.5)
    assert job.last_status is not None and job.last_status.state == "cancelled"


def test_sdk_usage_and_delete(live_service: Any, tmp_path: Path) -> None:
    import numpy as np

    from tests.service.helpers import safetensors_bytes

    path = tmp_path / "only-here.safetensors"  # bytes no other test uploads
    path.write_bytes(safetensors_bytes({"w": np.random.default_rng(7).random(64, np.float32)}))
    with Client(live_service.url, live_service.api_key) as client:
        before = client.usage()
        stored = client.upload_checkpoint(path)
        after = client.usage()
        assert after.stored_bytes == before.stored_bytes + stored.size == (
            before.stored_bytes + path.stat().st_size)
        assert after.max_stored_bytes > after.stored_bytes
        assert after.active_jobs <= after.max_active_jobs
        client.delete_checkpoint(stored.id)
        assert client.usage().stored_bytes == before.stored_bytes
        assert client.find_checkpoint(path) is None
