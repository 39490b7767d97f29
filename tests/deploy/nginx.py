"""The proxy's config (deploy/nginx.conf) for tests: finding nginx, rendering the config for a
gateway on a local port, running it.

Tests that need nginx fail without it when CI=true (.ci/run installs it) and skip, saying why,
anywhere else.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NGINX_CONF = REPO / "deploy" / "nginx.conf"


def nginx_binary() -> str:
    """The nginx executable; fails the test under CI=true without one, else skips it."""
    found = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None)
    if found is None:
        why = "nginx is not installed (Debian: apt-get install nginx-light or nginx)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why}; .ci/run installs it")
        pytest.skip(why)
    return found


def check(binary: str, conf: Path, prefix: Path) -> subprocess.CompletedProcess[str]:
    """`nginx -t` of conf: nginx's own validator (syntax, directives, values, files)."""
    prefix.mkdir(parents=True, exist_ok=True)
    return subprocess.run([binary, "-t", "-q", "-c", str(conf), "-p", str(prefix), "-e",
                           "stderr", "-g", f"pid {prefix / 'nginx.pid'};"],
                          capture_output=True, text=True, timeout=60)


def _replace(text: str, pattern: str, new: str) -> str:
    out, n = re.subn(pattern, new, text, flags=re.MULTILINE)
    assert n == 1, f"deploy/nginx.conf: expected one match of {pattern!r}, found {n}"
    return out


def render(*, upstream_port: int, listen_port: int,
           directives: dict[str, str] | None = None) -> str:
    """deploy/nginx.conf for a gateway on 127.0.0.1:upstream_port, listening on listen_port,
    with the named directives (each must be in the file once) set to other values, so a test
    need not wait 15 s for a header deadline."""
    text = NGINX_CONF.read_text()
    text = _replace(text, r"^(\s*set \$gateway) [\w.-]+:\d+;", rf"\1 127.0.0.1:{upstream_port};")
    text = _replace(text, r"^(\s*listen) 8080;", rf"\1 127.0.0.1:{listen_port};")
    text = _replace(text, r"^(\s*worker_processes) auto;", r"\1 1;")
    for name, value in (directives or {}).items():
        text = _replace(text, rf"^(\s*{name}) [^;]+;", rf"\g<1> {value};")
    return text


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running(binary: str, conf_text: str, prefix: Path, port: int) -> Iterator[Path]:
    """nginx in the foreground with conf_text until the block ends; yields its log file."""
    prefix.mkdir(parents=True, exist_ok=True)
    conf = prefix / "nginx.conf"
    conf.write_text(conf_text)
    result = check(binary, conf, prefix)
    assert result.returncode == 0, result.stderr
    log = prefix / "nginx.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen([binary, "-c", str(conf), "-p", str(prefix), "-e", "stderr",
                                 "-g", f"daemon off; pid {prefix / 'nginx.pid'};"],
                                stdout=out, stderr=out, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, log.read_text()
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            assert time.monotonic() < deadline, f"nginx did not listen:\n{log.read_text()}"
            time.sleep(0.1)
        yield log
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
