"""The async SDK: AsyncClient and AsyncJob, the same surface as Client and Job, awaited.

import asyncio
from stitchsim import AsyncClient

async def main():
    async with AsyncClient("http://127.0.0.1:8000") as client:
        jobs = [await client.compare("reference.safetensors", c, threshold=0.9)
                for c in ("a.safetensors", "b.safetensors")]
        reports = await asyncio.gather(*(job.wait(timeout=1800) for job in jobs))

Both run the request plans of stitchsim.sdk.core and stitchsim.sdk.job, so retries, long-polls,
uploads and errors behave alike. Hashing and packing local files run in the event loop's
thread, as the plans do them between requests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import httpx

from stitchsim.calibration import DEFAULT_FALSE_ALARM_RATE, GateFile
from stitchsim.models import (
    DatasetInfo,
    JobList,
    JobStatus,
    Report,
    Spec,
    StitchPoints,
    StoredObject,
    Usage,
)
from stitchsim.packing import PackOptions
from stitchsim.sdk.calibrate import acalibrate_gate
from stitchsim.sdk.core import ClientCore, ModelLike, PathLike, client_settings
from stitchsim.sdk.job import LONG_POLL_S, JobCore, ProgressArg, _write
from stitchsim.sdk.plans import Plan, drive_async
from stitchsim.sdk.transport import AsyncTransport

T = TypeVar("T")


class AsyncClient(ClientCore):
    """Client's surface with every request awaited (see Client for the arguments)."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout = 60.0,
        upload_timeout: float = 600.0,
        retries: int | None = None,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        max_retry_after: float = 300.0,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        settings = client_settings(base_url, api_key, retries)
        self._init_core(settings, upload_timeout)
        self.http = AsyncTransport(
            settings.url, api_key=settings.api_key, retries=settings.retries, timeout=timeout,
            backoff=backoff, max_backoff=max_backoff, max_retry_after=max_retry_after,
            headers=headers, transport=transport,
        )

    @property
    def _timeout(self) -> httpx.Timeout:
        return self.http.timeout

    async def _drive(self, plan: Plan[T]) -> T:
        return await drive_async(plan, self.http.request, lambda s: self.http.sleep(s))

    async def close(self) -> None:
        await self.http.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def health(self) -> bool:
        return await self._drive(self._plan_health())

    async def ready(self) -> dict[str, Any]:
        return await self._drive(self._plan_ready())

    async def upload_checkpoint(self, path: PathLike) -> StoredObject:
        return await self._drive(self._plan_upload_checkpoint(path))

    async def points(self, checkpoint: PathLike | str, *, arch: str | None = None,
                     arch_kwargs: Mapping[str, Any] | None = None,
                     input_size: int | None = None) -> StitchPoints:
        """Where a checkpoint can be stitched (GET /checkpoints/{id}/points)."""
        return await self._drive(self._plan_points(checkpoint, arch, arch_kwargs, input_size))

    async def upload_dataset(
        self, path: PathLike, options: PackOptions | Mapping[str, Any] | None = None
    ) -> DatasetInfo:
        return await self._drive(self._plan_upload_dataset(path, options))

    async def checkpoint(self, checkpoint_id: str) -> StoredObject:
        return await self._drive(self._plan_get(StoredObject, f"/checkpoints/{checkpoint_id}"))

    async def delete_checkpoint(self, checkpoint_id: str) -> None:
        await self._drive(self._plan_delete("checkpoints", checkpoint_id))

    async def delete_dataset(self, dataset_id: str) -> None:
        await self._drive(self._plan_delete("datasets", dataset_id))

    async def usage(self) -> Usage:
        return await self._drive(self._plan_usage())

    async def datasets(self) -> list[DatasetInfo]:
        return await self._drive(self._plan_datasets())

    async def find_checkpoint(self, path: PathLike) -> StoredObject | None:
        return await self._drive(self._plan_find(StoredObject, "checkpoints",
                                                 self._sha256(path)))

    async def compare(
        self,
        front: ModelLike,
        back: ModelLike,
        *,
        spec: Spec | Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        dataset_options: PackOptions | Mapping[str, Any] | None = None,
        **fields: Any,
    ) -> AsyncJob:
        return AsyncJob(self, await self._drive(self._plan_compare(
            front, back, spec, idempotency_key, dataset_options, fields)))

    async def calibrate(
        self,
        reference: ModelLike,
        benign: Sequence[ModelLike],
        *,
        spec: Spec | Mapping[str, Any] | None = None,
        false_alarm_rate: float = DEFAULT_FALSE_ALARM_RATE,
        gate: Sequence[str] | None = None,
        **fields: Any,
    ) -> GateFile:
        """Client.calibrate, awaited (the checks after the first waited for together)."""
        return await acalibrate_gate(self, reference, benign, spec=spec,
                                     false_alarm_rate=false_alarm_rate, gate=gate, **fields)

    async def submit(self, spec: Spec | Mapping[str, Any], *,
                     idempotency_key: str | None = None) -> AsyncJob:
        return AsyncJob(self, await self._drive(self._plan_submit(spec, idempotency_key)))

    def job(self, job_id: str) -> AsyncJob:
        return AsyncJob(self, job_id)

    async def jobs(self, *, limit: int = 20, cursor: str | None = None) -> JobList:
        return await self._drive(self._plan_jobs(limit, cursor))

    async def iter_jobs(self, *, page_size: int = 50) -> AsyncIterator[JobStatus]:
        cursor: str | None = None
        while True:
            page = await self.jobs(limit=page_size, cursor=cursor)
            for item in page.items:
                yield item
            if not page.next_cursor or not page.items:
                return
            cursor = page.next_cursor


class AsyncJob(JobCore):
    """Job's surface, awaited."""

    client: AsyncClient

    async def status(self) -> JobStatus:
        return await self.client._drive(self._plan_status())

    async def cancel(self) -> JobStatus:
        return await self.client._drive(self._plan_cancel())

    async def wait(
        self,
        timeout: float | None = None,
        *,
        progress: ProgressArg = False,
        poll_interval: float = 0.5,
        max_poll_interval: float = 5.0,
        outage_tolerance: float = 300.0,
        long_poll: float = LONG_POLL_S,
    ) -> Report:
        """As Job.wait: long-polls, outage tolerance, progress; other tasks run meanwhile."""
        return await self.client._drive(self._plan_wait(
            timeout, progress, poll_interval, max_poll_interval, outage_tolerance, long_poll))

    async def report(self) -> Report:
        return await self.client._drive(self._plan_report())

    async def report_json(self) -> str:
        return await self.client._drive(self._plan_report_json())

    async def report_html(self) -> str:
        return await self.client._drive(self._plan_report_html())

    async def save_report(self, path: PathLike, format: Literal["json", "html"] = "json"
                          ) -> Path:
        text = await (self.report_json() if format == "json" else self.report_html())
        return _write(path, text)
