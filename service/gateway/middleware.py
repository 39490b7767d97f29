"""Counts and times every HTTP request into the core's Prometheus registry."""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from stitchsim_service.core.metrics import LATENCY, REQUESTS


class MetricsMiddleware:
    """Counts and times every request (pure ASGI: no per-request task like BaseHTTPMiddleware)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            # The route template, not the raw path, so job ids do not explode the label space.
            name = getattr(route, "path", "unmatched")
            method = scope.get("method", "")
            REQUESTS.labels(method, name, str(status)).inc()
            LATENCY.labels(method, name).observe(time.perf_counter() - start)
