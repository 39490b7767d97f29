"""Streaming uploads: the body goes to a temp file in bounded pieces, hashed on the way in.

Starlette's own form parser spools files without a size limit and hands them over only once
complete; here the body is parsed as it arrives, so a file that is too big (413) or is a
pickle (415) is refused after its first bytes, and no upload is ever held in memory.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from fastapi import Request
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from stitchsim.failure import Failure
from stitchsim.files.errors import SafetensorsError
from stitchsim.files.header import Header, header_length, read_header
from stitchsim.files.limits import SNIFF_BYTES
from stitchsim.files.sniff import sniff
from stitchsim_service.core import objects
from stitchsim_service.core.context import Context
from stitchsim_service.core.db import ObjectRow
from stitchsim_service.core.settings import Settings
from stitchsim_service.core.store import StoreError, write_error
from stitchsim_service.core.tmpfiles import new_upload_path
from stitchsim_service.gateway.errors import file_error, status_of

_FLUSH_BYTES = 4 * 1024 * 1024
_IOV_MAX = 512  # below every platform's IOV_MAX (Linux: 1024)
_DRAIN_LIMIT = 256 * 1024 * 1024
_SPOOL = "the upload spool (STITCHSIM_DATA_DIR/tmp)"


def _too_large(what: str, limit: int) -> Failure:
    return Failure(
        "too_large",
        f"{what} is larger than the {limit} bytes this service accepts "
        "(STITCHSIM_MAX_UPLOAD_BYTES)",
        {"limit_bytes": limit},
    )


@dataclass
class UploadedFile:
    field: str
    filename: str | None
    path: Path
    size: int
    sha256: str
    header: Header | None = None

    @property
    def object_id(self) -> str:
        return f"sha256:{self.sha256}"

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)


class _Stage:
    """One thread applying fn to each piece it is handed, in order; a bounded queue, so
    memory stays flat however big the file. An error stops the work but not the draining,
    so the producer never blocks on a dead stage."""

    def __init__(self, name: str, fn: Callable[[list[bytes]], None], depth: int):
        self._fn = fn
        self._queue: queue.Queue[list[bytes] | None] = queue.Queue(depth)
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()
        self._closed = False

    def _loop(self) -> None:
        while True:
            piece = self._queue.get()
            if piece is None:
                return
            if self.error is not None:
                continue
            try:
                self._fn(piece)
            except BaseException as exc:
                self.error = exc

    def offer(self, piece: list[bytes]) -> bool:
        try:
            self._queue.put_nowait(piece)
            return True
        except queue.Full:
            return False

    def put(self, piece: list[bytes]) -> None:
        self._queue.put(piece)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._thread.join()


def _write_all(fd: int, piece: list[bytes]) -> None:
    """os.writev until every byte of piece is written (it may write less at a time)."""
    views = [memoryview(c) for c in piece]
    while views:
        n = os.writev(fd, views[:_IOV_MAX])
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if n:
            views[0] = views[0][n:]


class _Spool:
    """One file being received, in bounded memory: the body's pieces, as they come, go to
    two threads at once, one hashing, one writing (large vectored writes, no copy into one
    buffer first), so the hash costs no second pass and neither waits for the other; both
    overlap with receiving the next bytes on the event loop."""

    _QUEUE_DEPTH = 4  # pieces of about _FLUSH_BYTES in flight per stage: bounded memory

    def __init__(self, field: str, filename: str | None, path: Path, limit: int,
                 max_header_bytes: int, fd: int, *, dataset: bool = False):
        self.field = field
        self.dataset = dataset
        self.filename = filename
        self.path = path
        self.limit = limit
        self.max_header_bytes = max_header_bytes
        self.fd: int | None = fd
        self.hasher = hashlib.sha256()
        self.size = 0
        self.pending: list[bytes] = []
        self.pending_bytes = 0
        self.head = bytearray()
        self.sniffed = False
        self._hash = _Stage("upload-hash", self._hash_piece, self._QUEUE_DEPTH)
        self._write = _Stage("upload-write", self._write_piece, self._QUEUE_DEPTH)
        self._closed = False

    def _hash_piece(self, piece: list[bytes]) -> None:
        for chunk in piece:
            self.hasher.update(chunk)  # releases the GIL for all but tiny chunks

    def _write_piece(self, piece: list[bytes]) -> None:
        assert self.fd is not None
        _write_all(self.fd, piece)

    def _check_head(self, final: bool) -> None:
        if self.sniffed or (len(self.head) < SNIFF_BYTES and not final):
            return
        self.sniffed = True
        try:
            sniff(bytes(self.head), dataset=self.dataset)
            if len(self.head) >= 8:
                # Only the cap can be judged before the end; the file size is not known yet.
                header_length(bytes(self.head[:8]), 1 << 62, max_header_bytes=self.max_header_bytes)
        except SafetensorsError as exc:
            raise file_error(exc, f"file {self.field!r}") from None

    def add(self, data: bytes) -> bool:
        """Queue bytes; True when enough is queued to flush."""
        self.size += len(data)
        if self.size > self.limit:
            raise _too_large(f"file {self.field!r}", self.limit)
        if len(self.head) < SNIFF_BYTES:
            self.head += data[: SNIFF_BYTES - len(self.head)]
            self._check_head(final=False)
        self.pending.append(data)
        self.pending_bytes += len(data)
        return self.pending_bytes >= _FLUSH_BYTES

    async def flush(self) -> None:
        if not self.pending:
            return
        piece = self.pending  # the chunks as received: both stages only read them
        self.pending, self.pending_bytes = [], 0
        for stage in (self._hash, self._write):
            if not stage.offer(piece):
                # That stage is the bottleneck (the disk, or the hash): wait off the loop.
                await anyio.to_thread.run_sync(stage.put, piece)

    def _close_stages(self) -> None:
        if not self._closed:
            self._closed = True
            self._hash.close()
            self._write.close()

    async def finish(self) -> UploadedFile:
        await self.flush()
        self._check_head(final=True)
        await anyio.to_thread.run_sync(self._close_stages)
        error = self._write.error or self._hash.error
        if isinstance(error, OSError):  # disk full, read-only …: 503, not 500
            raise write_error(error, _SPOOL) from error
        if error is not None:
            raise StoreError(f"cannot write the upload to disk: {error}")
        fd, self.fd = self.fd, None
        try:
            if fd is not None:
                await anyio.to_thread.run_sync(os.close, fd)
        except OSError as exc:
            raise write_error(exc, _SPOOL) from exc
        return UploadedFile(self.field, self.filename, self.path, self.size,
                            self.hasher.hexdigest())

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self._close_stages()
        fd, self.fd = self.fd, None
        if fd is not None:
            with contextlib.suppress(Exception):
                os.close(fd)
        self.path.unlink(missing_ok=True)


class UploadReceiver:
    """Receives the request body: multipart/form-data with file and text fields, or raw bytes."""

    def __init__(self, request: Request, settings: Settings, *, file_fields: set[str],
                 text_fields: set[str], dataset_fields: frozenset[str] = frozenset()):
        self.request = request
        self.dataset_fields = dataset_fields
        self.settings = settings
        self.file_fields = file_fields
        self.text_fields = text_fields
        self.files: dict[str, UploadedFile] = {}
        self.texts: dict[str, str] = {}
        self._spools: list[_Spool] = []

    def _new_spool(self, field_name: str, filename: str | None) -> _Spool:
        tmp = self.settings.tmp_dir
        path = new_upload_path(tmp)
        try:
            tmp.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            raise write_error(exc, _SPOOL) from exc
        spool = _Spool(field_name, filename, path, self.settings.max_upload_bytes,
                       self.settings.max_header_bytes, fd,
                       dataset=field_name in self.dataset_fields)
        self._spools.append(spool)
        return spool

    def cleanup(self) -> None:
        for spool in self._spools:
            spool.abort()
        for f in self.files.values():
            f.discard()

    def _content_length(self) -> int | None:
        raw = self.request.headers.get("content-length")
        if raw is None:
            return None
        try:
            return int(raw)
        except ValueError:
            raise Failure("bad_request", "Content-Length is not a number") from None

    async def _drain(self) -> None:
        # Read (and drop) what the client is still sending, so it receives our error instead of
        # a reset connection; bounded, so a huge body cannot keep us busy.
        seen = 0
        with contextlib.suppress(Exception):
            async for chunk in self.request.stream():
                seen += len(chunk)
                if seen > _DRAIN_LIMIT:
                    break

    async def receive_raw(self, field_name: str = "file") -> None:
        length = self._content_length()
        if length is not None and length > self.settings.max_upload_bytes:
            raise _too_large("the upload", self.settings.max_upload_bytes)
        spool = self._new_spool(field_name, None)
        try:
            async for chunk in self.request.stream():
                if chunk and spool.add(chunk):
                    await spool.flush()
            self.files[field_name] = await spool.finish()
        except Failure as exc:
            spool.abort()
            if status_of(exc) != 413:
                await self._drain()
            raise
        except BaseException:  # client gone, cancelled: no partial file stays behind
            spool.abort()
            raise

    async def receive_multipart(self) -> None:
        ctype, params = parse_options_header(self.request.headers.get("content-type", ""))
        boundary = params.get(b"boundary")
        if ctype != b"multipart/form-data" or not boundary:
            raise Failure("bad_request", "expected multipart/form-data with a boundary")
        n_files = max(1, len(self.file_fields))
        total_limit = (n_files * self.settings.max_upload_bytes + self.settings.max_spec_bytes
                       + 65536)
        length = self._content_length()
        if length is not None and length > total_limit:
            raise _too_large("the request body", total_limit)

        state: dict[str, Any] = {"headers": {}, "hname": b"", "hvalue": b"", "spool": None,
                                 "text": None, "name": None}
        events: list[tuple[str, Any]] = []

        def on_part_begin() -> None:
            state["headers"] = {}

        def on_header_field(data: bytes, start: int, end: int) -> None:
            state["hname"] += data[start:end]

        def on_header_value(data: bytes, start: int, end: int) -> None:
            state["hvalue"] += data[start:end]

        def on_header_end() -> None:
            state["headers"][state["hname"].lower()] = state["hvalue"]
            state["hname"], state["hvalue"] = b"", b""

        def on_headers_finished() -> None:
            events.append(("begin", dict(state["headers"])))

        def on_part_data(data: bytes, start: int, end: int) -> None:
            events.append(("data", data[start:end]))

        def on_part_end() -> None:
            events.append(("end", None))

        parser = MultipartParser(
            boundary,
            {
                "on_part_begin": on_part_begin,
                "on_header_field": on_header_field,
                "on_header_value": on_header_value,
                "on_header_end": on_header_end,
                "on_headers_finished": on_headers_finished,
                "on_part_data": on_part_data,
                "on_part_end": on_part_end,
            },
        )
        received = 0
        try:
            async for chunk in self.request.stream():
                received += len(chunk)
                if received > total_limit:
                    raise _too_large("the request body", total_limit)
                try:
                    parser.write(chunk)
                except MultipartParseError as exc:
                    raise Failure("bad_request", f"malformed multipart body: {exc}") from None
                await self._handle(events, state)
                events.clear()
            try:
                parser.finalize()
            except MultipartParseError as exc:
                raise Failure("bad_request", f"malformed multipart body: {exc}") from None
            await self._handle(events, state)
            if state["name"] is not None:
                raise Failure("bad_request",
                              "the multipart body ended in the middle of a part")
        except Failure as exc:
            self.cleanup()
            if status_of(exc) != 413:
                await self._drain()
            raise
        except BaseException:
            self.cleanup()
            raise

    async def _handle(self, events: list[tuple[str, Any]], state: dict[str, Any]) -> None:
        for kind, value in events:
            if kind == "begin":
                _, disp = parse_options_header(value.get(b"content-disposition", b""))
                name = disp.get(b"name", b"").decode("utf-8", "replace")
                filename = disp.get(b"filename")
                if name in self.files or name in self.texts:
                    raise Failure("bad_request", f"field {name!r} given twice")
                state["name"] = name
                if name in self.file_fields:
                    state["spool"] = self._new_spool(
                        name, filename.decode("utf-8", "replace") if filename else None
                    )
                elif name in self.text_fields:
                    state["text"] = bytearray()
                else:
                    allowed = sorted(self.file_fields | self.text_fields)
                    raise Failure(
                        "bad_request",
                        f"unexpected form field {name!r}; this endpoint takes {allowed}",
                    )
            elif kind == "data":
                if state["spool"] is not None:
                    if state["spool"].add(value):
                        await state["spool"].flush()
                elif state["text"] is not None:
                    state["text"] += value
                    if len(state["text"]) > self.settings.max_spec_bytes:
                        raise _too_large(f"field {state['name']!r}", self.settings.max_spec_bytes)
            elif kind == "end":
                name = state["name"]
                if state["spool"] is not None:
                    spool = state["spool"]
                    self._spools.remove(spool)
                    try:
                        self.files[name] = await spool.finish()
                    except BaseException:
                        spool.abort()
                        raise
                elif state["text"] is not None:
                    try:
                        self.texts[name] = bytes(state["text"]).decode("utf-8")
                    except UnicodeDecodeError:
                        raise Failure("bad_request", f"field {name!r} is not UTF-8") from None
                state["spool"], state["text"], state["name"] = None, None, None


async def validate_safetensors(upload: UploadedFile, settings: Settings, what: str) -> Header:
    """Full header check of a received file (off the event loop)."""

    def check() -> Header:
        return read_header(upload.path, max_header_bytes=settings.max_header_bytes)

    if upload.size == 0:
        raise Failure("invalid_safetensors", f"{what} is empty")
    try:
        header = await anyio.to_thread.run_sync(check)
    except SafetensorsError as exc:
        raise file_error(exc, what) from None
    upload.header = header
    return header


async def receive_single_file(request: Request, settings: Settings, *, dataset: bool = False
                              ) -> UploadedFile:
    """One file, as multipart field ``file`` or as the raw body (application/octet-stream);
    `dataset`: a refused format is answered with how to pack a dataset."""
    ctype = request.headers.get("content-type", "")
    receiver = UploadReceiver(request, settings, file_fields={"file"}, text_fields=set(),
                              dataset_fields=frozenset({"file"}) if dataset else frozenset())
    if ctype.startswith("multipart/form-data"):
        await receiver.receive_multipart()
    elif ctype.startswith("application/octet-stream") or ctype == "":
        await receiver.receive_raw("file")
    else:
        raise Failure(
            "unsupported_media_type",
            "send the file as multipart/form-data (field 'file') or as "
            f"application/octet-stream, not {ctype!r}",
        )
    upload = receiver.files.get("file")
    if upload is None:
        receiver.cleanup()
        raise Failure("bad_request", "no file given: send it in the multipart field 'file'")
    return upload


Describe = Callable[[UploadedFile, Header], Awaitable[dict[str, Any]]]
"""What an upload endpoint records of a validated file (it may refuse it, too)."""


async def receive_and_store(request: Request, ctx: Context, owner: str, kind: str,
                            describe: Describe) -> tuple[ObjectRow, bool]:
    """The upload endpoints: stream the file in, validate it, then let the core store it by
    content and grant it to owner. Returns the object and whether it is new to owner; on any
    failure nothing of it is left behind."""
    upload = await receive_single_file(request, ctx.settings, dataset=kind == "datasets")
    try:
        header = await validate_safetensors(upload, ctx.settings, kind[:-1])
        info = await describe(upload, header)
        return await anyio.to_thread.run_sync(objects.store_upload, ctx, owner, kind, upload,
                                              info)
    finally:
        upload.discard()


UPLOAD_OPENAPI: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {"file": {"type": "string", "format": "binary",
                                            "description": "a .safetensors file"}},
                    "additionalProperties": False,
                }
            },
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        },
    }
}
