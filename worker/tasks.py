"""Celery tasks: thin wrappers; the work is in runner.py and the engine."""

from __future__ import annotations

from typing import Any

from stitchsim_service.core.queue import CHECK_TASK, POINTS_TASK, RUN_TASK
from stitchsim_worker.celery_app import app, worker_context
from stitchsim_worker.runner import (
    check_slot_held,
    check_spec_doc,
    execute_job,
    stitch_points_doc,
)


@app.task(name=RUN_TASK, bind=True, acks_late=True, reject_on_worker_lost=True,
          ignore_result=True)
def run_job(self: Any, job_id: str) -> str:
    return execute_job(worker_context(), job_id, self.request.hostname or "worker")


# A check is worthless once the gateway stopped waiting: no redelivery, a short limit. The
# gateway sends each with its own limits (the check timeout: service/core/queue.py); these
# hold for a sender that does not. `slot`: the key's pending-check slot, freed at the end.
@app.task(name=CHECK_TASK, acks_late=False, time_limit=120, soft_time_limit=110)
def check_spec(spec: dict[str, Any], slot: str | None = None) -> dict[str, Any]:
    ctx = worker_context()
    with check_slot_held(ctx, slot):
        return check_spec_doc(ctx, spec)


@app.task(name=POINTS_TASK, acks_late=False, time_limit=120, soft_time_limit=110)
def stitch_points(checkpoint_id: str, ref: dict[str, Any],
                  slot: str | None = None) -> dict[str, Any]:
    ctx = worker_context()
    with check_slot_held(ctx, slot):
        return stitch_points_doc(ctx, checkpoint_id, ref)
