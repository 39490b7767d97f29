"""Limits at the HTTP edge that the gateway keeps itself, in ASGI: slow bodies and piled-up
uploads. What happens before a request reaches the app is not ours to parse:

- Header deadlines, idle and slow connections, connection caps and the body size: the reverse
  proxy in front (deploy/nginx.conf, the `proxy` service of docker-compose.yml:
  client_header_timeout, client_body_timeout, keepalive_timeout, limit_conn,
  worker_connections, client_max_body_size), checked by `nginx -t` in tests/deploy.
- Requests in flight per gateway process (STITCHSIM_MAX_CONNECTIONS): uvicorn's own
  --limit-concurrency (worker/cli.py), 503 beyond; idle keep-alive connections close after
  uvicorn's keep-alive timeout.
- Body read timeout (STITCHSIM_BODY_READ_TIMEOUT_S, STITCHSIM_MIN_BODY_RATE_BYTES_S), here: the
  next piece of a body must arrive within the timeout, and once the timeout has passed, the
  body must have come at the minimum average rate; else 408 (the upload's spool file is
  removed on the way out, the connection closed). The proxy streams bodies through
  (proxy_request_buffering off), so this holds behind it too.
- Concurrent uploads (STITCHSIM_MAX_CONCURRENT_UPLOADS, ..._PER_KEY), here: requests with a
  file body (multipart or octet-stream) each hold a slot while they are received and stored;
  with none free the answer is 429 with Retry-After before a byte of the body is read.

Counts are per gateway process (one serves a machine; several behind a balancer each keep
their own).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from fastapi import Depends, Request
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from stitchsim.failure import Failure
from stitchsim_service.core.settings import Settings, get_settings
from stitchsim_service.gateway.deps import get_ctx, get_owner
from stitchsim_service.gateway.middleware import HTTPMiddleware

# ---------------------------------------------------------------- bodies


if sys.version_info >= (3, 11):

    async def _within(awaitable: Awaitable[Message], seconds: float) -> Message:
        """awaitable's result, or TimeoutError after seconds. A body arrives in thousands of
        pieces: asyncio.timeout arms one timer on the running task, where wait_for would wrap
        every receive in a task of its own."""
        async with asyncio.timeout(seconds):
            return await awaitable

else:  # pragma: no cover (Python 3.10)

    async def _within(awaitable: Awaitable[Message], seconds: float) -> Message:
        return await asyncio.wait_for(awaitable, seconds)


def _body_timeout(message: str) -> HTTPException:
    # An HTTP exception, not a domain error: it must pass unchanged through FastAPI's own body
    # parsing (which turns other exceptions into 400) and through the upload receiver (which
    # removes its spool file on any exception).
    return HTTPException(408, detail=message, headers={"Connection": "close"})


class BodyTimeoutMiddleware(HTTPMiddleware):
    """Bounds how slowly a request body may arrive (see the module's docstring)."""

    def __init__(self, app: ASGIApp, settings: Settings | None = None) -> None:
        super().__init__(app)
        self.settings = settings or get_settings()

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        idle_s = self.settings.body_read_timeout_s
        min_rate = self.settings.min_body_rate_bytes_s
        started = time.monotonic()
        state = {"received": 0, "done": False}

        async def timed_receive() -> Message:
            if state["done"]:  # after the body: waiting for a disconnect is not reading
                return await receive()
            try:
                message = await _within(receive(), idle_s)
            except TimeoutError:
                raise _body_timeout(f"no part of the request body arrived for {idle_s:.0f} s "
                                    "(STITCHSIM_BODY_READ_TIMEOUT_S)") from None
            state["received"] += len(message.get("body", b""))
            if not message.get("more_body", False):
                state["done"] = True
            elapsed = time.monotonic() - started
            if not state["done"] and elapsed > idle_s and state["received"] < min_rate * elapsed:
                raise _body_timeout(
                    f"the request body arrives at {state['received'] / elapsed:.0f} bytes/s, "
                    f"below the {min_rate} bytes/s this service needs "
                    "(STITCHSIM_MIN_BODY_RATE_BYTES_S)")
            return message

        await self.app(scope, timed_receive, send)


# ---------------------------------------------------------------- upload slots


class UploadSlots:
    """Concurrent uploads, overall and per key, in this gateway process."""

    def __init__(self) -> None:
        self.total = 0
        self.by_owner: dict[str, int] = {}

    def take(self, owner: str, settings: Settings) -> None:
        if self.total >= settings.max_concurrent_uploads:
            raise Failure("too_many_uploads",
                          f"the service is receiving {self.total} uploads, as many as it "
                          "takes at once (STITCHSIM_MAX_CONCURRENT_UPLOADS); retry shortly",
                          {"limit": settings.max_concurrent_uploads, "scope": "service"},
                          retry_after=settings.upload_retry_after_s)
        mine = self.by_owner.get(owner, 0)
        if mine >= settings.max_concurrent_uploads_per_key:
            raise Failure("too_many_uploads",
                          f"this key already has {mine} uploads in progress, as many as "
                          "allowed (STITCHSIM_MAX_CONCURRENT_UPLOADS_PER_KEY); send the "
                          "next when one has finished",
                          {"limit": settings.max_concurrent_uploads_per_key, "scope": "key"},
                          retry_after=settings.upload_retry_after_s)
        self.total += 1
        self.by_owner[owner] = mine + 1

    def give_back(self, owner: str) -> None:
        self.total -= 1
        left = self.by_owner.get(owner, 1) - 1
        if left:
            self.by_owner[owner] = left
        else:
            self.by_owner.pop(owner, None)


_SLOTS = UploadSlots()
_FILE_BODIES = ("multipart/form-data", "application/octet-stream")


async def upload_slot(request: Request, ctx: Any = Depends(get_ctx),
                      owner: str = Depends(get_owner)) -> AsyncIterator[None]:
    """Dependency of the routes that receive files: holds a slot while the request runs.
    A JSON body (a spec with checkpoint ids) is small and needs none."""
    ctype = request.headers.get("content-type", "")
    if not ctype.startswith(_FILE_BODIES) and ctype:
        yield
        return
    _SLOTS.take(owner, ctx.settings)  # single-threaded event loop: no lock needed
    try:
        yield
    finally:
        _SLOTS.give_back(owner)

