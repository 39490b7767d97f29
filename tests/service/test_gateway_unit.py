"""Fast checks without running services: the gateway stays light, settings refuse unsafe
combinations, the store works on a directory and on fsspec URLs, the OpenAPI document."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError
from stitchsim_service.core.settings import Settings, is_loopback
from stitchsim_service.core.store import FsspecStore, LocalStore, object_key, parse_object_id


def test_gateway_imports_no_torch_and_no_worker_code() -> None:
    code = (
        "import sys; from stitchsim_service.gateway.main import create_app; app = create_app(); "
        "app.openapi(); bad = [m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'timm', 'stitchsim_worker', 'torchvision')]; print(bad); "
        "sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_openapi_documents_every_endpoint(tmp_path: Path) -> None:
    from stitchsim_service.gateway.main import create_app

    doc = create_app(Settings(data_dir=tmp_path)).openapi()
    paths = doc["paths"]
    for path, method in [("/checkpoints", "post"), ("/datasets", "post"), ("/datasets", "get"),
                         ("/similarity", "post"), ("/jobs", "get"), ("/jobs/{job_id}", "get"),
                         ("/jobs/{job_id}", "delete"), ("/jobs/{job_id}/report", "get"),
                         ("/jobs/{job_id}/report.html", "get"), ("/healthz", "get"),
                         ("/readyz", "get"), ("/metrics", "get")]:
        assert method in paths[path], (path, method)
    body = paths["/similarity"]["post"]["requestBody"]["content"]
    assert set(body) == {"application/json", "multipart/form-data"}
    assert "Spec" in doc["components"]["schemas"]
    assert "ErrorBody" in doc["components"]["schemas"]


def test_settings_refuse_time_limit_beyond_visibility_timeout() -> None:
    with pytest.raises(ValidationError, match="VISIBILITY_TIMEOUT"):
        Settings(job_time_limit_s=7200, visibility_timeout_s=3600)
    s = Settings(job_time_limit_s=7200)
    assert s.resolved_visibility_timeout_s > s.job_time_limit_s
    with pytest.raises(ValidationError, match="STALE_AFTER"):
        Settings(heartbeat_s=10, stale_after_s=15)


@pytest.mark.parametrize("host,required", [("127.0.0.1", False), ("localhost", False),
                                           ("::1", False), ("0.0.0.0", True),
                                           ("10.1.2.3", True), ("example.org", True)])
def test_keys_required_beyond_loopback(host: str, required: bool) -> None:
    assert Settings(host=host).keys_required is required
    # An explicit "false" cannot open a non-loopback bind.
    assert Settings(host=host, require_api_key=False).keys_required is required
    assert Settings(host=host, require_api_key=True).keys_required
    assert is_loopback(host) is not required


def test_object_ids_never_make_paths() -> None:
    good = "sha256:" + "a" * 64
    assert object_key("checkpoints", good) == f"checkpoints/aa/{'a' * 64}.safetensors"
    for bad in ("sha256:../../etc/passwd", "sha256:" + "A" * 64, "md5:" + "a" * 32, good + "/x"):
        with pytest.raises(ValueError):
            parse_object_id(bad)
    with pytest.raises(ValueError):
        object_key("../x", good)


@pytest.mark.parametrize("kind", ["local", "file-url", "memory"])
def test_store_backends(kind: str, tmp_path: Path) -> None:
    if kind == "local":
        store = LocalStore(tmp_path / "s")
    elif kind == "file-url":
        store = FsspecStore(f"file://{tmp_path / 's'}")
    else:
        store = FsspecStore(f"memory://stitchsim-test-{tmp_path.name}")
    import hashlib

    data = b"some bytes" * 1000
    digest = hashlib.sha256(data).hexdigest()
    src = tmp_path / "upload.part"
    src.write_bytes(data)
    key = object_key("checkpoints", f"sha256:{digest}")
    store.ping()
    assert not store.has(key)
    assert store.put_file(key, src) is True
    assert store.put_file(key, src) is False  # content-addressed: already there
    assert store.has(key) and store.keys("checkpoints") == [key]
    local = store.local_path(key, tmp_path / "cache")
    assert local.read_bytes() == data
    store.put_bytes("reports/" + "0" * 32 + ".json", b"{}")
    assert store.get_bytes("reports/" + "0" * 32 + ".json") == b"{}"
    assert store.get_bytes("reports/" + "1" * 32 + ".json") is None
    store.delete(key)
    assert not store.has(key)


def test_worker_parent_imports_neither_torch_nor_the_gateway() -> None:
    # The Celery parent forks pool children: it must not have touched torch (let alone CUDA);
    # the engine is imported in each child after the fork. And no worker process loads the
    # gateway's FastAPI: workers import the service's core only.
    code = (
        "import sys; import stitchsim_worker.tasks, stitchsim_worker.cli; "
        "from stitchsim_worker.celery_app import app; "
        "assert {'stitchsim.run_job', 'stitchsim.check_spec'} <= set(app.tasks); "
        "c = app.conf; assert c.task_acks_late and c.task_reject_on_worker_lost; "
        "assert c.worker_prefetch_multiplier == 1; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'timm', 'fastapi', "
        "'starlette') or m.startswith('stitchsim_service.gateway')]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_status_polls_send_the_stored_spec_without_parsing_it() -> None:
    # The stored spec is the one validated at submission: a poll emits it as stored. A text
    # that no Spec would accept shows that nothing parses or validates it on the way out.
    import json
    from datetime import datetime, timezone

    from stitchsim.models import JobStatus
    from stitchsim_service.core import jobs
    from stitchsim_service.core.db import JobRow

    stored = '{"front":{"checkpoint":"not an id"},"unknown_field":[1,2]}'
    row = JobRow(id="a" * 32, owner="o", state="running", spec_json=stored,
                 created_at=datetime(2026, 1, 1, tzinfo=timezone.utc), attempts=1, stage="iri",
                 done=3, total=9, eta_s=12.0)
    body = json.loads(jobs.status_json(row))
    assert body["spec"] == json.loads(stored)
    assert body["progress"] == {"stage": "iri", "done": 3, "total": 9, "eta_s": 12.0}
    assert JobStatus.model_validate({**body, "spec": None}).state == "running"
    listed = json.loads(jobs.list_json([row], None))
    assert listed["items"][0]["spec"] is None and listed["items"][0]["id"] == "a" * 32


def test_if_none_match_uses_the_weak_comparison() -> None:
    # RFC 9110 13.1.2/13.1.5: a weak tag matches its strong twin for If-None-Match; a list
    # matches when any tag does; * matches any current status.
    from stitchsim_service.core import jobs
    from stitchsim_service.gateway.routers.jobs import etag_matches

    etag = jobs.status_etag(b'{"state":"queued"}')
    assert etag.startswith('"') and etag.endswith('"') and len(etag) == 34
    assert etag != jobs.status_etag(b'{"state":"running"}')
    for header in (etag, f"W/{etag}", f'"x", {etag}', f' W/"y",W/{etag} ', "*", " * "):
        assert etag_matches(header, etag), header
    for header in ('"x"', etag[:-2] + '"', f"{etag[1:-1]}", '"x", W/"y"', ""):
        assert not etag_matches(header, etag), header


def test_quiet_polls_drop_only_answered_status_polls() -> None:
    import logging

    from stitchsim_service.gateway.routers.jobs import QuietPolls

    job = "0123456789abcdef" * 2

    def kept(method: str, path: str, status: int) -> bool:
        record = logging.LogRecord("uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d',
                                   ("127.0.0.1:1", method, path, "1.1", status), None)
        return QuietPolls().filter(record)

    for path in (f"/jobs/{job}", f"/jobs/{job}?wait=30"):
        assert not kept("GET", path, 200) and not kept("GET", path, 304)
        assert kept("GET", path, 404) and kept("DELETE", path, 200)
    assert kept("GET", f"/jobs/{job}/events", 200) and kept("GET", f"/jobs/{job}/report", 200)
    assert kept("GET", "/jobs/" + "g" * 32, 200) and kept("GET", "/jobs", 200)
