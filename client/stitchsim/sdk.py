"""The HTTP SDK: upload checkpoints, start comparisons, follow jobs, fetch reports.

from stitchsim import Client

with Client("http://127.0.0.1:8000") as client:
    job = client.compare("reference.safetensors", "candidate.safetensors",
                         layers=[{"front": "layer3.1", "back": "layer3.1"}], threshold=0.9)
    report = job.wait(timeout=1800, progress=True)
    print(report.summary.similarity, report.verdict)
"""

from __future__ import annotations

import contextlib
import email.utils
import hashlib
import logging
import os
import random
import re
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, Literal, TypeVar

import httpx
from pydantic import ValidationError

from stitchsim.config import deep_merge, load_settings
from stitchsim.errors import (
    APIError,
    Conflict,
    ConnectionFailed,
    InvalidFile,
    InvalidSpec,
    JobCancelled,
    JobFailed,
    NotFound,
    RateLimited,
    ServiceUnavailable,
    StitchsimError,
    UsageError,
    WaitTimeout,
)
from stitchsim.models import (
    BUILTIN_DATASETS,
    DatasetInfo,
    JobCreated,
    JobList,
    JobStatus,
    ModelRef,
    Report,
    Spec,
    StoredObject,
    Usage,
)
from stitchsim.safetensors_format import SafetensorsError, check_dataset, read_header

__all__ = ["Client", "Job", "ProgressPrinter", "file_sha256", "parse_retry_after"]

# The CLI gives this logger a handler; a library user opts in with logging.basicConfig.
log = logging.getLogger("stitchsim")
log.addHandler(logging.NullHandler())

_VERSION = "0.1.0"
ID_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_PLACEHOLDER_ID = "sha256:" + "0" * 64
RETRY_STATUSES = frozenset({429, 502, 503, 504})
_TRANSIENT = (ConnectionFailed, ServiceUnavailable, RateLimited)

PathLike = str | os.PathLike[str]
ModelLike = PathLike | ModelRef | Mapping[str, Any]
ProgressArg = bool | Callable[[JobStatus], None]
_Stored = TypeVar("_Stored", StoredObject, DatasetInfo)


def file_sha256(path: PathLike, chunk_size: int = 1 << 20) -> str:
    """The id the service stores a file under: "sha256:" + hex digest of its bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk_size):
            h.update(block)
    return "sha256:" + h.hexdigest()


class Client:
    """A connection to a stitchsim service.

    `base_url` and `api_key` default to the CLI's settings (STITCHSIM_URL, STITCHSIM_API_KEY,
    config files). Requests are retried on connection errors, 429 and 502/503/504 with
    exponential backoff, waiting at least as long as a `Retry-After` header asks; every
    request is safe to repeat (uploads are content-addressed, submissions carry an
    Idempotency-Key).
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
        if base_url is None:
            # Same sources as the CLI: STITCHSIM_* variables, then the config files.
            settings = load_settings({"api_key": api_key, "retries": retries})
            base_url, api_key, retries = settings.url, settings.api_key, settings.retries
        else:
            # An explicit URL means explicit settings: only the key may come from the
            # environment, so it need not be written into code.
            settings = load_settings(
                {"url": base_url, "api_key": api_key, "retries": retries},
                env={k: v for k, v in os.environ.items() if k == "STITCHSIM_API_KEY"},
                read_files=False,
            )
        self.base_url = settings.url
        self.api_key = settings.api_key
        self.retries = settings.retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_retry_after = max_retry_after
        self.upload_timeout = upload_timeout
        # Tests swap this out to observe waits without spending them.
        self._sleep: Callable[[float], None] = time.sleep
        self._known: dict[tuple[str, str], StoredObject | DatasetInfo] = {}
        self._hashes: dict[tuple[str, int, int], str] = {}

        all_headers = {"User-Agent": f"stitchsim-python/{_VERSION}", "Accept": "application/json"}
        if self.api_key:
            all_headers["Authorization"] = f"Bearer {self.api_key}"
        all_headers.update(headers or {})
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=all_headers,
            timeout=timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout),
            transport=transport,
            follow_redirects=True,
        )

    # ------------------------------------------------------------ lifecycle

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.base_url!r})"

    # ------------------------------------------------------------ service

    def health(self) -> bool:
        """True when the gateway process answers (no retries: this is a probe)."""
        try:
            self._request("GET", "/healthz", retries=0)
        except (ConnectionFailed, APIError):
            return False
        return True

    def ready(self) -> dict[str, Any]:
        """`/readyz`: broker, store and workers; raises ServiceUnavailable when not ready."""
        return self._request("GET", "/readyz", retries=0).json()

    # ------------------------------------------------------------ uploads

    def upload_checkpoint(self, path: PathLike) -> StoredObject:
        """Upload a safetensors checkpoint unless the service already holds the same bytes."""
        return self._upload(StoredObject, "checkpoints", path)

    def upload_dataset(self, path: PathLike) -> DatasetInfo:
        """Upload a safetensors dataset unless the service already holds the same bytes."""
        return self._upload(DatasetInfo, "datasets", path)

    def checkpoint(self, checkpoint_id: str) -> StoredObject:
        """Metadata of a stored checkpoint; NotFound when this key has no such checkpoint."""
        return StoredObject.model_validate(
            self._request("GET", f"/checkpoints/{checkpoint_id}").json()
        )

    def delete_checkpoint(self, checkpoint_id: str) -> None:
        """Forget a checkpoint (frees storage quota); Conflict while a job of yours uses it."""
        self._delete("checkpoints", checkpoint_id)

    def delete_dataset(self, dataset_id: str) -> None:
        """Forget an uploaded dataset (frees storage quota); Conflict while a job uses it."""
        self._delete("datasets", dataset_id)

    def _delete(self, kind: str, object_id: str) -> None:
        self._request("DELETE", f"/{kind}/{object_id}")
        self._known.pop((kind, object_id), None)

    def usage(self) -> Usage:
        """This key's jobs in flight and bytes stored, against its quotas."""
        return Usage.model_validate(self._request("GET", "/usage").json())

    def datasets(self) -> list[DatasetInfo]:
        """Built-in datasets and the ones this key uploaded."""
        body = self._request("GET", "/datasets").json()
        items = body.get("items", []) if isinstance(body, dict) else body
        return [DatasetInfo.model_validate(d) for d in items]

    def find_checkpoint(self, path: PathLike) -> StoredObject | None:
        """The stored checkpoint with this file's bytes, or None (this key has none such)."""
        return self._find(StoredObject, "checkpoints", self._sha256(path))

    def _sha256(self, path: PathLike) -> str:
        path = Path(path)
        try:
            st = path.stat()
        except OSError:
            raise UsageError(f"{path}: no such file") from None
        if not path.is_file():
            raise UsageError(f"{path}: not a regular file")
        # Hash once per file version: compare() and the CLI may ask about the same file twice.
        key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
        if key not in self._hashes:
            self._hashes[key] = file_sha256(path)
        return self._hashes[key]

    def _find(self, model: type[_Stored], kind: str, digest: str) -> _Stored | None:
        known = self._known.get((kind, digest))
        if isinstance(known, model):
            return known
        found = self._lookup(model, kind, digest)
        if found is not None:
            self._known[(kind, digest)] = found
        return found

    def _upload(self, model: type[_Stored], kind: str, path: PathLike) -> _Stored:
        path = Path(path)
        digest = self._sha256(path)
        known = self._find(model, kind, digest)
        if known is not None:
            log.info("%s: already on the service as %s, not uploaded", path, _short(known.id))
            return known
        _check_file(path, kind)
        log.info("%s: uploading %s", path, _size(path.stat().st_size))

        def body(stack: contextlib.ExitStack) -> dict[str, Any]:
            # Reopened on every attempt so a retry sends the whole file again.
            fh: IO[bytes] = stack.enter_context(path.open("rb"))
            return {"files": {"file": (path.name, fh, "application/octet-stream")}}

        timeout = httpx.Timeout(
            self._http.timeout.connect,
            read=self.upload_timeout,
            write=self.upload_timeout,
            pool=self._http.timeout.pool,
        )
        response = self._request("POST", f"/{kind}", body=body, timeout=timeout)
        stored = model.model_validate(response.json())
        if stored.id != digest:
            raise StitchsimError(
                f"{path}: the service stored it as {stored.id}, but its sha256 is {digest}; "
                "the file changed during upload or the bytes were altered in transit"
            )
        self._known[(kind, digest)] = stored
        log.info("%s: stored as %s", path, _short(stored.id))
        return stored

    def _lookup(self, model: type[_Stored], kind: str, digest: str) -> _Stored | None:
        """The stored object with this hash, or None when it has to be uploaded."""
        try:
            response = self._request("GET", f"/{kind}/{digest}")
        except NotFound:
            return None
        except APIError as exc:
            if exc.status_code == 405:  # a service without lookups: just upload
                return None
            raise
        return model.model_validate(response.json())

    # ------------------------------------------------------------ jobs

    def compare(
        self,
        front: ModelLike,
        back: ModelLike,
        *,
        spec: Spec | Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> Job:
        """Start a comparison of two models and return its Job at once.

        `front` and `back` are paths to safetensors files (uploaded unless already stored), ids
        ("sha256:…"), or dicts/ModelRefs with a `checkpoint` that is either, plus `arch`,
        `arch_kwargs` etc. `spec` gives a base spec; keyword arguments override its fields
        (nested ones such as `train={"epochs": 2}` are merged). `dataset` may also be a path.
        The spec is validated here before any upload, so a bad field costs no transfer.
        """
        base: dict[str, Any] = {}
        if isinstance(spec, Spec):
            base = spec.model_dump(mode="json", exclude_unset=True)
        elif spec is not None:
            base = dict(spec)
        payload = deep_merge(base, fields)
        refs = {
            side: _as_ref_dict(model, base.get(side))
            for side, model in (("front", front), ("back", back))
        }

        # Validate with stand-in ids first: no upload for a spec that cannot run.
        trial = {**payload, **_dataset_placeholder(payload)}
        for side, ref in refs.items():
            trial[side] = {**ref, "checkpoint": _PLACEHOLDER_ID}
        _validate_spec(trial)
        for side, ref in refs.items():
            ref["checkpoint"] = self._checkpoint_id(ref["checkpoint"], side)
            payload[side] = ref
        if "dataset" in payload:
            payload["dataset"] = self._dataset_id(payload["dataset"])
        return self.submit(_validate_spec(payload), idempotency_key=idempotency_key)

    def submit(self, spec: Spec | Mapping[str, Any], *, idempotency_key: str | None = None) -> Job:
        """Start a job from a complete spec whose checkpoints are already stored."""
        if not isinstance(spec, Spec):
            spec = _validate_spec(spec)
        response = self._request(
            "POST",
            "/similarity",
            json=spec.model_dump(mode="json", exclude_unset=True),
            headers={"Idempotency-Key": idempotency_key or uuid.uuid4().hex},
        )
        created = JobCreated.model_validate(response.json())
        log.info("job %s submitted", created.job_id)
        return Job(self, created.job_id)

    def job(self, job_id: str) -> Job:
        return Job(self, job_id)

    def jobs(self, *, limit: int = 20, cursor: str | None = None) -> JobList:
        """One page of this key's jobs, newest first."""
        params: dict[str, Any] = {"limit": limit}
        if cursor:
            params["cursor"] = cursor
        return JobList.model_validate(self._request("GET", "/jobs", params=params).json())

    def iter_jobs(self, *, page_size: int = 50) -> Iterator[JobStatus]:
        cursor: str | None = None
        while True:
            page = self.jobs(limit=page_size, cursor=cursor)
            yield from page.items
            if not page.next_cursor or not page.items:
                return
            cursor = page.next_cursor

    def _checkpoint_id(self, checkpoint: Any, side: str) -> str:
        if isinstance(checkpoint, str) and ID_RE.match(checkpoint):
            return checkpoint
        if isinstance(checkpoint, Mapping) and "path" in checkpoint:
            checkpoint = checkpoint["path"]
        if not isinstance(checkpoint, str | os.PathLike):
            raise UsageError(f"{side}: expected a file path or a sha256: id, got {checkpoint!r}")
        if not Path(checkpoint).is_file():
            raise UsageError(
                f"{side}: {os.fspath(checkpoint)!r} is neither a file nor a sha256:<64 hex> id"
            )
        return self.upload_checkpoint(checkpoint).id

    def _dataset_id(self, dataset: Any) -> Any:
        if isinstance(dataset, Mapping) and "path" in dataset:
            dataset = Path(dataset["path"])
        if isinstance(dataset, os.PathLike):
            return self.upload_dataset(dataset).id
        if (
            isinstance(dataset, str)
            and dataset not in BUILTIN_DATASETS
            and not ID_RE.match(dataset)
            and Path(dataset).is_file()
        ):
            return self.upload_dataset(dataset).id
        return dataset

    # ------------------------------------------------------------ transport

    def _pause(self, method: str, path: str, why: str, delay: float, attempt: int,
               retries: int) -> None:
        log.warning("%s %s: %s; retrying in %.1fs (%d/%d)", method, path, why, delay,
                    attempt + 1, retries)
        self._sleep(delay)

    def _request(
        self,
        method: str,
        path: str,
        *,
        body: Callable[[contextlib.ExitStack], dict[str, Any]] | None = None,
        retries: int | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        retries = self.retries if retries is None else retries
        attempt = 0
        while True:
            try:
                with contextlib.ExitStack() as stack:
                    extra = body(stack) if body else {}
                    response = self._http.request(method, path, **kwargs, **extra)
            except httpx.TransportError as exc:
                if attempt >= retries:
                    tries = f" after {attempt + 1} attempts" if attempt else ""
                    raise ConnectionFailed(
                        f"cannot reach the stitchsim service at {self.base_url}{tries}: "
                        f"{_describe(exc)}",
                        self.base_url,
                    ) from exc
                self._pause(method, path, _describe(exc), self._backoff_delay(attempt),
                            attempt, retries)
                attempt += 1
                continue
            if response.status_code in RETRY_STATUSES and attempt < retries:
                delay = self._retry_delay(response, attempt)
                if delay is not None:
                    self._pause(method, path, f"HTTP {response.status_code}", delay, attempt,
                                retries)
                    attempt += 1
                    continue
            if response.is_error:
                raise APIError.from_response(response)
            return response

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
            self.client._request("GET", f"/jobs/{self.id}").json()
        )
        return self.last_status

    def cancel(self) -> JobStatus:
        """Ask the service to stop the job; cancellation is cooperative, so poll to see it end."""
        self.client._request("DELETE", f"/jobs/{self.id}")
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
                    self.client._sleep(_bounded(max_poll_interval, deadline))
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
                self.client._sleep(_bounded(interval, deadline))
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
            self._report_text = self.client._request("GET", f"/jobs/{self.id}/report").text
        return self._report_text

    def report_html(self) -> str:
        """The report as a self-contained HTML page."""
        return self.client._request(
            "GET", f"/jobs/{self.id}/report.html", headers={"Accept": "text/html"}
        ).text

    def save_report(self, path: PathLike, format: Literal["json", "html"] = "json") -> Path:
        text = self.report_json() if format == "json" else self.report_html()
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        return out


class ProgressPrinter:
    """Shows a job's progress: a bar redrawn in place on a terminal, plain lines in CI logs.

    Lines are printed on every change of state; while running, at most one per
    `min_interval` seconds when the stage or the tenth of the work done changed, and one per
    `heartbeat` seconds regardless, so a log shows the job is alive without flooding.
    """

    def __init__(
        self,
        stream: IO[str] | None = None,
        *,
        job_id: str = "",
        mode: Literal["auto", "bar", "lines"] = "auto",
        min_interval: float = 10.0,
        heartbeat: float = 30.0,
        width: int = 24,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.stream = stream or sys.stderr
        self.clock = clock
        if mode == "auto":
            isatty = getattr(self.stream, "isatty", lambda: False)
            mode = "bar" if isatty() and os.environ.get("TERM") != "dumb" else "lines"
        self.mode = mode
        # The full id is logged at submission; eight hex digits identify it in a log.
        self.label = f"job {job_id[:8]}" if job_id else "job"
        self.min_interval = min_interval
        self.heartbeat = heartbeat
        self.width = width
        self._start = clock()
        self._last: tuple[str, str, int] | None = None
        self._last_time = 0.0
        self._drawn = False

    def __call__(self, status: JobStatus) -> None:
        if self.mode == "bar":
            self._draw_bar(status)
        else:
            self._print_line(status)

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False

    def _describe(self, status: JobStatus) -> tuple[list[str], float | None]:
        p = status.progress
        running = status.state == "running"
        frac = min(1.0, p.done / p.total) if running and p.total > 0 else None
        parts = [p.stage if running else status.state]
        if frac is not None:
            parts.append(f"{p.done}/{p.total}")
        # An ETA of 0 with work left means "not estimated yet" (a stage just began).
        if running and p.eta_s is not None and (p.eta_s > 0 or p.done >= p.total):
            parts.append(f"eta {_duration(p.eta_s) if p.eta_s >= 0.5 else '<1s'}")
        parts.append(f"elapsed {_duration(self.clock() - self._start)}")
        return parts, frac

    def _draw_bar(self, status: JobStatus) -> None:
        parts, frac = self._describe(status)
        if status.state == "succeeded":
            frac = 1.0
        filled = round((frac or 0.0) * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        pct = f"{frac:4.0%}" if frac is not None else "    "
        line = f"[{bar}] {pct}  {'  '.join(parts)}"
        # A line longer than the terminal wraps, and \r then redraws only its last row.
        columns = shutil.get_terminal_size().columns
        if len(line) >= columns:
            line = line[: max(columns - 2, 10)] + "…"
        self.stream.write(f"\r\x1b[K{line}")
        self.stream.flush()
        self._drawn = True

    def _print_line(self, status: JobStatus) -> None:
        parts, frac = self._describe(status)
        key = (status.state, status.progress.stage, -1 if frac is None else int(frac * 10))
        now = self.clock()
        new_state = self._last is None or key[0] != self._last[0]
        since = now - self._last_time
        quiet = since < self.min_interval or (key == self._last and since < self.heartbeat)
        if quiet and not new_state:
            return
        self._last, self._last_time = key, now
        if frac is not None:
            parts[1] += f" ({frac:.0%})"
        self.stream.write(f"stitchsim: {self.label}: {', '.join(parts)}\n")
        self.stream.flush()


# ---------------------------------------------------------------- helpers


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


def _as_ref_dict(model: ModelLike, base: Any) -> dict[str, Any]:
    if isinstance(model, ModelRef):
        ref = model.model_dump(mode="json", exclude_none=True)
    elif isinstance(model, Mapping):
        ref = dict(model)
    else:
        ref = {"checkpoint": model}
    if "checkpoint" not in ref:
        raise UsageError("a model given as a mapping needs a 'checkpoint' (path or sha256: id)")
    # arch/arch_kwargs etc. from a base spec apply unless the model overrides them.
    if isinstance(base, Mapping):
        ref = {**{k: v for k, v in base.items() if k != "checkpoint"}, **ref}
    return ref


def _dataset_placeholder(payload: Mapping[str, Any]) -> dict[str, Any]:
    dataset = payload.get("dataset")
    if isinstance(dataset, os.PathLike | Mapping) or (
        isinstance(dataset, str) and dataset not in BUILTIN_DATASETS and Path(dataset).is_file()
    ):
        return {"dataset": _PLACEHOLDER_ID}
    return {}


def _check_file(path: Path, kind: str) -> None:
    """The service's own header checks, run here first: a pickle or a truncated file fails in
    milliseconds instead of after a long upload."""
    try:
        if kind == "datasets":
            check_dataset(path)
        else:
            read_header(path)
    except SafetensorsError as exc:
        raise InvalidFile(f"{path}: {exc.message}", code=exc.code) from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror}") from None


def _validate_spec(payload: Mapping[str, Any]) -> Spec:
    try:
        return Spec.model_validate(payload)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        lines = []
        for e in errors:
            loc = ".".join(str(p) for p in e["loc"])
            lines.append(f"{loc}: {e['msg']}" if loc else e["msg"])
        raise InvalidSpec("invalid spec: " + "; ".join(lines), errors=errors) from None


def _bounded(seconds: float, deadline: float | None) -> float:
    if deadline is None:
        return seconds
    return max(0.0, min(seconds, deadline - time.monotonic()))


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _short(object_id: str) -> str:
    return object_id[:19] + "…" if len(object_id) > 20 else object_id


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def _describe(exc: httpx.TransportError) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) < 200 else text[:200] + "…"
