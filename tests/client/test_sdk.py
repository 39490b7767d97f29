"""The SDK's own logic against the scripted fake service: uploads, validation, waiting."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from stitchsim import Client, file_sha256
from stitchsim.errors import (
    AuthenticationError,
    InvalidFile,
    InvalidSpec,
    JobCancelled,
    JobFailed,
    UsageError,
    WaitTimeout,
)
from stitchsim.models import JobStatus
from stitchsim.sdk import ProgressPrinter

from tests.client.fake_service import FakeService
from tests.client.files import write_safetensors

LAYER = [{"front": "layer1", "back": "layer1"}]


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    ref, cand = tmp_path / "reference.safetensors", tmp_path / "candidate.safetensors"
    write_safetensors(ref, b"reference weights" * 100)
    write_safetensors(cand, b"candidate weights" * 100)
    return ref, cand


def fast(client: Client) -> Client:
    client.http.sleep = lambda s: None
    return client


def test_uploads_are_skipped_when_the_service_has_the_bytes(
    fake: FakeService, files: tuple[Path, Path]
) -> None:
    ref, cand = files
    with Client(fake.url) as client:
        first = client.upload_checkpoint(ref)
        assert first.id == file_sha256(ref)
        assert len(fake.calls("POST", "/checkpoints")) == 1

    # A new client (a new CI run) asks by hash and sends nothing.
    with Client(fake.url) as client:
        again = client.compare(ref, cand, layers=LAYER)
    posts = fake.calls("POST", "/checkpoints")
    assert len(posts) == 2  # only the candidate
    assert b"candidate weights" in posts[1].body
    spec = fake.jobs[again.id].spec
    # The reference goes in as the front model so the service's IRI cache (by front hash) hits.
    assert spec["front"]["checkpoint"] == first.id
    assert spec["back"]["checkpoint"] == file_sha256(cand)
    assert spec["layers"] == LAYER


def test_ids_are_used_without_any_upload(fake: FakeService, files: tuple[Path, Path]) -> None:
    ref, _ = files
    with Client(fake.url) as client:
        stored = client.upload_checkpoint(ref)
        n = len(fake.requests)
        job = client.compare(stored.id, {"checkpoint": stored.id, "arch": "resnet18"})
    assert [r.method for r in fake.requests[n:]] == ["POST"]  # just the submission
    assert fake.jobs[job.id].spec["back"] == {"checkpoint": stored.id, "arch": "resnet18"}


def test_bad_spec_fails_before_anything_is_sent(
    fake: FakeService, files: tuple[Path, Path]
) -> None:
    ref, cand = files
    with Client(fake.url) as client, pytest.raises(InvalidSpec) as info:
        client.compare(ref, cand, train={"epochs": 0}, objectives=["slm", "nope"])
    assert fake.requests == []
    message = str(info.value)
    assert "train.epochs: Input should be greater than or equal to 1" in message
    assert "objectives.1" in message


def test_a_pickle_is_refused_before_upload(fake: FakeService, tmp_path: Path) -> None:
    pickled = tmp_path / "model.pt"
    pickled.write_bytes(b"\x80\x04\x95" + b"\x00" * 64)
    with Client(fake.url) as client, pytest.raises(InvalidFile) as info:
        client.upload_checkpoint(pickled)
    assert info.value.code == "unsupported_format"
    assert "pickle" in str(info.value) and "safetensors" in str(info.value)
    assert fake.calls("POST", "/checkpoints") == []


def test_missing_file_is_a_usage_error(fake: FakeService, tmp_path: Path) -> None:
    with Client(fake.url) as client, pytest.raises(UsageError, match="neither a file nor"):
        client.compare(tmp_path / "nope.safetensors", "sha256:" + "a" * 64)
    assert fake.requests == []


def test_wait_returns_the_report_and_reports_progress(
    fake: FakeService, files: tuple[Path, Path]
) -> None:
    fake.agreement = {("invariance_aware", "front_to_back"): 0.6}
    seen: list[JobStatus] = []
    with Client(fake.url) as client:
        job = client.compare(*files, layers=LAYER, threshold=0.8)
        report = fast(client).job(job.id).wait(timeout=60, progress=seen.append)
    assert [s.state for s in seen] == ["queued", "running", "succeeded"]
    assert report.job_id == job.id
    assert report.summary.similarity == pytest.approx(0.6)
    assert report.verdict == "dissimilar"


def test_wait_raises_the_service_reason_when_the_job_fails(
    fake: FakeService, files: tuple[Path, Path]
) -> None:
    fake.states = [
        {
            "state": "failed",
            "error": {"code": "worker_lost", "message": "out of memory, 3 attempts"},
        }
    ]
    with Client(fake.url) as client, pytest.raises(JobFailed) as info:
        fast(client).compare(*files).wait(timeout=60)
    assert info.value.code == "worker_lost" and not info.value.is_user_error
    assert "out of memory, 3 attempts" in str(info.value)


def test_wait_sees_cancellation(fake: FakeService, files: tuple[Path, Path]) -> None:
    fake.states = [{"state": "running"}]
    with Client(fake.url) as client:
        job = fast(client).compare(*files)
        status = job.cancel()
        assert status.state == "cancelled"
        with pytest.raises(JobCancelled):
            job.wait(timeout=60)


def test_wait_times_out_and_says_where_the_job_is(
    fake: FakeService, files: tuple[Path, Path]
) -> None:
    fake.states = [{"state": "running", "progress": {"stage": "iri", "done": 3, "total": 10}}]
    with Client(fake.url) as client:
        job = client.compare(*files)
        with pytest.raises(WaitTimeout) as info:
            job.wait(timeout=0.3, poll_interval=0.05)
    assert isinstance(info.value, TimeoutError)
    assert "still running after 0.3s (stage iri, 3/10)" in str(info.value)


def test_wait_rides_out_a_short_outage(fake: FakeService, files: tuple[Path, Path]) -> None:
    with Client(fake.url, retries=0) as client:
        job = fast(client).compare(*files)
        # A load balancer's answers while the gateway behind it restarts.
        fake.inject("GET", f"/jobs/{job.id}", 503, times=4, proxy=True)
        report = job.wait(timeout=60)
    assert report.job_id == job.id
    assert len(fake.calls("GET", f"/jobs/{job.id}")) >= 4 + 3


def _status_polls(fake: FakeService, job_id: str) -> list[Any]:
    return [r for r in fake.calls("GET", f"/jobs/{job_id}")
            if r.path.split("?")[0] == f"/jobs/{job_id}"]


def _header(recorded: Any, name: str) -> str | None:
    return {k.lower(): v for k, v in recorded.headers.items()}.get(name.lower())


RUNNING = {"state": "running", "progress": {"stage": "train", "done": 1, "total": 2}}


def test_wait_long_polls_with_the_etag_and_shows_every_answer(
    fake: FakeService, files: tuple[Path, Path]
) -> None:
    """Against a service with ETags every status request is a long-poll naming the status it
    has; a 304 (no change within the wait) gives the callback the same status again, and the
    only pauses are what is left of poll_interval, not a polling schedule."""
    fake.etags = True
    fake.states = [{"state": "queued"}, RUNNING, RUNNING,
                   {"state": "succeeded", "progress": {"stage": "done", "done": 2, "total": 2}}]
    seen: list[JobStatus] = []
    pauses: list[float] = []
    with Client(fake.url) as client:
        job = client.compare(*files)
        client.http.sleep = pauses.append
        job.wait(timeout=60, progress=seen.append)
    polls = _status_polls(fake, job.id)
    assert len(polls) == 4
    assert all("wait=30" in p.path for p in polls)
    sent = [_header(p, "If-None-Match") for p in polls]
    assert sent[0] is None and all(sent[1:])
    assert sent[2] == sent[3]  # the 304 kept the ETag it had
    assert [s.state for s in seen] == ["queued", "running", "running", "succeeded"]
    assert seen[1] is seen[2]
    assert len(pauses) == 3 and all(0 <= p <= 0.5 for p in pauses), pauses


def test_a_long_poll_may_outlast_the_read_timeout(
    fake: FakeService, files: tuple[Path, Path]
) -> None:
    """A long-poll answered after 1.5 s by a client whose read timeout is 1 s: the request's
    own timeout covers the wait it asked for (no outage tolerated: a read timeout fails)."""
    fake.etags, fake.hold_s = True, 1.5
    fake.states = [RUNNING, RUNNING, {"state": "succeeded"}]
    with Client(fake.url, timeout=1.0, retries=0) as client:
        job = fast(client).compare(*files)
        report = job.wait(timeout=60, long_poll=2, outage_tolerance=0)
    assert report.job_id == job.id
    assert [_header(p, "If-None-Match") is not None for p in _status_polls(fake, job.id)] == [
        False, True, True]


def test_wait_polls_an_older_service_on_a_growing_interval(
    fake: FakeService, files: tuple[Path, Path]
) -> None:
    """No ETag in the answers (a service before long-polls): wait() falls back to polling
    every poll_interval, growing by half each time up to max_poll_interval."""
    fake.states = [{"state": "queued"}, RUNNING, RUNNING, RUNNING, {"state": "succeeded"}]
    pauses: list[float] = []
    with Client(fake.url) as client:
        job = client.compare(*files)
        client.http.sleep = pauses.append
        job.wait(timeout=60, poll_interval=0.5, max_poll_interval=1.0)
    assert pauses == [0.5, 0.75, 1.0, 1.0]
    assert all(_header(p, "If-None-Match") is None for p in _status_polls(fake, job.id))


def test_api_key_is_sent_and_a_wrong_one_is_an_auth_error(
    fake: FakeService, files: tuple[Path, Path]
) -> None:
    fake.api_key = "ssk_right"
    with Client(fake.url, "ssk_right") as client:
        client.compare(*files)
    with Client(fake.url, "ssk_wrong") as client, pytest.raises(AuthenticationError):
        client.compare(*files)


def test_report_downloads(fake: FakeService, files: tuple[Path, Path], tmp_path: Path) -> None:
    with Client(fake.url) as client:
        job = fast(client).compare(*files, threshold=0.5)
        job.wait(timeout=60)
        out = job.save_report(tmp_path / "out" / "r.json")
        page = job.save_report(tmp_path / "r.html", format="html")
    assert '"verdict":"similar"' in out.read_text().replace(" ", "")
    assert page.read_text() == f"<html><body>job {job.id}: similar</body></html>"


def status(state: str, stage: str = "train", done: int = 0, total: int = 0) -> JobStatus:
    return JobStatus.model_validate(
        {
            "id": "j1",
            "state": state,
            "created_at": "2026-01-01T00:00:00Z",
            "progress": {"stage": stage, "done": done, "total": total, "eta_s": 75},
        }
    )


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_progress_lines_for_logs_are_few_and_plain() -> None:
    buf, clock = io.StringIO(), Clock()
    printer = ProgressPrinter(buf, job_id="0123456789abcdef", clock=clock)
    assert printer.mode == "lines"  # StringIO is not a TTY
    printer(status("queued", "queued"))
    for done in range(0, 101):  # one poll a second for 100 s, one stage
        clock.now = done + 1.0
        printer(status("running", "train", done, 100))
    clock.now = 102
    printer(status("succeeded", "done", 100, 100))
    printer.close()
    lines = buf.getvalue().splitlines()
    # queued; running at 0%; then a line per tenth, each 10 s after the last; succeeded
    assert len(lines) == 1 + 1 + 10 + 1
    assert lines[0] == "stitchsim: job 01234567: queued, elapsed 0s"
    assert lines[1] == "stitchsim: job 01234567: train, 0/100 (0%), eta 1m15s, elapsed 1s"
    assert lines[6] == "stitchsim: job 01234567: train, 50/100 (50%), eta 1m15s, elapsed 51s"
    assert lines[-1] == "stitchsim: job 01234567: succeeded, elapsed 1m42s"
    assert "\r" not in buf.getvalue() and "\x1b" not in buf.getvalue()


def test_progress_lines_are_rate_limited_when_stages_churn() -> None:
    buf, clock = io.StringIO(), Clock()
    printer = ProgressPrinter(buf, clock=clock)
    for second in range(60):  # a new stage every second, 1 % done: still one line per 10 s
        clock.now = float(second)
        printer(status("running", f"stage {second}", 1, 100))
    assert len(buf.getvalue().splitlines()) == 6
    clock.now = 200.0  # a minute of silence on the same stage: the heartbeat speaks
    printer(status("running", "stage 59", 1, 100))
    printer(status("running", "stage 59", 1, 100))
    assert len(buf.getvalue().splitlines()) == 7


def test_unknown_eta_is_not_shown_as_zero() -> None:
    buf = io.StringIO()
    printer = ProgressPrinter(buf, clock=Clock())
    printer(
        JobStatus.model_validate(
            {"id": "j", "state": "running", "created_at": "2026-01-01T00:00:00Z",
             "progress": {"stage": "iri", "done": 3, "total": 9, "eta_s": 0}}
        )
    )  # fmt: skip
    assert buf.getvalue() == "stitchsim: job: iri, 3/9 (33%), elapsed 0s\n"


def test_progress_bar_redraws_one_line() -> None:
    buf = io.StringIO()
    printer = ProgressPrinter(buf, mode="bar", width=10)
    printer(status("running", "iri", 5, 10))
    printer(status("succeeded", "done", 0, 0))
    printer.close()
    text = buf.getvalue()
    assert text.count("\r\x1b[K") == 2 and text.endswith("\n") and text.count("\n") == 1
    assert "[#####-----]  50%  iri  5/10" in text
    assert "[##########] 100%  succeeded" in text


def test_one_version_everywhere() -> None:
    from importlib.metadata import version

    import stitchsim
    from stitchsim.sdk import transport

    assert stitchsim.__version__ == version("stitchsim")
    assert f"stitchsim-python/{stitchsim.__version__}" == transport.USER_AGENT


def test_compare_validates_the_spec_once(
    fake: FakeService, files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from stitchsim.models import Spec

    calls: list[object] = []
    original = Spec.model_validate

    def counted(payload: object, *args: object, **kwargs: object) -> Spec:
        calls.append(payload)
        return original(payload, *args, **kwargs)

    monkeypatch.setattr(Spec, "model_validate", counted)
    with Client(fake.url) as client:
        job = client.compare(*files, layers=LAYER, dataset="digits_marker")
    assert len(calls) == 1
    spec = fake.jobs[job.id].spec
    assert spec["front"]["checkpoint"] == file_sha256(files[0])
    assert spec["dataset"] == "digits_marker" and spec["layers"] == LAYER
