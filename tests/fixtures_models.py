"""Small timm models trained on the built-in sets, saved as users upload them (safetensors
with arch metadata).

Training is deterministic (fixed seeds, one thread), so a trained model is kept in a cache
shared by test processes and runs: $STITCHSIM_TEST_CACHE, else ~/.cache/stitchsim-tests. An
entry's key hashes what decides its weights: the source of the training code and of the
built-in data, torch/timm/safetensors/numpy versions, the CPU's kernel set (AVX2 and AVX-512
train the same seed to slightly different weights) and the model's own settings; any change
is a new entry, trained again. Entries are written to a temp dir and renamed into place under
a file lock, so two xdist workers (or two runs) never read a half-written one, and the one that
loses the race reads what the winner wrote. Each session copies its checkpoints out of the
cache, so no test can change a cached file."""

from __future__ import annotations

import fcntl
import hashlib
import json
import multiprocessing
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from stitchsim_worker.engine.models.zoo import make_checkpoint

REPO = Path(__file__).resolve().parent.parent
# The code whose every line can change a trained model's weights or its recorded figures.
TRAINING_CODE = [
    "worker/engine/models/zoo.py",
    "worker/engine/models/loading.py",
    "worker/engine/models/preprocess.py",
    "worker/engine/data/datasets.py",
    "worker/engine/data/shapes.py",
    "worker/engine/data/pixels.py",
    "client/stitchsim/datasets.py",
]
# Adversarial training also depends on the attack and its default settings.
ROBUST_CODE = [
    *TRAINING_CODE,
    "worker/engine/models/robust.py",
    "worker/engine/models/attacks.py",
    "client/stitchsim/models/spec.py",
    "client/stitchsim/models/settings.py",  # the adversarial settings' defaults
]

# name: (arch, dataset, arch kwargs, seed, training settings)
CNN = {"epochs": 10, "lr": 0.01}
VIT = {"epochs": 15, "lr": 0.002, "batch_size": 32}
MODELS = {
    "digits_resnet": ("test_resnet", "digits_digit_only", {}, 0, CNN),
    "digits_resnet_b": ("test_resnet", "digits_digit_only", {}, 1, CNN),
    # Two more benign retrains of the reference's recipe: a calibrated gate needs 3 at least
    # (tests/client/test_calibration_e2e.py).
    "digits_resnet_c": ("test_resnet", "digits_digit_only", {}, 2, CNN),
    "digits_resnet_d": ("test_resnet", "digits_digit_only", {}, 3, CNN),
    "digits_vit": ("test_vit", "digits_digit_only", {"img_size": 32}, 0, VIT),
    "marker_resnet": ("test_resnet", "digits_marker", {}, 0, CNN),
    "colour_resnet": ("test_resnet", "digits_colour_only", {}, 0, CNN),
}


# ---------------------------------------------------------------- the cache


def cache_root() -> Path:
    root = Path(os.environ.get("STITCHSIM_TEST_CACHE")
                or Path.home() / ".cache" / "stitchsim-tests")
    root.mkdir(parents=True, exist_ok=True)
    return root


def cache_key(settings: dict[str, Any], code: list[str]) -> str:
    import numpy
    import safetensors
    import timm
    import torch

    h = hashlib.sha256()
    versions = {"python": sys.version_info[:2], "torch": torch.__version__,
                "timm": timm.__version__, "safetensors": safetensors.__version__,
                "numpy": numpy.__version__, "threads": os.environ.get("OMP_NUM_THREADS"),
                # training is deterministic per kernel set: AVX2 and AVX-512 train apart
                "cpu": torch.backends.cpu.get_cpu_capability(),
                "onednn_isa": os.environ.get("ONEDNN_MAX_CPU_ISA")}
    h.update(json.dumps([versions, settings], sort_keys=True, default=str).encode())
    for rel in code:
        h.update(rel.encode() + b"\0" + (REPO / rel).read_bytes())
    return h.hexdigest()[:20]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _entry(name: str, key: str) -> Path:
    return cache_root() / f"{name}-{key}"


def _complete(entry: Path) -> bool:
    return (entry / "info.json").is_file()


def _store(entry: Path, build: Callable[[Path], dict[str, Any]]) -> None:
    """Builds into a temp dir beside the entry and renames it into place (atomic)."""
    tmp = entry.with_name(f".{entry.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    info = build(tmp / "model.safetensors")
    (tmp / "info.json").write_text(json.dumps(info))
    shutil.rmtree(entry, ignore_errors=True)  # an incomplete one left by a killed run
    os.replace(tmp, entry)


def cached_model(name: str, settings: dict[str, Any], code: list[str],
                 build: Callable[[Path], dict[str, Any]], dest: Path) -> dict[str, Any]:
    """The model `build` writes for these settings, from the cache or built (once, under a
    lock) and cached; copied to dest. Returns what build returned (its figures)."""
    entry = _entry(name, cache_key(settings, code))
    if not _complete(entry):
        with _locked(cache_root() / f".{name}.lock"):
            if not _complete(entry):
                _store(entry, build)
    return _copy_out(entry, dest)


def _copy_out(entry: Path, dest: Path) -> dict[str, Any]:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(entry / "model.safetensors", dest)
    info = json.loads((entry / "info.json").read_text())
    dest.with_suffix(".json").write_text(json.dumps(info))
    return info


# ---------------------------------------------------------------- the fixture models


@dataclass
class Checkpoints:
    root: Path
    accuracy: dict[str, float]

    def __getattr__(self, name: str) -> Path:
        if name in MODELS:
            return self.root / f"{name}.safetensors"
        raise AttributeError(name)


def _settings(name: str) -> dict[str, Any]:
    arch, dataset, kwargs, seed, training = MODELS[name]
    return {"arch": arch, "dataset": dataset, "arch_kwargs": kwargs, "seed": seed, **training}


def _train_one(name: str, path: Path) -> dict[str, Any]:
    s = _settings(name)
    acc = make_checkpoint(path, s.pop("arch"), s.pop("dataset"), **s)
    return {"test_accuracy": acc}


def _train_missing(entries: dict[str, Path]) -> None:
    """Trains the models without a cache entry, in parallel processes: the suite runs
    single-threaded (OMP_NUM_THREADS=1), so one process per core halves the wall time."""
    missing = [name for name, entry in entries.items() if not _complete(entry)]
    if not missing:
        return
    # spawn: a forked child of a process with OpenMP threads can hang in its first parallel op.
    pool = ProcessPoolExecutor(max_workers=min(2, os.cpu_count() or 1, len(missing)),
                               mp_context=multiprocessing.get_context("spawn"))
    with pool:
        futures = [pool.submit(_store, entries[name], _Builder(name)) for name in missing]
        for f in futures:
            f.result()


@dataclass(frozen=True)
class _Builder:
    """Picklable `build` for a fixture model (the pool's processes are spawned)."""

    name: str

    def __call__(self, path: Path) -> dict[str, Any]:
        return _train_one(self.name, path)


@pytest.fixture(scope="session")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> Checkpoints:
    entries = {name: _entry(name, cache_key(_settings(name), TRAINING_CODE)) for name in MODELS}
    if not all(_complete(e) for e in entries.values()):
        # One lock for the set: the first process trains what is missing on both cores, the
        # other (an xdist worker) waits and then finds every entry there.
        with _locked(cache_root() / ".fixture-models.lock"):
            _train_missing(entries)
    root = tmp_path_factory.mktemp("ckpts")
    accuracy = {name: _copy_out(entry, root / f"{name}.safetensors")["test_accuracy"]
                for name, entry in entries.items()}
    return Checkpoints(root, accuracy)


@dataclass
class Untrained:
    front: Path
    back: Path


def write_untrained(path: Path, seed: int, arch: str = "test_resnet") -> Path:
    """A checkpoint of `arch` (10 classes) as its random init left it, saved as a user would."""
    import timm
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    net = timm.create_model(arch, pretrained=False, num_classes=10)
    weights = {k: v.detach().contiguous().clone() for k, v in net.state_dict().items()}
    save_file(weights, str(path), metadata={"arch": arch,
                                            "arch_kwargs": json.dumps({"num_classes": 10})})
    return path


@pytest.fixture(scope="session")
def untrained(tmp_path_factory: pytest.TempPathFactory) -> Untrained:
    """Two test_resnet checkpoints straight from their random init (seeds 0 and 1): no
    training, so they cost a second, and they predict at chance. For tests of failures,
    listings and retries, where what the models learned does not matter."""
    root = tmp_path_factory.mktemp("untrained")
    return Untrained(write_untrained(root / "front.safetensors", 0),
                     write_untrained(root / "back.safetensors", 1))
