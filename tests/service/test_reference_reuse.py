"""The reference's work is shared through the store: a check A-vs-R on one worker, then B-vs-R
on another worker with a cache folder of its own, and the second computes nothing of R's (its
IRIs, tensors and logits all come from the store), with the figures of B-vs-R run cold."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stitchsim.models import Spec
from stitchsim_worker.engine import Resources, run_job
from stitchsim_worker.engine.core.refcache import PREFIX

from tests.engine.jobs import REUSE_SPEC
from tests.service.conftest import (
    assert_same_figures,
    job_report,
    submit,
    unflagged_figures,
    upload,
)

SPEC = REUSE_SPEC
REFERENCE_ENTRIES = 5  # R's test logits, its train and test tensors, its IRIs, its tensors on them




def _check(svc: Any, front: str, back: str) -> dict[str, Any]:
    job = submit(svc, {**SPEC, "front": {"checkpoint": front}, "back": {"checkpoint": back}})
    assert svc.wait_job(job, timeout=400)[-1]["state"] == "succeeded", svc.logs()
    return job_report(svc, job)


def test_a_second_check_on_another_worker_reuses_the_reference_from_the_store(
    service_factory: Any, ckpts: Any, untrained: Any, tmp_path: Path
) -> None:
    svc = service_factory.redis(workers=False)
    svc.start_worker("checks")
    svc.start_worker("gpu", {"STITCHSIM_CACHE_DIR": str(tmp_path / "cache-1")})
    svc.wait_ready()
    with svc.client() as c:
        r, a, b = (upload(c, p) for p in (ckpts.digits_resnet, ckpts.digits_resnet_b,
                                          untrained.back))
    first = _check(svc, r, a)
    made = first["environment"]["reference_cache"]
    assert made["hits"] == 0 and made["written"] == REFERENCE_ENTRIES, made
    entries = list((svc.data_dir / "store" / PREFIX).rglob("*.json"))
    assert len(entries) == REFERENCE_ENTRIES  # in the shared store, not the worker's folder
    assert not (tmp_path / "cache-1" / PREFIX).exists()

    # Another worker process with a cache folder of its own: only the store is shared.
    svc.stop_process("worker_gpu")
    svc.start_worker("gpu", {"STITCHSIM_CACHE_DIR": str(tmp_path / "cache-2")})
    svc.wait_ready()
    second = _check(svc, r, b)
    reused = second["environment"]["reference_cache"]
    assert reused["hits"] == REFERENCE_ENTRIES and reused["misses"] == 0, reused
    assert reused["written"] == 0 and reused["rejected"] == 0, reused
    assert all(row["iri"]["cache_hit"] for row in second["results"] if row["iri"])
    stages = second["environment"]["stage_seconds"]
    assert stages and first["environment"]["stage_seconds"]

    cold = run_job(Spec.model_validate(
        {**SPEC, "front": {"checkpoint": {"path": str(ckpts.digits_resnet)}},
         "back": {"checkpoint": {"path": str(untrained.back)}}}),
        resources=Resources(cache_dir=tmp_path / "cold"))
    assert cold.environment["reference_cache"]["hits"] == 0
    assert_same_figures(unflagged_figures(second), unflagged_figures(cold), tol=0)


def test_a_remote_store_shares_entries_and_rejects_a_corrupt_blob(tmp_path: Path) -> None:
    """Through an fsspec store (as S3 is): a worker with an empty cache folder reads another's
    entry, checked against its hash; a blob corrupted in the bucket is dropped, not used."""
    import numpy as np
    import torch
    from stitchsim_service.core.store import FsspecStore
    from stitchsim_worker.engine.core.refcache import BLOBS, ReferenceCache
    from stitchsim_worker.reference_store import StoreEntries

    bucket = tmp_path / "bucket"
    salt = {"device": "cpu", "bf16": False, "torch": torch.__version__}

    def worker(name: str) -> ReferenceCache:
        entries = StoreEntries(FsspecStore(f"file://{bucket}"), tmp_path / name, 1 << 30)
        return ReferenceCache(entries, tmp_path / name, salt)

    one, two = worker("w1"), worker("w2")
    key = one.key("iri", {"k": 1})
    x = np.arange(4000, dtype=np.float32).reshape(1000, 4)
    one.put("iri", key, {"x": x})
    got = two.load("iri", key)
    assert got is not None and np.array_equal(got.arrays["x"], x)
    assert list((tmp_path / "w2" / "objects" / BLOBS).rglob("*.safetensors"))  # downloaded

    (remote,) = (bucket / BLOBS).rglob("*.safetensors")
    data = bytearray(remote.read_bytes())
    data[-1] ^= 0xFF
    remote.write_bytes(bytes(data))
    three = worker("w3")  # no local copy: it downloads the corrupt blob
    assert three.load("iri", key) is None and three.stats.rejected == 1
    assert not remote.exists()  # dropped from the bucket, so it is written whole again
    one.put("iri", key, {"x": x})
    again = worker("w4").load("iri", key)
    assert again is not None and np.array_equal(again.arrays["x"], x)
