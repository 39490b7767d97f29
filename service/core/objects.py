"""Stored checkpoints and datasets: registration, per-key visibility, rollback.

What a stored object holds is content-addressed; which key may use it is a grant in the
ownership table, within the key's storage quota."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session
from stitchsim.datasets import BUILTIN
from stitchsim.failure import Failure
from stitchsim.files.dataset import DatasetFileInfo
from stitchsim.files.header import Header
from stitchsim.models import ACTIVE_STATES, DatasetInfo, StoredObject
from stitchsim_service.core import quotas
from stitchsim_service.core.context import Context
from stitchsim_service.core.db import JobRow, ObjectRow, OwnershipRow, advisory_lock, utcnow
from stitchsim_service.core.metrics import UPLOAD_BYTES
from stitchsim_service.core.settings import Settings
from stitchsim_service.core.store import OBJECT_ID, object_key

log = logging.getLogger("stitchsim.objects")


class StagedFile(Protocol):
    """A received file on local disk, validated, not yet in the store."""

    @property
    def object_id(self) -> str: ...

    @property
    def size(self) -> int: ...

    @property
    def path(self) -> Path: ...


def checkpoint_info(header: Header) -> dict[str, Any]:
    return {"n_tensors": header.n_tensors, "arch": header.arch, "metadata": header.metadata}


def dataset_info(header: Header, ds: DatasetFileInfo) -> dict[str, Any]:
    return {
        "n_tensors": header.n_tensors,
        "n_train": ds.n_train,
        "n_test": ds.n_test,
        "image_shape": list(ds.image_shape),
        "image_dtype": ds.image_dtype,
        "n_classes": ds.n_classes,
        "labelled": ds.labelled,
        "test_split": ds.test_split.describe() if ds.test_split else None,
        "source_format": ds.source_format,
        "metadata": header.metadata,
    }


def stored_object(row: ObjectRow) -> StoredObject:
    info = json.loads(row.info_json)
    return StoredObject(id=row.id, size=row.size, n_tensors=info.get("n_tensors", 0),
                        arch=info.get("arch"), metadata=info.get("metadata", {}))


def dataset_listing(row: ObjectRow) -> DatasetInfo:
    info = json.loads(row.info_json)
    return DatasetInfo(id=row.id, builtin=False, size=row.size, n_train=info.get("n_train"),
                       n_test=info.get("n_test"), image_shape=info.get("image_shape"),
                       n_classes=info.get("n_classes"), labelled=info.get("labelled", True),
                       test_split=info.get("test_split"), source_format=info.get("source_format"),
                       description=info.get("metadata", {}).get("description", ""))


def builtin_datasets() -> list[DatasetInfo]:
    return [DatasetInfo(id=d.name, builtin=True, n_train=d.n_train, n_test=d.n_test,
                        image_shape=list(d.image_shape), n_classes=d.n_classes,
                        description=d.description)
            for d in BUILTIN.values()]


def store_upload(ctx: Context, owner: str, kind: str, upload: StagedFile,
                 info: dict[str, Any]) -> tuple[ObjectRow, bool]:
    """Store a validated upload by content and grant it to owner. Returns the object and
    whether it is new to owner; on any failure nothing of it is left behind."""
    created = put_object(ctx, kind, upload)
    try:
        row, new = register(ctx, owner, kind, upload, info)
    except BaseException:
        if created:
            rollback(ctx, [(kind, upload.object_id)])
        raise
    UPLOAD_BYTES.labels(kind).inc(upload.size)
    return row, new


def put_object(ctx: Context, kind: str, upload: StagedFile) -> bool:
    """Copy an upload into the store; True when this call created the object."""
    return ctx.store.put_file(object_key(kind, upload.object_id), upload.path)


def register(ctx: Context, owner: str, kind: str, upload: StagedFile,
             info: dict[str, Any]) -> tuple[ObjectRow, bool]:
    """Record the object and grant it to owner within its storage quota (quota_exceeded
    beyond); returns
    the object and whether owner did not have it before."""
    with ctx.db.write() as s:
        new_for_owner = grant_existing(s, ctx.settings, owner, kind, upload.object_id,
                                       upload.size, info)
        row = s.get(ObjectRow, (kind, upload.object_id))
        assert row is not None
    # A failed submission elsewhere may have rolled the bytes back between our put and our
    # grant; now that we own it, it must stay, so put it back.
    key = object_key(kind, upload.object_id)
    if not ctx.store.has(key):
        ctx.store.put_file(key, upload.path)
    return row, new_for_owner


def grant_existing(session: Session, settings: Settings, owner: str, kind: str,
                   object_id: str, size: int, info: dict[str, Any]) -> bool:
    """Grant an object in the store to owner, within its storage quota; True when new to it."""
    quotas.lock_owner(session, owner)
    _lock_object(session, kind, object_id)
    if session.get(OwnershipRow, (owner, kind, object_id)) is not None:
        return False
    quotas.check_storage(session, settings, owner, size)
    if session.get(ObjectRow, (kind, object_id)) is None:
        session.add(ObjectRow(kind=kind, id=object_id, size=size, info_json=json.dumps(info),
                              created_at=utcnow()))
    session.add(OwnershipRow(owner=owner, kind=kind, object_id=object_id, created_at=utcnow()))
    return True


def _is_object_id(object_id: str) -> bool:
    # Checked before any lookup: the job table cannot even be asked about some strings
    # (PostgreSQL refuses a NUL byte), and a malformed id names nothing anyway.
    return OBJECT_ID.match(object_id) is not None


def owned(ctx: Context, owner: str, kind: str, object_id: str) -> ObjectRow | None:
    if not _is_object_id(object_id):
        return None
    with ctx.db.read() as s:
        if s.get(OwnershipRow, (owner, kind, object_id)) is None:
            return None
        return s.get(ObjectRow, (kind, object_id))


def list_owned(ctx: Context, owner: str, kind: str) -> list[ObjectRow]:
    with ctx.db.read() as s:
        rows = s.scalars(
            select(ObjectRow)
            .join(OwnershipRow, (OwnershipRow.kind == ObjectRow.kind)
                  & (OwnershipRow.object_id == ObjectRow.id))
            .where(OwnershipRow.owner == owner, OwnershipRow.kind == kind)
            .order_by(OwnershipRow.created_at.desc())
        )
        return list(rows)


def _lock_object(session: Session, kind: str, object_id: str) -> None:
    # Granting, releasing and rolling back one object must not interleave across processes,
    # or a release could delete bytes that a concurrent upload of the same content just
    # granted.
    advisory_lock(session, f"object:{kind}:{object_id}")


def _drop_if_orphaned(ctx: Context, session: Session, kind: str, object_id: str) -> bool:
    """Delete the object's row and bytes when no key owns it any more; True when dropped."""
    owners = session.scalar(select(func.count()).select_from(OwnershipRow).where(
        OwnershipRow.kind == kind, OwnershipRow.object_id == object_id))
    if owners:
        return False
    session.execute(delete(ObjectRow).where(ObjectRow.kind == kind, ObjectRow.id == object_id))
    # Inside the transaction, so a concurrent grant waits for it and then finds the bytes
    # gone, and puts them back (see register).
    ctx.store.delete(object_key(kind, object_id))
    return True


def rollback(ctx: Context, created: list[tuple[str, str]]) -> None:
    """Remove objects this request put in the store, unless someone owns them by now."""
    for kind, object_id in created:
        try:
            with ctx.db.write() as s:
                _lock_object(s, kind, object_id)
                _drop_if_orphaned(ctx, s, kind, object_id)
        except Exception:  # cleanup must not hide the error being reported
            log.exception("could not roll back %s %s", kind, object_id)


def release(ctx: Context, owner: str, kind: str, object_id: str) -> bool:
    """Take owner's grant to an object away (freeing its quota); the bytes go once no key owns
    them. False when owner did not have it; in_use while one of owner's active jobs uses it."""
    if kind == "datasets" and object_id in BUILTIN:
        raise Failure("builtin", f"{object_id} is a built-in dataset; it cannot be deleted "
                      "and takes none of your storage quota", {"id": object_id})
    if not _is_object_id(object_id):
        return False
    with ctx.db.write() as s:
        quotas.lock_owner(s, owner)
        _lock_object(s, kind, object_id)
        grant = s.get(OwnershipRow, (owner, kind, object_id))
        if grant is None:
            return False
        user = s.scalar(select(JobRow.id).where(
            JobRow.owner == owner, JobRow.state.in_(ACTIVE_STATES),
            JobRow.spec_json.contains(object_id)).limit(1))
        if user is not None:
            raise Failure(
                "in_use",
                f"{kind[:-1]} {object_id} is used by job {user}, which is queued or running; "
                f"wait for it to finish or cancel it (DELETE /jobs/{user}), then delete again",
                {"job_id": user})
        s.delete(grant)
        s.flush()
        _drop_if_orphaned(ctx, s, kind, object_id)
    return True
