"""The Celery app of the workers: `celery -A stitchsim_worker.celery_app worker`, or
`stitchsim-server worker`. Configuration comes from STITCHSIM_* like the gateway's."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
from typing import Any

from celery import Celery
from celery.signals import (
    task_received,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)
from stitchsim_service.core import jobs, workers
from stitchsim_service.core.context import Context
from stitchsim_service.core.db import forget_inherited_databases
from stitchsim_service.core.queue import CHECKS_QUEUE, GPU_QUEUE, RUN_TASK, make_celery
from stitchsim_service.core.settings import get_settings
from stitchsim_worker.lifeline import die_with_parent, ignore_terminate_while_exiting

log = logging.getLogger("stitchsim.worker")

app: Celery = make_celery(get_settings())
app.conf.include = ["stitchsim_worker.tasks"]
app.conf.worker_autoscaler = "stitchsim_worker.autoscale:SupervisedAutoscaler"

_ctx: Context | None = None
_ctx_pid: int | None = None


def worker_context() -> Context:
    """This process's context (a forked pool child builds its own)."""
    global _ctx, _ctx_pid
    if _ctx is None or _ctx_pid != os.getpid():
        _ctx = Context.open(get_settings())
        _ctx_pid = os.getpid()
    return _ctx


QUEUES_ENV = "STITCHSIM_WORKER_QUEUES"
"""The queues the worker consumes, as `stitchsim-server worker` was told (for its children)."""


@worker_process_init.connect
def _child_init(**_: Any) -> None:
    # A job must not go on computing in an orphan once its worker is gone (kill -9, OOM).
    die_with_parent()
    forget_inherited_databases()
    settings = get_settings()
    if os.environ.get(QUEUES_ENV) == CHECKS_QUEUE:
        _limit_memory(settings.check_memory_bytes)
    if settings.worker_idle_release_s > 0:
        # Forked when a task arrives and gone when idle: the task's own imports load the
        # engine, and an idle worker holds no torch at all.
        return
    # Kept for the worker's life: import the engine (torch, timm) and what its first check
    # imports on first use (transformers, torchvision's registry, the built-in data's loader)
    # now, after the fork, so the parent stays light and never initialises CUDA, and the first
    # task does not pay for it: a cold transformers import would take much of a spec check's
    # time limit.
    try:
        import stitchsim_worker.engine  # noqa: F401
        from stitchsim_worker.engine.warm import warm_up

        took = warm_up()
    except Exception as exc:
        log.error("the engine cannot be imported: %s", exc)
        return
    log.info("pool process %d warmed up: %s", os.getpid(),
             ", ".join(f"{name} {seconds:.1f} s" for name, seconds in took.items()))


@worker_process_shutdown.connect
def _child_exiting(**_: Any) -> None:
    # Sent in the pool child by billiard's exit path, before it writes its DEATH note.
    ignore_terminate_while_exiting()


def _limit_memory(limit: int | None) -> None:
    """An address-space limit for a child that only checks specs: a spec that gets past the
    check's estimates fails there with MemoryError (answered 422), not the host."""
    if not limit:
        return
    # Checks compute on the meta device: one thread is all they need, and every thread's
    # stack and malloc arena would count against the limit.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    os.environ.setdefault("MALLOC_ARENA_MAX", "2")
    import resource

    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (ValueError, OSError) as exc:
        log.warning("cannot limit the spec check's memory: %s", exc)


@task_received.connect
def _received(request: Any = None, **_: Any) -> None:
    # In the parent, as the broker hands the task over: lets the reaper tell a job whose
    # worker died before starting it from one still waiting in the queue.
    if request is None or request.name != RUN_TASK or not request.args:
        return
    try:
        jobs.mark_delivered(worker_context(), str(request.args[0]), request.hostname or "")
    except Exception as exc:
        log.warning("could not mark delivery: %s", exc)


class _Presence:
    """The worker's entry in the workers table, refreshed while the process lives."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.name = ""
        self.queues = ""
        self.calibration: str | None = None
        """This worker's device calibration as JSON, once measured (job workers only)."""

    def run(self) -> None:
        ctx = None
        while ctx is None:
            try:
                ctx = worker_context()
            except Exception as exc:
                # Processes starting together can find the job table locked for a moment; a
                # worker that never registers would never be seen as ready.
                log.warning("job table not reachable yet (%s); retrying", exc)
                if self.stop.wait(1.0):
                    return
        period = min(5.0, ctx.settings.heartbeat_s)
        while True:
            try:
                workers.announce(ctx, self.name, self.queues, self.calibration)
            except Exception as exc:
                log.warning("presence update failed: %s", exc)
            if self.stop.wait(period):
                return


_presence = _Presence()


@worker_ready.connect
def _ready(sender: Any = None, **_: Any) -> None:
    # sender is the worker's Consumer: it knows the node name and the queues it consumes.
    queues = list(app.amqp.queues.consume_from or {}) if app.amqp.queues else []
    _presence.name = getattr(sender, "hostname", None) or f"worker@{socket.gethostname()}"
    _presence.queues = ",".join(sorted(queues)) or "gpu"
    threading.Thread(target=_presence.run, name="stitchsim-presence", daemon=True).start()
    if GPU_QUEUE in queues and get_settings().calibration != "off":
        threading.Thread(target=_calibrate, name="stitchsim-calibrate", daemon=True).start()


CALIBRATE_TIMEOUT_S = 600


def _calibrate() -> None:
    """Measure (or read from the cache) this worker's device calibration and announce it. In
    a child process: the worker's parent never imports torch nor initialises CUDA. The worker
    is ready before it is calibrated; until then the spec check prices its jobs as
    STITCHSIM_SECONDS_PER_UNIT says."""
    figures = get_settings().calibration
    if figures not in ("auto", "probe"):  # stand-in figures: read here, nothing to measure
        from stitchsim_worker.calibration import parse_stand_in

        _presence.calibration = json.dumps(parse_stand_in(figures).as_dict(), sort_keys=True)
        log.info("device calibration (stand-in): %s", _presence.calibration)
        return
    cmd = [sys.executable, "-m", "stitchsim_worker.cli", "calibrate", "--json"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=CALIBRATE_TIMEOUT_S,
                             check=True).stdout
        doc = json.loads(out.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        detail = getattr(exc, "stderr", "") or ""
        log.error("device calibration failed (%s) %s", exc, detail[-2000:])
        return
    if doc:
        _presence.calibration = json.dumps(doc, sort_keys=True)
        log.info("device calibration: %s", doc)


@worker_shutdown.connect
def _shutdown(**_: Any) -> None:
    _presence.stop.set()
    if not _presence.name:
        return
    try:
        workers.forget(worker_context(), _presence.name)
    except Exception as exc:
        log.warning("could not deregister: %s", exc)
