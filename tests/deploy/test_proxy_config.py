"""deploy/nginx.conf, the reverse proxy of docker-compose.yml: nginx's own validator accepts it
(and refuses broken copies, so the check is not vacuous), and its figures agree with the
gateway's (body size, long-poll and event-stream timings). It runs in front of a real gateway
in tests/service/test_edge_limits.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from stitchsim_service.core.settings import Settings
from stitchsim_service.gateway.routers.jobs import EVENTS_KEEPALIVE_S, MAX_WAIT_S

from tests.deploy import nginx

_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}


def directive(name: str) -> str:
    """The value of a directive that appears exactly once in the file."""
    found = re.findall(rf"^\s*{name} ([^;]+);", nginx.NGINX_CONF.read_text(), re.MULTILINE)
    assert len(found) == 1, (name, found)
    return str(found[0])


def seconds(value: str) -> float:
    m = re.fullmatch(r"(\d+)(ms|s|m|h)?", value)
    assert m, value
    return int(m[1]) * _SECONDS[m[2] or "s"]


def size(value: str) -> int:
    m = re.fullmatch(r"(\d+)([kmg]?)", value.lower())
    assert m, value
    return int(m[1]) * _UNITS[m[2]]


def test_nginx_accepts_the_config(tmp_path: Path) -> None:
    binary = nginx.nginx_binary()
    result = nginx.check(binary, nginx.NGINX_CONF, tmp_path)
    assert result.returncode == 0, result.stderr
    # What the tests run: the same file with a local gateway and port.
    rendered = tmp_path / "rendered.conf"
    rendered.write_text(nginx.render(upstream_port=8000, listen_port=nginx.free_port()))
    assert nginx.check(binary, rendered, tmp_path).returncode == 0


@pytest.mark.parametrize("broken,complaint", [
    (("client_header_timeout 15s;", "client_header_timout 15s;"), "unknown directive"),
    (("client_body_timeout 30s;", "client_body_timeout thirty;"), "invalid value"),
    (("limit_conn per_client 100;", "limit_conn no_such_zone 100;"), "zero size shared memory"),
])
def test_nginx_refuses_broken_copies(broken: tuple[str, str], complaint: str,
                                     tmp_path: Path) -> None:
    binary = nginx.nginx_binary()
    text = nginx.NGINX_CONF.read_text()
    assert broken[0] in text
    conf = tmp_path / "broken.conf"
    conf.write_text(text.replace(broken[0], broken[1]))
    result = nginx.check(binary, conf, tmp_path)
    assert result.returncode != 0 and complaint in result.stderr, result.stderr


def test_the_proxy_figures_fit_the_gateway() -> None:
    settings = Settings()
    # A slowloris is cut off well before the gateway's own body timeout would matter.
    assert seconds(directive("client_header_timeout")) <= 30
    assert seconds(directive("client_body_timeout")) <= settings.body_read_timeout_s
    assert seconds(directive("keepalive_timeout")) <= 60
    # The largest upload the gateway takes passes, in a multipart envelope.
    assert size(directive("client_max_body_size")) > settings.max_upload_bytes
    # A long-poll's whole wait and an event stream's keep-alive fit in one upstream read.
    assert seconds(directive("proxy_read_timeout")) > max(MAX_WAIT_S, EVENTS_KEEPALIVE_S) + 10
    # Uploads stream through (upload slots answer before the body), caps are set.
    assert directive("proxy_request_buffering") == "off"
    assert int(directive("limit_conn per_client")) >= 10
    assert int(directive("worker_connections")) >= 1024
    assert directive("limit_conn_status") == "503"
