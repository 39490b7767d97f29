"""Scales a real threaded prefork pool (what a worker on the embedded broker runs) up and down
as the idle release does, with an autoscaler class, and exits 0 if the pool survived.

    python -m tests.service.autoscale_cycles stock|ours CYCLES

Every fork is slowed past the pool supervisor's 0.8 s beat (os.register_at_fork), so a race
between two threads doing the pool's upkeep, which otherwise needs a fork to meet the beat by
chance, happens on the first scale-up."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from types import SimpleNamespace

from celery import Celery
from celery.concurrency.prefork import TaskPool
from celery.worker import state
from celery.worker.autoscale import Autoscaler
from stitchsim_worker.autoscale import SupervisedAutoscaler

CLASSES = {"stock": Autoscaler, "ours": SupervisedAutoscaler}


class _Request:
    """A reserved task, as the autoscaler counts them (state.reserved_requests is weak)."""


def _until(done: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit("the pool did not scale in time")
        time.sleep(0.01)


def main(which: str, cycles: int) -> None:
    app = Celery(set_as_current=False)
    pool = TaskPool(limit=1, app=app, initargs=(app, "cycles"), threads=True)
    pool.start()
    processes = pool._pool._pool  # billiard's list of pool processes: what the test watches
    scaler = CLASSES[which](pool, 1, 0, worker=SimpleNamespace(use_eventloop=False),
                            keepalive=0.01)
    os.register_at_fork(before=lambda: time.sleep(1.0))
    request = _Request()

    def task_arrives() -> None:  # up to one process
        state.reserved_requests.add(request)
        scaler.maybe_scale(request)
        _until(lambda: len(processes) == 1 and processes[0].pid is not None)

    def idle() -> None:  # past the keepalive: down to none
        state.reserved_requests.discard(request)
        time.sleep(0.02)
        scaler.maybe_scale()
        _until(lambda: not processes)

    task_arrives()  # the pool starts with its process: this one forks nothing
    idle()
    for _ in range(cycles):
        task_arrives()
        idle()
    print(f"{which}: {cycles} cycles, the pool alive", flush=True)
    pool.stop()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
