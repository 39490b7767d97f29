"""Limits at the HTTP edge, against slow or piled-up clients (slowloris and friends).

- Header read timeout (STITCHSIM_HEADER_TIMEOUT_S): a connection must deliver a request's
  complete headers within this time after it opens (or after its previous response), however
  it trickles them; else it gets 408 and is closed. A uvicorn protocol does this: no ASGI app
  sees a request before its headers are complete.
- Open connections (STITCHSIM_MAX_CONNECTIONS): beyond it a new connection gets 503 with
  Retry-After at once and is closed, so file descriptors stay bounded.
- Body read timeout (STITCHSIM_BODY_READ_TIMEOUT_S, STITCHSIM_MIN_BODY_RATE_BYTES_S): the next
  piece of a body must arrive within the timeout, and once the timeout has passed, the body
  must have come at the minimum average rate; else 408 (the upload's spool file is removed on
  the way out, the connection closed).
- Status polls (GET /jobs/{id}) are answered by this protocol itself where they can be,
  without an ASGI request cycle (routers.jobs.StatusPolls decides): a read that is one whole
  plain poll before httptools sees it (GuardedProtocol._answer_raw_poll), any other from the
  parsed headers (_answer_poll).
- Concurrent uploads (STITCHSIM_MAX_CONCURRENT_UPLOADS, ..._PER_KEY): requests with a file
  body (multipart or octet-stream) each hold a slot while they are received and stored; with
  none free the answer is 429 with Retry-After before a byte of the body is read.

Counts are per gateway process (one serves a machine; several behind a balancer each keep
their own).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from fastapi import Depends, Request
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from stitchsim.failure import Failure
from stitchsim_service.core.settings import Settings, get_settings
from stitchsim_service.gateway.deps import get_ctx, get_owner, key_from_headers
from stitchsim_service.gateway.middleware import HTTPMiddleware

try:  # uvicorn's fast parser when installed, as uvicorn itself prefers
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _BaseProtocol
except ImportError:  # pragma: no cover (httptools is a dependency of uvicorn[standard])
    from uvicorn.protocols.http.h11_impl import H11Protocol as _BaseProtocol  # type: ignore

log = logging.getLogger("stitchsim.service")

def _raw_error(status: int, code: str, message: str, retry_after: int | None = None) -> bytes:
    """A complete HTTP/1.1 error response with the contract's body, closing the connection."""
    body = json.dumps({"error": {"code": code, "message": message, "details": None}}).encode()
    reason = {408: "Request Timeout", 503: "Service Unavailable"}[status]
    head = [f"HTTP/1.1 {status} {reason}", "content-type: application/json",
            f"content-length: {len(body)}", "connection: close"]
    if retry_after is not None:
        head.append(f"retry-after: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


_STATUS_200 = b"HTTP/1.1 200 OK\r\n"
_POLL_PATH = b"/jobs/"
_POLL_URL_LEN = len(_POLL_PATH) + 32
# Headers that make a GET more than a plain poll: a body, or a proxy's view of the client
# (uvicorn's ProxyHeadersMiddleware reads those, and the access line shows its result).
_NOT_A_PLAIN_POLL = frozenset((b"content-length", b"transfer-encoding", b"expect",
                               b"x-forwarded-for", b"x-forwarded-proto", b"forwarded"))
# One complete plain poll and nothing else, as a keep-alive poller sends it: the request line,
# header lines of token names and visible values (no folding, no control bytes), the blank
# line. Anything else, or a header in _RAW_REFUSED, goes to httptools as before.
_RAW_POLL = re.compile(
    rb"GET (/jobs/[0-9a-f]{32}) HTTP/1\.1\r\n"
    rb"((?:[!#$%&'*+.^_`|~0-9A-Za-z-]+:[\t\x20-\x7e\x80-\xff]*\r\n)*)\r\n")
_RAW_REFUSED = _NOT_A_PLAIN_POLL | {b"connection", b"upgrade"}


def _status_polls(app: Any) -> Any:
    """The StatusPolls of the gateway app under uvicorn's wrappers (proxy headers, message
    logger), or None: the protocol then only guards, never answers."""
    for _ in range(8):
        polls = getattr(app, "status_polls", None)
        if polls is not None:
            return polls
        app = getattr(app, "app", None)
    return None


class GuardedProtocol(_BaseProtocol):  # type: ignore[misc, valid-type]
    """uvicorn's HTTP protocol with a header deadline, a cap on open connections, and status
    polls answered as soon as their headers are parsed."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._settings: Settings = get_settings()
        self._header_timer: asyncio.TimerHandle | None = None
        self._header_deadline: float | None = None
        self._waiting_cycle: Any = None
        self._polls = _status_polls(self.app)
        limit = self._settings.max_connections
        if len(self.connections) > limit:
            log.warning("connection refused: %d open connections (STITCHSIM_MAX_CONNECTIONS)",
                        limit)
            transport.write(_raw_error(503, "too_many_connections",
                                       f"the service has {limit} connections open, as many as "
                                       "it allows; retry shortly", retry_after=5))
            transport.close()
            return
        self._arm_header_timer()

    # One timer per connection, moved by deadlines rather than re-armed: a keep-alive poller
    # sends a request every second or so, and a timer cancelled and made anew for each cost
    # it more than the deadlines' attribute writes. It keeps two: the header deadline, and
    # after a poll answered here, uvicorn's keep-alive timeout (an idle connection closes
    # quietly), which uvicorn would otherwise arm as a timer of its own per response.

    _idle_deadline: float | None = None
    _timer_at = 0.0

    def _arm_header_timer(self, idle_close: bool = False) -> None:
        now = self.loop.time()
        self._waiting_cycle = self.cycle  # headers are complete once a new cycle exists
        self._header_deadline = now + self._settings.header_timeout_s
        self._idle_deadline = now + self.timeout_keep_alive if idle_close else None
        due = min(self._header_deadline, self._idle_deadline or self._header_deadline)
        if self._header_timer is not None and self._timer_at > due:
            self._header_timer.cancel()  # deadlines move later but for the first idle close
            self._header_timer = None
        if self._header_timer is None:
            self._timer_at = due
            self._header_timer = self.loop.call_at(due, self._header_check)

    def _header_check(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        now = self.loop.time()
        idle, deadline = self._idle_deadline, self._header_deadline
        if idle is not None and now >= idle:
            self.transport.close()  # as uvicorn's timeout_keep_alive_handler
            return
        if deadline is None:
            return
        if now < deadline:  # a deadline moved since this timer was set
            self._timer_at = min(deadline, idle or deadline)
            self._header_timer = self.loop.call_at(self._timer_at, self._header_check)
            return
        client = self.client[0] if self.client else "?"
        log.info("client %s: no complete request headers within %.0f s; closed with 408",
                 client, self._settings.header_timeout_s)
        self.transport.write(_raw_error(408, "request_timeout",
                                        "the request headers took too long to arrive "
                                        "(STITCHSIM_HEADER_TIMEOUT_S)"))
        self.transport.close()

    _in_message = False  # the parser has begun a request it has not finished

    _declined = False  # StatusPolls had no answer for the poll in this read: the route's

    def data_received(self, data: bytes) -> None:
        self._idle_deadline = None  # any byte ends an idle spell, as it ends uvicorn's
        self._declined = False
        if (not self._in_message and data.startswith(b"GET /jobs/")
                and data.endswith(b"\r\n\r\n") and self._answer_raw_poll(data)):
            return
        super().data_received(data)
        if self._header_deadline is not None and self.cycle is not self._waiting_cycle:
            self._header_deadline = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_header_timer()  # the next request on this connection gets its own

    # ---------------------------------------------------------------- status polls

    def on_headers_complete(self) -> None:
        if self._answer_poll():
            return
        super().on_headers_complete()

    def on_message_begin(self) -> None:
        # A poll answered just before, in the same read (pipelined), set an idle deadline
        # that a new read would have cleared: this request must not run under it.
        self._in_message, self._idle_deadline = True, None
        super().on_message_begin()

    def on_message_complete(self) -> None:
        self._in_message = False
        if self.cycle is None:  # the connection's first request was a poll answered here
            return
        super().on_message_complete()

    def _may_answer_polls(self) -> bool:
        """Whether a poll may be answered here now: no request in flight (pipelining keeps its
        order), a client reading its answers, and a job table readable without waiting."""
        polls = self._polls
        if (polls is None or (self.cycle is not None and not self.cycle.response_complete)
                or self.flow.write_paused or self.limit_concurrency is not None):
            return False
        ctx = polls.ctx
        return ctx is not None and bool(ctx.db.nonblocking_lookups)

    def _answer_raw_poll(self, data: bytes) -> bool:
        """A read that is one whole plain poll, answered before httptools sees it (a keep-alive
        poller's every request): no parser callbacks, no header list but the one made here.
        False, with nothing consumed, for anything else: httptools parses it as always."""
        m = _RAW_POLL.fullmatch(data)
        if m is None or not self._may_answer_polls():
            return False
        headers = []
        for line in m[2].split(b"\r\n")[:-1]:
            name, _, value = line.partition(b":")
            name = name.lower()
            if name in _RAW_REFUSED:
                return False
            headers.append((name, value.strip(b" \t")))
        self._unset_keepalive_if_required()
        if self._reply_poll(m[1], headers):
            return True
        # A key not cached, another owner's job …: httptools parses it for the route, and
        # _answer_poll does not ask StatusPolls a second time.
        self._declined = True
        return False

    def _answer_poll(self) -> bool:
        """Answer a plain status poll here, as the app would, and True; else False, untouched:
        uvicorn starts its request cycle and the app answers (its own fast path, or the
        route). The poll costs no scope, no task, no ASGI messages; the rules (key, owner,
        the body) stay StatusPolls'. Only HTTP/1.1 keep-alive GETs of /jobs/{32 chars} with
        no body, no query and no proxy headers, on a connection with no request in flight
        (pipelining keeps its order) and a client reading its answers."""
        url = self.url
        if (self._declined or len(url) != _POLL_URL_LEN or not url.startswith(_POLL_PATH)
                or self.parser.get_method() != b"GET" or not self._may_answer_polls()
                or self.parser.get_http_version() != "1.1"
                or not self.parser.should_keep_alive() or self.parser.should_upgrade()):
            return False
        for name, _ in self.headers:
            if name in _NOT_A_PLAIN_POLL:
                return False
        return self._reply_poll(url, self.headers)

    def _reply_poll(self, url: bytes, headers: list[tuple[bytes, bytes]]) -> bool:
        """Write StatusPolls' answer to the poll of url, and True; False, nothing written, where
        it has none (the app decides)."""
        polls = self._polls
        start = time.perf_counter()
        key = key_from_headers(headers)
        # No client address: the keyless local case (and its loopback rule) is the app's.
        body = polls.answer_now(polls.ctx, url[len(_POLL_PATH):].decode("ascii", "replace"),
                                key, None)
        if body is None:
            return False
        if self.access_log and self._settings.access_log_polls:
            client = f"{self.client[0]}:{self.client[1]}" if self.client else ""
            self.access_logger.info('%s - "%s %s HTTP/%s" %d', client, "GET", url.decode(),
                                    "1.1", 200)
        self.transport.write(self._response(body))
        polls.count(start)
        # uvicorn's on_response_complete but for its keep-alive timer: nothing is pipelined
        # behind this poll (_may_answer_polls), and the idle close is our timer's.
        self.server_state.total_requests += 1
        self.flow.resume_reading()
        self._arm_header_timer(idle_close=True)
        return True

    _headers_of: list[tuple[bytes, bytes]] | None = None
    _responses: dict[bytes, bytes] = {}  # noqa: RUF012 (the class's own, shared on purpose)

    def _response(self, body: bytes) -> bytes:
        """The whole 200 response for body, with uvicorn's default headers (server, date).
        The server replaces their list once a second (the date); until then a body polled
        again (by every poller of one job) gets the same bytes, made once."""
        current = self.server_state.default_headers
        cls = type(self)
        if cls._headers_of is not current:
            cls._responses = {}
            cls._headers_of = current
        response = cls._responses.get(body)
        if response is None:
            if len(cls._responses) >= 1024:
                cls._responses.clear()
            response = cls._responses[body] = b"".join((
                _STATUS_200, *(b"%s: %s\r\n" % h for h in current),
                b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body),
                body))
        return response

    def connection_lost(self, exc: Exception | None) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)


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

