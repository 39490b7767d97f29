"""FastAPI dependencies: the process context, the calling key's identity."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from anyio import to_thread
from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from stitchsim.failure import Failure
from stitchsim_service.core.context import Context
from stitchsim_service.core.db import Database
from stitchsim_service.core.keys import LOCAL_OWNER, owner_for_key
from stitchsim_service.core.settings import Settings, is_loopback

_bearer = HTTPBearer(auto_error=False, description="API key as a bearer token")
_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="API key")


# Dependencies are async on purpose: FastAPI runs every sync dependency in its own threadpool
# hop, which costs more than the work here (status polls are the hottest path).
async def get_ctx(request: Request) -> Context:
    return request.app.state.ctx  # type: ignore[no-any-return]


async def get_settings(ctx: Context = Depends(get_ctx)) -> Settings:
    return ctx.settings


class _KeyCache:
    """Recent key → owner lookups, so a poller does not cost a table read per request.

    Per gateway process, and the one per-process cache on the request path: with several
    gateway processes each holds its own, so a revoked key stops working in every process
    within TTL_S (bounded staleness, documented in docs/deploy.md); a new key works at once
    (unknown keys are looked up, their answer cached only for TTL_S too).

    A key in use is read again in the background once its entry is REFRESH_AT of its TTL old
    (owner_if_fresh()), so the entry of a key polled more often than every
    (1 - REFRESH_AT) * TTL_S never lapses and none of its polls waits for the read; a
    revocation still shows within TTL_S."""

    TTL_S = 5.0
    REFRESH_AT = 0.7

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, tuple[float, str | None]] = {}
        self._refreshing: set[str] = set()
        self._pool: ThreadPoolExecutor | None = None

    def get(self, key: str) -> tuple[bool, str | None]:
        # A dict read is atomic under the GIL: no lock on the hot path.
        hit = self._items.get(key)
        if hit is None or time.monotonic() - hit[0] > self.TTL_S:
            return False, None
        return True, hit[1]

    def put(self, key: str, owner: str | None) -> None:
        with self._lock:
            if len(self._items) > 10_000:
                self._items.clear()
            self._items[key] = (time.monotonic(), owner)

    def owner_if_fresh(self, db: Database, key: str) -> str | None:
        """The cached owner of key, or None: not cached within TTL_S, or cached as no key. An
        entry past REFRESH_AT of its TTL is read again in the background (and no second read
        of it starts while one is under way); the caller goes on with the entry it has."""
        hit = self._items.get(key)
        if hit is None:
            return None
        age = time.monotonic() - hit[0]
        if age > self.TTL_S:
            return None
        if age > self.TTL_S * self.REFRESH_AT and key not in self._refreshing:
            self._reread_in_background(db, key)
        return hit[1]

    def _reread_in_background(self, db: Database, key: str) -> None:
        with self._lock:
            if key in self._refreshing:
                return
            self._refreshing.add(key)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="stitchsim-keys")
        self._pool.submit(self._reread, db, key)

    def _reread(self, db: Database, key: str) -> None:
        try:
            self.put(key, owner_for_key(db, key))
        except Exception:  # the table is busy or down: the entry lapses, the route decides
            pass
        finally:
            self._refreshing.discard(key)


_keys = _KeyCache()

_NO_KEY_MESSAGE = (
    "an API key is required: send 'Authorization: Bearer <key>' (an operator creates "
    "keys with `stitchsim-server keys create NAME`)"
)


def key_from_headers(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The API key from raw ASGI headers, as get_owner's dependencies read it: a Bearer
    token, else X-API-Key (for the status-poll fast path, which runs before FastAPI)."""
    auth = api_key = None
    for name, value in headers:
        if name == b"authorization" and auth is None:
            auth = value.decode("latin-1")
        elif name == b"x-api-key" and api_key is None:
            api_key = value.decode("latin-1")
    if auth:
        scheme, _, token = auth.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    return api_key or None


def cached_owner(ctx: Context, key: str | None, client: str | None) -> str | None:
    """The owner of a request when it is known without a table read (a key seen within
    TTL_S, or no key where none is needed); None when get_owner has to decide (a key not
    seen lately, or a request it refuses). For the status-poll fast path."""
    if key:
        return _keys.owner_if_fresh(ctx.db, key)
    settings = ctx.settings
    if settings.keys_required or not is_loopback(client):
        return None
    return LOCAL_OWNER


async def get_owner(
    request: Request,
    ctx: Context = Depends(get_ctx),
    bearer: HTTPAuthorizationCredentials | None = Depends(_bearer),
    header_key: str | None = Depends(_header),
) -> str:
    """The owner id everything this request touches is scoped to."""
    key = bearer.credentials if bearer else header_key
    client = request.client.host if request.client else None
    # A client from beyond loopback always needs a key, even when the bind address looked
    # local (e.g. a port forwarded by a container runtime).
    required = ctx.settings.keys_required or not is_loopback(client)
    if key:
        cached, owner = _keys.get(key)
        if not cached:
            owner = await to_thread.run_sync(owner_for_key, ctx.db, key)
            _keys.put(key, owner)
        if owner is None:
            raise Failure("unauthorized", "this API key is not valid (unknown or revoked)")
        return owner
    if required:
        raise Failure("unauthorized", _NO_KEY_MESSAGE)
    return LOCAL_OWNER
