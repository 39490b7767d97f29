"""`stitchsim-server`: serve (gateway + workers), gateway, worker, keys, and run (if present)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

log = logging.getLogger("stitchsim.server")


def _apply_env(args: argparse.Namespace) -> None:
    """Flags win over the environment; children inherit them through it."""
    for flag, var in (("data_dir", "STITCHSIM_DATA_DIR"), ("host", "STITCHSIM_HOST"),
                      ("port", "STITCHSIM_PORT"), ("redis_url", "STITCHSIM_REDIS_URL"),
                      ("database_url", "STITCHSIM_DATABASE_URL"),
                      ("store_url", "STITCHSIM_STORE_URL"),
                      ("gateway_workers", "STITCHSIM_GATEWAY_WORKERS")):
        value = getattr(args, flag, None)
        if value is not None:
            os.environ[var] = str(Path(value).resolve()) if flag == "data_dir" else str(value)
    # Relative data dirs would differ between processes started from different places.
    if "STITCHSIM_DATA_DIR" in os.environ:
        os.environ["STITCHSIM_DATA_DIR"] = str(Path(os.environ["STITCHSIM_DATA_DIR"]).resolve())
    else:
        os.environ["STITCHSIM_DATA_DIR"] = str(Path(".stitchsim").resolve())


def _settings():  # type: ignore[no-untyped-def]
    from stitchsim_service.core.settings import Settings, get_settings

    get_settings.cache_clear()
    s: Settings = get_settings()
    return s


GATEWAY_APP = "stitchsim_service.gateway.main:create_app"
"""By import string: the worker side never imports the gateway (nor FastAPI) itself, and
uvicorn could start several processes of it."""


SERVE_STOP_S = 10.0
"""`serve` is gone this long after SIGTERM or ^C at the most: gateway, workers, pool children."""
GATEWAY_GRACE_S = 10
"""How long a gateway's open requests (long-polls, uploads) may go on once told to stop."""
SERVE_GATEWAY_GRACE_S = 5
"""The same under serve, which must be gone within SERVE_STOP_S."""
WORKER_GRACE_S = 3.0
"""Under serve, the most a running job gets to finish once told to stop (it goes back to the
queue if it does not): STITCHSIM_SHUTDOWN_GRACE_S is capped at this for serve's workers."""


def _run_gateway(host: str, port: int, log_level: str, grace_s: int,
                 on_signal: Callable[[], None] | None = None) -> None:
    """The gateway in this process until a signal stops it, with grace_s for open requests
    then; on_signal is called as the signal arrives, before the gateway's own graceful
    shutdown (serve stops its workers meanwhile)."""
    import uvicorn

    settings = _settings()  # flags and environment are applied: the app reads the same
    # Stock uvicorn, public settings only: requests beyond limit_concurrency get its 503 (the
    # edge limits before a request exists are the reverse proxy's: docs/deploy.md).
    opts: dict[str, Any] = dict(factory=True, host=host, port=port, log_level=log_level,
                                timeout_graceful_shutdown=grace_s,
                                limit_concurrency=settings.max_connections)
    if settings.gateway_workers > 1 or on_signal is None:
        # Several processes (uvicorn's workers) share the port; the job table is all they
        # share. uvicorn's own supervisor handles the signals then.
        workers = settings.gateway_workers if settings.gateway_workers > 1 else None
        uvicorn.run(GATEWAY_APP, workers=workers, **opts)
        return
    server = _gateway_server(uvicorn.Config(GATEWAY_APP, **opts), on_signal)
    server.run()
    if not server.started:
        sys.exit(3)  # as uvicorn.run exits when the gateway cannot start (port taken)


def _gateway_server(config: Any, on_signal: Callable[[], None]) -> Any:
    """uvicorn's server, telling serve of a stop signal the moment it arrives."""
    import uvicorn

    class Gateway(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            on_signal()
            super().handle_exit(sig, frame)

    return Gateway(config)


# ---------------------------------------------------------------- serve


class Supervisor:
    """Keeps worker processes alive beside the gateway; restarts them if they die."""

    def __init__(self, commands: list[list[str]]):
        self.commands = commands
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * len(commands)
        # Write ends of the workers' lifelines: only this process holds them, so they close
        # (and the workers shut down) however it dies.
        self._lifelines: list[int | None] = [None] * len(commands)
        self._stop = threading.Event()
        self._stopping_since = 0.0
        self._thread = threading.Thread(target=self._watch, name="supervisor", daemon=True)

    def _spawn(self, i: int) -> None:
        from stitchsim_worker.lifeline import PIPE_ENV

        old = self._lifelines[i]
        if old is not None:
            os.close(old)
        read_end, write_end = os.pipe()
        env = {**os.environ, PIPE_ENV: str(read_end)}
        try:
            # Own session: a signal to the worker reaches its pool children, and ^C in the
            # terminal reaches only serve, which shuts the workers down in order.
            self.procs[i] = subprocess.Popen(self.commands[i], start_new_session=True, env=env,
                                             pass_fds=(read_end,))
        finally:
            os.close(read_end)
        self._lifelines[i] = write_end

    def start(self) -> None:
        for i in range(len(self.commands)):
            self._spawn(i)
        self._thread.start()

    def _watch(self) -> None:
        backoff = [1.0] * len(self.commands)
        while not self._stop.wait(0.5):
            for i, p in enumerate(self.procs):
                if p is not None and p.poll() is not None and not self._stop.is_set():
                    log.warning("worker %d exited with %s; restarting in %.0f s", i,
                                p.returncode, backoff[i])
                    if self._stop.wait(backoff[i]):
                        return
                    backoff[i] = min(backoff[i] * 2, 30.0)
                    self._spawn(i)

    def begin_stop(self) -> None:
        """Tell every worker to stop, without waiting (from a signal handler: the gateway shuts
        down meanwhile). Later calls do nothing."""
        if self._stop.is_set():
            return
        self._stopping_since = time.monotonic()
        self._stop.set()
        for p in self.procs:
            if p is not None and p.poll() is None:
                # Cold shutdown: Celery gives running tasks worker_soft_shutdown_timeout, then
                # stops them; their messages go back to the queue (acks late), the job table
                # keeps state. The Celery parent only: its pool processes would exit on the
                # signal at once, job and all, and be forked again.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGQUIT)

    def stop(self, within: float) -> None:
        """Stop the workers: gone `within` seconds after begin_stop (or now), their process
        groups (pool children included) killed if they take longer."""
        self.begin_stop()
        deadline = self._stopping_since + within
        for p in self.procs:
            if p is None:
                continue
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker %d still running %.1f s after it was told to stop; killing "
                            "it (its job goes back to the queue)", p.pid, within)
            # Killed whether or not the worker itself has exited: no pool child may outlive it.
            _signal_group(p, signal.SIGKILL)
            p.wait()


def _signal_group(p: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, sig)


def _worker_command(queues: str, concurrency: int, name: str, loglevel: str) -> list[str]:
    return [sys.executable, "-m", "stitchsim_worker.cli", "worker", "--queues", queues,
            "--concurrency", str(concurrency), "--name", name, "--loglevel", loglevel]


def cmd_serve(args: argparse.Namespace) -> int:
    _apply_env(args)
    settings = _settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    commands = []
    if args.workers > 0:
        commands.append(_worker_command("gpu", args.workers, "gpu@%h", args.loglevel))
        # Spec checks get their own process, so a long job never delays a submission's 422.
        commands.append(_worker_command("checks", 1, "checks@%h", args.loglevel))
    mode = "Redis " + settings.redis_url if settings.redis_url else "embedded SQLite broker"
    print(f"stitchsim-server: data in {settings.data_dir}, {mode}, "
          f"http://{settings.host}:{settings.port}", flush=True)
    if settings.embedded:
        # Create the broker's tables once, before several workers race to.
        from stitchsim_service.core.queue import JobQueue

        JobQueue(settings).ping()
    # A running job gets a grace that fits serve's own stop (SERVE_STOP_S).
    os.environ["STITCHSIM_SHUTDOWN_GRACE_S"] = str(min(settings.shutdown_grace_s,
                                                       WORKER_GRACE_S))
    sup = Supervisor(commands)

    def _exit(signum: int, _frame: object) -> None:
        # Before and after the gateway runs (uvicorn re-raises the signal that stopped it once
        # it has shut down): SystemExit lets the finally below stop the workers instead of
        # orphaning them.
        sup.begin_stop()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)
    signal.signal(signal.SIGINT, _exit)
    sup.start()
    try:
        # The workers are told to stop as the signal arrives, and stop beside the gateway.
        _run_gateway(settings.host, settings.port, args.loglevel, SERVE_GATEWAY_GRACE_S,
                     on_signal=sup.begin_stop)
    finally:
        # A margin under SERVE_STOP_S for this process's own exit on a loaded machine.
        sup.stop(within=SERVE_STOP_S - 2.5)
    return 0


def cmd_gateway(args: argparse.Namespace) -> int:
    _apply_env(args)
    settings = _settings()
    _run_gateway(settings.host, settings.port, args.loglevel, GATEWAY_GRACE_S)
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    _apply_env(args)
    settings = _settings()
    concurrency = args.concurrency or settings.worker_concurrency
    from stitchsim_worker.lifeline import (
        NameTaken,
        expand_node_name,
        hold_node_name,
        watch_lifeline,
    )

    name = expand_node_name(args.name or "celery@%h")
    name_lock: IO[bytes] | None
    try:
        # Held until this process and its pool children are gone; a previous holder in its
        # cold shutdown gets the grace period and some to let go.
        name_lock = hold_node_name(settings.data_dir / "workers", name,
                                   wait_s=settings.shutdown_grace_s + 15.0)
    except NameTaken as exc:
        print(f"stitchsim-server worker: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a read-only data dir: run, but the name is not guarded
        log.warning("cannot lock the node name %s (%s); a second worker could take it", name,
                    exc)
        name_lock = None
    watch_lifeline(settings.shutdown_grace_s)
    if name_lock is not None and "gpu" in args.queues.split(","):
        _requeue_own_jobs(settings, name)
    from stitchsim_worker.celery_app import QUEUES_ENV

    # Read by the pool children: a checks-only worker runs under the checks' memory limit.
    os.environ[QUEUES_ENV] = args.queues
    pool = ["--concurrency", str(concurrency)]
    if settings.worker_idle_release_s > 0:
        # Celery's autoscaler down to no process: idle, nothing holds torch; a task forks a
        # child at once. Read by celery.worker.autoscale at import, hence the environment.
        os.environ["AUTOSCALE_KEEPALIVE"] = str(settings.worker_idle_release_s)
        pool = ["--autoscale", f"{concurrency},0"]
    from stitchsim_worker.celery_app import app

    argv = ["worker", "--queues", args.queues, *pool,
            "--loglevel", args.loglevel.upper(), "--without-gossip", "--without-mingle",
            "--without-heartbeat", "--pool", "prefork", "--hostname", name]
    try:
        app.worker_main(argv)
    finally:
        if name_lock is not None:
            name_lock.close()
    return 0


def _requeue_own_jobs(settings: Any, name: str) -> None:
    """Jobs still marked running under this node name lost their process (a killed serve):
    this one holds the name, so none of them runs anywhere."""
    from stitchsim_service.core.context import Context
    from stitchsim_service.core.reaper import requeue_node_once

    try:
        ctx = Context.open(settings, with_queue=True)
        n = requeue_node_once(ctx, name)
    except Exception as exc:  # noqa: BLE001 - the reaper requeues them later anyway
        log.warning("could not requeue the jobs %s was running: %s", name, exc)
        return
    if n:
        log.warning("requeued %d job(s) %s was running when its previous process died", n,
                    name)


def cmd_keys(args: argparse.Namespace) -> int:
    _apply_env(args)
    from stitchsim_service.core.db import get_database
    from stitchsim_service.core.keys import LOCAL_OWNER, create_key, list_keys, revoke_key

    db = get_database(_settings().resolved_database_url)
    if args.keys_cmd == "create":
        new = create_key(db, args.name)
        print(f"id:  {new.id}\nkey: {new.key}\n(shown once: only its hash is stored)")
        if any(v is not None for v in (args.max_jobs, args.max_stored_bytes, args.max_units)):
            return _set_limits(db, new.id, args)
    elif args.keys_cmd == "list":
        for row in list_keys(db):
            state = f"revoked {row.revoked_at:%Y-%m-%d}" if row.revoked_at else "active"
            print(f"{row.id}\t{row.name}\t{row.created_at:%Y-%m-%d %H:%M}\t{state}")
    elif args.keys_cmd == "revoke":
        if not revoke_key(db, args.id):
            print(f"no active key {args.id}", file=sys.stderr)
            return 1
        print(f"revoked {args.id}")
    elif args.keys_cmd == "limits":
        if args.id != LOCAL_OWNER and args.id not in {r.id for r in list_keys(db)}:
            print(f"no key {args.id} (see `stitchsim-server keys list`)", file=sys.stderr)
            return 1
        return _set_limits(db, args.id, args)
    return 0


def _set_limits(db, owner: str, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    from stitchsim_service.core import quotas

    changes = {name: None if value == "default" else value
               for name, value in (("max_active_jobs", args.max_jobs),
                                   ("max_stored_bytes", args.max_stored_bytes),
                                   ("max_active_units", args.max_units))
               if value is not None}
    settings = _settings()
    with db.write() as s:
        if changes:
            quotas.set_limits(s, owner, changes)
            s.flush()
        u = quotas.usage(s, settings, owner)
    units = "no limit" if u.max_active_units is None else f"{u.max_active_units}"
    print(f"{owner}: {u.active_jobs} of {u.max_active_jobs} jobs in flight, "
          f"{u.active_units} of {units} work units in flight, "
          f"{u.stored_bytes} of {u.max_stored_bytes} bytes stored")
    return 0


def _limit(kind: str):  # type: ignore[no-untyped-def]
    """argparse type: a count, a size like 20G (bytes), or "default"."""
    units = {"k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}

    def parse(text: str) -> int | str:
        t = text.strip().lower()
        if t == "default":
            return t
        factor = 1
        if kind == "bytes" and t[-1:] in units:
            factor, t = units[t[-1]], t[:-1]
        try:
            value = int(float(t) * factor)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value < 0:
            raise argparse.ArgumentTypeError("limits cannot be negative")
        return value

    return parse


def _limit_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-jobs", type=_limit("count"),
                   help="jobs queued or running at once (STITCHSIM_MAX_ACTIVE_JOBS_PER_KEY "
                        "when 'default')")
    p.add_argument("--max-stored-bytes", type=_limit("bytes"),
                   help="bytes of checkpoints and datasets kept, e.g. 20G "
                        "(STITCHSIM_MAX_STORED_BYTES_PER_KEY when 'default')")
    p.add_argument("--max-units", type=_limit("count"),
                   help="estimated work units of the jobs queued or running at once, e.g. "
                        "3000000 (STITCHSIM_MAX_ACTIVE_UNITS_PER_KEY when 'default')")


# ---------------------------------------------------------------- parser


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", help="data directory (STITCHSIM_DATA_DIR, default .stitchsim)")
    p.add_argument("--redis-url", help="use Redis as broker (STITCHSIM_REDIS_URL)")
    p.add_argument("--database-url", help="job table URL (STITCHSIM_DATABASE_URL)")
    p.add_argument("--store-url", help="blob store dir or URL (STITCHSIM_STORE_URL)")
    p.add_argument("--loglevel", default="info",
                   choices=["debug", "info", "warning", "error", "critical"])


_GATEWAY_WORKERS_HELP = ("gateway processes on the one port (STITCHSIM_GATEWAY_WORKERS, "
                         "default 1); see docs/deploy.md")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stitchsim-server",
        description="stitchsim server side: the HTTP gateway, Celery workers, one-off runs.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="gateway and workers in one go (embedded default: no "
                                     "external server needed)")
    _common(p)
    p.add_argument("--host", help="bind address (STITCHSIM_HOST, default 127.0.0.1); beyond "
                                  "loopback API keys are required")
    p.add_argument("--port", type=int, help="port (STITCHSIM_PORT, default 8000)")
    p.add_argument("--workers", type=int, default=1,
                   help="concurrent jobs (one per GPU); 0 = gateway only")
    p.add_argument("--gateway-workers", type=int, help=_GATEWAY_WORKERS_HELP)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("gateway", help="the HTTP gateway alone (workers run elsewhere)")
    _common(p)
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--gateway-workers", type=int, help=_GATEWAY_WORKERS_HELP)
    p.set_defaults(func=cmd_gateway)

    p = sub.add_parser("worker", help="a Celery worker (Redis deployments: run one per GPU)")
    _common(p)
    p.add_argument("--queues", default="gpu,checks",
                   help="queues to consume: gpu (jobs), checks (submission-time spec checks)")
    p.add_argument("--concurrency", type=int, default=None,
                   help="jobs at once in this worker (STITCHSIM_WORKER_CONCURRENCY, default 1)")
    p.add_argument("--name", help="Celery node name, e.g. gpu0@%%h")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("keys", help="manage API keys (stored hashed)")
    _common(p)
    ks = p.add_subparsers(dest="keys_cmd", required=True)
    c = ks.add_parser("create", help="create a key and print it once")
    c.add_argument("name")
    _limit_flags(c)
    ks.add_parser("list", help="list keys (ids and names, never the keys)")
    r = ks.add_parser("revoke", help="revoke a key by id")
    r.add_argument("id")
    q = ks.add_parser("limits", help="show or set a key's own quotas (no flags: show)")
    q.add_argument("id", help="key id (from `keys list`), or 'local' for keyless loopback use")
    _limit_flags(q)
    p.set_defaults(func=cmd_keys)

    try:
        from stitchsim_worker.run_command import add_run_parser
    except ImportError:
        pass
    else:
        add_run_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: "
                                                   "%(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    rc = args.func(args)
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
