"""/checkpoints: safetensors weights, validated on the way in, stored by content."""

from __future__ import annotations

from typing import Any

from anyio import to_thread
from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import ValidationError
from stitchsim.failure import Failure
from stitchsim.files.header import Header
from stitchsim.jsondepth import JSONInputError, is_json_object_text, parse_json
from stitchsim.models import ErrorBody, ModelRef, StitchPoints, StoredObject
from stitchsim.validation import validation_failure
from stitchsim_service.core import objects
from stitchsim_service.core.context import Context
from stitchsim_service.core.errors import NotFoundError
from stitchsim_service.core.points import stitch_points
from stitchsim_service.gateway.deps import get_ctx, get_owner
from stitchsim_service.gateway.edge import upload_slot
from stitchsim_service.gateway.uploads import UPLOAD_OPENAPI, UploadedFile, receive_and_store

router = APIRouter(prefix="/checkpoints", tags=["checkpoints"])

_ERRORS = {s: {"model": ErrorBody} for s in (400, 401, 408, 413, 415, 422, 429, 503)}
_MODEL_REF = ModelRef.model_json_schema()["properties"]


MAX_ARCH_KWARGS_CHARS = 8192
# A JSON object in the query: OpenAPI's `content` parameter, which generators and validators read
# as "serialize the object as JSON" (FastAPI writes only `schema` parameters, so it is declared
# here and read from the query in the route).
_ARCH_KWARGS_QUERY: dict[str, Any] = {"parameters": [{
    "name": "arch_kwargs", "in": "query", "required": False,
    "description": f"create_model kwargs as a JSON object (at most {MAX_ARCH_KWARGS_CHARS} "
                   "characters); else the checkpoint's",
    "content": {"application/json": {"schema": {"type": "object"}}},
}]}


def _as_in_model_ref(field: str) -> dict[str, Any]:
    """The constraints of the ModelRef field a query parameter sets, for the OpenAPI document
    (the parameter is validated as that field)."""
    schema = _MODEL_REF[field]
    value = next(s for s in schema.get("anyOf", [schema]) if s.get("type") != "null")
    return {k: v for k, v in {**schema, **value}.items()
            if k not in ("anyOf", "type", "default", "title", "description")}


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


@router.get("/{checkpoint_id}/points", response_model=StitchPoints,
            responses={404: {"model": ErrorBody}, **_ERRORS}, openapi_extra=_ARCH_KWARGS_QUERY,
            summary="Where one of your checkpoints can be stitched")
async def checkpoint_points(
    request: Request, checkpoint_id: str, ctx: Context = Depends(get_ctx),
    owner: str = Depends(get_owner),
    arch: str | None = Query(None, description="timm architecture; else the checkpoint's",
                             json_schema_extra=_as_in_model_ref("arch")),
    input_size: int | None = Query(None, description="square input side the shapes are for",
                                   json_schema_extra=_as_in_model_ref("input_size")),
) -> StitchPoints:
    """Every stitchable module output with its shape, the stage outputs and the points
    `layers: "auto"` picks, as a job on this checkpoint would see them (a check worker builds
    the model on the meta device; no weights are read)."""
    ref = _model_ref(checkpoint_id, arch, request.query_params.get("arch_kwargs"), input_size)
    return await to_thread.run_sync(stitch_points, ctx, owner, checkpoint_id, ref)


def _model_ref(checkpoint_id: str, arch: str | None, arch_kwargs: str | None,
               input_size: int | None) -> dict[str, Any]:
    """The query's ModelRef fields, validated as a spec's would be."""
    kwargs = None if arch_kwargs is None else _parse_kwargs(arch_kwargs)
    fields = {"arch": arch, "arch_kwargs": kwargs, "input_size": input_size}
    try:
        ModelRef.model_validate({"checkpoint": checkpoint_id, **fields})
    except ValidationError as exc:
        raise validation_failure("invalid_spec", "invalid query", exc.errors()) from None
    return fields


def _parse_kwargs(text: str) -> dict[str, Any]:
    def refused(why: str) -> Failure:
        return Failure("invalid_spec", f"arch_kwargs: not a JSON object of kwargs ({why})",
                       {"field": "arch_kwargs"})

    if len(text) > MAX_ARCH_KWARGS_CHARS:
        raise refused(f"longer than {MAX_ARCH_KWARGS_CHARS} characters")
    if not is_json_object_text(text):
        raise refused("it must be {...}")
    try:
        return dict(parse_json(text, "the value"))
    except JSONInputError as exc:
        raise refused(str(exc)) from None
