"""Clear refusals at submission, through the gateway and the checks worker: images smaller than
a model can use (1x1), a device the workers do not have (`cuda:99`), and a job above the
per-job compute budget (every range at its top; the message gives the estimate in seconds),
and a batch whose activations would not fit the activation limit (huge inputs). Each is a 422
with its own code and what to change, and no job is created."""

from __future__ import annotations

import pytest

from tests.service.conftest import tiny_spec, upload
from tests.service.helpers import assert_error_body, dataset_bytes


@pytest.fixture(scope="module")
def pair(live_service, ckpts) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    with live_service.client() as c:
        return upload(c, ckpts.digits_resnet), upload(c, ckpts.digits_vit)


def _refusal(svc, spec) -> dict:  # type: ignore[no-untyped-def, type-arg]
    before = svc.count_rows("jobs")
    with svc.client() as c:
        r = c.post("/similarity", json=spec)
    assert r.status_code == 422, r.text
    assert svc.count_rows("jobs") == before
    return assert_error_body(r)


@pytest.mark.parametrize("back", ["resnet", "vit"])
def test_one_pixel_images_are_refused_at_submission(live_service, pair, back: str) -> None:  # type: ignore[no-untyped-def]
    with live_service.client() as c:
        r = c.post("/datasets", files={"file": ("tiny.safetensors",
                                                dataset_bytes(n_train=40, n_test=20, hw=1))})
    assert r.status_code in (200, 201), r.text
    resnet, vit = pair
    spec = tiny_spec({"checkpoint": resnet}, {"checkpoint": resnet if back == "resnet" else vit},
                     dataset=r.json()["id"], layers="auto")
    err = _refusal(live_service, spec)
    assert err["code"] == "images_too_small", err
    assert "input_size" in err["message"], err


def test_a_device_the_workers_lack_is_refused(live_service, pair) -> None:  # type: ignore[no-untyped-def]
    resnet, _ = pair
    err = _refusal(live_service, tiny_spec({"checkpoint": resnet}, {"checkpoint": resnet},
                                           device="cuda:99"))
    assert err["code"] == "device_unavailable", err
    assert "cuda:99" in err["message"] and "auto" in err["message"], err
    assert "cpu" in err["details"]["available"], err


def test_a_job_above_the_compute_budget_is_refused(live_service, pair) -> None:  # type: ignore[no-untyped-def]
    resnet, _ = pair
    spec = tiny_spec({"checkpoint": resnet}, {"checkpoint": resnet},
                     protocols=["standard", "invariance_aware"],
                     iri={"steps": 10_000, "extra_rounds": 0},
                     train={"epochs": 1000, "seeds": 20, "batch_size": 1})
    err = _refusal(live_service, spec)
    assert err["code"] == "job_too_large", err
    assert err["details"]["units"] > err["details"]["limit"], err
    shrink = " ".join(err["details"]["shrink"])
    for field in ("train.epochs", "train.seeds", "train.batch_size", "iri.steps"):
        assert field in shrink and field in err["message"], (field, err)
    est = err["details"]["estimate"]
    assert est["units"] == err["details"]["units"] and est["seconds"] > 0, err
    assert f"about {est['seconds']:,.0f} s of worker time" in err["message"], err


def test_activations_above_the_limit_are_refused(live_service, pair) -> None:  # type: ignore[no-untyped-def]
    resnet, _ = pair
    # 1024 px inputs: the stem's output alone is 32 x 512 x 512 values a sample, 8 GiB a batch.
    err = _refusal(live_service, tiny_spec({"checkpoint": resnet, "input_size": 1024},
                                           {"checkpoint": resnet}))
    assert err["code"] == "job_too_large", err
    d = err["details"]
    assert d["activation_bytes"] > d["limit"] == 4 * 1024**3, err
    assert d["activation_bytes"] == 32 * 512 * 512 * 256 * 4, err
    assert d["batch"] == 256 and "STITCHSIM_MAX_ACTIVATION_BYTES" in err["message"], err


def test_the_engines_failure_reaches_the_client_unchanged(live_service, pair, ckpts,  # type: ignore[no-untyped-def]
                                                          tmp_path) -> None:
    """One failure type: what the engine raises in its spec check is what the SDK raises, code,
    message and details as they were, through the check task, the core and the gateway."""
    from stitchsim import Client, Failure, InvalidRequest, Spec
    from stitchsim_worker.engine import Resources, check_spec

    resnet, _ = pair
    local = Spec.model_validate(tiny_spec({"checkpoint": {"path": str(ckpts.digits_resnet)}},
                                          {"checkpoint": {"path": str(ckpts.digits_resnet)}},
                                          device="cuda:99"))
    with pytest.raises(Failure) as engine:
        check_spec(local, resources=Resources(cache_dir=tmp_path))
    client = Client(live_service.url, live_service.api_key, retries=0)
    with pytest.raises(InvalidRequest) as answered:
        client.submit(tiny_spec({"checkpoint": resnet}, {"checkpoint": resnet},
                                device="cuda:99"))
    assert isinstance(answered.value, Failure) and answered.value.status_code == 422
    assert answered.value.as_dict() == engine.value.as_dict()
