"""Workers that cannot outlive whoever started them, and node names that cannot run twice.

`serve` hands each worker the read end of a pipe whose write end only serve holds. However
serve dies (SIGKILL included: the kernel closes its descriptors), the worker reads end of file,
shuts down cold (its running job goes back to the queue, the job table keeps the state), and
is killed with its pool children if that takes too long. The pipe, not PR_SET_PDEATHSIG, is the
parent link because the death signal follows the *thread* that forked, and serve restarts
workers from its supervisor thread.

Pool children get PR_SET_PDEATHSIG from their Celery parent, so a worker killed with -9 takes
its running job with it instead of leaving an orphan computing on the GPU.

A node name is held by an exclusive lock on a file under the data directory for the worker's
whole life (its pool children inherit it): a restarted worker waits for the old one to be gone
before it takes the name, so the job table never sees two live workers under one name.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import logging
import os
import re
import signal
import socket
import threading
import time
from pathlib import Path
from typing import IO

log = logging.getLogger("stitchsim.worker")

PIPE_ENV = "STITCHSIM_LIFELINE_FD"
"""The inherited descriptor a worker started by serve watches (unset: nothing to watch)."""

_PR_SET_PDEATHSIG = 1


def watch_lifeline(grace_s: float) -> None:
    """If this process was started with a lifeline, shut down when its far end closes."""
    raw = os.environ.pop(PIPE_ENV, None)
    if raw is None:
        return
    fd = int(raw)
    threading.Thread(target=_wait_for_parent, args=(fd, grace_s), name="stitchsim-lifeline",
                     daemon=True).start()


def _wait_for_parent(fd: int, grace_s: float) -> None:
    with contextlib.suppress(OSError):
        while os.read(fd, 1):
            pass
    log.warning("the process that started this worker is gone; shutting down (jobs go back "
                "to the queue)")
    # Cold shutdown of the Celery parent: running tasks get the grace period, then stop.
    with contextlib.suppress(ProcessLookupError):
        os.kill(os.getpid(), signal.SIGQUIT)
    time.sleep(grace_s + 5.0)
    # Still here: take the pool children along (they share this process group).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(os.getpgid(0), signal.SIGKILL)
    os._exit(1)


def die_with_parent() -> None:
    """In a pool child: SIGKILL when the Celery parent dies (Linux; elsewhere a no-op)."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the call took effect
        os._exit(1)


def ignore_terminate_while_exiting() -> None:
    """In a pool child that is exiting: ignore SIGTERM from here on.

    billiard's exiting child writes its DEATH note to the pool's result pipe under a lock
    shared with every pool process, with SIGTERM blocked in its main thread only; the parent,
    on reading the note, sends SIGTERM to the child again. A child released for idleness
    (the idle release terminates it with SIGTERM, whose handler then falls back to the default
    action) that has other threads (torch's) gets that second SIGTERM on one of them and is
    killed before it lets go of the lock: the next pool process then blocks forever on its
    first write (the ACK of the job it took), and the job stays queued with the worker idle.
    Ignored, the second signal is harmless; the child exits on its own a second later."""
    with contextlib.suppress(ValueError, OSError):  # ValueError: not the main thread
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


# ---------------------------------------------------------------- node names


class NameTaken(RuntimeError):
    """Another live worker holds the node name."""


def expand_node_name(name: str) -> str:
    """Celery's %h (host name), %n (name part) and %d (domain) in a node name."""
    host = socket.gethostname()
    short, _, domain = host.partition(".")
    return re.sub(r"%[hnd%]", lambda m: {"%h": host, "%n": short, "%d": domain,
                                        "%%": "%"}[m.group(0)], name)


def hold_node_name(lock_dir: Path, name: str, wait_s: float) -> IO[bytes]:
    """An exclusive lock on the node name, waiting up to wait_s for a previous holder (a worker
    of a killed serve in its cold shutdown) to exit. Keep the returned file open for the
    process's life; raises NameTaken with the holder's pid when it does not let go."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9_.@-]", "_", name)
    fh = open(lock_dir / f"{safe}.lock", "a+b")  # noqa: SIM115 (held for the process's life)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = _holder(fh)
                fh.close()
                raise NameTaken(f"a worker named {name!r} is already running (pid {holder}); "
                                "stop it or choose another --name") from None
            time.sleep(0.2)
    fh.seek(0)
    fh.truncate()
    fh.write(str(os.getpid()).encode())
    fh.flush()
    return fh


def _holder(fh: IO[bytes]) -> str:
    with contextlib.suppress(OSError, ValueError):
        fh.seek(0)
        return fh.read().decode().strip() or "?"
    return "?"
