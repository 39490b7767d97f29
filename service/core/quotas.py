"""Per-key quotas: jobs queued or running at once (too_many_jobs), bytes stored
(quota_exceeded).

Limits come from the settings, overridden per key by `stitchsim-server keys limits`. Every
check runs inside the write transaction that adds the job or the object, after taking a lock
on the owner, so that concurrent requests of one key cannot overshoot a limit together.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session
from stitchsim.models import ACTIVE_STATES, Usage
from stitchsim_service.core.db import JobRow, KeyLimitsRow, ObjectRow, OwnershipRow, advisory_lock
from stitchsim_service.core.errors import DomainError
from stitchsim_service.core.settings import Settings


@dataclass(frozen=True)
class Limits:
    max_active_jobs: int
    max_stored_bytes: int


def limits_for(session: Session, settings: Settings, owner: str) -> Limits:
    row = session.get(KeyLimitsRow, owner)
    jobs = row.max_active_jobs if row and row.max_active_jobs is not None else None
    stored = row.max_stored_bytes if row and row.max_stored_bytes is not None else None
    return Limits(max_active_jobs=settings.max_active_jobs_per_key if jobs is None else jobs,
                  max_stored_bytes=(settings.max_stored_bytes_per_key if stored is None
                                    else stored))


def lock_owner(session: Session, owner: str) -> None:
    """Serialise this owner's quota-checked writes until the transaction ends."""
    advisory_lock(session, f"owner:{owner}")


def active_jobs(session: Session, owner: str) -> int:
    return int(session.scalar(select(func.count()).select_from(JobRow).where(
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
                 max_stored_bytes=limits.max_stored_bytes)


def check_job_slot(session: Session, settings: Settings, owner: str) -> None:
    """too_many_jobs when the owner already has as many active jobs as allowed."""
    limit = limits_for(session, settings, owner).max_active_jobs
    active = active_jobs(session, owner)
    if active >= limit:
        raise DomainError(
            "too_many_jobs",
            f"you have {active} jobs queued or running and the limit for your key is {limit}; "
            "wait for some to finish (or cancel them with DELETE /jobs/{id}), then retry",
            {"active": active, "limit": limit}, retry_after=settings.quota_retry_after_s)


def check_storage(session: Session, settings: Settings, owner: str, adding: int) -> None:
    """quota_exceeded when storing `adding` more bytes would take the owner over its quota."""
    if adding <= 0:
        return
    limit = limits_for(session, settings, owner).max_stored_bytes
    stored = stored_bytes(session, owner)
    if stored + adding > limit:
        raise DomainError(
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
        if name not in ("max_active_jobs", "max_stored_bytes"):
            raise ValueError(f"no such limit: {name}")
        setattr(row, name, value)
    return row
