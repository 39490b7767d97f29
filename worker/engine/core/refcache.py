"""The reference's work, kept across jobs and workers.

A CI job checks new models against one reference again and again. What a job computes from one
model alone (its IRIs at a point, its tensors at a point on a set of inputs, its logits on the
test split) does not depend on the other model, so it is kept here and the next job against the
same reference reads it instead of computing it.

Where entries live is the caller's choice (an EntryStore): the service passes its blob store,
which every worker shares (a folder, or an S3 bucket in the compose deployment); a run without
a service keeps them in a folder of its cache. An entry is two objects:

- ``refcache/v1/blobs/<sha[:2]>/<sha>.safetensors``: the arrays, in one safetensors file named by
  the SHA-256 of its bytes. Blobs never change once written, so two workers writing the same
  entry at once write to different names (or the same name with the same bytes): neither can
  corrupt the other's.
- ``refcache/v1/<kind>/<key[:2]>/<key>.json``: the manifest, written last and in one put (an
  atomic rename on a folder, one PUT on S3), naming the blob and the entry's metadata.

A load reads the manifest, then the blob, and hashes the blob before any of it is used: a
corrupt, partial or missing entry is a miss (its manifest is removed and the work done again).
The key (ReferenceCache.key) holds everything that changes an entry's bytes: the format, what
was computed, the model's identity (checkpoint hash, architecture, preprocessing), the point,
the inputs' identity, and the salt (device type, precision, torch version).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import struct
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from stitchsim.files.digest import sha256_hex
from stitchsim_worker.engine.core.bank import Bank, BankBuilder

log = logging.getLogger(__name__)

FORMAT = "refcache-v1"
PREFIX = "refcache/v1"
BLOBS = f"{PREFIX}/blobs"
DEFAULT_MAX_ENTRY_BYTES = 4 * 1024**3
"""Larger entries are not kept: writing and hashing them would cost about what they save."""
DEFAULT_MAX_BYTES = 20 * 1024**3
"""What a folder of entries may hold before the least recently used are pruned."""

# torch dtype -> (safetensors name, the numpy dtype its bytes are kept and mapped as).
# bfloat16 has no numpy type: its bytes travel as int16 and are viewed back on load.
_DTYPES: dict[torch.dtype, tuple[str, np.dtype]] = {
    torch.float32: ("F32", np.dtype(np.float32)),
    torch.float16: ("F16", np.dtype(np.float16)),
    torch.bfloat16: ("BF16", np.dtype(np.int16)),
    torch.float64: ("F64", np.dtype(np.float64)),
    torch.int64: ("I64", np.dtype(np.int64)),
    torch.int32: ("I32", np.dtype(np.int32)),
    torch.int16: ("I16", np.dtype(np.int16)),
    torch.uint8: ("U8", np.dtype(np.uint8)),
    torch.bool: ("BOOL", np.dtype(np.bool_)),
}
_BY_NAME = {name: (dt, np_dt) for dt, (name, np_dt) in _DTYPES.items()}
_CHUNK = 1024


class EntryStore(Protocol):
    """Where entries live. Keys are slash-separated names; puts are atomic (a reader sees a
    whole object or none); OSError on a store that cannot be read or written."""

    def get_bytes(self, key: str) -> bytes | None: ...

    def put_bytes(self, key: str, data: bytes) -> None: ...

    def put_file(self, key: str, src: Path) -> bool:
        """Copy src in under key (False: an object was there already)."""
        ...

    def local_file(self, key: str) -> Path | None:
        """A local file with the object's bytes (None: there is no such object)."""
        ...

    def discard(self, key: str) -> None:
        """Remove the object (and any local copy of it); no error when absent."""
        ...

    def written(self) -> None:
        """Called after each entry written: where the store bounds its size, it prunes."""
        ...


@dataclass
class CacheStats:
    """What a job's cache did: reported in the report's environment."""

    hits: int = 0
    misses: int = 0
    written: int = 0
    rejected: int = 0  # corrupt or partial entries found, dropped and computed again
    bytes_read: int = 0
    bytes_written: int = 0
    kinds: dict[str, dict[str, int]] = field(default_factory=dict)

    def count(self, kind: str, what: str) -> None:
        per = self.kinds.setdefault(kind, {"hits": 0, "misses": 0})
        per[what] = per.get(what, 0) + 1

    def as_dict(self) -> dict[str, object]:
        return {"hits": self.hits, "misses": self.misses, "written": self.written,
                "rejected": self.rejected, "bytes_read": self.bytes_read,
                "bytes_written": self.bytes_written, "kinds": self.kinds}


@dataclass
class Entry:
    """A verified entry: its arrays (mapped from the blob, read as needed) and metadata."""

    arrays: dict[str, np.ndarray]
    dtypes: dict[str, torch.dtype]
    meta: dict[str, object]

    def tensor(self, name: str, sl: slice | None = None) -> torch.Tensor:
        data = self.arrays[name] if sl is None else self.arrays[name][sl]
        t = torch.from_numpy(np.array(data))
        dtype = self.dtypes[name]
        return t.view(dtype) if dtype == torch.bfloat16 else t

    def bank(self, name: str, banks: BankBuilder) -> Bank:
        """The array as a bank of the job (RAM or spilled, as its budget allows)."""
        a = self.arrays[name]
        out = banks.new(int(a.shape[0]), tuple(a.shape[1:]), self.dtypes[name])
        for s in range(0, int(a.shape[0]), _CHUNK):
            out.write(s, self.tensor(name, slice(s, s + _CHUNK)))
        return out


Array = Bank | np.ndarray | torch.Tensor


def _info(a: Array) -> tuple[torch.dtype, tuple[int, ...]]:
    if isinstance(a, Bank):
        return a.dtype, (a.n, *a.shape)
    if isinstance(a, np.ndarray):
        return torch.from_numpy(np.empty(0, dtype=a.dtype)).dtype, tuple(a.shape)
    return a.dtype, tuple(a.shape)


def _chunks(a: Array) -> Iterator[bytes]:
    """The array's bytes, a few rows at a time (a bank mapped from disk is never read whole)."""
    if not isinstance(a, Bank):
        t = torch.from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a
        a_t = t.detach().cpu().contiguous()
        if a_t.dtype == torch.bfloat16:
            a_t = a_t.view(torch.int16)
        yield a_t.numpy().tobytes()
        return
    for s in range(0, a.n, _CHUNK):
        t = a[slice(s, min(a.n, s + _CHUNK))].contiguous()
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        yield t.numpy().tobytes()


def write_blob(path: Path, arrays: Mapping[str, Array]) -> str:
    """The arrays as one safetensors file at path, streamed; returns the file's SHA-256."""
    header: dict[str, object] = {}
    offset = 0
    for name, a in arrays.items():
        dtype, shape = _info(a)
        if dtype not in _DTYPES:
            raise ValueError(f"cache entries cannot hold {dtype}")
        size = int(np.prod(shape, dtype=np.int64)) * _DTYPES[dtype][1].itemsize
        header[name] = {"dtype": _DTYPES[dtype][0], "shape": list(shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    h = hashlib.sha256()
    with open(path, "wb") as fh:
        for part in (struct.pack("<Q", len(text)), text):
            fh.write(part)
            h.update(part)
        for a in arrays.values():
            for part in _chunks(a):
                fh.write(part)
                h.update(part)
    return h.hexdigest()


def read_blob(path: Path) -> tuple[dict[str, np.ndarray], dict[str, torch.dtype]]:
    """The arrays of a blob, mapped read-only (ValueError: not a whole blob)."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        if n > size - 8:
            raise ValueError("header runs past the end of the file")
        header = json.loads(fh.read(n))
    arrays, dtypes = {}, {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        dtype, np_dtype = _BY_NAME[spec["dtype"]]
        start, end = spec["data_offsets"]
        shape = tuple(spec["shape"])
        want = int(np.prod(shape, dtype=np.int64)) * np_dtype.itemsize
        if 8 + n + end > size or end - start != want:
            raise ValueError(f"{name} does not fit the file")
        arrays[name] = (np.memmap(path, dtype=np_dtype, mode="r", offset=8 + n + start,
                                  shape=shape) if end > start
                        else np.empty(shape, dtype=np_dtype))
        dtypes[name] = dtype
    return arrays, dtypes


def salt(device: torch.device, bf16: bool) -> dict[str, object]:
    """What changes an entry's bytes besides its own key: the same work on another device type,
    at another precision or under another torch may differ in its last bits, and a warm run must
    give the figures a cold run gives."""
    return {"device": device.type, "bf16": bf16, "torch": torch.__version__}


class ReferenceCache:
    """Entries by kind and key parts; a store that fails costs the work, never the job."""

    def __init__(self, store: EntryStore, scratch: Path, salt: dict[str, object],
                 max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES):
        self.store, self.scratch, self.salt = store, scratch, salt
        self.max_entry_bytes = max_entry_bytes
        self.stats = CacheStats()

    def key(self, kind: str, parts: Mapping[str, object]) -> str:
        blob = json.dumps({"format": FORMAT, "kind": kind, "salt": self.salt, **parts},
                          sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()

    @staticmethod
    def manifest_key(kind: str, key: str) -> str:
        return f"{PREFIX}/{kind}/{key[:2]}/{key}.json"

    @staticmethod
    def blob_key(digest: str) -> str:
        return f"{BLOBS}/{digest[:2]}/{digest}.safetensors"

    def load(self, kind: str, key: str) -> Entry | None:
        manifest = self.manifest_key(kind, key)
        try:
            raw = self.store.get_bytes(manifest)
        except OSError as e:
            log.warning("reference cache unreadable (%s); computing %s %s", e, kind, key[:12])
            return self._miss(kind)
        if raw is None:
            return self._miss(kind)
        blob_key = ""
        try:
            doc = json.loads(raw)
            if doc.get("format") != FORMAT or doc.get("key") != key:
                raise ValueError("the manifest is not this entry's")
            digest = str(doc["blob"])
            blob_key = self.blob_key(digest)
            path = self.store.local_file(blob_key)
            if path is None:
                raise ValueError("its blob is gone (pruned)")
            if sha256_hex(path) != digest:
                raise ValueError("its blob does not match its hash")
            arrays, dtypes = read_blob(path)
        except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError) as e:
            log.warning("reference cache entry %s %s rejected (%s); computing it again",
                        kind, key[:12], e)
            self.stats.rejected += 1
            with contextlib.suppress(OSError):
                self.store.discard(manifest)
                if blob_key and "does not match" in str(e):
                    self.store.discard(blob_key)
            return self._miss(kind)
        self.stats.hits += 1
        self.stats.count(kind, "hits")
        self.stats.bytes_read += int(doc.get("bytes", 0))
        return Entry(arrays, dtypes, dict(doc.get("meta", {})))

    def _miss(self, kind: str) -> None:
        self.stats.misses += 1
        self.stats.count(kind, "misses")
        return None

    def put(self, kind: str, key: str, arrays: Mapping[str, Array],
            meta: Mapping[str, object] | None = None) -> None:
        """Keep an entry. A store that cannot be written (full, read-only, unreachable) only
        costs the next job the work, so the job goes on without it."""
        size = sum(int(np.prod(_info(a)[1], dtype=np.int64)) * _DTYPES[_info(a)[0]][1].itemsize
                   for a in arrays.values() if _info(a)[0] in _DTYPES)
        if size > self.max_entry_bytes:
            log.info("reference cache: %s entry of %d bytes is over the %d-byte limit; not kept",
                     kind, size, self.max_entry_bytes)
            return
        tmp = self.scratch / f".refcache-{uuid.uuid4().hex}.tmp"
        try:
            self.scratch.mkdir(parents=True, exist_ok=True)
            _forget_abandoned(self.scratch)
            digest = write_blob(tmp, arrays)
            self.store.put_file(self.blob_key(digest), tmp)
            doc = {"format": FORMAT, "kind": kind, "key": key, "blob": digest, "bytes": size,
                   "created": time.time(), "meta": dict(meta or {})}
            self.store.put_bytes(self.manifest_key(kind, key),
                                 json.dumps(doc, default=str).encode())
            self.stats.written += 1
            self.stats.bytes_written += size
            self.store.written()
        except OSError as e:
            log.warning("reference cache entry %s %s not written (%s); going on without it",
                        kind, key[:12], e)
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)


def _forget_abandoned(scratch: Path, older_than_s: float = 24 * 3600) -> None:
    """Temp files of writers killed mid-write are never read; a day is far longer than any
    write, so an old one has no live writer."""
    cutoff = time.time() - older_than_s
    for tmp in scratch.glob(".refcache-*.tmp"):
        with contextlib.suppress(OSError):
            if tmp.stat().st_mtime < cutoff:
                tmp.unlink()


def _atomic_write(dest: Path, data: bytes | None = None, src: Path | None = None) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.part")
    try:
        if src is not None:
            try:
                os.link(src, part)  # free on one filesystem
            except OSError:
                shutil.copyfile(src, part)
        else:
            part.write_bytes(data or b"")
        os.replace(part, dest)
    finally:
        with contextlib.suppress(OSError):
            part.unlink(missing_ok=True)


class FolderStore:
    """Entries in a local folder (`stitchsim-server run`, or a service on one host's disk),
    pruned to max_bytes, least recently used first."""

    def __init__(self, root: Path, max_bytes: int = DEFAULT_MAX_BYTES):
        self.root, self.max_bytes = root, max_bytes

    def get_bytes(self, key: str) -> bytes | None:
        try:
            return (self.root / key).read_bytes()
        except FileNotFoundError:
            return None

    def put_bytes(self, key: str, data: bytes) -> None:
        _atomic_write(self.root / key, data=data)

    def put_file(self, key: str, src: Path) -> bool:
        if (self.root / key).is_file():
            return False
        _atomic_write(self.root / key, src=src)
        return True

    def local_file(self, key: str) -> Path | None:
        path = self.root / key
        if not path.is_file():
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # used now: pruned last
        return path

    def discard(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.root / key).unlink()

    def written(self) -> None:
        prune(self.root, self.max_bytes)


def prune(root: Path, max_bytes: int, abandoned_after_s: float = 24 * 3600) -> int:
    """Delete the least recently used blobs under root/refcache until their total is at most
    max_bytes (a hit touches its blob), and part files older than a day (writers that died);
    the manifests of deleted blobs become misses. Returns the bytes freed."""
    base = root / PREFIX
    if not base.is_dir():
        return 0
    freed, cutoff = 0, time.time() - abandoned_after_s
    blobs = []
    for p in base.rglob("*"):
        with contextlib.suppress(OSError):
            st = p.stat()
            if p.name.endswith(".part") and st.st_mtime < cutoff:
                p.unlink()
            elif p.suffix == ".safetensors" and p.parent.parent.name == "blobs":
                blobs.append((st.st_mtime, st.st_size, p))
    total = sum(size for _, size, _ in blobs)
    for _, size, p in sorted(blobs):
        if total <= max_bytes:
            break
        with contextlib.suppress(OSError):
            p.unlink()
            total -= size
            freed += size
    return freed
