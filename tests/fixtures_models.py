"""Small timm models trained on the built-in sets, saved as users upload them (safetensors
with arch metadata). Trained once per test session, in parallel processes: the suite runs
single-threaded (OMP_NUM_THREADS=1), so one process per core halves the fixture's wall time."""

from __future__ import annotations

import fcntl
import json
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from stitchsim_worker.engine.models.zoo import make_checkpoint

# name: (arch, dataset, arch kwargs, seed, training settings)
CNN = {"epochs": 10, "lr": 0.01}
VIT = {"epochs": 15, "lr": 0.002, "batch_size": 32}
MODELS = {
    "digits_resnet": ("test_resnet", "digits_digit_only", {}, 0, CNN),
    "digits_resnet_b": ("test_resnet", "digits_digit_only", {}, 1, CNN),
    "digits_vit": ("test_vit", "digits_digit_only", {"img_size": 32}, 0, VIT),
    "marker_resnet": ("test_resnet", "digits_marker", {}, 0, CNN),
    "colour_resnet": ("test_resnet", "digits_colour_only", {}, 0, CNN),
}


@dataclass
class Checkpoints:
    root: Path
    accuracy: dict[str, float]

    def __getattr__(self, name: str) -> Path:
        if name in MODELS:
            return self.root / f"{name}.safetensors"
        raise AttributeError(name)


def _train_all(root: Path) -> dict[str, float]:
    # spawn: a forked child of a process with OpenMP threads can hang in its first parallel op.
    pool = ProcessPoolExecutor(max_workers=min(2, os.cpu_count() or 1),
                               mp_context=multiprocessing.get_context("spawn"))
    with pool:
        futures = {
            name: pool.submit(make_checkpoint, root / f"{name}.safetensors", arch, dataset,
                              arch_kwargs=kwargs, seed=seed, **training)
            for name, (arch, dataset, kwargs, seed, training) in MODELS.items()
        }
        return {name: f.result() for name, f in futures.items()}


@pytest.fixture(scope="session")
def ckpts(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Checkpoints:
    if worker_id == "master":  # one pytest process
        root = tmp_path_factory.mktemp("ckpts")
        return Checkpoints(root, _train_all(root))
    # pytest-xdist: the workers share one base temp dir; the first to take the lock trains,
    # the others wait for it and read what it wrote (the same files, the same figures).
    root = tmp_path_factory.getbasetemp().parent / "ckpts"
    root.mkdir(exist_ok=True)
    done = root / "accuracy.json"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            acc = _train_all(root)
            tmp = done.with_suffix(".tmp")
            tmp.write_text(json.dumps(acc))
            tmp.replace(done)
    return Checkpoints(root, json.loads(done.read_text()))


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
