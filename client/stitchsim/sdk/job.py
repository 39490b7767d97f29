"""A job on the service: its status, waiting for it (polling), its report."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

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
from stitchsim.sdk.progress import ProgressPrinter

if TYPE_CHECKING:
    from stitchsim.sdk.client import Client, PathLike

ProgressArg = bool | Callable[[JobStatus], None]
_TRANSIENT = (ConnectionFailed, ServiceUnavailable, RateLimited)


class Job:
    """A comparison running on the service."""

    def __init__(self, client: Client, job_id: str):
        self.client = client
        self.id = job_id
        self.last_status: JobStatus | None = None
        self._report_text: str | None = None

    def __repr__(self) -> str:
        state = self.last_status.state if self.last_status else "?"
        return f"Job({self.id!r}, state={state!r})"

    def status(self) -> JobStatus:
        self.last_status = JobStatus.model_validate(
            self.client.http.request("GET", f"/jobs/{self.id}").json()
        )
        return self.last_status

    def cancel(self) -> JobStatus:
        """Ask the service to stop the job; cancellation is cooperative, so poll to see it end."""
        self.client.http.request("DELETE", f"/jobs/{self.id}")
        return self.status()

    def wait(
        self,
        timeout: float | None = None,
        *,
        progress: ProgressArg = False,
        poll_interval: float = 0.5,
        max_poll_interval: float = 5.0,
        outage_tolerance: float = 300.0,
    ) -> Report:
        """Poll until the job ends; return its report.

        Raises JobFailed, JobCancelled, or WaitTimeout after `timeout` seconds (None: no
        limit). While it waits, a service that is briefly unreachable (a gateway restart) is
        tolerated for up to `outage_tolerance` seconds, since jobs outlive the gateway.
        `progress=True` draws a bar on a terminal and prints plain lines otherwise (stderr);
        a callable receives every JobStatus instead.
        """
        printer: ProgressPrinter | None = None
        if progress is True:
            printer = ProgressPrinter(job_id=self.id)
            callback: Callable[[JobStatus], None] | None = printer
        else:
            callback = progress or None
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        interval = poll_interval
        outage_since: float | None = None
        try:
            while True:
                try:
                    status = self.status()
                    outage_since = None
                except _TRANSIENT:
                    now = time.monotonic()
                    outage_since = outage_since or now
                    if now - outage_since >= outage_tolerance or (
                        deadline is not None and now >= deadline
                    ):
                        raise
                    self.client.http.sleep(_bounded(max_poll_interval, deadline))
                    continue
                if callback is not None:
                    callback(status)
                if status.state == "succeeded":
                    try:
                        return self.report()
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
                self.client.http.sleep(_bounded(interval, deadline))
                interval = min(max_poll_interval, interval * 1.5)
        finally:
            if printer is not None:
                printer.close()

    def report(self) -> Report:
        """The JSON report; Conflict (409) while the job has not finished."""
        return Report.model_validate_json(self.report_json())

    def report_json(self) -> str:
        """The report exactly as the service sent it."""
        if self._report_text is None:
            self._report_text = self.client.http.request("GET", f"/jobs/{self.id}/report").text
        return self._report_text

    def report_html(self) -> str:
        """The report as a self-contained HTML page."""
        return self.client.http.request(
            "GET", f"/jobs/{self.id}/report.html", headers={"Accept": "text/html"}
        ).text

    def save_report(self, path: PathLike, format: Literal["json", "html"] = "json") -> Path:
        text = self.report_json() if format == "json" else self.report_html()
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        return out


def _bounded(seconds: float, deadline: float | None) -> float:
    if deadline is None:
        return seconds
    return max(0.0, min(seconds, deadline - time.monotonic()))
