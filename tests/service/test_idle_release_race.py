"""The idle release (STITCHSIM_WORKER_IDLE_RELEASE_S) scales a worker's pool between no
process and one with Celery's autoscaler. On the embedded broker the pool is threaded, and
Celery's own autoscaler does the pool's upkeep from its thread beside billiard's supervisor:
when a fork lands on the supervisor's beat, the supervisor takes the process being started for
one that exited, crashes on KeyError(None), and the worker dies with the task it reserved (a
spec check that hung until the client gave up, seen once in a suite run). Ours leaves the
upkeep to the supervisor alone."""

from __future__ import annotations

import subprocess
import sys

from celery.utils.imports import symbol_by_name
from stitchsim_worker.autoscale import SupervisedAutoscaler
from stitchsim_worker.celery_app import app

from tests.fixtures_models import REPO


def _cycles(which: str, cycles: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tests.service.autoscale_cycles", which,
                           str(cycles)], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_the_workers_autoscaler_is_ours() -> None:
    assert symbol_by_name(app.conf.worker_autoscaler) is SupervisedAutoscaler


def test_scaling_up_never_races_the_pool_supervisor() -> None:
    # Every fork slowed past the supervisor's beat: Celery's autoscaler loses the pool on the
    # first scale-up, which shows the race is really there to be won...
    stock = _cycles("stock", 1)
    assert stock.returncode != 0, stock.stdout
    assert "'Supervisor' crashed: KeyError(None)" in stock.stderr, stock.stderr[-3000:]
    # ...and ours scales up and down three times with the pool alive.
    ours = _cycles("ours", 3)
    assert ours.returncode == 0, ours.stderr[-3000:]
    assert "ours: 3 cycles, the pool alive" in ours.stdout
    assert "crashed" not in ours.stderr, ours.stderr[-3000:]
