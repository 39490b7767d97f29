"""Submitting a job, without the HTTP: what POST /similarity does once the body is read.

    assemble   the spec's front/back from uploaded files, validated once
    refs       every id the spec names exists and belongs to the key
    replay     a known Idempotency-Key answers with its job
    quota      a job slot is free (checked early, then again atomically on insert)
    objects    uploaded checkpoints go into the store; grants wait for the insert
    check      a check worker tries the spec (unknown layer, weights that do not fit ...) and
               counts its work (the estimate); a key has a few checks pending at most
    insert     the job row, its estimate and the grants, in one transaction (the compute
               quota is checked there, atomically)
    enqueue    the job goes to the broker; if it cannot, the row goes again
    repair     bytes a concurrent rollback took are put back

On any failure before the job is queued, nothing of the submission stays behind. The spec is
stored as validated, every default filled in: workers and status polls use that JSON as is.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import ValidationError
from stitchsim.datasets import BUILTIN
from stitchsim.failure import Failure
from stitchsim.files.header import Header
from stitchsim.models import Estimate, LocalPath, Spec
from stitchsim.probes import BUILTIN_PROBES
from stitchsim.validation import validation_failure
from stitchsim_service.core import jobs, objects, quotas
from stitchsim_service.core.context import Context
from stitchsim_service.core.errors import NotFoundError
from stitchsim_service.core.metrics import JOBS_SUBMITTED
from stitchsim_service.core.objects import StagedFile
from stitchsim_service.core.queue import check_slot_lifetime_s
from stitchsim_service.core.store import object_key, parse_object_id

log = logging.getLogger("stitchsim.submit")

SIDES = ("front", "back")


class StagedCheckpoint(StagedFile, Protocol):
    """An uploaded checkpoint whose header the gateway validated."""

    @property
    def header(self) -> Header | None: ...


@dataclass(frozen=True)
class Submitted:
    job_id: str
    created: bool
    """False when an earlier request with the same Idempotency-Key made the job."""


def submit_job(ctx: Context, owner: str, raw: Any, files: Mapping[str, StagedCheckpoint],
               idempotency_key: str | None = None) -> Submitted:
    """Validate, check and queue a job for owner. `raw` is the spec as the client sent it;
    `files` the checkpoints uploaded with it, by side ("front", "back"). The caller keeps
    (and removes) the files."""
    spec = assemble_spec(raw, files)
    check_refs(ctx, owner, spec, {f.object_id for f in files.values()})
    spec_doc = spec.model_dump(mode="json")
    spec_json = json.dumps(spec_doc, sort_keys=True, separators=(",", ":"), allow_nan=False)
    request_hash = hashlib.sha256(spec_json.encode()).hexdigest()

    if idempotency_key is not None:
        prior = jobs.find_idempotent(ctx, owner, idempotency_key)
        if prior is not None:
            return _replay(prior.id, prior.request_hash, request_hash)
    jobs.check_job_slot(ctx, owner)

    created_objects: list[tuple[str, str]] = []
    queued = False
    try:
        grants = []
        for up in {f.object_id: f for f in files.values()}.values():
            if objects.put_object(ctx, "checkpoints", up):
                created_objects.append(("checkpoints", up.object_id))
            assert up.header is not None
            grants.append({"kind": "checkpoints", "object_id": up.object_id, "size": up.size,
                           "info": objects.checkpoint_info(up.header)})
        estimate = check_spec(ctx, owner, spec_doc)
        row, created = jobs.insert_job(ctx, owner, spec_json, idempotency_key=idempotency_key,
                                       request_hash=request_hash, grants=grants,
                                       estimate=estimate)
        if not created:
            # Lost a race against the same Idempotency-Key: that request's job is ours.
            return _replay(row.id, row.request_hash, request_hash)
        _enqueue(ctx, row.id)
        queued = True
        # Our grants are committed: make sure a concurrent rollback did not take the bytes.
        for up in files.values():
            key = object_key("checkpoints", up.object_id)
            if not ctx.store.has(key):
                ctx.store.put_file(key, up.path)
        JOBS_SUBMITTED.inc()
        return Submitted(row.id, True)
    except BaseException:
        if not queued and created_objects:
            objects.rollback(ctx, created_objects)
        raise


def _replay(job_id: str, prior_hash: str | None, request_hash: str) -> Submitted:
    if prior_hash != request_hash:
        raise Failure("idempotency_conflict",
                      "this Idempotency-Key was used with a different request; use a new "
                      "key for a new request", {"job_id": job_id})
    return Submitted(job_id, False)


def _enqueue(ctx: Context, job_id: str) -> None:
    assert ctx.queue is not None
    try:
        ctx.queue.enqueue(job_id)
    except Exception as exc:
        log.error("enqueue of job %s failed: %s", job_id, exc)
        jobs.delete_job(ctx, job_id)
        raise Failure("broker_unavailable",
                      "the job queue is unreachable; nothing was queued, retry later",
                      retry_after=10) from None


def _spec_error(message: str, field: str | None = None, code: str = "invalid_spec") -> Failure:
    return Failure(code, message, {"field": field} if field else None)


def assemble_spec(raw: Any, files: Mapping[str, StagedCheckpoint]) -> Spec:
    """The spec with uploaded files as its front/back checkpoints, validated (the one
    validation a spec gets in the service)."""
    if not isinstance(raw, dict):
        raise _spec_error("the spec must be a JSON object")
    raw = dict(raw)
    for side in SIDES:
        up = files.get(side)
        if up is None:
            continue
        ref = raw.get(side) or {}
        if not isinstance(ref, dict):
            raise _spec_error(f"{side} must be an object", side)
        if "checkpoint" in ref and ref["checkpoint"] != up.object_id:
            raise Failure("bad_request",
                          f"{side} is given both as a file and as checkpoint "
                          f"{ref['checkpoint']!r}; give one of them", {"field": side})
        raw[side] = {**ref, "checkpoint": up.object_id}
    for side in SIDES:
        if side not in raw:
            raise _spec_error(
                f"{side} is missing: upload it as multipart file '{side}' or give "
                f'{{"{side}": {{"checkpoint": "sha256:..."}}}}', side)
    try:
        return Spec.model_validate(raw)
    except ValidationError as exc:
        raise validation_failure("invalid_spec", "invalid spec", exc.errors()) from None


def _local_path_refused(field: str, what: str, endpoint: str) -> Failure:
    return _spec_error(f"{field}: local paths are only accepted by `stitchsim-server run`; "
                       f"upload {what} with {endpoint} and give its id", field,
                       code="local_path_refused")


def check_refs(ctx: Context, owner: str, spec: Spec, uploaded: set[str]) -> None:
    """Every id the spec names must exist and belong to this key (not_found otherwise)."""
    for side in SIDES:
        ref = getattr(spec, side).checkpoint
        field = f"{side}.checkpoint"
        if isinstance(ref, LocalPath):
            raise _local_path_refused(field, "the file", "POST /checkpoints")
        try:
            parse_object_id(ref)
        except ValueError as exc:
            raise _spec_error(f"{field}: {exc}", field) from None
        if ref not in uploaded and objects.owned(ctx, owner, "checkpoints", ref) is None:
            raise NotFoundError(f"{side} checkpoint", ref, {"field": field},
                                hint="; upload it with POST /checkpoints")
    _check_dataset_ref(ctx, owner, spec.dataset, "dataset")
    if spec.front_dataset is not None:
        _check_dataset_ref(ctx, owner, spec.front_dataset, "front_dataset")
    for n, probe in enumerate(spec.probes):
        _check_dataset_ref(ctx, owner, probe, f"probes[{n}]", BUILTIN_PROBES)


def _check_dataset_ref(ctx: Context, owner: str, ds: str | LocalPath, field: str,
                       probes: Mapping[str, object] | None = None) -> None:
    """`probes`: the built-in probe sets, where the field takes them too."""
    if isinstance(ds, LocalPath):
        raise _local_path_refused(field, "the file", "POST /datasets")
    if ds in BUILTIN or ds in (probes or {}):
        return
    if ds.startswith("sha256:"):
        try:
            parse_object_id(ds)
        except ValueError as exc:
            raise _spec_error(f"{field}: {exc}", field) from None
        if objects.owned(ctx, owner, "datasets", ds) is None:
            raise NotFoundError("dataset", ds, {"field": field},
                                hint="; upload it with POST /datasets")
        return
    names = [*BUILTIN, *(probes or {})]
    raise _spec_error(
        f"{field}: unknown dataset {ds!r}; use a built-in ({', '.join(names)}) or "
        "the id of a dataset you uploaded", field, code="unknown_dataset")


@dataclass
class CheckSlot:
    """One of a key's pending-check slots, as its check holds it."""

    token: str
    running: bool = False
    """The task outlived the wait: the worker frees the slot when it ends (or it expires)."""


@contextmanager
def pending_check(ctx: Context, owner: str, timeout: float) -> Iterator[CheckSlot]:
    """A pending-check slot of owner's for a check of `timeout`, freed on the way out unless
    its task may still run (CheckOutcome.running): giving up waiting does not end the work,
    so it must not free the key to send more of it."""
    with ctx.db.write() as session:
        token = quotas.take_check_slot(session, ctx.settings, owner,
                                       check_slot_lifetime_s(timeout))
    slot = CheckSlot(token)
    try:
        yield slot
    finally:
        if not slot.running:
            with ctx.db.write() as session:
                quotas.free_check_slot(session, token)


def check_spec(ctx: Context, owner: str, spec_doc: dict[str, Any]) -> Estimate | None:
    """The submission-time spec check: a check worker tries the spec without running it
    (architecture, kwargs, weights against the checkpoint's header, stitch points, activation
    memory, the job's work units), so a spec that cannot work is refused now, not after the
    job waited in the queue; a spec that can is answered with its estimate. Without an answer
    in time the submission is refused with 503 and Retry-After: one key's slow specs must not
    let another key's broken spec through to a GPU worker unchecked. Only an operator who
    switched checks off (STITCHSIM_CHECK_TIMEOUT_S=0) queues specs unchecked (no estimate)."""
    assert ctx.queue is not None
    settings = ctx.settings
    with pending_check(ctx, owner, settings.check_timeout_s) as slot:
        outcome = ctx.queue.check_spec(spec_doc, settings.check_timeout_s, slot.token)
        slot.running = outcome.running
    if outcome.failure is not None:
        raise outcome.failure  # as the engine raised it; the gateway answers its code
    if outcome.busy:
        log.warning("submission refused: %s", outcome.note)
        raise Failure("spec_check_busy",
                      f"the spec could not be checked now ({outcome.note}); the job was not "
                      "queued: retry after the time Retry-After gives",
                      {"check_timeout_s": settings.check_timeout_s},
                      retry_after=settings.check_retry_after_s)
    if not outcome.checked:
        log.info("job accepted unchecked: %s", outcome.note)
    return outcome.estimate
