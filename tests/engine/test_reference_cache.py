"""The reference cache (engine/core/refcache.py): entries round-trip bit for bit, a corrupt or
partial one is rejected and computed again, writers racing on one entry never corrupt it, the
folder is pruned least recently used first, and a second job against the same reference
computes nothing of the reference's and gives the cold run's figures."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.torch
import torch
from stitchsim.models import Spec
from stitchsim_worker.engine import Resources, run_job
from stitchsim_worker.engine.core.bank import BankBuilder
from stitchsim_worker.engine.core.refcache import (
    BLOBS,
    PREFIX,
    FolderStore,
    ReferenceCache,
    prune,
)

from tests.engine.jobs import REUSE_SPEC
from tests.service.conftest import assert_same_figures, unflagged_figures

SALT = {"device": "cpu", "bf16": False, "torch": torch.__version__}


def _cache(root: Path, **kw: Any) -> ReferenceCache:
    return ReferenceCache(FolderStore(root, **kw), root / "scratch", SALT)


def _arrays() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    spilled = BankBuilder(0, None)  # budget 0: the bank is a memory-mapped file
    bank = spilled.new(3000, (2, 5))  # more rows than one write chunk
    bank.write(0, torch.randn(3000, 2, 5, generator=g))
    return {"bank": bank, "np": np.arange(7, dtype=np.int32),
            "bf16": torch.randn(4, 3, generator=g).to(torch.bfloat16)}


def test_an_entry_round_trips_bit_for_bit_and_is_a_safetensors_file(tmp_path: Path) -> None:
    cache, arrays = _cache(tmp_path), _arrays()
    key = cache.key("act", {"model": "m", "point": "layer1"})
    assert cache.load("act", key) is None
    cache.put("act", key, arrays, {"steps_used": 3.5})
    got = cache.load("act", key)
    assert got is not None and got.meta == {"steps_used": 3.5}
    assert torch.equal(got.tensor("bank"), arrays["bank"].all())
    assert np.array_equal(got.arrays["np"], arrays["np"])
    assert got.tensor("bf16").dtype == torch.bfloat16
    assert torch.equal(got.tensor("bf16"), arrays["bf16"])
    assert torch.equal(got.bank("bank", BankBuilder(1 << 30)).all(), arrays["bank"].all())
    (blob,) = (tmp_path / BLOBS).rglob("*.safetensors")
    read = safetensors.torch.load_file(blob)  # the library reads it as written
    assert torch.equal(read["bf16"], arrays["bf16"])
    assert torch.equal(read["bank"], got.tensor("bank"))
    assert cache.stats.as_dict()["hits"] == 1 and cache.stats.misses == 1
    # Every part of the key changes it: the salt (device, precision, torch) too.
    other = ReferenceCache(FolderStore(tmp_path), tmp_path, {**SALT, "device": "cuda"})
    assert other.key("act", {"model": "m", "point": "layer1"}) != key
    assert cache.key("act", {"model": "m", "point": "layer2"}) != key


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "drop the blob", "bad manifest"])
def test_a_corrupt_or_partial_entry_is_rejected_never_used(tmp_path: Path, damage: str) -> None:
    cache = _cache(tmp_path)
    key = cache.key("iri", {"k": 1})
    cache.put("iri", key, {"x": np.ones((100, 4), dtype=np.float32)})
    (blob,) = (tmp_path / BLOBS).rglob("*.safetensors")
    manifest = tmp_path / cache.manifest_key("iri", key)
    if damage == "flip a byte":
        data = bytearray(blob.read_bytes())
        data[-3] ^= 0xFF
        blob.write_bytes(bytes(data))
    elif damage == "truncate":
        blob.write_bytes(blob.read_bytes()[:-40])
    elif damage == "drop the blob":
        blob.unlink()
    else:
        manifest.write_text('{"format": "refcache-v1", "key"')
    assert cache.load("iri", key) is None
    assert cache.stats.rejected == 1 and not manifest.exists()
    # Computed again and kept: the next load is a whole entry again.
    cache.put("iri", key, {"x": np.ones((100, 4), dtype=np.float32)})
    got = cache.load("iri", key)
    assert got is not None and np.array_equal(got.arrays["x"], np.ones((100, 4)))


def _race(root: str, seed: int, rounds: int) -> None:
    cache = _cache(Path(root))
    for r in range(rounds):
        key = cache.key("act", {"r": r})
        # Different bytes per writer: a torn entry would mix them or fail its hash.
        cache.put("act", key, {"x": np.full((20000,), seed, dtype=np.float32)}, {"by": seed})


def test_writers_racing_on_one_entry_never_corrupt_it(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_race, args=(str(tmp_path), s, 20)) for s in (1, 2, 3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    cache = _cache(tmp_path)
    for r in range(20):
        got = cache.load("act", cache.key("act", {"r": r}))
        assert got is not None, r
        by = got.meta["by"]
        assert np.array_equal(got.arrays["x"], np.full((20000,), by, dtype=np.float32))
    assert cache.stats.rejected == 0
    assert not list(tmp_path.rglob("*.part"))


def test_the_folder_is_pruned_least_recently_used_first(tmp_path: Path) -> None:
    cache = _cache(tmp_path, max_bytes=10**9)
    keys = [cache.key("act", {"n": n}) for n in range(4)]
    for n, key in enumerate(keys):
        cache.put("act", key, {"x": np.full((25_000,), n, dtype=np.float32)})  # 100 kB each
    blobs = sorted((tmp_path / BLOBS).rglob("*.safetensors"))
    for age, blob in enumerate(blobs):  # written in one second: age them apart
        os.utime(blob, (time.time() - 100 + age, time.time() - 100 + age))
    first = cache.load("act", keys[0])  # used now: kept
    assert first is not None
    freed = prune(tmp_path, 250_000)
    assert freed >= 100_000
    kept = [cache.load("act", k) is not None for k in keys]
    assert kept[0] and sum(kept) == 2, kept
    assert sum(p.stat().st_size for p in (tmp_path / PREFIX).rglob("*.safetensors")) <= 250_000


def _spec(front: Path, back: Path) -> Spec:
    return Spec.model_validate({
        "front": {"checkpoint": {"path": str(front)}},
        "back": {"checkpoint": {"path": str(back)}},
        **REUSE_SPEC,
    })


def test_a_second_job_against_the_reference_computes_none_of_its_work(
    ckpts: Any, untrained: Any, tmp_path: Path
) -> None:
    """A-vs-R, then B-vs-R in the same cache: B computes nothing of R's (every reference
    entry hits, the IRIs too) and its figures equal B-vs-R run cold."""
    ref, a, b = ckpts.digits_resnet, ckpts.digits_resnet_b, untrained.back
    shared = tmp_path / "shared"
    first = run_job(_spec(ref, a), resources=Resources(cache_dir=shared))
    cold = run_job(_spec(ref, b), resources=Resources(cache_dir=tmp_path / "cold"))
    warm = run_job(_spec(ref, b), resources=Resources(cache_dir=shared))
    made, reused = (r.environment["reference_cache"] for r in (first, warm))
    # R's logits, its test and train tensors at layer1, its IRIs and its tensors on them.
    assert made["hits"] == 0 and made["written"] == 5, made
    assert reused["hits"] == 5 and reused["misses"] == 0 and reused["written"] == 0, reused
    assert reused["kinds"] == {"act": {"hits": 4, "misses": 0}, "iri": {"hits": 1, "misses": 0}}
    iri_rows = [r for r in warm.results if r.iri is not None]
    assert iri_rows and all(r.iri.cache_hit for r in iri_rows)
    # Every figure the cold run gives, to the bit; only the hit flag says where IRIs came from.
    assert_same_figures(unflagged_figures(warm), unflagged_figures(cold), tol=0)
    manifest = next((shared / PREFIX / "iri").rglob("*.json"))
    assert json.loads(manifest.read_text())["meta"]["steps_used"] > 0


