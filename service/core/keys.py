"""API keys: random tokens shown once, stored only as SHA-256 hashes.

Keys are 256-bit random, so a fast hash is enough (no password stretching needed): the hash
at rest reveals nothing usable, and lookups stay O(1).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from dataclasses import dataclass

from sqlalchemy import select
from stitchsim.keyredact import KEY_PREFIX, redact_keys
from stitchsim_service.core.db import ApiKeyRow, Database, utcnow

LOCAL_OWNER = "local"
"""Owner of everything when keys are not required and none is given (a one-user machine)."""


class RedactKeys(logging.Filter):
    """Access logs print each request's path and query: a key someone put in a URL (where the
    service never reads it) must not land in them in clear."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact_keys(a) if isinstance(a, str) else a for a in record.args)
        if isinstance(record.msg, str):
            record.msg = redact_keys(record.msg)
        return True


REDACT_KEYS = RedactKeys()


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class NewKey:
    id: str
    name: str
    key: str


def create_key(db: Database, name: str) -> NewKey:
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    key_id = "k_" + secrets.token_hex(8)
    with db.write() as s:
        s.add(ApiKeyRow(id=key_id, name=name, key_hash=hash_key(key), created_at=utcnow()))
    return NewKey(id=key_id, name=name, key=key)


def list_keys(db: Database) -> list[ApiKeyRow]:
    with db.read() as s:
        return list(s.scalars(select(ApiKeyRow).order_by(ApiKeyRow.created_at)))


def revoke_key(db: Database, key_id: str) -> bool:
    with db.write() as s:
        row = s.get(ApiKeyRow, key_id)
        if row is None or row.revoked_at is not None:
            return False
        row.revoked_at = utcnow()
        return True


def owner_for_key(db: Database, key: str) -> str | None:
    """The key's id, or None when it is unknown or revoked."""
    digest = hash_key(key)
    # A unique-column lookup, not an ORM query: every key in use is read again every few
    # seconds (gateway.deps._KeyCache), and the ORM's session cost 2x the read itself.
    row = db.lookup(ApiKeyRow.__table__, digest, by="key_hash")  # type: ignore[arg-type]
    if row is None or row.revoked_at is not None:
        return None
    # Constant-time compare of what we looked up, so timing says nothing about near misses.
    if not secrets.compare_digest(row.key_hash, digest):
        return None
    return row.id
