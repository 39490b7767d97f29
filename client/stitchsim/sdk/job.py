"""A job on the service: its status, waiting for it (long-polls), its report."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import httpx

from stitchsim.errors import (
    Conflict,
    ConnectionFailed,
    JobCancelled,
    JobFailed,
    RateLimited,
    ServiceUnavailable,
    WaitTimeout,
)
from stitchsim.models import JobStatus, Report
from stitchsim.sdk.plans import Call, Plan, Sleep
from stitchsim.sdk.progress import ProgressPrinter

if TYPE_CHECKING:
    from stitchsim.sdk.client import Client
    from stitchsim.sdk.core import ClientCore, PathLike

ProgressArg = bool | Callable[[JobStatus], None]
_TRANSIENT = (ConnectionFailed, ServiceUnavailable, RateLimited)
LONG_POLL_S = 30.0
"""How long one status request may wait for a change (the service caps it at 60 s)."""


class JobCore:
    """A job's operations as request plans, shared by Job and AsyncJob."""

    client: ClientCore

    def __init__(self, client: Any, job_id: str):
        self.client = client
        self.id = job_id
        self.last_status: JobStatus | None = None
        self._etag: str | None = None  # of last_status, where the service sends ETags
        self._report_text: str | None = None

    def __repr__(self) -> str:
        state = self.last_status.state if self.last_status else "?"
        return f"{type(self).__name__}({self.id!r}, state={state!r})"

    def _repr_html_(self) -> str:
        from stitchsim.frames import status_html

        return status_html(self.id, self.last_status)

    def _plan_status(self) -> Plan[JobStatus]:
        return self._take((yield Call("GET", f"/jobs/{self.id}")))

    def _plan_cancel(self) -> Plan[JobStatus]:
        yield Call("DELETE", f"/jobs/{self.id}")
        return (yield from self._plan_status())

    def _plan_wait(self, timeout: float | None, progress: ProgressArg, poll_interval: float,
                   max_poll_interval: float, outage_tolerance: float, long_poll: float
                   ) -> Plan[Report]:
        printer: ProgressPrinter | None = None
        if progress is True:
            printer = ProgressPrinter(job_id=self.id)
            callback: Callable[[JobStatus], None] | None = printer
        else:
            callback = progress or None
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        pacing = _Pacing(deadline, poll_interval, max_poll_interval, long_poll)
        outage_since: float | None = None
        try:
            while True:
                pause = pacing.pause()
                if pause > 0:
                    yield Sleep(pause)
                pacing.sent()
                try:
                    status = yield from self._plan_next_status(pacing.wait_s())
                    outage_since = None
                except _TRANSIENT:
                    now = time.monotonic()
                    outage_since = outage_since or now
                    if now - outage_since >= outage_tolerance or (
                        deadline is not None and now >= deadline
                    ):
                        raise
                    pacing.back_off()
                    continue
                if self._etag is None:
                    pacing.long_polls = False  # an older service: plain polls
                if callback is not None:
                    callback(status)
                if status.state == "succeeded":
                    try:
                        return (yield from self._plan_report())
                    except Conflict:
                        pass  # the row says done before the report landed in the store
                elif status.state == "failed":
                    raise JobFailed(self.id, status.error, status)
                elif status.state == "cancelled":
                    raise JobCancelled(f"job {self.id} was cancelled", self.id, status)
                if deadline is not None and time.monotonic() >= deadline:
                    p = status.progress
                    raise WaitTimeout(
                        f"job {self.id} still {status.state} after {timeout:g}s "
                        f"(stage {p.stage}, {p.done}/{p.total}); it keeps running on the service",
                        self.id,
                        status,
                    )
        finally:
            if printer is not None:
                printer.close()

    def _plan_next_status(self, wait_s: float) -> Plan[JobStatus]:
        """The status, waiting up to wait_s seconds for it to differ from the last one seen
        (If-None-Match its ETag); the last one again when the service says it is unchanged."""
        known = self.last_status if self._etag else None
        headers = {"If-None-Match": self._etag} if known is not None and self._etag else {}
        params = {"wait": f"{wait_s:.3g}"} if wait_s > 0 else None
        base = self.client._timeout
        # The read may take the whole wait before a byte comes.
        read = None if base.read is None else base.read + wait_s
        limits = httpx.Timeout(connect=base.connect, read=read, write=base.write, pool=base.pool)
        response = yield Call("GET", f"/jobs/{self.id}",
                              {"params": params, "headers": headers, "timeout": limits})
        if response.status_code == 304 and known is not None:
            return known
        return self._take(response)

    def _take(self, response: httpx.Response) -> JobStatus:
        self.last_status = JobStatus.model_validate(response.json())
        self._etag = response.headers.get("ETag")
        return self.last_status

    def _plan_report(self) -> Plan[Report]:
        return Report.model_validate_json((yield from self._plan_report_json()))

    def _plan_report_json(self) -> Plan[str]:
        if self._report_text is None:
            self._report_text = (yield Call("GET", f"/jobs/{self.id}/report")).text
        return self._report_text

    def _plan_report_html(self) -> Plan[str]:
        return (yield Call("GET", f"/jobs/{self.id}/report.html",
                           {"headers": {"Accept": "text/html"}})).text


class Job(JobCore):
    """A comparison running on the service."""

    client: Client

    def status(self) -> JobStatus:
        return self.client._drive(self._plan_status())

    def cancel(self) -> JobStatus:
        """Ask the service to stop the job; cancellation is cooperative, so poll to see it end."""
        return self.client._drive(self._plan_cancel())

    def wait(
        self,
        timeout: float | None = None,
        *,
        progress: ProgressArg = False,
        poll_interval: float = 0.5,
        max_poll_interval: float = 5.0,
        outage_tolerance: float = 300.0,
        long_poll: float = LONG_POLL_S,
    ) -> Report:
        """Wait until the job ends; return its report.

        Each request is a long-poll: the service answers when the job's state or progress
        changes, or after `long_poll` seconds without a change (at most 60), so waiting costs
        about one request per change. `poll_interval` is the least time between two requests
        (changes within it come as one answer). A service without long-polls (no ETag in its
        answers: an older one) is polled instead, every `poll_interval` seconds growing to
        `max_poll_interval`; `long_poll=0` polls any service that way.

        Raises JobFailed, JobCancelled, or WaitTimeout after `timeout` seconds (None: no
        limit). While it waits, a service that is briefly unreachable (a gateway restart) is
        tolerated for up to `outage_tolerance` seconds, since jobs outlive the gateway.
        `progress=True` draws a bar on a terminal and prints plain lines otherwise (stderr);
        a callable receives the JobStatus of every answer instead (unchanged ones included,
        after a long-poll that saw no change).
        """
        return self.client._drive(self._plan_wait(timeout, progress, poll_interval,
                                                  max_poll_interval, outage_tolerance,
                                                  long_poll))

    def report(self) -> Report:
        """The JSON report; Conflict (409) while the job has not finished."""
        return self.client._drive(self._plan_report())

    def report_json(self) -> str:
        """The report exactly as the service sent it."""
        return self.client._drive(self._plan_report_json())

    def report_html(self) -> str:
        """The report as a self-contained HTML page."""
        return self.client._drive(self._plan_report_html())

    def save_report(self, path: PathLike, format: Literal["json", "html"] = "json") -> Path:
        text = self.report_json() if format == "json" else self.report_html()
        return _write(path, text)


def _write(path: PathLike, text: str) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return out


def _bounded(seconds: float, deadline: float | None) -> float:
    if deadline is None:
        return seconds
    return max(0.0, min(seconds, deadline - time.monotonic()))


class _Pacing:
    """When wait() sends its next status request, and how long that one may wait."""

    def __init__(self, deadline: float | None, poll_interval: float, max_poll_interval: float,
                 long_poll: float):
        self.deadline = deadline
        self.poll_interval = poll_interval
        self.max_poll_interval = max_poll_interval
        self.long_poll = long_poll
        self.long_polls = long_poll > 0
        self._interval = poll_interval
        self._last: float | None = None
        self._failed = False

    def back_off(self) -> None:
        """The last request found the service unreachable: the next waits max_poll_interval."""
        self._failed = True

    def pause(self) -> float:
        """Seconds to sleep before the next request: the rest of poll_interval since the last
        one while long-polling (its answer came at a change), the growing interval while
        polling, and max_poll_interval after a failure."""
        pause = 0.0
        if self._failed:
            self._failed = False
            pause = _bounded(self.max_poll_interval, self.deadline)
        elif self._last is not None:
            if self.long_polls:
                rest = self.poll_interval - (time.monotonic() - self._last)
            else:
                rest = self._interval
                self._interval = min(self.max_poll_interval, self._interval * 1.5)
            if rest > 0:
                pause = _bounded(rest, self.deadline)
        return pause

    def sent(self) -> None:
        """The request goes out now (after the pause)."""
        self._last = time.monotonic()

    def wait_s(self) -> float:
        return _bounded(self.long_poll, self.deadline) if self.long_polls else 0.0
