"""The autoscaler behind STITCHSIM_WORKER_IDLE_RELEASE_S: Celery's, made safe for the threaded
pool that brokers without an event loop (the embedded SQLite one) get."""

from __future__ import annotations

from typing import Any

from celery.worker.autoscale import Autoscaler


class SupervisedAutoscaler(Autoscaler):
    """Celery's autoscaler, except that beside a threaded pool it leaves starting and reaping
    pool processes to the pool's own supervisor thread.

    Celery's also runs the pool's upkeep from its own thread right after it scales. Two
    threads doing upkeep at once can each see a process the other has added but not yet
    started as one that has exited: billiard's supervisor then crashes (KeyError(None)),
    which ends the worker and strands the task it had reserved. Seen on the first spec check
    after an idle spell. With an event loop (Redis) everything runs on one thread, so there
    the upkeep stays immediate.
    """

    def maybe_scale(self, req: Any = None) -> None:
        if self.worker is None or self.worker.use_eventloop:
            super().maybe_scale(req)
            return
        if req is not None:
            self.on_task_received(req)
        self._maybe_scale(req)  # the supervisor starts the process within its 0.8 s beat
