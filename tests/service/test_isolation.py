"""One key cannot see or use another key's jobs, checkpoints, datasets or reports (404, never
403: existence is not revealed), and keys are stored only as hashes."""

from __future__ import annotations

import hashlib

from sqlalchemy import create_engine, text

from tests.service.conftest import tiny_spec, upload
from tests.service.helpers import dataset_bytes


def test_keys_are_isolated(redis_service, ckpts) -> None:  # type: ignore[no-untyped-def]
    svc = redis_service
    with svc.client() as alice, svc.client(svc.other_key) as bob:
        ckpt = upload(alice, ckpts.digits_resnet)
        ds = alice.post("/datasets", files={"file": ("d.safetensors", dataset_bytes(hw=8))})
        assert ds.status_code in (200, 201), ds.text
        ds_id = ds.json()["id"]
        r = alice.post("/similarity", json=tiny_spec({"checkpoint": ckpt},
                                                     {"checkpoint": ckpt}, directions="both"))
        assert r.status_code == 202, r.text
        job = r.json()["job_id"]
        assert svc.wait_job(job)[-1]["state"] == "succeeded"

        for path in (f"/jobs/{job}", f"/jobs/{job}/report", f"/jobs/{job}/report.html",
                     f"/checkpoints/{ckpt}", f"/datasets/{ds_id}"):
            assert alice.get(path).status_code == 200, path
            r = bob.get(path)
            assert r.status_code == 404, path
            assert r.json()["error"]["code"] == "not_found"
        assert bob.delete(f"/jobs/{job}").status_code == 404
        assert job not in {j["id"] for j in bob.get("/jobs").json()["items"]}
        assert ckpt not in {c["id"] for c in bob.get("/checkpoints").json()}
        assert ds_id not in {d["id"] for d in bob.get("/datasets").json()}
        assert {d["id"] for d in bob.get("/datasets").json() if d["builtin"]} >= {"digits"}

        # Knowing the ids is not enough to use them.
        r = bob.post("/similarity", json=tiny_spec({"checkpoint": ckpt}, {"checkpoint": ckpt}))
        assert r.status_code == 404 and "front checkpoint" in r.json()["error"]["message"]
        own = upload(bob, ckpts.digits_resnet_b)
        r = bob.post("/similarity", json=tiny_spec({"checkpoint": own}, {"checkpoint": own},
                                                   dataset=ds_id))
        assert r.status_code == 404 and "dataset" in r.json()["error"]["message"]

        # Uploading the same bytes makes them bob's too: 201 (new for bob), so the answer
        # does not reveal that alice has them.
        with open(ckpts.digits_resnet, "rb") as fh:
            r = bob.post("/checkpoints", files={"file": fh})
        assert r.status_code == 201 and r.json()["id"] == ckpt
        assert bob.get(f"/jobs/{job}").status_code == 404

    # No key, or a key that is not one: 401 everywhere (keys are required on this service).
    import httpx

    for method, path in (("GET", "/jobs"), ("GET", f"/jobs/{job}"), ("POST", "/checkpoints"),
                         ("GET", "/datasets")):
        r = httpx.request(method, svc.url + path)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
        assert r.headers["www-authenticate"] == "Bearer"
        r = httpx.request(method, svc.url + path, headers={"X-API-Key": svc.api_key + "x"})
        assert r.status_code == 401

    # At rest: only SHA-256 hashes of the keys.
    url = svc.database_url.replace("postgresql://", "postgresql+psycopg://", 1)
    engine = create_engine(url)
    with engine.connect() as conn:
        rows = [tuple(map(str, r)) for r in conn.execute(text("SELECT * FROM api_keys"))]
    engine.dispose()
    dump = repr(rows)
    assert svc.api_key not in dump and svc.other_key not in dump
    assert hashlib.sha256(svc.api_key.encode()).hexdigest() in dump
