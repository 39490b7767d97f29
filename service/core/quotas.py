"""Per-key quotas: jobs queued or running at once (too_many_jobs), their estimated work
(compute_quota_exceeded: the units the spec check counted, summed over the key's queued and
running jobs), bytes stored (quota_exceeded), spec checks waiting (too_many_checks).

Limits come from the settings, overridden per key by `stitchsim-server keys limits`. Every
check runs inside the write transaction that adds the job or the object, after taking a lock
on the owner, so that concurrent requests of one key cannot overshoot a limit together.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session
from stitchsim.failure import Failure
from stitchsim.models import ACTIVE_STATES, Usage
from stitchsim_service.core.db import (
    JobRow,
    KeyLimitsRow,
    ObjectRow,
    OwnershipRow,
    PendingCheckRow,
    advisory_lock,
    utcnow,
)
from stitchsim_service.core.settings import Settings


@dataclass(frozen=True)
class Limits:
    max_active_jobs: int
    max_stored_bytes: int
    max_active_units: int | None
    """None: no compute quota."""


# Each limit, and the setting that gives it to keys without an override of their own.
LIMIT_DEFAULTS = {
    "max_active_jobs": "max_active_jobs_per_key",
    "max_stored_bytes": "max_stored_bytes_per_key",
    "max_active_units": "max_active_units_per_key",
}


def limits_for(session: Session, settings: Settings, owner: str) -> Limits:
    row = session.get(KeyLimitsRow, owner)

    def limit(name: str) -> int | None:
        override = getattr(row, name) if row is not None else None
        return getattr(settings, LIMIT_DEFAULTS[name]) if override is None else override

    return Limits(**{name: limit(name) for name in LIMIT_DEFAULTS})


def lock_owner(session: Session, owner: str) -> None:
    """Serialise this owner's quota-checked writes until the transaction ends."""
    advisory_lock(session, f"owner:{owner}")


def active_jobs(session: Session, owner: str) -> int:
    return int(session.scalar(select(func.count()).select_from(JobRow).where(
        JobRow.owner == owner, JobRow.state.in_(ACTIVE_STATES))) or 0)


def active_units(session: Session, owner: str) -> int:
    """Estimated units of the owner's queued and running jobs (unchecked jobs count 0)."""
    return int(session.scalar(
        select(func.coalesce(func.sum(JobRow.est_units), 0)).where(
            JobRow.owner == owner, JobRow.state.in_(ACTIVE_STATES))) or 0)


def stored_bytes(session: Session, owner: str) -> int:
    return int(session.scalar(
        select(func.coalesce(func.sum(ObjectRow.size), 0))
        .join(OwnershipRow, (OwnershipRow.kind == ObjectRow.kind)
              & (OwnershipRow.object_id == ObjectRow.id))
        .where(OwnershipRow.owner == owner)) or 0)


def usage(session: Session, settings: Settings, owner: str) -> Usage:
    limits = limits_for(session, settings, owner)
    return Usage(active_jobs=active_jobs(session, owner), max_active_jobs=limits.max_active_jobs,
                 stored_bytes=stored_bytes(session, owner),
                 max_stored_bytes=limits.max_stored_bytes,
                 active_units=active_units(session, owner),
                 max_active_units=limits.max_active_units)


def check_job_slot(session: Session, settings: Settings, owner: str) -> None:
    """too_many_jobs when the owner already has as many active jobs as allowed."""
    limit = limits_for(session, settings, owner).max_active_jobs
    active = active_jobs(session, owner)
    _refuse_when_full(
        "too_many_jobs", "active", active, limit, settings.quota_retry_after_s,
        f"you have {active} jobs queued or running and the limit for your key is {limit}; "
        "wait for some to finish (or cancel them with DELETE /jobs/{id}), then retry")


def _refuse_when_full(code: str, name: str, held: int, limit: int, retry_after: int,
                      message: str) -> None:
    """`code` with Retry-After once the owner holds `limit` of something already."""
    if held >= limit:
        raise Failure(code, message, {name: held, "limit": limit}, retry_after=retry_after)


def check_compute(session: Session, settings: Settings, owner: str, adding: int) -> None:
    """compute_quota_exceeded when a job of `adding` estimated units would take the owner's
    queued-plus-running work over its limit. One job alone above the limit still needs the
    whole quota free, so it can run once the key's other jobs are done (the per-job limit,
    job_too_large, is what refuses a job for good)."""
    limit = limits_for(session, settings, owner).max_active_units
    if limit is None or adding <= 0:
        return
    in_use = active_units(session, owner)
    if in_use == 0 or in_use + adding <= limit:
        return
    spu = settings.seconds_per_unit
    raise Failure(
        "compute_quota_exceeded",
        f"your queued and running jobs hold {in_use:,} work units (about {in_use * spu:,.0f} s "
        f"of worker time) and this job would add {adding:,} (about {adding * spu:,.0f} s), "
        f"over your key's compute quota of {limit:,} units; wait for some jobs to finish (or "
        "cancel them with DELETE /jobs/{id}), then retry",
        {"active_units": in_use, "adding_units": adding, "limit_units": limit,
         "seconds_per_unit": spu},
        retry_after=settings.quota_retry_after_s)


PENDING_GRACE_S = 30
"""How long past its task's longest life a pending check's slot stays counted: long enough
for a late answer, short enough that a dead gateway's or worker's slots stop holding the
key's."""


def take_check_slot(session: Session, settings: Settings, owner: str, lifetime_s: float) -> str:
    """One of the owner's slots for spec checks waiting at once (too_many_checks beyond), kept
    in the job table so that the cap holds across gateway processes; returns its token for
    free_check_slot. The checks workers take checks in arrival order: without a cap, one key
    sending many slow specs at once would put them all ahead of another key's. The slot lives
    `lifetime_s` (the longest its task can) plus a grace unless freed: by the gateway when the
    answer came, else by the worker when the task ends, so a key cannot stack checks by
    giving up on them."""
    advisory_lock(session, f"checks:{owner}")
    now, limit = utcnow(), settings.max_pending_checks_per_key
    session.execute(delete(PendingCheckRow).where(PendingCheckRow.expires_at < now))
    pending = int(session.scalar(select(func.count()).select_from(PendingCheckRow).where(
        PendingCheckRow.owner == owner)) or 0)
    _refuse_when_full(
        "too_many_checks", "pending", pending, limit, settings.check_retry_after_s,
        f"your key has {pending} spec checks pending and the limit is {limit}: wait for your "
        "other submissions to be answered, then retry")
    token = uuid.uuid4().hex
    expires = now + timedelta(seconds=lifetime_s + PENDING_GRACE_S)
    session.add(PendingCheckRow(id=token, owner=owner, expires_at=expires))
    return token


def free_check_slot(session: Session, token: str) -> None:
    session.execute(delete(PendingCheckRow).where(PendingCheckRow.id == token))


def check_storage(session: Session, settings: Settings, owner: str, adding: int) -> None:
    """quota_exceeded when storing `adding` more bytes would take the owner over its quota."""
    if adding <= 0:
        return
    limit = limits_for(session, settings, owner).max_stored_bytes
    stored = stored_bytes(session, owner)
    if stored + adding > limit:
        raise Failure(
            "quota_exceeded",
            f"storing this file ({adding} bytes) would take your key to {stored + adding} "
            f"bytes, over its storage quota of {limit} bytes; delete checkpoints or datasets "
            "you no longer need (DELETE /checkpoints/{id}, DELETE /datasets/{id}) or ask the "
            "operator for a larger quota",
            {"stored_bytes": stored, "adding_bytes": adding, "limit_bytes": limit})


def set_limits(session: Session, owner: str, changes: dict[str, int | None]) -> KeyLimitsRow:
    """Change a key's own limits: field name -> value, None going back to the settings'."""
    row = session.get(KeyLimitsRow, owner)
    if row is None:
        row = KeyLimitsRow(owner=owner)
        session.add(row)
    for name, value in changes.items():
        if name not in LIMIT_DEFAULTS:
            raise ValueError(f"no such limit: {name}")
        setattr(row, name, value)
    return row
