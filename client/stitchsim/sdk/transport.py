"""The SDK's transport: one httpx connection pool and the retry policy.

Requests are retried on connection errors, 429 and 502/503/504, with exponential backoff and
jitter, waiting at least as long as a `Retry-After` header asks (but never longer than
`max_retry_after`: a longer wait is the caller's to decide). Every request of the SDK is safe
to repeat: uploads are content-addressed and submissions carry an Idempotency-Key.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timezone
from typing import Any

import httpx

from stitchsim import __version__, codes
from stitchsim.errors import APIError, ConnectionFailed

log = logging.getLogger("stitchsim")

RETRY_STATUSES = frozenset({429, 502, 503, 504})
USER_AGENT = f"stitchsim-python/{__version__}"

Body = Callable[[contextlib.ExitStack], dict[str, Any]]
"""Builds a request's files anew for every attempt (a retry must send the whole file again)."""


class _Policy:
    """The retry policy and the headers, shared by the sync and the async transport: each
    drives one loop of attempts and asks the policy after every one whether to wait and retry."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        retries: int = 5,
        timeout: float | httpx.Timeout = 60.0,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        max_retry_after: float = 300.0,
        headers: Mapping[str, str] | None = None,
    ):
        self.base_url = base_url
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_retry_after = max_retry_after
        self._timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        self._headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._headers.update(headers or {})

    @property
    def timeout(self) -> httpx.Timeout:
        return self._timeout

    def _after_error(self, exc: httpx.TransportError, method: str, path: str, attempt: int,
                     retries: int) -> float:
        """Seconds to wait before the next attempt; ConnectionFailed when none is left."""
        if attempt >= retries:
            tries = f" after {attempt + 1} attempts" if attempt else ""
            raise ConnectionFailed(
                f"cannot reach the stitchsim service at {self.base_url}{tries}: "
                f"{_describe(exc)}",
                self.base_url,
            ) from exc
        return self._pause(method, path, _describe(exc), self._backoff_delay(attempt),
                           attempt, retries)

    def _after_response(self, response: httpx.Response, method: str, path: str, attempt: int,
                        retries: int) -> float | None:
        """Seconds to wait before retrying, or None: the answer stands (an error raises)."""
        if response.status_code in RETRY_STATUSES and attempt < retries and _may_retry(response):
            delay = self._retry_delay(response, attempt)
            if delay is not None:
                return self._pause(method, path, f"HTTP {response.status_code}", delay,
                                   attempt, retries)
        if response.is_error:
            raise APIError.from_response(response)
        return None

    def _pause(self, method: str, path: str, why: str, delay: float, attempt: int,
               retries: int) -> float:
        log.warning("%s %s: %s; retrying in %.1fs (%d/%d)", method, path, why, delay,
                    attempt + 1, retries)
        return delay

    def _backoff_delay(self, attempt: int) -> float:
        # Jitter spreads out a fleet of CI jobs that all lost the service at the same moment.
        return min(self.max_backoff, self.backoff * 2**attempt) * random.uniform(0.5, 1.0)

    def _retry_delay(self, response: httpx.Response, attempt: int) -> float | None:
        """Seconds to wait before retrying, or None when the service asks for too long a wait."""
        after = parse_retry_after(response.headers.get("Retry-After"))
        if after is None:
            return self._backoff_delay(attempt)
        if after > self.max_retry_after:
            return None
        return after


class Transport(_Policy):
    def __init__(self, base_url: str, *, transport: httpx.BaseTransport | None = None,
                 **policy: Any):
        super().__init__(base_url, **policy)
        # Tests swap this out to observe waits without spending them.
        self.sleep: Callable[[float], None] = time.sleep
        self._http = httpx.Client(base_url=base_url, headers=self._headers,
                                  timeout=self._timeout, transport=transport,
                                  follow_redirects=True)

    def close(self) -> None:
        self._http.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Body | None = None,
        retries: int | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        """One request, retried as the policy says; an error answer raises its APIError."""
        retries = self.retries if retries is None else retries
        attempt = 0
        while True:
            try:
                with contextlib.ExitStack() as stack:
                    extra = body(stack) if body else {}
                    response = self._http.request(method, path, **kwargs, **extra)
            except httpx.TransportError as exc:
                self.sleep(self._after_error(exc, method, path, attempt, retries))
                attempt += 1
                continue
            delay = self._after_response(response, method, path, attempt, retries)
            if delay is None:
                return response
            self.sleep(delay)
            attempt += 1


class AsyncTransport(_Policy):
    """The same policy over httpx.AsyncClient (AsyncClient's transport)."""

    def __init__(self, base_url: str, *, transport: httpx.AsyncBaseTransport | None = None,
                 **policy: Any):
        super().__init__(base_url, **policy)
        self.sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
        self._http = httpx.AsyncClient(base_url=base_url, headers=self._headers,
                                       timeout=self._timeout, transport=transport,
                                       follow_redirects=True)

    async def close(self) -> None:
        await self._http.aclose()

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Body | None = None,
        retries: int | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        retries = self.retries if retries is None else retries
        attempt = 0
        while True:
            try:
                with contextlib.ExitStack() as stack:
                    extra = body(stack) if body else {}
                    response = await self._http.request(method, path, **kwargs, **extra)
            except httpx.TransportError as exc:
                await self.sleep(self._after_error(exc, method, path, attempt, retries))
                attempt += 1
                continue
            delay = self._after_response(response, method, path, attempt, retries)
            if delay is None:
                return response
            await self.sleep(delay)
            attempt += 1


def _may_retry(response: httpx.Response) -> bool:
    """False where the answer's code says the same request fails again (the registry's
    retry flag): an answer about the request's own input is not retried whatever its status."""
    # Any body but our error shape (a proxy's page, an unread stream) leaves it to the status.
    with contextlib.suppress(Exception):
        entry = codes.get(str(response.json()["error"]["code"]))
        if entry is not None:
            return entry.retry
    return True


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date); None if absent/bad."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def _describe(exc: httpx.TransportError) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) < 200 else text[:200] + "…"
