"""The engine's reference cache kept in the service's blob store, so every worker shares it: a
folder the service and its workers share, or the S3 bucket of the compose deployment. The
engine knows nothing of the service; this adapter gives it the store as an EntryStore."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from stitchsim_service.core.store import LocalStore, Store, StoreError


class StoreEntries:
    """EntryStore over a Store. A remote store's blobs are downloaded into the worker's cache
    (checked against their hash there); a local store's are read in place. The store's errors
    reach the engine as OSError, which costs the job the work and nothing else."""

    def __init__(self, store: Store, cache_dir: Path, max_bytes: int):
        self.store, self.cache_dir, self.max_bytes = store, cache_dir, max_bytes

    def get_bytes(self, key: str) -> bytes | None:
        try:
            return self.store.get_bytes(key)
        except StoreError as e:
            raise OSError(e.message) from e

    def put_bytes(self, key: str, data: bytes) -> None:
        try:
            self.store.put_bytes(key, data)
        except StoreError as e:
            raise OSError(e.message) from e

    def put_file(self, key: str, src: Path) -> bool:
        try:
            return self.store.put_file(key, src)
        except StoreError as e:
            raise OSError(e.message) from e

    def local_file(self, key: str) -> Path | None:
        try:
            path = self.store.local_path(key, self.cache_dir)
        except FileNotFoundError:
            return None
        except StoreError as e:
            raise OSError(e.message) from e
        with contextlib.suppress(OSError):
            os.utime(path)  # used now: pruned last
        return path

    def discard(self, key: str) -> None:
        self.store.delete(key)
        with contextlib.suppress(OSError):
            (self.cache_dir / "objects" / key).unlink(missing_ok=True)

    def written(self) -> None:
        """Keep a local store's entries, and this worker's downloaded copies of a remote
        store's, to max_bytes, least recently used first. A remote bucket is not listed after
        every write: its prefix is pruned by a lifecycle rule (docs/deploy.md)."""
        from stitchsim_worker.engine.core.refcache import prune

        if isinstance(self.store, LocalStore):
            prune(self.store.root, self.max_bytes)
        else:
            prune(self.cache_dir / "objects", self.max_bytes)
