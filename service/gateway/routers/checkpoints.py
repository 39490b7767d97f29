"""/checkpoints: safetensors weights, validated on the way in, stored by content."""

from __future__ import annotations

from typing import Any

from anyio import to_thread
from fastapi import APIRouter, Depends, Request, Response
from stitchsim.files.header import Header
from stitchsim.models import ErrorBody, StoredObject
from stitchsim_service.core import objects
from stitchsim_service.core.context import Context
from stitchsim_service.core.errors import NotFoundError
from stitchsim_service.gateway.deps import get_ctx, get_owner
from stitchsim_service.gateway.edge import upload_slot
from stitchsim_service.gateway.uploads import UPLOAD_OPENAPI, UploadedFile, receive_and_store

router = APIRouter(prefix="/checkpoints", tags=["checkpoints"])

_ERRORS = {s: {"model": ErrorBody} for s in (400, 401, 408, 413, 415, 422, 429, 503)}


async def _describe(upload: UploadedFile, header: Header) -> dict[str, Any]:
    return objects.checkpoint_info(header)


@router.post("", status_code=201, response_model=StoredObject,
             responses={200: {"model": StoredObject, "description": "already stored"}, **_ERRORS},
             openapi_extra=UPLOAD_OPENAPI, summary="Upload a safetensors checkpoint")
async def upload_checkpoint(request: Request, response: Response,
                            ctx: Context = Depends(get_ctx),
                            owner: str = Depends(get_owner),
                            _slot: None = Depends(upload_slot)) -> StoredObject:
    row, new = await receive_and_store(request, ctx, owner, "checkpoints", _describe)
    response.status_code = 201 if new else 200
    return objects.stored_object(row)


@router.get("", response_model=list[StoredObject], summary="Your checkpoints")
def list_checkpoints(ctx: Context = Depends(get_ctx),
                     owner: str = Depends(get_owner)) -> list[StoredObject]:
    return [objects.stored_object(r) for r in objects.list_owned(ctx, owner, "checkpoints")]


@router.get("/{checkpoint_id}", response_model=StoredObject,
            responses={404: {"model": ErrorBody}}, summary="One of your checkpoints")
def get_checkpoint(checkpoint_id: str, ctx: Context = Depends(get_ctx),
                   owner: str = Depends(get_owner)) -> StoredObject:
    row = objects.owned(ctx, owner, "checkpoints", checkpoint_id)
    if row is None:
        raise NotFoundError("checkpoint", checkpoint_id)
    return objects.stored_object(row)


@router.delete("/{checkpoint_id}", status_code=204,
               responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}},
               summary="Forget one of your checkpoints (frees its storage quota)")
async def delete_checkpoint(checkpoint_id: str, ctx: Context = Depends(get_ctx),
                            owner: str = Depends(get_owner)) -> Response:
    if not await to_thread.run_sync(objects.release, ctx, owner, "checkpoints", checkpoint_id):
        raise NotFoundError("checkpoint", checkpoint_id)
    return Response(status_code=204)
