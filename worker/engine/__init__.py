"""The compute engine: stitching, IRIs, metrics and controls. Knows nothing of HTTP or Celery.

Public surface:
    run_job(spec, resources=..., progress=..., should_cancel=..., job_id=...) -> Report
    check_spec(spec, resources=...) -> None   (raises SpecError; cheap, CPU only)
    list_stitch_points(arch, arch_kwargs) -> list[str]
"""

from stitchsim_worker.engine.errors import JobCancelled, SpecError
from stitchsim_worker.engine.job import check_spec, run_job
from stitchsim_worker.engine.points import list_stitch_points
from stitchsim_worker.engine.resources import CancelFn, ProgressFn, Resources

__all__ = [
    "CancelFn",
    "JobCancelled",
    "ProgressFn",
    "Resources",
    "SpecError",
    "check_spec",
    "list_stitch_points",
    "run_job",
]
