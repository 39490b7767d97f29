"""POST /similarity: read the body (JSON, or multipart with the two checkpoint files), then
hand it to the core's submit workflow (stitchsim_service.core.submit)."""

from __future__ import annotations

from typing import Any

from anyio import to_thread
from fastapi import APIRouter, Depends, Header, Request, Response
from stitchsim.failure import Failure
from stitchsim.jsondepth import JSON_OBJECT_TEXT, JSONInputError, is_json_object_text, parse_json
from stitchsim.models import ErrorBody, JobCreated
from stitchsim_service.core.context import Context
from stitchsim_service.core.metrics import JOBS_REJECTED
from stitchsim_service.core.submit import submit_job
from stitchsim_service.gateway.deps import get_ctx, get_owner
from stitchsim_service.gateway.edge import upload_slot
from stitchsim_service.gateway.errors import status_of
from stitchsim_service.gateway.uploads import UploadedFile, UploadReceiver, validate_safetensors

router = APIRouter(tags=["similarity"])

_SPEC_SCHEMA = {"$ref": "#/components/schemas/Spec"}
SUBMIT_OPENAPI: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": _SPEC_SCHEMA},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "front": {"type": "string", "format": "binary",
                                  "description": "front model, .safetensors"},
                        "back": {"type": "string", "format": "binary",
                                 "description": "back model, .safetensors"},
                        "spec": {"type": "string", **JSON_OBJECT_TEXT,
                                 "description": "the spec as a JSON object; its front/back "
                                                "checkpoint fields are filled from the files"},
                    },
                    # Any other field is refused (UploadReceiver's text and file fields).
                    "additionalProperties": False,
                }
            },
        },
    }
}


def _parse_json(text: str, what: str) -> Any:
    # Refused up front: past ~100 levels the parser, pydantic's serializer and json.dumps each
    # give up with an exception of their own (a 500); Infinity and NaN are no JSON a job can
    # store or answer with.
    try:
        return parse_json(text, what)
    except JSONInputError as exc:
        raise Failure("bad_request", str(exc)) from None


async def _read_json_body(request: Request, limit: int) -> Any:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Failure("too_large", f"the JSON body is larger than {limit} bytes",
                          {"limit_bytes": limit})
        chunks.append(chunk)
    if size == 0:
        raise Failure("bad_request", "the body is empty; send the spec as JSON")
    return _parse_json(b"".join(chunks).decode("utf-8", "replace"), "the body")


async def _read_body(request: Request, ctx: Context) -> tuple[Any, dict[str, UploadedFile]]:
    """The spec as sent, and the checkpoint files sent with it (validated headers)."""
    ctype = request.headers.get("content-type", "")
    if ctype.startswith("multipart/form-data"):
        receiver = UploadReceiver(request, ctx.settings, file_fields={"front", "back"},
                                  text_fields={"spec"})
        await receiver.receive_multipart()
        try:
            text = receiver.texts.get("spec", "{}")
            raw = _parse_json(text, "the spec field")
            if not is_json_object_text(text):
                raise Failure("bad_request", "the spec field must be a JSON object, from { to }"
                              " with nothing around it")
            for side, up in receiver.files.items():
                await validate_safetensors(up, ctx.settings, f"the {side} checkpoint")
        except BaseException:
            receiver.cleanup()
            raise
        return raw, receiver.files
    if ctype.startswith("application/json"):
        raw = await _read_json_body(request, ctx.settings.max_spec_bytes)
        if isinstance(raw, dict) and set(raw) == {"spec"}:
            raw = raw["spec"]
        return raw, {}
    raise Failure(
        "unsupported_media_type",
        "send the spec as application/json (with checkpoint ids), or multipart/form-data "
        "with files 'front' and 'back' and a 'spec' JSON field",
    )


@router.post(
    "/similarity",
    status_code=202,
    response_model=JobCreated,
    responses={s: {"model": ErrorBody} for s in (400, 401, 404, 408, 409, 413, 415, 422, 429, 503)},
    openapi_extra=SUBMIT_OPENAPI,
    summary="Start a comparison of two checkpoints",
    description="JSON: a Spec whose front/back name uploaded checkpoint ids. Multipart: files "
    "`front` and `back` plus a `spec` JSON field. `Idempotency-Key` makes retries safe.",
)
async def submit(
    request: Request,
    response: Response,
    ctx: Context = Depends(get_ctx),
    owner: str = Depends(get_owner),
    _slot: None = Depends(upload_slot),
    idempotency_key: str | None = Header(default=None, alias="Idempotency-Key", max_length=255),
) -> JobCreated:
    files: dict[str, UploadedFile] = {}
    try:
        raw, files = await _read_body(request, ctx)
        done = await to_thread.run_sync(submit_job, ctx, owner, raw, files, idempotency_key)
    except Failure as exc:
        JOBS_REJECTED.labels(str(status_of(exc))).inc()
        raise
    finally:
        for up in files.values():
            up.discard()
    url = f"/jobs/{done.job_id}"
    response.headers["Location"] = url
    response.headers["Retry-After"] = str(ctx.settings.poll_after_s)
    return JobCreated(job_id=done.job_id, status_url=url)
