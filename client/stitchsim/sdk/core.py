"""The SDK's logic, once: uploads, spec assembly, submissions and listings as request plans
(stitchsim.sdk.plans) that Client runs with blocking requests and AsyncClient awaits."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import tempfile
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping
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
from stitchsim.files.digest import object_id
from stitchsim.files.errors import SafetensorsError
from stitchsim.files.folder import is_model_folder, pack_model_folder
from stitchsim.files.header import read_header
from stitchsim.models import (
    BUILTIN_DATASETS,
    DatasetInfo,
    JobCreated,
    JobList,
    ModelRef,
    Spec,
    StitchPoints,
    StoredObject,
    Usage,
)
from stitchsim.packing import PackOptions, is_service_file, pack_dataset
from stitchsim.packing.summary import human_size
from stitchsim.probes import BUILTIN_PROBES
from stitchsim.sdk.plans import Call, Plan

# The CLI gives this logger a handler; a library user opts in with logging.basicConfig.
log = logging.getLogger("stitchsim")
log.addHandler(logging.NullHandler())

ID_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_PLACEHOLDER_ID = "sha256:" + "0" * 64

PathLike = str | os.PathLike[str]
ModelLike = PathLike | ModelRef | Mapping[str, Any]
_Stored = TypeVar("_Stored", StoredObject, DatasetInfo)


file_sha256 = object_id
"""The id the service stores a file under: "sha256:" + hex digest of its bytes."""


def client_settings(base_url: str | None, api_key: str | None, retries: int | None) -> Any:
    """The URL, key and retries a client runs with: the CLI's sources without an explicit
    URL; with one, explicit settings (only the key may come from the environment, so it need
    not be written into code)."""
    if base_url is None:
        return load_settings({"api_key": api_key, "retries": retries})
    return load_settings(
        {"url": base_url, "api_key": api_key, "retries": retries},
        env={k: v for k, v in os.environ.items() if k == "STITCHSIM_API_KEY"},
        read_files=False,
    )


class ClientCore(ABC):
    """What Client and AsyncClient share: settings, caches, and every operation as a plan."""

    base_url: str
    api_key: str | None
    upload_timeout: float

    def _init_core(self, settings: Any, upload_timeout: float) -> None:
        self.base_url = settings.url
        self.api_key = settings.api_key
        self.upload_timeout = upload_timeout
        self._known: dict[tuple[str, str], StoredObject | DatasetInfo] = {}
        self._hashes: dict[tuple[str, int, int], str] = {}

    @property
    @abstractmethod
    def _timeout(self) -> httpx.Timeout:
        """The transport's timeouts; Client and AsyncClient each answer from their own
        transport (the plans here read it to lengthen an upload's)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r})"

    # ------------------------------------------------------------ service

    def _plan_health(self) -> Plan[bool]:
        try:
            yield Call("GET", "/healthz", retries=0)
        except (ConnectionFailed, APIError):
            return False
        return True

    def _plan_ready(self) -> Plan[dict[str, Any]]:
        return (yield Call("GET", "/readyz", retries=0)).json()

    def _plan_get(self, model: type[Any], path: str, **kwargs: Any) -> Plan[Any]:
        return model.model_validate((yield Call("GET", path, kwargs)).json())

    # ------------------------------------------------------------ uploads

    def _plan_upload_checkpoint(self, path: PathLike) -> Plan[StoredObject]:
        with tempfile.TemporaryDirectory(prefix="stitchsim-model-") as tmp:
            local = _local_checkpoint(path, Path(tmp))
            return (yield from self._plan_upload(StoredObject, "checkpoints", local))

    def _plan_points(self, checkpoint: Any, arch: str | None,
                     arch_kwargs: Mapping[str, Any] | None,
                     input_size: int | None) -> Plan[StitchPoints]:
        cid = yield from self._plan_checkpoint_id(checkpoint, "checkpoint")
        params: dict[str, Any] = {"arch": arch, "input_size": input_size,
                                  "arch_kwargs": None if arch_kwargs is None
                                  else json.dumps(dict(arch_kwargs))}
        return (yield from self._plan_get(
            StitchPoints, f"/checkpoints/{cid}/points",
            params={k: v for k, v in params.items() if v is not None}))

    def _plan_upload_dataset(
        self, path: PathLike, options: PackOptions | Mapping[str, Any] | None
    ) -> Plan[DatasetInfo]:
        with tempfile.TemporaryDirectory(prefix="stitchsim-pack-") as tmp:
            local = _local_dataset(path, _pack_options(options), Path(tmp))
            return (yield from self._plan_upload(DatasetInfo, "datasets", local))

    def _plan_delete(self, kind: str, object_id: str) -> Plan[None]:
        yield Call("DELETE", f"/{kind}/{object_id}")
        self._known.pop((kind, object_id), None)

    def _plan_datasets(self) -> Plan[list[DatasetInfo]]:
        body = (yield Call("GET", "/datasets")).json()
        items = body.get("items", []) if isinstance(body, dict) else body
        return [DatasetInfo.model_validate(d) for d in items]

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

    def _plan_find(self, model: type[_Stored], kind: str, digest: str) -> Plan[_Stored | None]:
        known = self._known.get((kind, digest))
        if isinstance(known, model):
            return known
        found = yield from self._plan_lookup(model, kind, digest)
        if found is not None:
            self._known[(kind, digest)] = found
        return found

    def _plan_upload(self, model: type[_Stored], kind: str, path: PathLike) -> Plan[_Stored]:
        path = Path(path)
        digest = self._sha256(path)
        known = yield from self._plan_find(model, kind, digest)
        if known is not None:
            log.info("%s: already on the service as %s, not uploaded", path, _short(known.id))
            return known
        log.info("%s: uploading %s", path, human_size(path.stat().st_size))

        def body(stack: contextlib.ExitStack) -> dict[str, Any]:
            # Reopened on every attempt so a retry sends the whole file again.
            fh: IO[bytes] = stack.enter_context(path.open("rb"))
            return {"files": {"file": (path.name, fh, "application/octet-stream")}}

        base = self._timeout
        timeout = httpx.Timeout(base.connect, read=self.upload_timeout,
                                write=self.upload_timeout, pool=base.pool)
        response = yield Call("POST", f"/{kind}", {"timeout": timeout}, body=body)
        stored = model.model_validate(response.json())
        if stored.id != digest:
            raise StitchsimError(
                f"{path}: the service stored it as {stored.id}, but its sha256 is {digest}; "
                "the file changed during upload or the bytes were altered in transit",
                code="upload_mismatch")
        self._known[(kind, digest)] = stored
        log.info("%s: stored as %s", path, _short(stored.id))
        return stored

    def _plan_lookup(self, model: type[_Stored], kind: str, digest: str) -> Plan[_Stored | None]:
        """The stored object with this hash, or None when it has to be uploaded."""
        try:
            response = yield Call("GET", f"/{kind}/{digest}")
        except NotFound:
            return None
        except APIError as exc:
            if exc.status_code == 405:  # a service without lookups: just upload
                return None
            raise
        return model.model_validate(response.json())

    # ------------------------------------------------------------ jobs

    def _plan_compare(
        self,
        front: ModelLike,
        back: ModelLike,
        spec: Spec | Mapping[str, Any] | None,
        idempotency_key: str | None,
        dataset_options: PackOptions | Mapping[str, Any] | None,
        fields: dict[str, Any],
    ) -> Plan[str]:
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
        trial = {**payload, **_dataset_placeholder(payload), **_probe_placeholders(payload)}
        if dataset_options and trial.get("dataset") != _PLACEHOLDER_ID:
            raise UsageError(
                f"packing options apply to a dataset uploaded from a file or folder, but "
                f"dataset is {payload.get('dataset', 'digits')!r} (a built-in name or a stored "
                "id; or a path that does not exist)")
        for side, ref in refs.items():
            trial[side] = {**ref, "checkpoint": _PLACEHOLDER_ID}
        checked = _validate_spec(trial)
        with tempfile.TemporaryDirectory(prefix="stitchsim-") as tmp:
            # Every local input is read, packed and checked before the first upload: a bad
            # dataset must not cost two checkpoint uploads first (nor leave them stored).
            local = {side: _local_model(ref["checkpoint"], side, Path(tmp) / side)
                     for side, ref in refs.items()}
            probes = [_local_dataset(_dataset_path(p), None, Path(tmp) / f"probe{n}")
                      if _is_local_probe(p) else p
                      for n, p in enumerate(payload.get("probes") or [])]
            dataset = payload.get("dataset")
            if "dataset" in payload and _is_dataset_path(dataset):
                dataset = _local_dataset(_dataset_path(dataset), _pack_options(dataset_options),
                                         Path(tmp) / "dataset")
            ids: dict[str, Any] = {}
            for side, model in local.items():
                if isinstance(model, Path):
                    model = (yield from self._plan_upload(StoredObject, "checkpoints", model)).id
                ids[side] = getattr(checked, side).model_copy(update={"checkpoint": model})
            if isinstance(dataset, Path):
                dataset = (yield from self._plan_upload(DatasetInfo, "datasets", dataset)).id
            if "dataset" in payload:
                ids["dataset"] = dataset
            if "probes" in payload:
                uploaded = []
                for p in probes:
                    if isinstance(p, Path):
                        p = (yield from self._plan_upload(DatasetInfo, "datasets", p)).id
                    uploaded.append(p)
                ids["probes"] = uploaded
            return (yield from self._plan_submit(checked.model_copy(update=ids),
                                                 idempotency_key))

    def _plan_submit(self, spec: Spec | Mapping[str, Any], idempotency_key: str | None
                     ) -> Plan[str]:
        if not isinstance(spec, Spec):
            spec = _validate_spec(spec)
        response = yield Call("POST", "/similarity", {
            "json": spec.model_dump(mode="json", exclude_unset=True),
            "headers": {"Idempotency-Key": idempotency_key or uuid.uuid4().hex}})
        created = JobCreated.model_validate(response.json())
        log.info("job %s submitted", created.job_id)
        return created.job_id

    def _plan_jobs(self, limit: int, cursor: str | None) -> Plan[JobList]:
        params: dict[str, Any] = {"limit": limit}
        if cursor:
            params["cursor"] = cursor
        return (yield from self._plan_get(JobList, "/jobs", params=params))

    def _plan_usage(self) -> Plan[Usage]:
        return (yield from self._plan_get(Usage, "/usage"))

    def _plan_checkpoint_id(self, checkpoint: Any, side: str) -> Plan[str]:
        with tempfile.TemporaryDirectory(prefix="stitchsim-model-") as tmp:
            local = _local_model(checkpoint, side, Path(tmp))
            if isinstance(local, str):
                return local
            return (yield from self._plan_upload(StoredObject, "checkpoints", local)).id

    def _plan_dataset_id(self, dataset: Any,
                         options: PackOptions | Mapping[str, Any] | None = None) -> Plan[Any]:
        if _is_dataset_path(dataset):
            return (yield from self._plan_upload_dataset(_dataset_path(dataset), options)).id
        return dataset


def _local_model(checkpoint: Any, side: str, tmp: Path) -> str | Path:
    """A model as given: a stored id as it is, else the checked local file to upload (a model
    folder packed into `tmp` first)."""
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
    return _local_checkpoint(checkpoint, tmp)


def _local_checkpoint(path: PathLike, tmp: Path) -> Path:
    """The one file to upload for a checkpoint path, its header checked here first. A model
    folder (save_pretrained, timm's hub layout) is packed into one file in `tmp`: every
    tensor plus the config files in its metadata, so the service stores all or nothing."""
    if not is_model_folder(path):
        return _check_file(Path(path), "checkpoints")
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        packed = pack_model_folder(path, tmp / "model.safetensors")
    except SafetensorsError as exc:
        raise InvalidFile(f"{path}: {exc.message}", code=exc.code, details=exc.details) from None
    log.info("%s: %s folder of %s (%d tensors, %d shard(s))", path,
             packed.config.layout, packed.config.arch, packed.tensors, packed.shards)
    return _check_file(packed.path, "checkpoints")


def _local_dataset(path: PathLike, opts: PackOptions | None, tmp: Path) -> Path:
    """The service's dataset file for a local source: as it is when it is one already, else
    packed into `tmp` (what was found printed before any upload); checked either way."""
    if opts is None and is_service_file(path):
        return _check_file(Path(path), "datasets")
    tmp.mkdir(parents=True, exist_ok=True)
    packed = tmp / f"{Path(path).name or 'dataset'}.safetensors"
    summary = pack_dataset(path, packed, opts)
    for line in summary.lines():
        log.info("%s", line)
    return _check_file(packed, "datasets")


def _is_dataset_path(dataset: Any) -> bool:
    return (isinstance(dataset, os.PathLike) or _is_local_dataset(dataset)
            or (isinstance(dataset, Mapping) and "path" in dataset))


def _dataset_path(dataset: Any) -> PathLike:
    return Path(dataset["path"]) if isinstance(dataset, Mapping) else dataset


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


def _is_local_probe(probe: Any) -> bool:
    """A probe given as a file or folder here: uploaded (packed first) like a dataset."""
    return (isinstance(probe, os.PathLike)
            or (_is_local_dataset(probe) and probe not in BUILTIN_PROBES))


def _probe_placeholders(payload: Mapping[str, Any]) -> dict[str, Any]:
    """Stand-in ids for local probes, one each (probe names must not repeat)."""
    probes = payload.get("probes")
    if not isinstance(probes, list) or not any(_is_local_probe(p) for p in probes):
        return {}
    return {"probes": [f"sha256:{n + 1:012x}" + "0" * 52 if _is_local_probe(p) else p
                       for n, p in enumerate(probes)]}


def _pack_options(options: PackOptions | Mapping[str, Any] | None) -> PackOptions | None:
    if options is None or isinstance(options, PackOptions):
        return options
    try:
        return PackOptions.model_validate(dict(options))
    except ValidationError as exc:
        raise UsageError.from_validation("dataset options", exc.errors()) from None


def _check_file(path: Path, kind: str) -> Path:
    """The service's own header checks, run here first: a pickle or a truncated file fails in
    milliseconds instead of after a long upload."""
    try:
        if kind == "datasets":
            check_dataset(path)
        else:
            read_header(path)
    except SafetensorsError as exc:
        raise InvalidFile(f"{path}: {exc.message}", code=exc.code, details=exc.details) from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror}") from None
    return path


def _validate_spec(payload: Mapping[str, Any]) -> Spec:
    try:
        return Spec.model_validate(payload)
    except ValidationError as exc:
        # The service's own words for the same spec (stitchsim.validation): one shape.
        raise InvalidSpec.from_validation("invalid spec", exc.errors()) from None


def _short(object_id: str) -> str:
    return object_id[:19] + "…" if len(object_id) > 20 else object_id

