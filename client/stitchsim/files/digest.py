"""A file's SHA-256, read in chunks: the one hash the client, the store and the engine agree on
(an object's id is "sha256:" + it)."""

from __future__ import annotations

import hashlib
import os

CHUNK = 1 << 20


def sha256_hex(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def object_id(path: str | os.PathLike[str]) -> str:
    """The id the service stores a file under."""
    return "sha256:" + sha256_hex(path)
