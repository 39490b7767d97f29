"""Limits at the HTTP edge, over real sockets against `serve`: clients that trickle headers or
bodies get 408 and are closed (spool files removed), connections beyond the cap get 503 at
once, uploads beyond the per-key cap get 429 with Retry-After, and the gateway's file
descriptors come back to where they were."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import time
from pathlib import Path

import pytest

EDGE_ENV = {
    "STITCHSIM_HEADER_TIMEOUT_S": "2",
    "STITCHSIM_BODY_READ_TIMEOUT_S": "2",
    "STITCHSIM_MIN_BODY_RATE_BYTES_S": "4096",
    "STITCHSIM_MAX_CONNECTIONS": "60",
    "STITCHSIM_MAX_CONCURRENT_UPLOADS": "10",
    "STITCHSIM_MAX_CONCURRENT_UPLOADS_PER_KEY": "3",
}
N_SLOW_HEADERS = 40


@pytest.fixture(scope="module")
def edge(tmp_path_factory):  # type: ignore[no-untyped-def]
    from tests.fixtures_service import ServiceFactory

    factory = ServiceFactory(tmp_path_factory)
    yield factory.embedded(workers=False, extra_env=EDGE_ENV)
    factory.close()


def _port(svc) -> int:  # type: ignore[no-untyped-def]
    return int(svc.url.rsplit(":", 1)[1])


def _fds(svc) -> int:  # type: ignore[no-untyped-def]
    return len(os.listdir(f"/proc/{svc.procs['serve'].pid}/fd"))


def _status(sock: socket.socket, timeout: float) -> tuple[int | None, bytes]:
    """The status of the response the server sends (None: nothing within timeout), and it."""
    sock.settimeout(timeout)
    data = b""
    with contextlib.suppress(OSError):
        while b"\r\n\r\n" not in data:
            piece = sock.recv(65536)
            if not piece:
                break
            data += piece
    if not data.startswith(b"HTTP/1.1 "):
        return None, data
    return int(data[9:12]), data


def _upload_head(length: int) -> bytes:
    return (f"POST /checkpoints HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def _safetensors_start() -> bytes:
    header = b'{"w":{"dtype":"F32","shape":[262144],"data_offsets":[0,1048576]}}'
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header


def test_slow_headers_get_408_and_are_closed(edge) -> None:  # type: ignore[no-untyped-def]
    baseline = _fds(edge)
    socks = [socket.create_connection(("127.0.0.1", _port(edge))) for _ in range(N_SLOW_HEADERS)]
    for s in socks:
        s.sendall(b"POST /checkpoints HTTP/1.1\r\nHost: x\r\n")
    t0 = time.monotonic()
    held = 0
    for _ in range(3):  # trickling keeps no connection alive past the deadline
        time.sleep(0.5)
        held = max(held, _fds(edge))
        for s in socks:
            with contextlib.suppress(OSError):
                s.sendall(b"X")
    statuses = [_status(s, timeout=6)[0] for s in socks]
    took = time.monotonic() - t0
    for s in socks:
        s.close()
    time.sleep(0.5)
    print(f"{N_SLOW_HEADERS} slow-header clients: {statuses.count(408)} got 408 in {took:.1f} s; "
          f"gateway fds {baseline} -> {held} -> {_fds(edge)}")
    assert statuses == [408] * N_SLOW_HEADERS, statuses
    assert took < 8, took
    assert _fds(edge) <= baseline + 2


def test_connections_beyond_the_cap_get_503_at_once(edge) -> None:  # type: ignore[no-untyped-def]
    socks = [socket.create_connection(("127.0.0.1", _port(edge))) for _ in range(70)]
    try:
        t0 = time.monotonic()
        early = [_status(s, timeout=0.5) for s in socks[60:]]
        assert [st for st, _ in early] == [503] * 10, early
        assert all(b"retry-after: " in raw.lower() for _, raw in early)
        assert time.monotonic() - t0 < 5
        # The ones within the cap are still served (they only waited for their headers).
        socks[0].sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _status(socks[0], timeout=5)[0] == 200
    finally:
        for s in socks:
            s.close()


def test_slow_bodies_get_408_and_leave_no_spool_file(edge) -> None:  # type: ignore[no-untyped-def]
    tmp = Path(edge.data_dir) / "tmp"
    socks = []
    for _ in range(3):  # the per-key cap
        s = socket.create_connection(("127.0.0.1", _port(edge)))
        s.sendall(_upload_head(1048576 + 80) + _safetensors_start())
        socks.append(s)
    time.sleep(0.3)
    spooled = len(list(tmp.glob("*")))
    # A fourth upload of the same key while three are received: 429 before its body is read.
    with edge.client() as c:
        r = c.post("/checkpoints", content=b"\0" * 1024,
                   headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "too_many_uploads" and r.headers["Retry-After"]
    t0 = time.monotonic()
    for _ in range(8):  # a byte every half second: alive, but far below the minimum rate
        time.sleep(0.5)
        for s in socks:
            with contextlib.suppress(OSError):
                s.sendall(b"\0")
    results = [_status(s, timeout=6) for s in socks]
    took = time.monotonic() - t0
    for s in socks:
        s.close()
    print(f"3 slow uploads: {[st for st, _ in results]} after {took:.1f} s; spool files "
          f"{spooled} -> {len(list(tmp.glob('*')))}")
    assert [st for st, _ in results] == [408] * 3, results
    assert all(b'"request_timeout"' in raw or b"connection: close" in raw.lower()
               for _, raw in results)
    assert spooled == 3
    assert not list(tmp.glob("*")), "spool files left behind"
    # The slots are free again.
    with edge.client() as c:
        r = c.post("/checkpoints", content=b"\0" * 1024,
                   headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 422, r.text  # refused for what it is, not for the cap
