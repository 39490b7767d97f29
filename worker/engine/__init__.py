"""The compute engine: stitching, IRIs, metrics and controls. Knows nothing of HTTP or Celery.

Public surface:
    run_job(spec, resources=..., progress=..., should_cancel=..., job_id=...) -> Report
    check_spec(spec, resources=...) -> Checked (raises SpecError; meta device, no weights)
    list_stitch_points(arch, arch_kwargs) -> list[str]
"""

from stitchsim_worker.engine.errors import EngineFailure, JobCancelled, SpecError
from stitchsim_worker.engine.job.check import check_spec
from stitchsim_worker.engine.job.run import run_job
from stitchsim_worker.engine.models.points import list_stitch_points
from stitchsim_worker.engine.resources import CancelFn, ProgressFn, Resources

__all__ = [
    "CancelFn",
    "EngineFailure",
    "JobCancelled",
    "ProgressFn",
    "Resources",
    "SpecError",
    "check_spec",
    "list_stitch_points",
    "run_job",
]
