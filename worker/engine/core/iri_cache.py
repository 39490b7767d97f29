"""The IRIs' cache: a kind of entry of the reference cache (engine/core/refcache.py), which the
service keeps in its store, shared by every worker. Entries are verified on load, so a partial
or corrupt one is computed again, never used."""

from __future__ import annotations

import numpy as np
from stitchsim_worker.engine.core.bank import Bank
from stitchsim_worker.engine.core.refcache import ReferenceCache

KIND = "iri"


class IRICache:
    """IRIs by their key (synthesis.cache_key: front model, point, data, settings); the
    reference cache adds the device type, precision and torch version to it."""

    def __init__(self, cache: ReferenceCache):
        self.cache = cache

    def _key(self, key: str) -> str:
        return self.cache.key(KIND, {"iri": key})

    def load(self, key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict] | None:
        entry = self.cache.load(KIND, self._key(key))
        if entry is None:
            return None
        a = entry.arrays
        return a["images"], np.array(a["start"]), np.array(a["final"]), entry.meta

    def store(
        self, key: str, images: Bank, start: np.ndarray, final: np.ndarray, meta: dict
    ) -> None:
        self.cache.put(KIND, self._key(key), {"images": images, "start": start, "final": final},
                       meta)
