"""POST/GET /datasets: built-in names and uploaded dataset files."""

from __future__ import annotations

from anyio import to_thread
from fastapi import APIRouter, Depends, Request, Response
from stitchsim.models import DatasetInfo, ErrorBody
from stitchsim.safetensors_format import SafetensorsError, check_dataset
from stitchsim_service import objects
from stitchsim_service.context import Context
from stitchsim_service.deps import get_ctx, get_owner
from stitchsim_service.errors import not_found, safetensors_error
from stitchsim_service.metrics import UPLOAD_BYTES
from stitchsim_service.uploads import UPLOAD_OPENAPI, receive_single_file, validate_safetensors

router = APIRouter(prefix="/datasets", tags=["datasets"])

_ERRORS = {s: {"model": ErrorBody} for s in (400, 401, 413, 415, 422, 503)}


@router.post("", status_code=201, response_model=DatasetInfo,
             responses={200: {"model": DatasetInfo, "description": "already stored"}, **_ERRORS},
             openapi_extra=UPLOAD_OPENAPI,
             summary="Upload a dataset (safetensors: train/test images and labels)")
async def upload_dataset(request: Request, response: Response,
                         ctx: Context = Depends(get_ctx),
                         owner: str = Depends(get_owner)) -> DatasetInfo:
    upload = await receive_single_file(request, ctx.settings)
    try:
        header = await validate_safetensors(upload, ctx.settings, "dataset")
        try:
            ds = await to_thread.run_sync(check_dataset, upload.path, header)
        except SafetensorsError as exc:
            raise safetensors_error(exc, "dataset") from None
        info = objects.dataset_info(header, ds)
        created = await to_thread.run_sync(objects.put_object, ctx, "datasets", upload)
        try:
            new = await to_thread.run_sync(objects.register, ctx, owner, "datasets", upload, info)
        except BaseException:
            if created:
                objects.rollback(ctx, [("datasets", upload.object_id)])
            raise
    finally:
        upload.discard()
    UPLOAD_BYTES.labels("datasets").inc(upload.size)
    response.status_code = 201 if new else 200
    return DatasetInfo(id=upload.object_id, builtin=False, size=upload.size,
                       n_train=ds.n_train, n_test=ds.n_test, image_shape=list(ds.image_shape),
                       n_classes=ds.n_classes,
                       description=header.metadata.get("description", ""))


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
        raise not_found("dataset", dataset_id)
    return objects.dataset_listing(row)
