"""Upload → submit → progress → succeeded → report, in both modes, against a real service;
the figures equal an in-process run of the same spec and seed."""

from __future__ import annotations

import json
from typing import Any

from stitchsim.models import JobStatus, Report

from tests.service.conftest import assert_same_figures, figures, tiny_spec, upload

TERMINAL = ("succeeded", "failed", "cancelled")


def _check_progress(seen: list[dict[str, Any]]) -> None:
    states = [s["state"] for s in seen]
    assert states[-1] == "succeeded", seen[-1]
    # queued* running* succeeded, never backwards.
    order = {"queued": 0, "running": 1, "succeeded": 2}
    assert [order[s] for s in states] == sorted(order[s] for s in states), states
    for s in seen:
        JobStatus.model_validate(s)
        p = s["progress"]
        assert 0 <= p["done"] <= max(p["total"], p["done"])
        if p["eta_s"] is not None:
            assert p["eta_s"] >= 0
    final = seen[-1]
    assert final["progress"]["stage"] == "done"
    assert final["started_at"] and final["finished_at"]
    assert final["finished_at"] >= final["started_at"] >= final["created_at"]
    assert final["attempts"] == 1
    assert final["report_url"] == f"/jobs/{final['id']}/report"


def test_embedded_json_submission(live_service, ckpts, reference_report) -> None:  # type: ignore[no-untyped-def]
    svc = live_service
    with svc.client() as c:
        front = upload(c, ckpts.digits_resnet)
        back = upload(c, ckpts.digits_resnet_b)
        # Content-addressed: the same bytes again are "already stored" (200), same id.
        with open(ckpts.digits_resnet, "rb") as fh:
            again = c.post("/checkpoints", content=fh.read(),
                           headers={"content-type": "application/octet-stream"})
        assert again.status_code == 200 and again.json()["id"] == front
        assert again.json()["arch"] == "test_resnet" and again.json()["n_tensors"] > 10

        spec = tiny_spec({"checkpoint": front}, {"checkpoint": back})
        r = c.post("/similarity", json=spec, headers={"Idempotency-Key": "e2e-1"})
        assert r.status_code == 202, r.text
        job_id = r.json()["job_id"]
        assert r.headers["location"] == f"/jobs/{job_id}" == r.json()["status_url"]
        assert int(r.headers["retry-after"]) >= 1
        # A retried POST with the same key is the same job, not a second one.
        again = c.post("/similarity", json=spec, headers={"Idempotency-Key": "e2e-1"})
        assert again.status_code == 202 and again.json()["job_id"] == job_id
        other = c.post("/similarity", json={**spec, "train": {"epochs": 2}},
                       headers={"Idempotency-Key": "e2e-1"})
        assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency_conflict"

        seen = svc.wait_job(job_id)
        _check_progress(seen)

        r = c.get(f"/jobs/{job_id}/report")
        assert r.status_code == 200
        report = Report.model_validate(r.json())
        assert report.job_id == job_id
        assert report.spec.front.checkpoint == front
        assert report.spec.train.max_train_samples == 200
        assert_same_figures(figures(report), figures(reference_report))

        html = c.get(f"/jobs/{job_id}/report.html")
        assert html.status_code == 200 and "text/html" in html.headers["content-type"]
        assert report.front.arch in html.text and "<svg" in html.text  # the plotted page

        listing = c.get("/jobs", params={"limit": 5}).json()
        assert listing["items"][0]["id"] == job_id
        assert sum(1 for j in listing["items"] if j["id"] == job_id) == 1

        metrics = c.get("/metrics").text
        assert 'stitchsim_jobs{state="succeeded"}' in metrics
        succeeded = float(metrics.split('stitchsim_jobs{state="succeeded"} ')[1].split()[0])
        assert succeeded >= 1
        assert "stitchsim_job_duration_seconds_count" in metrics
        assert 'stitchsim_http_requests_total{method="POST",route="/similarity",status="202"}' \
            in metrics
        assert 'stitchsim_queue_depth{queue="gpu"}' in metrics


def test_redis_multipart_submission(redis_service, ckpts, reference_report) -> None:  # type: ignore[no-untyped-def]
    svc = redis_service
    spec = tiny_spec({}, {})
    del spec["front"], spec["back"]
    with svc.client() as c, open(ckpts.digits_resnet, "rb") as f, \
            open(ckpts.digits_resnet_b, "rb") as b:
        r = c.post("/similarity", files={"front": ("a.safetensors", f),
                                         "back": ("b.safetensors", b)},
                   data={"spec": json.dumps(spec)})
        assert r.status_code == 202, r.text
        job_id = r.json()["job_id"]
        seen = svc.wait_job(job_id)
        _check_progress(seen)
        report = Report.model_validate(c.get(f"/jobs/{job_id}/report").json())
        assert_same_figures(figures(report), figures(reference_report))
        # The uploaded files became this key's checkpoints.
        ids = {o["id"] for o in c.get("/checkpoints").json()}
        assert {report.spec.front.checkpoint, report.spec.back.checkpoint} <= ids
        ready = c.get("/readyz").json()
        queues = ready["checks"]["workers"]["queues"]
        assert queues["gpu"] >= 1 and queues["checks"] >= 1
        assert svc.database_url.startswith(("postgresql://", "sqlite:///"))


def test_cancel_queued_and_running(live_service, ckpts) -> None:  # type: ignore[no-untyped-def]
    svc = live_service
    with svc.client() as c:
        front = upload(c, ckpts.digits_resnet)
        long = tiny_spec({"checkpoint": front}, {"checkpoint": front},
                         train={"epochs": 200, "max_train_samples": 1000})
        first = c.post("/similarity", json=long).json()["job_id"]
        second = c.post("/similarity", json=long).json()["job_id"]
        svc.wait_job(first, states=("running", *TERMINAL))

        # The second waits behind the first: cancelled at once.
        r = c.delete(f"/jobs/{second}")
        assert r.status_code == 200 and r.json()["state"] == "cancelled"
        # The first runs: the worker stops it at its next cancel check.
        r = c.delete(f"/jobs/{first}")
        assert r.status_code == 202 and r.json()["state"] == "running"
        final = svc.wait_job(first, timeout=60)[-1]
        assert final["state"] == "cancelled"
        assert svc.wait_job(second)[-1]["state"] == "cancelled"
        # Finished jobs cannot be cancelled again, and have no report.
        assert c.delete(f"/jobs/{first}").status_code == 409
        r = c.get(f"/jobs/{first}/report")
        assert r.status_code == 409 and r.json()["error"]["code"] == "job_cancelled"
