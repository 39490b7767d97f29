"""The SDK's client: uploads, spec assembly, submissions, listings.

from stitchsim import Client

with Client("http://127.0.0.1:8000") as client:
    job = client.compare("reference.safetensors", "candidate.safetensors",
                         layers=[{"front": "layer3.1", "back": "layer3.1"}], threshold=0.9)
    report = job.wait(timeout=1800, progress=True)
    print(report.summary.similarity, report.verdict)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any, TypeVar

import httpx
from pydantic import ValidationError

from stitchsim.config import deep_merge, load_settings
from stitchsim.errors import (
    APIError,
    ConnectionFailed,
    InvalidFile,
    InvalidSpec,
    NotFound,
    StitchsimError,
    UsageError,
)
from stitchsim.files.dataset import check_dataset
from stitchsim.files.errors import SafetensorsError
from stitchsim.files.folder import is_model_folder, pack_model_folder
from stitchsim.files.header import read_header
from stitchsim.models import (
    BUILTIN_DATASETS,
    DatasetInfo,
    JobCreated,
    JobList,
    JobStatus,
    ModelRef,
    Spec,
    StitchPoints,
    StoredObject,
    Usage,
)
from stitchsim.packing import PackOptions, is_service_file, pack_dataset
from stitchsim.sdk.job import Job
from stitchsim.sdk.transport import Transport

# The CLI gives this logger a handler; a library user opts in with logging.basicConfig.
log = logging.getLogger("stitchsim")
log.addHandler(logging.NullHandler())

ID_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_PLACEHOLDER_ID = "sha256:" + "0" * 64

PathLike = str | os.PathLike[str]
ModelLike = PathLike | ModelRef | Mapping[str, Any]
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
        if base_url is None:
            # Same sources as the CLI: STITCHSIM_* variables, then the config files.
            settings = load_settings({"api_key": api_key, "retries": retries})
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
        self.upload_timeout = upload_timeout
        self.http = Transport(
            settings.url, api_key=settings.api_key, retries=settings.retries, timeout=timeout,
            backoff=backoff, max_backoff=max_backoff, max_retry_after=max_retry_after,
            headers=headers, transport=transport,
        )
        self._known: dict[tuple[str, str], StoredObject | DatasetInfo] = {}
        self._hashes: dict[tuple[str, int, int], str] = {}

    # ------------------------------------------------------------ lifecycle

    def close(self) -> None:
        self.http.close()

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
            self.http.request("GET", "/healthz", retries=0)
        except (ConnectionFailed, APIError):
            return False
        return True

    def ready(self) -> dict[str, Any]:
        """`/readyz`: broker, store and workers; raises ServiceUnavailable when not ready."""
        return self.http.request("GET", "/readyz", retries=0).json()

    # ------------------------------------------------------------ uploads

    def upload_checkpoint(self, path: PathLike) -> StoredObject:
        """Upload a safetensors checkpoint unless the service already holds the same bytes.

        `path` may also be a model folder as `transformers`' `save_pretrained` or timm's hub
        layout writes it (config.json beside model.safetensors, or beside the shards that
        model.safetensors.index.json lists): it is packed into one file first, every tensor
        plus the config files in its metadata, so the service stores all of it or nothing.
        """
        if is_model_folder(path):
            with tempfile.TemporaryDirectory(prefix="stitchsim-model-") as tmp:
                try:
                    packed = pack_model_folder(path, Path(tmp) / "model.safetensors")
                except SafetensorsError as exc:
                    raise InvalidFile(f"{path}: {exc.message}", code=exc.code) from None
                log.info("%s: %s folder of %s (%d tensors, %d shard(s))", path,
                         packed.config.layout, packed.config.arch, packed.tensors, packed.shards)
                return self._upload(StoredObject, "checkpoints", packed.path)
        return self._upload(StoredObject, "checkpoints", path)

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
        opts = _pack_options(options)
        if opts is None and is_service_file(path):
            return self._upload(DatasetInfo, "datasets", path)
        with tempfile.TemporaryDirectory(prefix="stitchsim-pack-") as tmp:
            packed = Path(tmp) / f"{Path(path).name or 'dataset'}.safetensors"
            summary = pack_dataset(path, packed, opts)
            for line in summary.lines():
                log.info("%s", line)
            return self._upload(DatasetInfo, "datasets", packed)

    def checkpoint(self, checkpoint_id: str) -> StoredObject:
        """Metadata of a stored checkpoint; NotFound when this key has no such checkpoint."""
        return StoredObject.model_validate(
            self.http.request("GET", f"/checkpoints/{checkpoint_id}").json()
        )

    def points(self, checkpoint: PathLike | str, *, arch: str | None = None,
               arch_kwargs: Mapping[str, Any] | None = None,
               input_size: int | None = None) -> StitchPoints:
        """Where a checkpoint (a file, uploaded unless the service holds it, or a sha256: id)
        can be stitched: every module output with its shape, the stage outputs and what
        `layers: "auto"` picks (GET /checkpoints/{id}/points)."""
        cid = self._checkpoint_id(checkpoint, "checkpoint")
        params: dict[str, Any] = {"arch": arch, "input_size": input_size,
                                  "arch_kwargs": None if arch_kwargs is None
                                  else json.dumps(dict(arch_kwargs))}
        r = self.http.request("GET", f"/checkpoints/{cid}/points",
                              params={k: v for k, v in params.items() if v is not None})
        return StitchPoints.model_validate(r.json())

    def delete_checkpoint(self, checkpoint_id: str) -> None:
        """Forget a checkpoint (frees storage quota); Conflict while a job of yours uses it."""
        self._delete("checkpoints", checkpoint_id)

    def delete_dataset(self, dataset_id: str) -> None:
        """Forget an uploaded dataset (frees storage quota); Conflict while a job uses it."""
        self._delete("datasets", dataset_id)

    def _delete(self, kind: str, object_id: str) -> None:
        self.http.request("DELETE", f"/{kind}/{object_id}")
        self._known.pop((kind, object_id), None)

    def usage(self) -> Usage:
        """This key's jobs in flight and bytes stored, against its quotas."""
        return Usage.model_validate(self.http.request("GET", "/usage").json())

    def datasets(self) -> list[DatasetInfo]:
        """Built-in datasets and the ones this key uploaded."""
        body = self.http.request("GET", "/datasets").json()
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
            self.http.timeout.connect,
            read=self.upload_timeout,
            write=self.upload_timeout,
            pool=self.http.timeout.pool,
        )
        response = self.http.request("POST", f"/{kind}", body=body, timeout=timeout)
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
            response = self.http.request("GET", f"/{kind}/{digest}")
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

        # Validated once, with stand-in ids: no upload for a spec that cannot run. The ids the
        # service gives the uploads then replace the stand-ins; they are ids by construction.
        trial = {**payload, **_dataset_placeholder(payload)}
        if dataset_options and trial.get("dataset") != _PLACEHOLDER_ID:
            raise UsageError(
                f"packing options apply to a dataset uploaded from a file or folder, but "
                f"dataset is {payload.get('dataset', 'digits')!r} (a built-in name or a stored "
                "id; or a path that does not exist)")
        for side, ref in refs.items():
            trial[side] = {**ref, "checkpoint": _PLACEHOLDER_ID}
        spec = _validate_spec(trial)
        ids: dict[str, Any] = {
            side: getattr(spec, side).model_copy(
                update={"checkpoint": self._checkpoint_id(ref["checkpoint"], side)})
            for side, ref in refs.items()
        }
        if "dataset" in payload:
            ids["dataset"] = self._dataset_id(payload["dataset"], dataset_options)
        return self.submit(spec.model_copy(update=ids), idempotency_key=idempotency_key)

    def submit(self, spec: Spec | Mapping[str, Any], *, idempotency_key: str | None = None) -> Job:
        """Start a job from a complete spec whose checkpoints are already stored."""
        if not isinstance(spec, Spec):
            spec = _validate_spec(spec)
        response = self.http.request(
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
        return JobList.model_validate(self.http.request("GET", "/jobs", params=params).json())

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
        if not Path(checkpoint).is_file() and not is_model_folder(checkpoint):
            raise UsageError(
                f"{side}: {os.fspath(checkpoint)!r} is neither a file nor a sha256:<64 hex> "
                "id (nor a model folder)"
            )
        return self.upload_checkpoint(checkpoint).id

    def _dataset_id(self, dataset: Any,
                    options: PackOptions | Mapping[str, Any] | None = None) -> Any:
        if isinstance(dataset, Mapping) and "path" in dataset:
            dataset = Path(dataset["path"])
        if isinstance(dataset, os.PathLike) or _is_local_dataset(dataset):
            return self.upload_dataset(dataset, options).id
        return dataset


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


def _is_local_dataset(dataset: Any) -> bool:
    """A string that names a file or folder here (not a built-in name or a stored id)."""
    return (isinstance(dataset, str) and dataset not in BUILTIN_DATASETS
            and not ID_RE.match(dataset) and Path(dataset).exists())


def _dataset_placeholder(payload: Mapping[str, Any]) -> dict[str, Any]:
    dataset = payload.get("dataset")
    if isinstance(dataset, os.PathLike | Mapping) or _is_local_dataset(dataset):
        return {"dataset": _PLACEHOLDER_ID}
    return {}


def _pack_options(options: PackOptions | Mapping[str, Any] | None) -> PackOptions | None:
    if options is None or isinstance(options, PackOptions):
        return options
    try:
        return PackOptions.model_validate(dict(options))
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                             for e in exc.errors(include_url=False))
        raise UsageError(f"dataset options: {problems}") from None


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


def _short(object_id: str) -> str:
    return object_id[:19] + "…" if len(object_id) > 20 else object_id


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"
