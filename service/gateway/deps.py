"""FastAPI dependencies: the process context, the calling key's identity."""

from __future__ import annotations

import threading
import time

from anyio import to_thread
from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from stitchsim.failure import Failure
from stitchsim_service.core.context import Context
from stitchsim_service.core.keys import LOCAL_OWNER, owner_for_key
from stitchsim_service.core.settings import Settings, is_loopback
from stitchsim_service.gateway.watch import JobWatcher

_bearer = HTTPBearer(auto_error=False, description="API key as a bearer token")
_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="API key")


# Dependencies are async on purpose: FastAPI runs every sync dependency in its own threadpool
# hop, which costs more than the work here (status polls are the hottest path).
async def get_ctx(request: Request) -> Context:
    return request.app.state.ctx  # type: ignore[no-any-return]


async def get_watcher(request: Request) -> JobWatcher:
    """The process's watcher of the jobs clients wait on."""
    return request.app.state.watcher  # type: ignore[no-any-return]


async def get_settings(ctx: Context = Depends(get_ctx)) -> Settings:
    return ctx.settings


class _KeyCache:
    """Recent key → owner lookups, so a poller does not cost a table read per request.

    Per gateway process, and the one per-process cache on the request path: with several
    gateway processes each holds its own, so a revoked key stops working in every process
    within TTL_S (bounded staleness, documented in docs/deploy.md); a new key works at once
    (unknown keys are looked up, their answer cached only for TTL_S too)."""

    TTL_S = 5.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, tuple[float, str | None]] = {}

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


_keys = _KeyCache()

_NO_KEY_MESSAGE = (
    "an API key is required: send 'Authorization: Bearer <key>' (an operator creates "
    "keys with `stitchsim-server keys create NAME`)"
)


async def get_owner(
    request: Request,
    bearer: HTTPAuthorizationCredentials | None = Depends(_bearer),
    header_key: str | None = Depends(_header),
) -> str:
    """The owner id everything this request touches is scoped to."""
    # The context straight from the app, not as a sub-dependency: every keyed request solves
    # this one, and each dependency FastAPI solves costs more than the attribute read.
    ctx: Context = request.app.state.ctx
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
