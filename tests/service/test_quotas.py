"""Per-key quotas under load: concurrent jobs (429 with Retry-After, exact under concurrency)
and stored bytes (413), per-key overrides from the operator's CLI, and the load test itself
(200 submissions from four keys with 50 status pollers; zero errors; poll p99 reported).

The services here run the gateway alone: accepted jobs stay queued, so the load measures the
gateway and the job table, and nothing trains in the background.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests.fixtures_service import ServiceFactory, ServiceHandle, cli_command
from tests.service.conftest import tiny_spec, upload
from tests.service.loadgen import pct, run_load

QUOTA = 40
DAVE_QUOTA = 10  # set per key with `stitchsim-server keys limits`
PER_KEY = 50  # 4 keys x 50 = 200 submissions
POLLERS = 50
LOAD_ENV = {
    "STITCHSIM_MAX_ACTIVE_JOBS_PER_KEY": str(QUOTA),
    "STITCHSIM_CHECK_TIMEOUT_S": "0",  # no checks worker: submission-time checks are off
    "STITCHSIM_REQUIRE_API_KEY": "true",
    "STITCHSIM_QUOTA_RETRY_AFTER_S": "7",
}


def _limits(svc: ServiceHandle, key_id: str, *flags: str) -> str:
    out = subprocess.run(cli_command("keys", "limits", key_id, *flags), env=svc.env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _key_id(svc: ServiceHandle, name: str) -> str:
    out = subprocess.run(cli_command("keys", "list"), env=svc.env, capture_output=True,
                         text=True, check=True, timeout=60).stdout
    return next(line.split("\t")[0] for line in out.splitlines() if f"\t{name}\t" in line)


def _gateway_only(factory: ServiceFactory, mode: str) -> ServiceHandle:
    if mode == "embedded":
        return factory.embedded(extra_env=LOAD_ENV, workers=False)
    return factory.redis(keys=False, extra_env=LOAD_ENV, workers=False)


@pytest.mark.parametrize("mode", ["embedded", "redis"])
def test_load_with_job_quota(mode: str, service_factory: ServiceFactory, ckpts: Any) -> None:
    svc = _gateway_only(service_factory, mode)
    keys = {name: svc.create_key(name) for name in ("alice", "bob", "carol", "dave")}
    assert f"0 of {DAVE_QUOTA} jobs" in _limits(svc, _key_id(svc, "dave"), "--max-jobs",
                                                str(DAVE_QUOTA))
    specs = {}
    for name, key in keys.items():
        with svc.client(key) as c:
            specs[name] = tiny_spec({"checkpoint": upload(c, ckpts.digits_resnet)},
                                    {"checkpoint": upload(c, ckpts.digits_resnet_b)})

    figures = run_load(svc.url, keys, specs, per_key=PER_KEY, pollers=POLLERS)
    print(f"\nload test ({mode}):\n  " + "\n  ".join(figures.lines()))

    assert figures.submissions == PER_KEY * len(keys)
    assert not figures.other, figures.other
    assert not figures.poll_errors, figures.poll_errors
    want = {name: DAVE_QUOTA if name == "dave" else QUOTA for name in keys}
    # Exact, not at most: the check and the insert are one transaction under a per-key lock.
    assert {n: len(figures.accepted.get(n, [])) for n in keys} == want
    assert figures.throttled == figures.submissions - sum(want.values())
    assert figures.throttled_without_retry_after == 0
    # Polls kept being answered through the storm, none with an error (5xx included). How many
    # fit in its ~10 s depends on the CPU left over: 700+ alone, 470 beside the other test
    # process (pytest -n 2). The p99 bound is what a loaded 2-core machine holds (10 s was
    # overrun there): polls answered, if slowly, not polls that wait out the 60 s client timeout.
    assert len(figures.poll_ms) > 4 * POLLERS and pct(figures.poll_ms, 99) < 30_000
    # A dropped keep-alive connection is sent again once (loadgen); it must stay the exception.
    assert sum(figures.poll_retries.values()) <= len(figures.poll_ms) // 100, figures.poll_retries
    assert sum(figures.submit_retries.values()) <= figures.submissions // 100, figures.lines()

    for name, key in keys.items():
        with svc.client(key) as c:
            listed = c.get("/jobs", params={"limit": 100}).json()["items"]
            assert sorted(j["id"] for j in listed) == sorted(figures.accepted[name])
            assert {j["state"] for j in listed} == {"queued"}
            usage = c.get("/usage").json()
            assert usage["active_jobs"] == want[name] == usage["max_active_jobs"]
            over = c.post("/similarity", json=specs[name])
            assert over.status_code == 429 and over.headers["retry-after"] == "7"
            err = over.json()["error"]
            assert err["code"] == "too_many_jobs" and f"limit for your key is {want[name]}" in (
                err["message"])
            # Cancelling frees the slots at once.
            for job in figures.accepted[name]:
                assert c.delete(f"/jobs/{job}").status_code in (200, 202)
            assert c.get("/usage").json()["active_jobs"] == 0
            assert c.post("/similarity", json=specs[name]).status_code == 202


@pytest.fixture(scope="module")
def quota_service(tmp_path_factory: pytest.TempPathFactory) -> Any:
    factory = ServiceFactory(tmp_path_factory)
    yield _gateway_only(factory, "redis")
    factory.close()


def test_storage_quota(quota_service: ServiceHandle, ckpts: Any) -> None:
    svc = quota_service
    key = svc.create_key("erin")
    sizes = {p.name: p.stat().st_size for p in (ckpts.digits_resnet, ckpts.digits_resnet_b,
                                                 ckpts.colour_resnet)}
    limit = ckpts.digits_resnet.stat().st_size + ckpts.digits_resnet_b.stat().st_size + 100
    _limits(svc, _key_id(svc, "erin"), "--max-stored-bytes", str(limit))

    with svc.client(key) as c:
        a = upload(c, ckpts.digits_resnet)
        b = upload(c, ckpts.digits_resnet_b)
        assert c.get("/usage").json() == {
            "active_jobs": 0, "max_active_jobs": QUOTA,
            "stored_bytes": limit - 100, "max_stored_bytes": limit,
            "active_units": 0, "max_active_units": 3_000_000}
        # Uploading what the key already has costs nothing.
        assert upload(c, ckpts.digits_resnet) == a

        before = (svc.store_files(), svc.count_rows("objects"), svc.count_rows("ownership"))
        with open(ckpts.colour_resnet, "rb") as fh:
            r = c.post("/checkpoints", files={"file": fh})
        assert r.status_code == 413, r.text
        err = r.json()["error"]
        assert err["code"] == "quota_exceeded"
        assert f"storage quota of {limit} bytes" in err["message"]
        assert "DELETE /checkpoints/{id}" in err["message"]
        assert err["details"]["adding_bytes"] == sizes[ckpts.colour_resnet.name]
        # Also through a submission that carries the file.
        with open(ckpts.colour_resnet, "rb") as fh:
            r = c.post("/similarity", files={"front": fh},
                       data={"spec": json.dumps({"back": {"checkpoint": b}})})
        assert r.status_code == 413 and r.json()["error"]["code"] == "quota_exceeded", r.text
        after = (svc.store_files(), svc.count_rows("objects"), svc.count_rows("ownership"))
        assert after == before, "a refused upload left something behind"

        # A checkpoint a queued job uses cannot go; once the job is cancelled it can.
        job = c.post("/similarity", json=tiny_spec({"checkpoint": a}, {"checkpoint": b}))
        assert job.status_code == 202, job.text
        job_id = job.json()["job_id"]
        r = c.delete(f"/checkpoints/{a}")
        assert r.status_code == 409 and job_id in r.json()["error"]["message"]
        c.delete(f"/jobs/{job_id}")
        assert c.delete(f"/checkpoints/{a}").status_code == 204
        assert c.get(f"/checkpoints/{a}").status_code == 404
        assert c.delete(f"/checkpoints/{a}").status_code == 404
        assert c.get("/usage").json()["stored_bytes"] == sizes[ckpts.digits_resnet_b.name]
        # Nobody else owns it: its bytes left the store.
        assert not any(a.split(":")[1] in f for f in svc.store_files())

        # Now the third fits.
        with open(ckpts.colour_resnet, "rb") as fh:
            assert c.post("/checkpoints", files={"file": fh}).status_code == 201
        assert c.delete("/datasets/digits").status_code == 409


def test_release_keeps_bytes_another_key_owns(quota_service: ServiceHandle, ckpts: Any) -> None:
    svc = quota_service
    k1, k2 = svc.create_key("fay"), svc.create_key("gus")
    with svc.client(k1) as c1, svc.client(k2) as c2:
        ident = upload(c1, ckpts.marker_resnet)
        assert upload(c2, ckpts.marker_resnet) == ident
        assert c1.delete(f"/checkpoints/{ident}").status_code == 204
        assert c1.get(f"/checkpoints/{ident}").status_code == 404
        assert c2.get(f"/checkpoints/{ident}").status_code == 200
        assert any(ident.split(":")[1] in f for f in svc.store_files())
        # And the other key's jobs can still use it.
        r = c2.post("/similarity", json=tiny_spec({"checkpoint": ident}, {"checkpoint": ident}))
        assert r.status_code == 202, r.text
