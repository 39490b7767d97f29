"""Content-addressed blob store: a local directory by default, any fsspec URL (S3 …) otherwise.

Objects are named by the SHA-256 of their bytes, never by anything a user chose. Reports are
stored under the job id, which the service generates.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any, Protocol

from stitchsim.failure import Failure
from stitchsim.files.digest import sha256_hex

OBJECT_ID = re.compile(r"^sha256:([0-9a-f]{64})$")
KINDS = ("checkpoints", "datasets")
_JOB_ID = re.compile(r"^[0-9a-f]{32}$")


class StoreError(Failure):
    """The store cannot be read or written (disk full, bucket unreachable …)."""

    def __init__(self, message: str):
        super().__init__("store_unavailable", message, retry_after=30)


_FULL = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "the disk quota is used up",
         errno.EFBIG: "the file size limit is reached"}
_UNWRITABLE = {errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EEXIST}


def write_error(exc: OSError, where: str) -> StoreError:
    """The StoreError for a failed write to where: it says whether the disk is full or not
    writable and what an operator has to do, since the client can only wait and retry."""
    name = errno.errorcode.get(exc.errno or 0, "unknown error")
    if exc.errno in _FULL:
        return StoreError(f"{where} is full ({_FULL[exc.errno]}, {name}): an operator must free "
                          "space or raise the limit")
    if exc.errno in _UNWRITABLE:
        return StoreError(f"{where} is not writable ({exc.strerror}, {name}): an operator must "
                          "fix its permissions or mount")
    return StoreError(f"cannot write to {where} ({exc.strerror or exc}, {name}): an operator "
                      "must check its disk")


def parse_object_id(object_id: str) -> str:
    """The hex digest of a "sha256:<hex>" id; ValueError otherwise."""
    m = OBJECT_ID.match(object_id)
    if not m:
        raise ValueError(f'{object_id!r} is not an object id ("sha256:" and 64 hex digits)')
    return m.group(1)


def object_key(kind: str, object_id: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown object kind {kind!r}")
    hexd = parse_object_id(object_id)
    return f"{kind}/{hexd[:2]}/{hexd}.safetensors"


def is_job_id(value: str) -> bool:
    """Whether value has the shape of a job id (32 hex digits)."""
    return _JOB_ID.match(value) is not None


def report_key(job_id: str) -> str:
    if not _JOB_ID.match(job_id):
        raise ValueError(f"bad job id {job_id!r}")
    return f"reports/{job_id}.json"


class Store(Protocol):
    url: str

    def has(self, key: str) -> bool: ...

    def put_file(self, key: str, src: Path) -> bool:
        """Copy src in under key; False if key already existed. src stays for the caller."""
        ...

    def delete(self, key: str) -> None: ...

    def put_bytes(self, key: str, data: bytes) -> None: ...

    def get_bytes(self, key: str) -> bytes | None: ...

    def local_path(self, key: str, cache_dir: Path) -> Path:
        """A local file with the object's bytes (downloaded into cache_dir when remote)."""
        ...

    def ping(self) -> None: ...

    def keys(self, prefix: str) -> list[str]: ...


def _part_path(dest: Path) -> Path:
    return dest.with_name(dest.name + f".{uuid.uuid4().hex}.part")


def _discard(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


class LocalStore:
    def __init__(self, root: Path):
        self.root = root.resolve()
        self.url = str(self.root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.root / key

    def has(self, key: str) -> bool:
        return self._path(key).is_file()

    def put_file(self, key: str, src: Path) -> bool:
        dest = self._path(key)
        part = _part_path(dest)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            if dest.exists():
                return False
            # Copy to a part file then rename, so a reader never sees half an object; a hard
            # link makes the copy free when tmp and store share a filesystem.
            try:
                os.link(src, part)
            except OSError:
                shutil.copyfile(src, part)
            os.chmod(part, 0o644)
            os.replace(part, dest)
            return True
        except OSError as exc:
            _discard(part)  # a copy cut short by a full disk leaves no half object behind
            raise write_error(exc, "the blob store") from exc

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(key).unlink()

    def put_bytes(self, key: str, data: bytes) -> None:
        dest = self._path(key)
        part = _part_path(dest)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            part.write_bytes(data)
            os.replace(part, dest)
        except OSError as exc:
            _discard(part)
            raise write_error(exc, "the blob store") from exc

    def get_bytes(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None

    def local_path(self, key: str, cache_dir: Path) -> Path:
        path = self._path(key)
        if not path.is_file():
            raise FileNotFoundError(key)
        return path

    def ping(self) -> None:
        probe = self.root / f".ping-{uuid.uuid4().hex}"
        try:
            probe.write_bytes(b"ok")
            probe.unlink()
        except OSError as exc:
            raise StoreError(f"store {self.url} is not writable: {exc.strerror or exc}") from exc

    def keys(self, prefix: str) -> list[str]:
        base = self.root / prefix
        if not base.exists():
            return []
        return sorted(
            str(p.relative_to(self.root)) for p in base.rglob("*") if p.is_file()
        )


class FsspecStore:
    """Any fsspec filesystem: s3:// (with s3fs), gcs://, file://, memory:// …"""

    def __init__(self, url: str, **storage_options: Any):
        import fsspec  # only deployments with a remote store pay for the import

        self.url = url.rstrip("/")
        self.fs, self.base = fsspec.core.url_to_fs(self.url, **storage_options)
        self.base = self.base.rstrip("/")

    def _path(self, key: str) -> str:
        return f"{self.base}/{key}"

    def has(self, key: str) -> bool:
        try:
            return bool(self.fs.exists(self._path(key)))
        except Exception as exc:
            raise StoreError(f"store {self.url} unreachable: {exc}") from exc

    def put_file(self, key: str, src: Path) -> bool:
        try:
            if self.fs.exists(self._path(key)):
                return False
            parent = self._path(key).rsplit("/", 1)[0]
            with contextlib.suppress(Exception):
                self.fs.makedirs(parent, exist_ok=True)
            # Object stores make a put atomic; file:// is not an object store, but tests only.
            self.fs.put_file(str(src), self._path(key))
            return True
        except StoreError:
            raise
        except Exception as exc:
            raise StoreError(f"cannot write to store {self.url}: {exc}") from exc

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._path(key))

    def put_bytes(self, key: str, data: bytes) -> None:
        try:
            parent = self._path(key).rsplit("/", 1)[0]
            with contextlib.suppress(Exception):
                self.fs.makedirs(parent, exist_ok=True)
            self.fs.pipe_file(self._path(key), data)
        except Exception as exc:
            raise StoreError(f"cannot write to store {self.url}: {exc}") from exc

    def get_bytes(self, key: str) -> bytes | None:
        try:
            return bytes(self.fs.cat_file(self._path(key)))
        except FileNotFoundError:
            return None

    def local_path(self, key: str, cache_dir: Path) -> Path:
        # Content-addressed keys never change, so a cached copy that hashes right is the object.
        dest = cache_dir / "objects" / key
        if dest.is_file():
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_name(dest.name + f".{uuid.uuid4().hex}.part")
        self.fs.get_file(self._path(key), str(part))
        expected = key.rsplit("/", 1)[-1].split(".", 1)[0]
        if len(expected) == 64 and sha256_hex(part) != expected:
            part.unlink(missing_ok=True)
            raise StoreError(f"object {key} in {self.url} does not match its hash")
        os.replace(part, dest)
        return dest

    def ping(self) -> None:
        try:
            self.fs.ls(self.base, detail=False)
        except FileNotFoundError:
            self.fs.makedirs(self.base, exist_ok=True)
        except Exception as exc:
            raise StoreError(f"store {self.url} unreachable: {exc}") from exc

    def keys(self, prefix: str) -> list[str]:
        try:
            found = self.fs.find(self._path(prefix))
        except FileNotFoundError:
            return []
        strip = len(self.base) + 1
        return sorted(p[strip:] for p in found)


def open_store(url: str) -> Store:
    if "://" in url:
        return FsspecStore(url)
    return LocalStore(Path(url))
