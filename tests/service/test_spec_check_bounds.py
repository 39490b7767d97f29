"""The spec check cannot be starved into accepting unchecked, and it bounds what it builds.

- No checks worker answering within STITCHSIM_CHECK_TIMEOUT_S (busy with another key's slow
  specs, or gone): the submission gets 503 spec_check_busy with Retry-After, and no job is
  queued unchecked (it used to be accepted with 202).
- A model with more parameters than STITCHSIM_MAX_MODEL_PARAMS is refused with 422
  model_too_large, counted on the meta device (two architectures).
- A job above STITCHSIM_MAX_JOB_UNITS (its progress plan's count) is refused with 422
  job_too_large, naming the fields that make it large.
- Budget units count a batch at the models' size: the same spec on a model with several times
  a resnet18's compute a sample costs that many times the units, and says so.
"""

from __future__ import annotations

import time

import pytest
from stitchsim.models import IRISettings, Spec
from stitchsim_service.core.queue import check_answer_wait_s

from tests.service.conftest import tiny_spec, upload
from tests.service.helpers import assert_error_body


def test_no_check_answer_is_503_not_accepted_unchecked(service_factory, ckpts) -> None:  # type: ignore[no-untyped-def]
    # The gateway alone: the checks queue has nobody consuming it, as when its workers are
    # all busy with other keys' specs.
    svc = service_factory.embedded(workers=False, extra_env={"STITCHSIM_CHECK_TIMEOUT_S": "1"})
    with svc.client() as c:
        ckpt = upload(c, ckpts.digits_resnet)
        t0 = time.monotonic()
        r = c.post("/similarity", json=tiny_spec({"checkpoint": ckpt}, {"checkpoint": ckpt}))
        took = time.monotonic() - t0
    assert r.status_code == 503, r.text
    err = assert_error_body(r)
    assert err["code"] == "spec_check_busy", err
    assert int(r.headers["Retry-After"]) > 0
    assert took < check_answer_wait_s(1) + 5, took  # its wait, not the client's timeout
    assert svc.count_rows("jobs") == 0


@pytest.mark.parametrize("model", ["digits_resnet", "digits_vit"])
def test_models_above_the_parameter_cap_are_refused(ckpts, tmp_path, model: str) -> None:  # type: ignore[no-untyped-def]
    from stitchsim.failure import Failure
    from stitchsim_worker.engine import Resources, check_spec

    path = {"path": str(getattr(ckpts, model))}
    spec = Spec.model_validate(tiny_spec({"checkpoint": path}, {"checkpoint": path},
                                         layers="auto"))
    check_spec(spec, resources=Resources(cache_dir=tmp_path))  # no cap: fine
    check_spec(spec, resources=Resources(cache_dir=tmp_path, max_model_params=10**7))
    with pytest.raises(Failure) as info:
        check_spec(spec, resources=Resources(cache_dir=tmp_path, max_model_params=50_000))
    err = info.value
    assert err.code == "model_too_large", err.message
    assert err.details["limit"] == 50_000 and err.details["parameters"] > 50_000
    assert "STITCHSIM_MAX_MODEL_PARAMS" in err.message


@pytest.mark.parametrize("model", ["digits_resnet", "digits_vit"])
def test_the_budget_counts_what_the_plan_counts(ckpts, tmp_path, model: str) -> None:  # type: ignore[no-untyped-def]
    from stitchsim.failure import Failure
    from stitchsim_worker.engine import Resources, check_spec

    path = {"path": str(getattr(ckpts, model))}
    small = Spec.model_validate(tiny_spec({"checkpoint": path}, {"checkpoint": path},
                                          layers="auto"))
    check_spec(small, resources=Resources(cache_dir=tmp_path, max_job_units=100))
    big = small.model_copy(update={"train": small.train.model_copy(update={"epochs": 200})})
    with pytest.raises(Failure) as info:
        check_spec(big, resources=Resources(cache_dir=tmp_path, max_job_units=100))
    err = info.value
    assert err.code == "job_too_large", err.message
    assert err.details["shrink"][0].startswith("train.epochs"), err.details
    # 200 epochs of 200 samples at batch 128: two batches an epoch, about 400 units per stitch
    # pair, plus a few evaluation batches.
    pairs = err.details["stitch_pairs"]
    assert pairs >= 2 and 400 * pairs <= err.details["units"] < 500 * pairs, err.details


def test_the_estimate_counts_iris_at_their_cap_and_expects_less(ckpts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from stitchsim_worker.engine import Resources, check_spec
    from stitchsim_worker.engine.job.plan import IRI_STEPS_EXPECTED

    path = {"path": str(ckpts.digits_resnet)}
    std = Spec.model_validate(tiny_spec({"checkpoint": path}, {"checkpoint": path}))
    ia = std.model_copy(update={"protocols": ["standard", "invariance_aware"],
                                "iri": IRISettings(method="fast", steps=50)})
    a = check_spec(std, resources=Resources(cache_dir=tmp_path))
    b = check_spec(ia, resources=Resources(cache_dir=tmp_path))
    assert a.expected_units == a.units
    # IRIs (the fast method: the paper's has no extra rounds): rounds of 50 steps, the first
    # and 6 extra: a cap of 350 steps of 3 units a full
    # batch, for 200 training samples in batches of 256 (a step counts the share of a batch it
    # steps), expected at the steps a set is taken to need (plan.IRI_STEPS_EXPECTED).
    iri_cap = round(3 * 350 * 200 / 256)
    assert b.units - a.units >= iri_cap, (a, b)
    expected = round(IRI_STEPS_EXPECTED / 350 * iri_cap)
    assert b.units - b.expected_units == iri_cap - expected, (a, b)


def test_a_large_model_counts_more_units_for_the_same_spec(ckpts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    import timm
    import torch
    from safetensors.torch import save_file
    from stitchsim.failure import Failure
    from stitchsim_worker.engine import Resources, check_spec
    from stitchsim_worker.engine.core.costs import REFERENCE_FLOPS
    from torch.utils.flop_counter import FlopCounterMode

    kwargs = {"num_classes": 10}
    big = timm.create_model("resnet26", pretrained=False, **kwargs).eval()
    path = tmp_path / "resnet26.safetensors"
    save_file({k: v.contiguous() for k, v in big.state_dict().items()}, path,
              metadata={"arch": "resnet26", "arch_kwargs": json.dumps(kwargs)})
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        big(torch.zeros(1, 3, 32, 32))
    factor = counter.get_total_flops() / REFERENCE_FLOPS
    assert factor > 1.2

    def budget(ckpt, limit=None):  # type: ignore[no-untyped-def]
        ref = {"checkpoint": {"path": str(ckpt)}}
        spec = Spec.model_validate(tiny_spec(ref, ref))
        return check_spec(spec, resources=Resources(cache_dir=tmp_path, max_job_units=limit))

    small, large = budget(ckpts.digits_resnet), budget(path)
    assert small.size_factor == 1.0  # smaller than the reference: a batch is a batch
    assert large.size_factor == pytest.approx(factor, rel=0.01)
    assert large.units == pytest.approx(small.units * factor, abs=1)
    with pytest.raises(Failure) as refused:
        budget(path, limit=small.units + 1)  # room for the small model's job, not the large's
    err = refused.value
    assert err.code == "job_too_large"
    assert err.details["shrink"][0].startswith("the models (x"), err.details
    assert err.details["batches"] == small.units
