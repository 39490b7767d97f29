"""What the caller gives a job: how the engine finds files (stored ids resolve through callables
the caller provides), what a job and a model build may take, and where the progress goes."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from stitchsim.failure import Failure
from stitchsim.models import LocalPath
from stitchsim_worker.engine.core.refcache import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_ENTRY_BYTES,
    EntryStore,
    FolderStore,
)

DEFAULT_MAX_MODULES = 2_500
"""Modules one model may have: timm's largest (vit_gigantic, densenet264d) have ~1,200."""


@dataclass(frozen=True)
class BuildLimits:
    """How much a build may register before it is stopped."""

    max_params: int | None = None
    """Parameters (None: no limit, as in `stitchsim-server run`)."""
    max_modules: int | None = DEFAULT_MAX_MODULES
    """Modules (None: no limit, for a job's build of a spec its check already passed)."""


ProgressFn = Callable[[str, int, int, float | None], None]
"""progress(stage, done, total, eta_s): called as long stages advance; eta_s is the engine's
estimate of the seconds left (None until it has measured any work)."""

CancelFn = Callable[[], bool]
"""should_cancel(): polled between batches; True stops the job with JobCancelled."""


def _no_store(kind: str) -> Callable[[str], Path]:
    def resolve(ref: str) -> Path:
        raise Failure("invalid_spec",
                      f"{kind} {ref!r} is a stored id, but this run has no store; give a path")

    return resolve


class DeviceRate(Protocol):
    """How fast the job workers do a work unit (stitchsim_worker.calibration.Calibration)."""

    device: str
    reference_seconds_per_unit: float
    """The rate max_job_units is stated at."""

    def seconds_per_unit(self, size: int) -> float: ...

    def job_limit(self, reference_units: int, size: int) -> int: ...


@dataclass
class Resources:
    cache_dir: Path
    checkpoint_path: Callable[[str], Path] = field(default_factory=lambda: _no_store("checkpoint"))
    dataset_path: Callable[[str], Path] = field(default_factory=lambda: _no_store("dataset"))
    allow_local_paths: bool = True
    memory_budget_bytes: int = 2 * 1024**3
    max_model_params: int | None = None
    """Parameters a model may have (None: no limit, as in `stitchsim-server run`)."""
    max_model_modules: int = DEFAULT_MAX_MODULES
    """Modules a model may have: a build past it is stopped (models.guard)."""

    @property
    def build_limits(self) -> BuildLimits:
        """What a spec check's model build may register before it is stopped."""
        return BuildLimits(self.max_model_params, self.max_model_modules)
    max_job_units: int | None = None
    """Work units (plan.py) a job may take (None: no limit); with a calibration, the units it
    may take on the reference device (calibration.REFERENCE_SECONDS_PER_UNIT), scaled to the
    calibrated device at the job's input size."""
    calibration: DeviceRate | None = None
    """How fast the job workers do a unit, by input size (None: not calibrated)."""
    max_activation_bytes: int | None = None
    """One batch's activation at a model's largest module output (None: no limit)."""
    reference_store: EntryStore | None = None
    """Where the reference's work (IRIs, tensors, logits: engine/core/refcache.py) is kept across
    jobs: the service passes its blob store, shared by every worker. None: a folder of
    cache_dir, pruned to reference_cache_max_bytes."""
    reference_cache_max_bytes: int = DEFAULT_MAX_BYTES
    reference_cache_max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES

    def entry_store(self) -> EntryStore:
        if self.reference_store is not None:
            return self.reference_store
        return FolderStore(self.cache_dir, self.reference_cache_max_bytes)

    def job_budget(self, input_size: int) -> tuple[int | None, float | None]:
        """The unit limit of a job at this input side, and the seconds a unit takes there
        (None where not calibrated)."""
        if self.calibration is None:
            return self.max_job_units, None
        spu = self.calibration.seconds_per_unit(input_size)
        if self.max_job_units is None:
            return None, spu
        return self.calibration.job_limit(self.max_job_units, input_size), spu

    def checkpoint(self, ref: str | LocalPath) -> tuple[Path, str]:
        """Local file and the content id it is reported under."""
        if isinstance(ref, LocalPath):
            return self._local(ref, "checkpoint"), ""
        return self.checkpoint_path(ref), ref

    def dataset(self, ref: str | LocalPath) -> tuple[Path, str]:
        if isinstance(ref, LocalPath):
            return self._local(ref, "dataset"), ""
        return self.dataset_path(ref), ref

    def _local(self, ref: LocalPath, kind: str) -> Path:
        if not self.allow_local_paths:
            raise Failure("invalid_spec",
                          f"local {kind} paths are only accepted by `stitchsim-server run`")
        path = Path(ref.path).expanduser()
        if kind == "checkpoint" and path.is_dir():
            return self._packed_folder(path)
        if not path.is_file():
            raise Failure("invalid_spec", f"{kind} file {str(path)!r} does not exist")
        return path

    def _packed_folder(self, folder: Path) -> Path:
        """A local model folder (save_pretrained, timm hub layout) as the one file an upload
        of it would be, packed into the cache."""
        from stitchsim.files.folder import pack_model_folder

        name = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:16]
        out = self.cache_dir / "folders" / f"{name}.safetensors"
        out.parent.mkdir(parents=True, exist_ok=True)
        return pack_model_folder(folder, out).path
