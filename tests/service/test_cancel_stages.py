"""Cancellation in every stage: a DELETE while the job prepares (its own test logits, batch by
batch), extracts activations at a stitch point, synthesises IRIs, trains, or runs a control ends
the job `cancelled` within a few seconds, through the real gateway, broker and worker."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.service.conftest import submit, tiny_spec, upload
from tests.service.helpers import dataset_bytes

CANCEL_WITHIN_S = 6.0


def _spec(front: str, back: str, **over: Any) -> dict[str, Any]:
    spec = tiny_spec({"checkpoint": front}, {"checkpoint": back})
    spec["train"] = {**spec["train"], **over.pop("train", {})}
    spec.update(over)
    return spec


@pytest.fixture(scope="module")
def models(live_service, ckpts) -> dict[str, str]:  # type: ignore[no-untyped-def]
    with live_service.client() as c:
        ids = {"front": upload(c, ckpts.digits_resnet), "back": upload(c, ckpts.digits_resnet_b)}
        # Many small test images: batch 1 makes every stage that walks the data long.
        r = c.post("/datasets", files={"file": ("big.safetensors",
                                                dataset_bytes(n_train=400, n_test=6000, hw=8))})
        assert r.status_code in (200, 201), r.text
        ids["big"] = r.json()["id"]
    return ids


def _stage_specs(m: dict[str, str]) -> dict[str, dict[str, Any]]:
    front, back = m["front"], m["back"]
    return {
        # The models' own logits on 6000 test images, one image per batch.
        "prepare": _spec(front, back, dataset=m["big"],
                         train={"batch_size": 1, "max_test_samples": None}),
        "iri": _spec(front, back, protocols=["invariance_aware"],
                     iri={"steps": 10_000, "extra_rounds": 0}),
        "train": _spec(front, back, train={"epochs": 1000}),
        "control": _spec(front, back, controls=["clustered_noise"], train={"epochs": 40},
                         control_settings={"noise_sigmas": [0.1 * k for k in range(1, 11)]}),
    }


def _cancel_in(svc: Any, job: str, stage: str) -> tuple[str, float, str]:
    """Waits for the stage, cancels; (final state, seconds from DELETE to it, stage seen)."""
    seen = svc.wait_job(job, states=("running", "succeeded", "failed", "cancelled"),
                        interval=0.05)
    with svc.client() as c:
        deadline = time.monotonic() + 120
        status = seen[-1]
        while not (status["progress"] or {}).get("stage", "").startswith(stage):
            assert status["state"] in ("queued", "running"), status
            assert time.monotonic() < deadline, f"never reached {stage}: {status}"
            time.sleep(0.05)
            status = c.get(f"/jobs/{job}").json()
        at = status["progress"]["stage"]
        t0 = time.monotonic()
        r = c.delete(f"/jobs/{job}")
        assert r.status_code == 202, r.text
    final = svc.wait_job(job, timeout=120, interval=0.1)[-1]
    return final["state"], time.monotonic() - t0, at


@pytest.mark.parametrize("stage", ["prepare", "iri", "train", "control"])
def test_cancel_in_every_stage(live_service, models, stage: str) -> None:  # type: ignore[no-untyped-def]
    job = submit(live_service, _stage_specs(models)[stage])
    state, took, at = _cancel_in(live_service, job, stage)
    print(f"cancel during {at!r}: {state} after {took:.2f} s")
    assert state == "cancelled", (at, state)
    assert took < CANCEL_WITHIN_S, f"cancelled during {at!r} only after {took:.1f} s"
