"""/datasets: built-in names and uploaded dataset files."""

from __future__ import annotations

from typing import Any

from anyio import to_thread
from fastapi import APIRouter, Depends, Request, Response
from stitchsim.files.dataset import check_dataset
from stitchsim.files.errors import SafetensorsError
from stitchsim.files.header import Header
from stitchsim.models import DatasetInfo, ErrorBody
from stitchsim_service.core import objects
from stitchsim_service.core.context import Context
from stitchsim_service.core.errors import NotFoundError
from stitchsim_service.gateway.deps import get_ctx, get_owner
from stitchsim_service.gateway.edge import upload_slot
from stitchsim_service.gateway.errors import file_error
from stitchsim_service.gateway.uploads import UPLOAD_OPENAPI, UploadedFile, receive_and_store

router = APIRouter(prefix="/datasets", tags=["datasets"])

_ERRORS = {s: {"model": ErrorBody} for s in (400, 401, 408, 413, 415, 422, 429, 503)}


async def _describe(upload: UploadedFile, header: Header) -> dict[str, Any]:
    try:
        ds = await to_thread.run_sync(check_dataset, upload.path, header)
    except SafetensorsError as exc:
        raise file_error(exc, "dataset") from None
    return objects.dataset_info(header, ds)


@router.post("", status_code=201, response_model=DatasetInfo,
             responses={200: {"model": DatasetInfo, "description": "already stored"}, **_ERRORS},
             openapi_extra=UPLOAD_OPENAPI,
             summary="Upload a dataset (safetensors: train/test images and labels)")
async def upload_dataset(request: Request, response: Response,
                         ctx: Context = Depends(get_ctx),
                         owner: str = Depends(get_owner),
                         _slot: None = Depends(upload_slot)) -> DatasetInfo:
    row, new = await receive_and_store(request, ctx, owner, "datasets", _describe)
    response.status_code = 201 if new else 200
    return objects.dataset_listing(row)


@router.get("", response_model=list[DatasetInfo], summary="Built-in datasets and yours")
def list_datasets(ctx: Context = Depends(get_ctx),
                  owner: str = Depends(get_owner)) -> list[DatasetInfo]:
    mine = [objects.dataset_listing(r) for r in objects.list_owned(ctx, owner, "datasets")]
    return objects.builtin_datasets() + mine


@router.get("/{dataset_id}", response_model=DatasetInfo, responses={404: {"model": ErrorBody}})
def get_dataset(dataset_id: str, ctx: Context = Depends(get_ctx),
                owner: str = Depends(get_owner)) -> DatasetInfo:
    for d in objects.builtin_datasets():
        if d.id == dataset_id:
            return d
    row = objects.owned(ctx, owner, "datasets", dataset_id)
    if row is None:
        raise NotFoundError("dataset", dataset_id)
    return objects.dataset_listing(row)


@router.delete("/{dataset_id}", status_code=204,
               responses={s: {"model": ErrorBody} for s in (404, 409)},
               summary="Forget one of your uploaded datasets (frees its storage quota)")
async def delete_dataset(dataset_id: str, ctx: Context = Depends(get_ctx),
                         owner: str = Depends(get_owner)) -> Response:
    if not await to_thread.run_sync(objects.release, ctx, owner, "datasets", dataset_id):
        raise NotFoundError("dataset", dataset_id)
    return Response(status_code=204)
