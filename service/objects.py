"""Stored checkpoints and datasets: registration, per-key visibility, rollback."""

from __future__ import annotations

import json
import logging
from typing import Any

from sqlalchemy import delete, func, select
from stitchsim.models import BUILTIN_DATASETS, DatasetInfo, StoredObject
from stitchsim.safetensors_format import DatasetFileInfo, Header
from stitchsim_service.context import Context
from stitchsim_service.db import ObjectRow, OwnershipRow, utcnow
from stitchsim_service.store import object_key
from stitchsim_service.uploads import UploadedFile

log = logging.getLogger("stitchsim.objects")

BUILTIN_DESCRIPTIONS: dict[str, str] = {
    "digits": "scikit-learn's 8x8 digits, upscaled, RGB",
    "digits_correlated": "digits whose colour is correlated with the class",
    "digits_digit_only": "digits with random colours: only the shape tells the class",
    "digits_colour_only": "class-coloured blank images: only the colour tells the class",
    "digits_colour_patches": "class-coloured patches without digits",
    "digits_marker": "digits with a class-coloured 4x4 marker (a pixel shortcut)",
    "clustered_noise": "clustered noise: one random centre per class plus Gaussian noise",
}
assert set(BUILTIN_DESCRIPTIONS) == set(BUILTIN_DATASETS)


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
                       n_classes=info.get("n_classes"),
                       description=info.get("metadata", {}).get("description", ""))


def builtin_datasets() -> list[DatasetInfo]:
    return [DatasetInfo(id=name, builtin=True, description=BUILTIN_DESCRIPTIONS[name])
            for name in BUILTIN_DATASETS]


def put_object(ctx: Context, kind: str, upload: UploadedFile) -> bool:
    """Copy an upload into the store; True when this call created the object."""
    return ctx.store.put_file(object_key(kind, upload.object_id), upload.path)


def register(ctx: Context, owner: str, kind: str, upload: UploadedFile,
             info: dict[str, Any]) -> bool:
    """Record the object and grant it to owner; True when owner did not have it before."""
    with ctx.db.write() as s:
        if s.get(ObjectRow, (kind, upload.object_id)) is None:
            s.add(ObjectRow(kind=kind, id=upload.object_id, size=upload.size,
                            info_json=json.dumps(info), created_at=utcnow()))
        new_for_owner = s.get(OwnershipRow, (owner, kind, upload.object_id)) is None
        if new_for_owner:
            s.add(OwnershipRow(owner=owner, kind=kind, object_id=upload.object_id,
                               created_at=utcnow()))
    # A failed submission elsewhere may have rolled the bytes back between our put and our
    # grant; now that we own it, it must stay, so put it back.
    key = object_key(kind, upload.object_id)
    if not ctx.store.has(key):
        ctx.store.put_file(key, upload.path)
    return new_for_owner


def grant_existing(session: Any, owner: str, kind: str, object_id: str, size: int,
                   info: dict[str, Any]) -> None:
    if session.get(ObjectRow, (kind, object_id)) is None:
        session.add(ObjectRow(kind=kind, id=object_id, size=size, info_json=json.dumps(info),
                              created_at=utcnow()))
    if session.get(OwnershipRow, (owner, kind, object_id)) is None:
        session.add(OwnershipRow(owner=owner, kind=kind, object_id=object_id,
                                 created_at=utcnow()))


def owned(ctx: Context, owner: str, kind: str, object_id: str) -> ObjectRow | None:
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


def rollback(ctx: Context, created: list[tuple[str, str]]) -> None:
    """Remove objects this request put in the store, unless someone owns them by now."""
    for kind, object_id in created:
        try:
            with ctx.db.write() as s:
                owners = s.scalar(
                    select(func.count()).select_from(OwnershipRow).where(
                        OwnershipRow.kind == kind, OwnershipRow.object_id == object_id)
                )
                if owners:
                    continue
                s.execute(delete(ObjectRow).where(ObjectRow.kind == kind,
                                                  ObjectRow.id == object_id))
                ctx.store.delete(object_key(kind, object_id))
        except Exception:  # cleanup must not hide the error being reported
            log.exception("could not roll back %s %s", kind, object_id)
