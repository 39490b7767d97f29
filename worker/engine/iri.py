"""Indistinguishable representation inputs (IRIs) and their content-addressed cache.

For every training input x, x' starts from uniform noise in [0,1] and takes signed-gradient
steps on d(f<=i(x'), f<=i(x)), clamped to the pixel range (and optionally to an L-inf ball
around x). The front model then cannot tell x' from x at the stitch point, while any model
that does not share its invariances can.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from stitchsim.models import IRISettings, IRIStats
from stitchsim_worker.engine.bank import Bank, BankBuilder
from stitchsim_worker.engine.data import file_sha256
from stitchsim_worker.engine.device import autocast
from stitchsim_worker.engine.metrics import per_sample_distance

log = logging.getLogger(__name__)
CACHE_FORMAT = "iri-v1"


@dataclass
class IRIResult:
    images: Bank  # (N, 3, H, W) in [0, 1]
    stats: IRIStats


def cache_key(
    front_identity: dict[str, object], point: str, dataset_digest: str, settings: IRISettings
) -> str:
    """IRIs depend only on the front model, the stitch point, the data and the IRI settings."""
    knobs = settings.model_dump(exclude={"converged_below"})
    blob = json.dumps(
        {
            "format": CACHE_FORMAT,
            "front": front_identity,
            "point": point,
            "data": dataset_digest,
            "iri": knobs,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


class IRICache:
    """Entries are directories written whole, then renamed into place; every file's hash is
    recorded and checked on load, so a partial or corrupt entry is rebuilt, never used."""

    def __init__(self, root: Path):
        self.root = root / "iri"

    def _dir(self, key: str) -> Path:
        return self.root / key[:2] / key

    def load(self, key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict] | None:
        entry = self._dir(key)
        meta_path = entry / "meta.json"
        if not meta_path.is_file():
            return None
        try:
            meta = json.loads(meta_path.read_text())
            for name, digest in meta["files"].items():
                if file_sha256(entry / name) != digest:
                    raise ValueError(f"{name} does not match its recorded hash")
            images = np.load(entry / "images.npy", mmap_mode="r")
            start = np.load(entry / "start.npy")
            final = np.load(entry / "final.npy")
        except (OSError, ValueError, KeyError, json.JSONDecodeError) as e:
            log.warning("IRI cache entry %s is corrupt (%s); rebuilding it", key, e)
            shutil.rmtree(entry, ignore_errors=True)
            return None
        return images, start, final, meta

    def store(
        self, key: str, images: Bank, start: np.ndarray, final: np.ndarray, meta: dict
    ) -> None:
        """Write an entry; a cache that cannot be written (disk full, read-only) only costs
        the next job the synthesis, so the job goes on without it."""
        # Workers on other hosts may share this cache and reuse pids: a random name is unique.
        tmp = self._dir(key).with_name(f".{key}.{uuid.uuid4().hex}.tmp")
        try:
            self._write(tmp, key, images, start, final, meta)
        except OSError as e:
            log.warning("IRI cache entry %s not written (%s); going on without it", key, e)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self._forget_abandoned()

    def _write(
        self, tmp: Path, key: str, images: Bank, start: np.ndarray, final: np.ndarray, meta: dict
    ) -> None:
        entry = self._dir(key)
        tmp.mkdir(parents=True)
        out = np.lib.format.open_memmap(
            tmp / "images.npy", mode="w+", dtype=np.float32, shape=(images.n, *images.shape)
        )
        for s in range(0, images.n, 1024):
            out[s : s + 1024] = images[slice(s, min(images.n, s + 1024))].numpy()
        out.flush()
        del out
        np.save(tmp / "start.npy", start)
        np.save(tmp / "final.npy", final)
        files = {name: file_sha256(tmp / name) for name in ("images.npy", "start.npy", "final.npy")}
        (tmp / "meta.json").write_text(json.dumps({**meta, "files": files}))
        if (entry / "meta.json").exists():  # a concurrent job finished the same entry first
            return
        shutil.rmtree(entry, ignore_errors=True)  # a partial entry left by a dead writer
        try:
            os.replace(tmp, entry)
        except OSError:
            # Another writer's complete entry landed in between: keep theirs.
            if not (entry / "meta.json").exists():
                raise

    def _forget_abandoned(self, older_than_s: float = 24 * 3600) -> None:
        # Temp dirs of writers killed mid-write are never read; a day is far longer than any
        # write, so an old one has no live writer.
        cutoff = time.time() - older_than_s
        for tmp in self.root.glob("*/.*.tmp"):
            with contextlib.suppress(OSError):
                if tmp.stat().st_mtime < cutoff:
                    shutil.rmtree(tmp, ignore_errors=True)


def synthesize(
    front: Callable[[torch.Tensor], torch.Tensor],
    pixels: Bank,
    settings: IRISettings,
    banks: BankBuilder,
    device: torch.device,
    on_batch: Callable[[], None],
) -> tuple[Bank, np.ndarray, np.ndarray]:
    """IRIs for every sample; returns them with per-sample start and final distances."""
    n = pixels.n
    out = banks.new(n, pixels.shape)
    start_d = np.zeros(n, dtype=np.float32)
    final_d = np.zeros(n, dtype=np.float32)
    noise = torch.Generator().manual_seed(settings.seed)
    for s in range(0, n, settings.batch_size):
        sl = slice(s, min(n, s + settings.batch_size))
        x = pixels[sl].to(device)
        x_iri, d0, d1 = _synthesize_batch(front, x, settings, noise, on_batch)
        out.write(s, x_iri)
        start_d[sl], final_d[sl] = d0.cpu().numpy(), d1.cpu().numpy()
    return out, start_d, final_d


def _project(x_iri: torch.Tensor, x: torch.Tensor, linf: float | None) -> torch.Tensor:
    if linf is not None:
        x_iri = torch.maximum(torch.minimum(x_iri, x + linf), x - linf)
    return x_iri.clamp(0, 1)


def _synthesize_batch(
    front: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    settings: IRISettings,
    noise: torch.Generator,
    on_step: Callable[[], None],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    with torch.no_grad(), autocast(x.device):
        target = front(x).float()
    x_iri = _project(torch.rand(x.shape, generator=noise).to(x.device), x, settings.linf)
    start = None
    for _ in range(settings.steps):
        x_iri.requires_grad_(True)
        with autocast(x.device):
            d = per_sample_distance(front(x_iri).float(), target)
        if start is None:
            start = d.detach()
        (grad,) = torch.autograd.grad(d.sum(), x_iri)
        with torch.no_grad():
            x_iri = _project(x_iri - settings.step_size * grad.sign(), x, settings.linf)
        on_step()
    with torch.no_grad(), autocast(x.device):
        final = per_sample_distance(front(x_iri).float(), target)
    assert start is not None
    return x_iri.detach(), start, final


def iri_stats(
    start: np.ndarray, final: np.ndarray, settings: IRISettings, cache_hit: bool, seconds: float
) -> IRIStats:
    median = float(np.median(final))
    return IRIStats(
        start_median=float(np.median(start)),
        median=median,
        p90=float(np.quantile(final, 0.9)),
        max=float(final.max()),
        converged=median < settings.converged_below,
        cache_hit=cache_hit,
        n=int(len(final)),
        seconds=seconds,
    )


def get_iris(
    *,
    key: str,
    cache: IRICache,
    front: Callable[[torch.Tensor], torch.Tensor],
    pixels: Bank,
    settings: IRISettings,
    banks: BankBuilder,
    device: torch.device,
    on_batch: Callable[[], None],
) -> IRIResult:
    t0 = time.perf_counter()
    hit = cache.load(key)
    if hit is not None:
        images, start, final, _ = hit
        bank = banks.new(len(images), tuple(images.shape[1:]))
        for s in range(0, len(images), 1024):
            bank.write(s, torch.from_numpy(np.array(images[s : s + 1024])))
        return IRIResult(bank, iri_stats(start, final, settings, True, time.perf_counter() - t0))
    bank, start, final = synthesize(front, pixels, settings, banks, device, on_batch)
    seconds = time.perf_counter() - t0
    cache.store(key, bank, start, final, {"settings": settings.model_dump(), "seconds": seconds})
    return IRIResult(bank, iri_stats(start, final, settings, False, seconds))
