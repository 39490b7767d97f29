"""A client that goes away mid-upload costs one INFO line in the gateway's log, not a traceback:
100 aborted uploads over real sockets against `serve`, and the log stays small and the upload
spool empty."""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

import pytest

N_ABORTS = 100


def _safetensors_start() -> bytes:
    header = b'{"w":{"dtype":"F32","shape":[262144],"data_offsets":[0,1048576]}}'
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header


def _aborted_upload(port: int, raw: bool) -> None:
    """Headers and part of the body of a 1 MiB upload, then a reset connection."""
    body = _safetensors_start() + b"\0" * 65536
    if raw:
        head = (f"POST /checkpoints HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream"
                f"\r\nContent-Length: {1048576 + 80}\r\n\r\n").encode()
    else:
        boundary = "b0undary"
        body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
                f"filename=\"m.safetensors\"\r\nContent-Type: application/octet-stream\r\n\r\n"
                ).encode() + body
        head = (f"POST /checkpoints HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; "
                f"boundary={boundary}\r\nContent-Length: {1048576 + 400}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head + body)
        time.sleep(0.02)  # let the gateway start reading the body
        # RST on close, as a killed client or a dropped network does.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def _log(svc) -> Path:  # type: ignore[no-untyped-def]
    return svc.data_dir / "logs" / "serve.log"


@pytest.mark.parametrize("raw", [False, True], ids=["multipart", "raw"])
def test_aborted_uploads_log_one_line_each(service_factory, raw: bool) -> None:  # type: ignore[no-untyped-def]
    svc = service_factory.embedded(workers=False)
    port = int(svc.url.rsplit(":", 1)[1])
    before = _log(svc).stat().st_size
    for _ in range(N_ABORTS // 2):
        _aborted_upload(port, raw)
    time.sleep(1.0)  # the gateway notices the resets
    with svc.client() as c:  # still serving
        assert c.get("/healthz").status_code == 200
    text = _log(svc).read_bytes()[before:].decode(errors="replace")
    lines = [line for line in text.splitlines() if line.strip()]
    print(f"{N_ABORTS // 2} aborted uploads: {len(text)} bytes, {len(lines)} log lines")
    assert "Traceback" not in text, text[-3000:]
    assert "ERROR" not in text, text[-3000:]
    disconnects = [line for line in lines if "disconnected" in line]
    # One line per aborted upload: the disconnect, or (when the reset beat the request to the
    # app, so the peer address was already gone) the access line of its refusal.
    about = [line for line in lines if "/checkpoints" in line]
    assert len(about) == N_ABORTS // 2, about[-10:]
    assert len(disconnects) >= N_ABORTS // 2 - 5, about[-10:]
    assert all(" INFO " in line for line in disconnects), disconnects[:3]
    assert len(text) < 300 * N_ABORTS, len(text)
    deadline = time.monotonic() + 10
    while any((svc.data_dir / "tmp").glob("*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not list((svc.data_dir / "tmp").glob("*")), "spool files left behind"
