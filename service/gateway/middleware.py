"""ASGI middleware of the gateway: request metrics, and quiet handling of clients that leave."""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from stitchsim_service.core.metrics import LATENCY, REQUESTS

log = logging.getLogger("stitchsim.service")

METRICS_ROUTE = "stitchsim.metrics_route"
"""A scope key by which a route names its request otherwise in the metrics (a long-poll is
counted apart from the plain polls of the same route: its time is mostly waiting)."""


class HTTPMiddleware(ABC):
    """Pure ASGI middleware for HTTP requests (no per-request task like BaseHTTPMiddleware);
    lifespan and other scopes pass straight through. Subclasses say what `handle` does."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.handle(scope, receive, send)

    @abstractmethod
    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """One HTTP request, passed on to self.app."""


class MetricsMiddleware(HTTPMiddleware):
    """Counts and times every request."""

    def __init__(self, app: ASGIApp) -> None:
        super().__init__(app)
        # Each label set's counter and histogram, looked up once: labels() takes a lock and
        # builds its key on every call, a cost each status poll paid twice. Bounded by routes
        # × methods × statuses.
        self._series: dict[tuple[str, str, str], tuple[Any, Any]] = {}

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except ClientDisconnect:
            status = 499  # nginx's "client closed request": not an error of ours
            raise
        finally:
            route = scope.get("route")
            # The route template, not the raw path, so job ids do not explode the label space.
            name = scope.get(METRICS_ROUTE) or getattr(route, "path", "unmatched")
            method = scope.get("method", "")
            series = self._series.get((method, name, status))
            if series is None:
                series = self._series[method, name, status] = (
                    REQUESTS.labels(method, name, str(status)), LATENCY.labels(method, name))
            series[0].inc()
            series[1].observe(time.perf_counter() - start)


class DisconnectMiddleware(HTTPMiddleware):
    """A client that goes away mid-request (a killed upload, a dropped network) is routine at a
    public edge: one INFO line with what was received, instead of an ERROR and a traceback per
    disconnect (9 KB each: a thousand aborted uploads made 9 MB of log). Whatever the request
    had spooled is removed by the upload receiver on the way out."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            return message

        try:
            await self.app(scope, counting_receive, send)
        except ClientDisconnect:
            client = scope.get("client") or ("?", 0)
            log.info("client %s disconnected during %s %s after %d body bytes", client[0],
                     scope.get("method", ""), scope.get("path", ""), received)
