"""The compute engine: stitching, IRIs, metrics and controls. Knows nothing of HTTP or Celery.

Public surface:
    run_job(spec, resources=..., progress=..., should_cancel=..., job_id=...) -> Report
    check_spec(spec, resources=...) -> Checked (meta device, no weights)
    Both raise the contract's Failure (stitchsim.failure) with what to fix, or what broke.
    list_stitch_points(arch, arch_kwargs) -> list[str]
"""

from stitchsim_worker.engine.core.errors import JobCancelled
from stitchsim_worker.engine.core.resources import CancelFn, ProgressFn, Resources
from stitchsim_worker.engine.job.check import check_spec
from stitchsim_worker.engine.job.run import run_job
from stitchsim_worker.engine.models.points import list_stitch_points

__all__ = [
    "CancelFn",
    "JobCancelled",
    "ProgressFn",
    "Resources",
    "check_spec",
    "list_stitch_points",
    "run_job",
]
