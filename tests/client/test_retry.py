"""Retries against a real local HTTP server: what is retried, how long it waits, what is raised."""

from __future__ import annotations

import email.utils
import socket
import time
from pathlib import Path

import pytest
from stitchsim import Client
from stitchsim.errors import (
    ConnectionFailed,
    InvalidRequest,
    RateLimited,
    ServiceUnavailable,
)
from stitchsim.sdk import parse_retry_after

from tests.client.fake_service import FakeService
from tests.client.files import write_safetensors

# A complete spec naming stored checkpoints: submit() sends it as it is.
SPEC = {"front": {"checkpoint": "sha256:" + "a" * 64}, "back": {"checkpoint": "sha256:" + "b" * 64}}


def recording(client: Client) -> list[float]:
    waits: list[float] = []
    client.http.sleep = waits.append
    return waits


def test_retry_after_is_honoured_in_real_time(fake: FakeService) -> None:
    fake.inject(
        "GET",
        "/jobs",
        503,
        headers={"Retry-After": "1"},
        body={"error": {"code": "unavailable", "message": "restarting"}},
    )
    with Client(fake.url, retries=3) as client:
        start = time.monotonic()
        page = client.jobs()
        elapsed = time.monotonic() - start
    assert page.items == []
    assert len(fake.calls("GET", "/jobs")) == 2
    assert 1.0 <= elapsed < 3.0


def test_retry_after_as_http_date(fake: FakeService) -> None:
    when = email.utils.formatdate(time.time() + 3, usegmt=True)
    # A rate-limiting proxy in front of the service; those send dates.
    fake.inject("GET", "/jobs", 429, headers={"Retry-After": when}, proxy=True)
    with Client(fake.url, retries=3) as client:
        waits = recording(client)
        client.jobs()
    assert len(waits) == 1 and 1.0 < waits[0] <= 3.0


def test_retry_after_longer_than_allowed_is_not_retried_early(fake: FakeService) -> None:
    fake.inject(
        "POST",
        "/similarity",
        429,
        headers={"Retry-After": "3600"},
        body={"error": {"code": "too_many_jobs", "message": "slow down"}},
    )
    with Client(fake.url, retries=3, max_retry_after=60) as client:
        waits = recording(client)
        with pytest.raises(RateLimited) as info:
            client.submit(SPEC)
    assert waits == []
    assert len(fake.calls("POST", "/similarity")) == 1
    assert (info.value.status_code, info.value.code, info.value.message) == (
        429,
        "too_many_jobs",
        "slow down",
    )


def test_backoff_doubles_then_gives_up_with_the_server_message(fake: FakeService) -> None:
    fake.inject(
        "GET",
        "/jobs",
        503,
        times=10,
        body={"error": {"code": "unavailable", "message": "no workers seen"}},
    )
    with Client(fake.url, retries=3, backoff=0.5) as client:
        waits = recording(client)
        with pytest.raises(ServiceUnavailable) as info:
            client.jobs()
    assert len(fake.calls("GET", "/jobs")) == 4
    # Full backoff times a jitter factor in [0.5, 1]: 0.5, 1, 2 seconds at most.
    assert len(waits) == 3
    for wait, full in zip(waits, (0.5, 1.0, 2.0), strict=True):
        assert full / 2 <= wait <= full
    assert str(info.value) == "no workers seen (unavailable)"


def test_client_errors_are_not_retried(fake: FakeService) -> None:
    details = [{"field": "train.epochs", "message": "must be >= 1"}]
    fake.inject(
        "POST",
        "/similarity",
        422,
        body={"error": {"code": "invalid_spec", "message": "bad epochs", "details": details}},
    )
    with Client(fake.url, retries=3) as client:
        waits = recording(client)
        with pytest.raises(InvalidRequest) as info:
            client.submit(SPEC)
    assert waits == [] and len(fake.calls("POST", "/similarity")) == 1
    assert info.value.code == "invalid_spec" and info.value.details == details


def test_connection_refused_is_retried_then_raised() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Client(f"http://127.0.0.1:{port}", retries=2) as client:
        waits = recording(client)
        with pytest.raises(ConnectionFailed) as info:
            client.jobs()
    assert len(waits) == 2
    assert f"127.0.0.1:{port}" in str(info.value) and "after 3 attempts" in str(info.value)


def test_resubmission_after_503_reuses_the_idempotency_key(
    fake: FakeService, tmp_path: Path
) -> None:
    a = tmp_path / "a.safetensors"
    write_safetensors(a, b"front-bytes")
    fake.inject("POST", "/similarity", 503, headers={"Retry-After": "0"},
                body={"error": {"code": "spec_check_busy", "message": "no check answered"}})
    with Client(fake.url, retries=3) as client:
        job = client.compare(a, a)
    posts = fake.calls("POST", "/similarity")
    assert len(posts) == 2
    keys = {p.headers["Idempotency-Key"] for p in posts}
    assert len(keys) == 1 and len(keys.pop()) >= 16
    assert list(fake.jobs) == [job.id]


def test_upload_retry_sends_the_whole_file_again(fake: FakeService, tmp_path: Path) -> None:
    data = bytes(range(256)) * 4096  # 1 MiB
    path = tmp_path / "big.safetensors"
    write_safetensors(path, data)
    fake.inject("POST", "/checkpoints", 502, headers={"Retry-After": "0"}, proxy=True)
    with Client(fake.url, retries=2) as client:
        stored = client.upload_checkpoint(path)
    posts = fake.calls("POST", "/checkpoints")
    assert len(posts) == 2
    assert all(data in p.body for p in posts)
    assert stored.size == path.stat().st_size


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("5", 5.0),
        ("0.5", 0.5),
        ("-3", 0.0),
        ("soon", None),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),
    ],
)
def test_parse_retry_after(header: str | None, expected: float | None) -> None:
    assert parse_retry_after(header) == expected


def test_a_check_that_timed_out_on_its_own_input_is_not_retried(fake: FakeService) -> None:
    """A spec check that ran out of its own time (spec_check_timeout: the spec's models are
    too slow to build) fails the same way again: one request. A busy checker
    (spec_check_busy) may answer later: retried as Retry-After says."""
    fake.inject("POST", "/similarity", 422,
                body={"error": {"code": "spec_check_timeout", "message": "too slow to build"}})
    with Client(fake.url, retries=3) as client:
        waits = recording(client)
        with pytest.raises(InvalidRequest) as info:
            client.submit(SPEC)
    assert waits == [] and len(fake.calls("POST", "/similarity")) == 1
    assert info.value.code == "spec_check_timeout"

    fake.inject("POST", "/similarity", 503, headers={"Retry-After": "1"}, times=10,
                body={"error": {"code": "spec_check_busy", "message": "checkers busy"}})
    with Client(fake.url, retries=2) as client:
        waits = recording(client)
        with pytest.raises(ServiceUnavailable):
            client.submit(SPEC)
    assert waits == [1.0, 1.0] and len(fake.calls("POST", "/similarity")) == 4
