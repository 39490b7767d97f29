"""The IRIs' content-addressed cache: entries written whole, checked on load."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
import uuid
from pathlib import Path

import numpy as np
from stitchsim_worker.engine.data.datasets import file_sha256
from stitchsim_worker.engine.stitching.bank import Bank

log = logging.getLogger(__name__)


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


