"""POST /similarity: validate everything that can be validated cheaply, then queue the job."""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from anyio import to_thread
from fastapi import APIRouter, Depends, Header, Request, Response
from pydantic import ValidationError
from stitchsim.models import BUILTIN_DATASETS, ErrorBody, JobCreated, LocalPath, Spec
from stitchsim.safetensors_format import MAX_JSON_DEPTH, nested_deeper_than
from stitchsim_service import jobs, objects
from stitchsim_service.context import Context
from stitchsim_service.deps import get_ctx, get_owner
from stitchsim_service.errors import ApiError, validation_details, validation_message
from stitchsim_service.metrics import JOBS_REJECTED, JOBS_SUBMITTED
from stitchsim_service.store import object_key, parse_object_id
from stitchsim_service.uploads import UploadedFile, UploadReceiver, validate_safetensors

log = logging.getLogger("stitchsim.similarity")

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
                        "spec": {"type": "string",
                                 "description": "the spec as JSON; its front/back checkpoint "
                                                "fields are filled from the files"},
                    },
                }
            },
        },
    }
}


def _spec_error(message: str, field: str | None = None, code: str = "invalid_spec") -> ApiError:
    return ApiError(422, code, message, {"field": field} if field else None)


def _parse_json(text: str, what: str) -> Any:
    # Refused up front: past ~100 levels the parser, pydantic's serializer and json.dumps each
    # give up with an exception of their own (a 500).
    too_deep = ApiError(400, "bad_request",
                        f"{what} is nested more than {MAX_JSON_DEPTH} levels deep")
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ApiError(400, "bad_request", f"{what} is not valid JSON: {exc}") from None
    except RecursionError:
        raise too_deep from None
    if nested_deeper_than(value, MAX_JSON_DEPTH):
        raise too_deep
    return value


async def _read_json_body(request: Request, limit: int) -> Any:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, "too_large", f"the JSON body is larger than {limit} bytes",
                           {"limit_bytes": limit})
        chunks.append(chunk)
    if size == 0:
        raise ApiError(400, "bad_request", "the body is empty; send the spec as JSON")
    return _parse_json(b"".join(chunks).decode("utf-8", "replace"), "the body")


def _check_refs(ctx: Context, owner: str, spec: Spec, uploaded: set[str]) -> None:
    """Every id the spec names must exist and belong to this key (404 otherwise)."""
    for side in ("front", "back"):
        ref = getattr(spec, side).checkpoint
        if isinstance(ref, LocalPath):
            raise _spec_error(
                f"{side}.checkpoint: local paths are only accepted by `stitchsim-server run`; "
                "upload the file (POST /checkpoints) and give its id", f"{side}.checkpoint",
                code="local_path_refused")
        try:
            parse_object_id(ref)
        except ValueError as exc:
            raise _spec_error(f"{side}.checkpoint: {exc}", f"{side}.checkpoint") from None
        if ref not in uploaded and objects.owned(ctx, owner, "checkpoints", ref) is None:
            raise ApiError(404, "not_found",
                           f"{side} checkpoint {ref} not found; upload it with POST /checkpoints",
                           {"field": f"{side}.checkpoint", "id": ref})
    ds = spec.dataset
    if isinstance(ds, LocalPath):
        raise _spec_error("dataset: local paths are only accepted by `stitchsim-server run`; "
                          "upload the file with POST /datasets and give its id", "dataset",
                          code="local_path_refused")
    if ds in BUILTIN_DATASETS:
        return
    if ds.startswith("sha256:"):
        try:
            parse_object_id(ds)
        except ValueError as exc:
            raise _spec_error(f"dataset: {exc}", "dataset") from None
        if objects.owned(ctx, owner, "datasets", ds) is None:
            raise ApiError(404, "not_found",
                           f"dataset {ds} not found; upload it with POST /datasets",
                           {"field": "dataset", "id": ds})
        return
    raise _spec_error(
        f"dataset: unknown dataset {ds!r}; use a built-in ({', '.join(BUILTIN_DATASETS)}) or "
        "the id of a dataset you uploaded", "dataset", code="unknown_dataset")


def _accepted(ctx: Context, response: Response, job_id: str) -> JobCreated:
    url = f"/jobs/{job_id}"
    response.headers["Location"] = url
    response.headers["Retry-After"] = str(ctx.settings.poll_after_s)
    return JobCreated(job_id=job_id, status_url=url)


@router.post(
    "/similarity",
    status_code=202,
    response_model=JobCreated,
    responses={s: {"model": ErrorBody} for s in (400, 401, 404, 409, 413, 415, 422, 429, 503)},
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
    idempotency_key: str | None = Header(default=None, alias="Idempotency-Key", max_length=255),
) -> JobCreated:
    try:
        return await _submit(request, response, ctx, owner, idempotency_key)
    except ApiError as exc:
        JOBS_REJECTED.labels(str(exc.status)).inc()
        raise


async def _submit(request: Request, response: Response, ctx: Context, owner: str,
                  idempotency_key: str | None) -> JobCreated:
    settings = ctx.settings
    ctype = request.headers.get("content-type", "")
    uploads: dict[str, UploadedFile] = {}
    created_objects: list[tuple[str, str]] = []
    job_inserted = False
    try:
        if ctype.startswith("multipart/form-data"):
            receiver = UploadReceiver(request, settings, file_fields={"front", "back"},
                                      text_fields={"spec"})
            await receiver.receive_multipart()
            uploads = receiver.files
            raw: Any = _parse_json(receiver.texts.get("spec", "{}"), "the spec field")
        elif ctype.startswith("application/json"):
            raw = await _read_json_body(request, settings.max_spec_bytes)
            if isinstance(raw, dict) and set(raw) == {"spec"}:
                raw = raw["spec"]
        else:
            raise ApiError(
                415, "unsupported_media_type",
                "send the spec as application/json (with checkpoint ids), or multipart/form-data "
                "with files 'front' and 'back' and a 'spec' JSON field",
            )
        if not isinstance(raw, dict):
            raise _spec_error("the spec must be a JSON object")

        for side in ("front", "back"):
            up = uploads.get(side)
            if up is None:
                continue
            await validate_safetensors(up, settings, f"the {side} checkpoint")
            ref = raw.get(side) or {}
            if not isinstance(ref, dict):
                raise _spec_error(f"{side} must be an object", side)
            if "checkpoint" in ref and ref["checkpoint"] != up.object_id:
                raise ApiError(400, "bad_request",
                               f"{side} is given both as a file and as checkpoint "
                               f"{ref['checkpoint']!r}; give one of them", {"field": side})
            raw[side] = {**ref, "checkpoint": up.object_id}
        for side in ("front", "back"):
            if side not in raw:
                raise _spec_error(
                    f"{side} is missing: upload it as multipart file '{side}' or give "
                    f'{{"{side}": {{"checkpoint": "sha256:..."}}}}', side)
        try:
            spec = Spec.model_validate(raw)
        except ValidationError as exc:
            errors = list(exc.errors())
            raise ApiError(422, "invalid_spec", validation_message("invalid spec", errors),
                           validation_details(errors)) from None

        await to_thread.run_sync(_check_refs, ctx, owner, spec,
                                 {u.object_id for u in uploads.values()})
        spec_doc = spec.model_dump(mode="json")
        spec_json = json.dumps(spec_doc, sort_keys=True, separators=(",", ":"))
        request_hash = hashlib.sha256(spec_json.encode()).hexdigest()

        if idempotency_key is not None:
            prior = await to_thread.run_sync(jobs.find_idempotent, ctx, owner, idempotency_key)
            if prior is not None:
                if prior.request_hash != request_hash:
                    raise ApiError(
                        409, "idempotency_conflict",
                        "this Idempotency-Key was used with a different request; use a new "
                        "key for a new request", {"job_id": prior.id})
                return _accepted(ctx, response, prior.id)

        await to_thread.run_sync(jobs.check_job_slot, ctx, owner)

        grants = []
        for up in uploads.values():
            if ("checkpoints", up.object_id) in created_objects:
                continue
            if await to_thread.run_sync(objects.put_object, ctx, "checkpoints", up):
                created_objects.append(("checkpoints", up.object_id))
            assert up.header is not None
            grants.append({"kind": "checkpoints", "object_id": up.object_id, "size": up.size,
                           "info": objects.checkpoint_info(up.header)})

        assert ctx.queue is not None
        outcome = await to_thread.run_sync(ctx.queue.check_spec, spec_doc,
                                           settings.check_timeout_s)
        if outcome.error is not None:
            err = outcome.error
            raise ApiError(422, str(err.get("code") or "invalid_spec"),
                           str(err.get("message") or "the spec cannot work"), err.get("details"))
        if not outcome.checked:
            log.info("job accepted unchecked: %s", outcome.note)

        row, created = await to_thread.run_sync(
            lambda: jobs.insert_job(ctx, owner, spec_json, idempotency_key=idempotency_key,
                                    request_hash=request_hash, grants=grants))
        if not created:
            # Lost a race against the same Idempotency-Key: that request's job is ours.
            if row.request_hash != request_hash:
                raise ApiError(409, "idempotency_conflict",
                               "this Idempotency-Key was used with a different request",
                               {"job_id": row.id})
            return _accepted(ctx, response, row.id)
        job_inserted = True
        try:
            await to_thread.run_sync(ctx.queue.enqueue, row.id)
        except Exception as exc:
            log.error("enqueue of job %s failed: %s", row.id, exc)
            await to_thread.run_sync(jobs.delete_job, ctx, row.id)
            job_inserted = False
            raise ApiError(503, "broker_unavailable",
                           "the job queue is unreachable; nothing was queued, retry later",
                           headers={"Retry-After": "10"}) from None
        # Our grants are committed: make sure a concurrent rollback did not take the bytes.
        for up in uploads.values():
            key = object_key("checkpoints", up.object_id)
            if not await to_thread.run_sync(ctx.store.has, key):
                await to_thread.run_sync(ctx.store.put_file, key, up.path)
        JOBS_SUBMITTED.inc()
        return _accepted(ctx, response, row.id)
    except BaseException:
        if not job_inserted and created_objects:
            await to_thread.run_sync(objects.rollback, ctx, created_objects)
        raise
    finally:
        for up in uploads.values():
            up.discard()
