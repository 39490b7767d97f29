"""The SDK's client: uploads, spec assembly, submissions, listings.

from stitchsim import Client

with Client("http://127.0.0.1:8000") as client:
    job = client.compare("reference.safetensors", "candidate.safetensors",
                         layers=[{"front": "layer3.1", "back": "layer3.1"}], threshold=0.9)
    report = job.wait(timeout=1800, progress=True)
    print(report.summary.similarity, report.verdict)

Every operation is a request plan of stitchsim.sdk.core, run here with blocking requests;
AsyncClient (stitchsim.sdk.aclient) awaits the same plans.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

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
from stitchsim.sdk.calibrate import calibrate_gate
from stitchsim.sdk.core import (
    ID_RE,
    ClientCore,
    ModelLike,
    PathLike,
    client_settings,
    file_sha256,
    log,
)
from stitchsim.sdk.job import Job
from stitchsim.sdk.plans import Plan, drive
from stitchsim.sdk.transport import Transport

__all__ = ["ID_RE", "Client", "ModelLike", "PathLike", "file_sha256", "log"]

T = TypeVar("T")


class Client(ClientCore):
    """A connection to a stitchsim service.

    `base_url` and `api_key` default to the CLI's settings (STITCHSIM_URL, STITCHSIM_API_KEY,
    config files). Requests go through `http` (a Transport): retried on connection errors, 429
    and 502/503/504 with exponential backoff, waiting at least as long as a `Retry-After`
    header asks; every request is safe to repeat (uploads are content-addressed, submissions
    carry an Idempotency-Key).
    """

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
        transport: httpx.BaseTransport | None = None,
    ):
        settings = client_settings(base_url, api_key, retries)
        self._init_core(settings, upload_timeout)
        self.http = Transport(
            settings.url, api_key=settings.api_key, retries=settings.retries, timeout=timeout,
            backoff=backoff, max_backoff=max_backoff, max_retry_after=max_retry_after,
            headers=headers, transport=transport,
        )

    @property
    def _timeout(self) -> httpx.Timeout:
        return self.http.timeout

    def _drive(self, plan: Plan[T]) -> T:
        # The sleep is looked up per step: tests swap http.sleep to observe waits.
        return drive(plan, self.http.request, lambda s: self.http.sleep(s))

    # ------------------------------------------------------------ lifecycle

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ service

    def health(self) -> bool:
        """True when the gateway process answers (no retries: this is a probe)."""
        return self._drive(self._plan_health())

    def ready(self) -> dict[str, Any]:
        """`/readyz`: broker, store and workers; raises ServiceUnavailable when not ready."""
        return self._drive(self._plan_ready())

    # ------------------------------------------------------------ uploads

    def upload_checkpoint(self, path: PathLike) -> StoredObject:
        """Upload a safetensors checkpoint unless the service already holds the same bytes.

        `path` may also be a model folder as `transformers`' `save_pretrained` or timm's hub
        layout writes it (config.json beside model.safetensors, or beside the shards that
        model.safetensors.index.json lists): it is packed into one file first."""
        return self._drive(self._plan_upload_checkpoint(path))

    def upload_dataset(
        self, path: PathLike, options: PackOptions | Mapping[str, Any] | None = None
    ) -> DatasetInfo:
        """Upload a dataset unless the service already holds the same bytes.

        `path` is the service's own .safetensors file (sent as it is), or any other source
        `stitchsim.packing` reads: an ImageFolder directory, zip or tar, a parquet file, an
        .npz, a WebDataset tar. Those are packed into the service's file first (in a temporary
        directory; the summary goes to the `stitchsim` logger), with `options` (PackOptions
        or its fields: size, test, test_fraction, seed, unlabelled, image_column ...). Packing
        is deterministic, so the same source is stored once however often it is uploaded.
        Raises DatasetSourceError for a source that cannot be packed, MissingExtra without the
        client's data extra, before anything is sent.
        """
        return self._drive(self._plan_upload_dataset(path, options))

    def checkpoint(self, checkpoint_id: str) -> StoredObject:
        """Metadata of a stored checkpoint; NotFound when this key has no such checkpoint."""
        return self._drive(self._plan_get(StoredObject, f"/checkpoints/{checkpoint_id}"))

    def points(self, checkpoint: PathLike | str, *, arch: str | None = None,
               arch_kwargs: Mapping[str, Any] | None = None,
               input_size: int | None = None) -> StitchPoints:
        """Where a checkpoint (a file, uploaded unless the service holds it, or a sha256: id)
        can be stitched: every module output with its shape, the stage outputs and what
        `layers: "auto"` picks (GET /checkpoints/{id}/points)."""
        return self._drive(self._plan_points(checkpoint, arch, arch_kwargs, input_size))

    def delete_checkpoint(self, checkpoint_id: str) -> None:
        """Forget a checkpoint (frees storage quota); Conflict while a job of yours uses it."""
        self._drive(self._plan_delete("checkpoints", checkpoint_id))

    def delete_dataset(self, dataset_id: str) -> None:
        """Forget an uploaded dataset (frees storage quota); Conflict while a job uses it."""
        self._drive(self._plan_delete("datasets", dataset_id))

    def usage(self) -> Usage:
        """This key's jobs in flight and bytes stored, against its quotas."""
        return self._drive(self._plan_usage())

    def datasets(self) -> list[DatasetInfo]:
        """Built-in datasets and the ones this key uploaded."""
        return self._drive(self._plan_datasets())

    def find_checkpoint(self, path: PathLike) -> StoredObject | None:
        """The stored checkpoint with this file's bytes, or None (this key has none such)."""
        return self._drive(self._plan_find(StoredObject, "checkpoints", self._sha256(path)))

    # ------------------------------------------------------------ jobs

    def compare(
        self,
        front: ModelLike,
        back: ModelLike,
        *,
        spec: Spec | Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        dataset_options: PackOptions | Mapping[str, Any] | None = None,
        **fields: Any,
    ) -> Job:
        """Start a comparison of two models and return its Job at once.

        `front` and `back` are paths to safetensors files (uploaded unless already stored), ids
        ("sha256:…"), or dicts/ModelRefs with a `checkpoint` that is either, plus `arch`,
        `arch_kwargs` etc. `spec` gives a base spec; keyword arguments override its fields
        (nested ones such as `train={"epochs": 2}` are merged). `dataset` may also be a path:
        the service's .safetensors file, or a source to pack first (see `upload_dataset`, which
        gets `dataset_options`). The spec is validated here before any upload, so a bad field
        costs no transfer.
        """
        return Job(self, self._drive(self._plan_compare(
            front, back, spec, idempotency_key, dataset_options, fields)))

    def calibrate(
        self,
        reference: ModelLike,
        benign: Sequence[ModelLike],
        *,
        spec: Spec | Mapping[str, Any] | None = None,
        false_alarm_rate: float = DEFAULT_FALSE_ALARM_RATE,
        gate: Sequence[str] | None = None,
        wait: Callable[[Job], Report] | None = None,
        **fields: Any,
    ) -> GateFile:
        """A gate calibrated on benign retrains (stitchsim.calibration): `reference` checked
        against each of `benign` (3 at least, 8 or more advised) under one spec, then per
        figure the benign band and its limit, a one-sided Student t prediction bound for one
        new benign model at the family-wise `false_alarm_rate`. `gate`: the figure kinds or
        protocols tested (default calibration.DEFAULT_GATED; "all"). `wait` waits for each
        job (default `job.wait()`). Write it with `gate.model_dump_json()`; test a report on
        it with `stitchsim.gatefile.evaluate(report, gate)`. Raises CalibrationFailed naming
        every benign model whose check gave no report."""
        return calibrate_gate(self, reference, benign, spec=spec,
                              false_alarm_rate=false_alarm_rate, gate=gate, wait=wait, **fields)

    def submit(self, spec: Spec | Mapping[str, Any], *, idempotency_key: str | None = None) -> Job:
        """Start a job from a complete spec whose checkpoints are already stored."""
        return Job(self, self._drive(self._plan_submit(spec, idempotency_key)))

    def job(self, job_id: str) -> Job:
        return Job(self, job_id)

    def jobs(self, *, limit: int = 20, cursor: str | None = None) -> JobList:
        """One page of this key's jobs, newest first."""
        return self._drive(self._plan_jobs(limit, cursor))

    def iter_jobs(self, *, page_size: int = 50) -> Iterator[JobStatus]:
        cursor: str | None = None
        while True:
            page = self.jobs(limit=page_size, cursor=cursor)
            yield from page.items
            if not page.next_cursor or not page.items:
                return
            cursor = page.next_cursor
