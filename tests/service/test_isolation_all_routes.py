"""Isolation on every route, with the route list taken from the service's own OpenAPI document.

Public routes (no key, no user data): the health and readiness probes, the Prometheus metrics,
and the API's description (`/openapi.json`, `/docs`, `/redoc`). Every other route answers 401
without a valid key, and another key's ids are 404 `not_found` wherever they appear (path or
body), exactly as for ids that do not exist. A route this file does not know fails the test,
so the table cannot go stale. Keys appear in clear nowhere the service writes: logs, job
table, store, cache.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import APIRouter
from sqlalchemy import create_engine, inspect, text
from starlette.routing import Route as StarletteRoute
from stitchsim_service.core.settings import Settings
from stitchsim_service.gateway import routers
from stitchsim_service.gateway.main import create_app

from tests.service.conftest import tiny_spec
from tests.service.helpers import (
    PUBLIC_PATHS,
    assert_error_body,
    dataset_bytes,
    restamp,
)

PLACEHOLDERS = {"job_id": "job", "checkpoint_id": "checkpoint", "dataset_id": "dataset"}
IDEMPOTENCY_KEY = f"isolation-{uuid.uuid4().hex}"


@dataclass
class World:
    """Alice's objects (a finished job, a checkpoint, a dataset), bob's (a checkpoint, a
    dataset), and the two keys' clients."""

    svc: Any
    alice: httpx.Client
    bob: httpx.Client
    ids: dict[str, str]
    bob_ids: dict[str, str]

    def path(self, template: str) -> str:
        """The route's path with alice's ids in its placeholders."""
        def fill(m: re.Match[str]) -> str:
            assert m.group(1) in PLACEHOLDERS, f"no id known for {{{m.group(1)}}} in {template}"
            return self.ids[PLACEHOLDERS[m.group(1)]]
        return re.sub(r"\{(\w+)\}", fill, template)


Check = Callable[[World, str, str], None]
"""What another key (bob) gets on a route: check(world, method, route template)."""


def _not_found(world: World, method: str, template: str) -> None:
    r = world.bob.request(method, world.path(template))
    assert r.status_code == 404, (method, template, r.status_code, r.text)
    assert assert_error_body(r)["code"] == "not_found"


def _not_found_keeps_it(what: str) -> Check:
    """For DELETE: 404 to bob, and alice's object is still there afterwards."""
    def check(world: World, method: str, template: str) -> None:
        _not_found(world, method, template)
        assert world.alice.get(world.path(f"/{what}s/{{{what}_id}}")).status_code == 200
    return check


def _owner_sees(world: World, method: str, template: str) -> None:
    """Alice gets her object (so bob's 404 is about the key, not about the id)."""
    r = world.alice.request(method, world.path(template))
    assert r.status_code == 200, (method, template, r.text)


def _others_hidden(world: World, method: str, template: str) -> None:
    r = world.bob.request(method, template)
    assert r.status_code == 200, r.text
    for ident in world.ids.values():
        assert ident not in r.text, (template, ident)


def _public(world: World, method: str, template: str) -> None:
    assert world.bob.request(method, template).status_code == 200


def _submit_with_alices_ids(world: World, method: str, template: str) -> None:
    ckpt = world.ids["checkpoint"]
    r = world.bob.post(template, json=tiny_spec({"checkpoint": ckpt}, {"checkpoint": ckpt}))
    assert r.status_code == 404 and "front checkpoint" in assert_error_body(r)["message"]
    own = world.bob_ids["checkpoint"]
    r = world.bob.post(template, json=tiny_spec({"checkpoint": own}, {"checkpoint": own},
                                                dataset=world.ids["dataset"]))
    assert r.status_code == 404 and "dataset" in assert_error_body(r)["message"]
    # Idempotency keys are per API key: alice's is a new one for bob, never her job.
    r = world.bob.post(template, json=tiny_spec({"checkpoint": own}, {"checkpoint": own}),
                       headers={"Idempotency-Key": IDEMPOTENCY_KEY})
    assert r.status_code == 202, r.text
    assert r.json()["job_id"] != world.ids["job"]
    assert world.bob.delete(r.json()["status_url"]).status_code in (200, 202, 409)


def _upload_stays_own(kind: str) -> Check:
    """Bob's upload is his alone: alice cannot see it."""
    def check(world: World, method: str, template: str) -> None:
        ident = world.bob_ids[kind]
        r = world.alice.get(f"{template}/{ident}")
        assert r.status_code == 404 and assert_error_body(r)["code"] == "not_found"
    return check


def _usage_is_own(world: World, method: str, template: str) -> None:
    """Bob's figures add up from bob's own listings (alice's finished job and files excluded)."""
    usage = world.bob.get(template).json()
    own = [o["size"] for kind in ("checkpoints", "datasets")
           for o in world.bob.get(f"/{kind}").json() if not o.get("builtin")]
    assert usage["stored_bytes"] == sum(own) > 0, usage
    jobs = world.bob.get("/jobs", params={"limit": 100}).json()["items"]
    assert usage["active_jobs"] <= len(jobs), usage


def _both(*checks: Check) -> Check:
    def check(world: World, method: str, template: str) -> None:
        for c in checks:
            c(world, method, template)
    return check


# Every operation of the OpenAPI document, and what another key gets there.
OTHER_KEY: dict[tuple[str, str], Check] = {
    ("GET", "/jobs/{job_id}"): _both(_owner_sees, _not_found),
    ("GET", "/jobs/{job_id}/report"): _both(_owner_sees, _not_found),
    ("GET", "/jobs/{job_id}/report.html"): _both(_owner_sees, _not_found),
    # The owner's stream of a finished job: its last status, then the end.
    ("GET", "/jobs/{job_id}/events"): _both(_owner_sees, _not_found),
    ("DELETE", "/jobs/{job_id}"): _not_found,
    ("GET", "/checkpoints/{checkpoint_id}"): _both(_owner_sees, _not_found),
    ("GET", "/checkpoints/{checkpoint_id}/points"): _both(_owner_sees, _not_found),
    ("DELETE", "/checkpoints/{checkpoint_id}"): _not_found_keeps_it("checkpoint"),
    ("GET", "/datasets/{dataset_id}"): _both(_owner_sees, _not_found),
    ("DELETE", "/datasets/{dataset_id}"): _not_found_keeps_it("dataset"),
    ("GET", "/jobs"): _others_hidden,
    ("GET", "/checkpoints"): _others_hidden,
    ("GET", "/datasets"): _others_hidden,
    ("POST", "/checkpoints"): _upload_stays_own("checkpoint"),
    ("POST", "/datasets"): _upload_stays_own("dataset"),
    ("POST", "/similarity"): _submit_with_alices_ids,
    ("GET", "/usage"): _usage_is_own,
    ("GET", "/healthz"): _public,
    ("GET", "/readyz"): _public,
    ("GET", "/metrics"): _public,
}


def _operations(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}


@pytest.fixture(scope="module")
def openapi(redis_service: Any) -> dict[str, Any]:
    r = httpx.get(redis_service.url + "/openapi.json", timeout=30)
    assert r.status_code == 200
    return dict(r.json())


@pytest.fixture(scope="module")
def world(redis_service: Any, ckpts: Any) -> Iterator[World]:
    svc = redis_service
    stamp = uuid.uuid4().hex  # bytes no other test uploaded, so only alice owns them
    with svc.client() as alice, svc.client(svc.other_key) as bob:
        ids = {
            "checkpoint": _post_file(alice, "/checkpoints",
                                     restamp(ckpts.digits_resnet.read_bytes(), test=stamp)),
            "dataset": _post_file(alice, "/datasets", restamp(dataset_bytes(), test=stamp)),
        }
        bob_ids = {
            "checkpoint": _post_file(bob, "/checkpoints", restamp(
                ckpts.digits_resnet.read_bytes(), test="b" + stamp)),
            "dataset": _post_file(bob, "/datasets", restamp(dataset_bytes(), test="b" + stamp)),
        }
        r = alice.post("/similarity", json=tiny_spec({"checkpoint": ids["checkpoint"]},
                                                     {"checkpoint": ids["checkpoint"]}),
                       headers={"Idempotency-Key": IDEMPOTENCY_KEY})
        assert r.status_code == 202, r.text
        ids["job"] = r.json()["job_id"]
        assert svc.wait_job(ids["job"])[-1]["state"] == "succeeded"
        yield World(svc, alice, bob, ids, bob_ids)


def _post_file(client: httpx.Client, endpoint: str, data: bytes) -> str:
    r = client.post(endpoint, files={"file": ("f.safetensors", data)})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def test_the_table_covers_exactly_the_published_operations(openapi: dict[str, Any]) -> None:
    published = _operations(openapi)
    missing = published - set(OTHER_KEY)
    assert not missing, f"routes without an isolation check (add them to OTHER_KEY): {missing}"
    stale = set(OTHER_KEY) - published
    assert not stale, f"OTHER_KEY names routes the service no longer has: {stale}"


def _declared_routes() -> Iterator[Any]:
    """Every route the code declares: the app's own, and those of every router module."""
    app = create_app(Settings(data_dir=Path("unused")))
    yield from (r for r in app.routes if isinstance(r, StarletteRoute))
    for info in pkgutil.iter_modules(routers.__path__):
        module = importlib.import_module(f"{routers.__name__}.{info.name}")
        for router in (v for v in vars(module).values() if isinstance(v, APIRouter)):
            yield from router.routes


def test_routes_outside_the_openapi_document_are_public(openapi: dict[str, Any]) -> None:
    # A route hidden from the document would escape the table above: only the API's own
    # description and docs pages may be hidden.
    published = _operations(openapi)
    declared = list(_declared_routes())
    assert len(declared) >= len(published)
    for route in declared:
        for method in set(route.methods or ()) - {"HEAD"}:
            assert (method, route.path) in published or route.path in PUBLIC_PATHS, (
                f"{method} {route.path} is neither in the OpenAPI document nor public")


def test_another_keys_ids_are_not_found_on_every_route(world: World,
                                                       openapi: dict[str, Any]) -> None:
    for method, template in sorted(_operations(openapi)):
        OTHER_KEY[(method, template)](world, method, template)
    # Bob's attempts changed nothing of alice's.
    assert world.alice.get(world.path("/jobs/{job_id}")).json()["state"] == "succeeded"


def _bad_credentials(key: str) -> list[dict[str, str]]:
    """No key, a wrong key, and the right key in forms the service does not accept."""
    return [{}, {"Authorization": f"Bearer {key}x"}, {"X-API-Key": key[:-1]},
            {"Authorization": key}, {"Authorization": f"Token {key}"},
            {"Authorization": f"Basic {key}"}, {"X-API-Key": f"Bearer {key}"}]


def test_every_non_public_route_needs_a_valid_key(world: World,
                                                  openapi: dict[str, Any]) -> None:
    key = world.svc.api_key
    for method, template in sorted(_operations(openapi)):
        for headers in _bad_credentials(key):
            r = httpx.request(method, world.svc.url + world.path(template), headers=headers,
                              timeout=30)
            if template in PUBLIC_PATHS:
                assert r.status_code == 200, (method, template, r.text)
                continue
            assert r.status_code == 401, (method, template, headers.keys(), r.text)
            assert assert_error_body(r)["code"] == "unauthorized"
            assert r.headers["www-authenticate"] == "Bearer"
    for path in ("/openapi.json", "/docs", "/redoc"):
        assert httpx.get(world.svc.url + path, timeout=30).status_code == 200


def _database_dump(svc: Any) -> str:
    url = svc.database_url.replace("postgresql://", "postgresql+psycopg://", 1)
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return "\n".join(repr(row) for table in inspect(engine).get_table_names()
                             for row in conn.execute(text(f'SELECT * FROM "{table}"')))
    finally:
        engine.dispose()


def test_keys_appear_in_clear_nowhere(world: World) -> None:
    svc = world.svc
    sent = [svc.api_key, svc.other_key]
    for key in sent:
        for headers in _bad_credentials(key):
            assert httpx.get(svc.url + "/jobs", headers=headers, timeout=30).status_code == 401
    # The key where it never belongs: in the query string and in the path.
    assert httpx.get(svc.url + "/jobs", params={"api_key": svc.api_key},
                     timeout=30).status_code == 401
    assert world.bob.get(f"/jobs/{svc.api_key}").status_code == 404
    # A key with its last character cut is a substring of the key: one search finds both.
    secrets = [k[:-1] for k in sent] + [k + "x" for k in sent]
    dump = _database_dump(svc)
    metrics = httpx.get(svc.url + "/metrics", timeout=30).text
    files = [p for p in svc.data_dir.rglob("*") if p.is_file()]
    assert {"gateway.log", "worker_gpu.log", "worker_checks.log"} <= {p.name for p in files}
    assert any(p.parts[-3:-1] == ("store", "checkpoints") or "checkpoints" in p.parts
               for p in files)
    for secret in secrets:
        assert secret not in dump, "a key is stored in clear in the job table"
        assert secret not in metrics, "a key is in the metrics"
        for p in files:
            assert secret.encode() not in p.read_bytes(), f"a key in clear in {p}"
