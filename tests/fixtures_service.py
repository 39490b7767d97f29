"""Real running services for tests: `stitchsim-server serve` on the embedded default, and a
Redis deployment (gateway + separate Celery worker processes). No mocks of our own parts.

live_service    session: serve on a free loopback port, temp data dir, keys not required.
redis_service   session: uvicorn gateway + `worker --queues gpu` + `worker --queues checks`
                against the real Redis at 127.0.0.1:6379 (its own db number, flushed), the job
                table in PostgreSQL at 127.0.0.1:5432, keys required (.api_key and .other_key).
                Without PostgreSQL: a failure under CI; elsewhere SQLite, with a warning (see
                tests/environment.py). Without Redis: a failure under CI, a skip elsewhere.
gateway_service session: `serve --workers 0`, keys required, spec checks off (jobs stay queued).
service_factory function: start more of either kind (for restart tests).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.environment import POSTGRES_ADMIN_URL, in_ci, missing, postgres_problem, require_redis

REDIS_HOST = "127.0.0.1:6379"

# Fast failure detection, so restart tests take seconds, not minutes.
FAST_ENV = {
    "STITCHSIM_HOST": "127.0.0.1",
    "STITCHSIM_HEARTBEAT_S": "0.5",
    "STITCHSIM_STALE_AFTER_S": "4",
    "STITCHSIM_REAP_INTERVAL_S": "1",
    # A fresh service's first check forks its pool process and imports torch: 15-30 s on two
    # cores that the other test process (pytest -n 2) keeps busy as well.
    "STITCHSIM_CHECK_TIMEOUT_S": "150",
    "STITCHSIM_BROKER_POLL_S": "0.1",
    "STITCHSIM_JOB_TIME_LIMIT_S": "600",
    "STITCHSIM_MAX_UPLOAD_BYTES": str(32 * 1024 * 1024),
    "STITCHSIM_POLL_AFTER_S": "1",
    "STITCHSIM_SHUTDOWN_GRACE_S": "1",
    # The flat figures the tests were written against: a probe per service start would cost
    # seconds of CPU and make the job limit follow this machine's load. The calibration tests
    # set their own (tests/service/test_calibration.py).
    "STITCHSIM_CALIBRATION": "off",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "stitchsim_worker.cli", *args]


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


@dataclass
class ServiceHandle:
    mode: str  # "embedded" or "redis"
    url: str
    data_dir: Path
    env: dict[str, str]
    api_key: str | None = None
    other_key: str | None = None
    database_url: str = ""
    redis_url: str | None = None
    with_workers: bool = True  # False: the gateway alone, jobs stay queued (load tests)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    # ---- processes

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        out = open(logs / f"{name}.log", "ab")  # noqa: SIM115 (closed with the process)
        self.procs[name] = subprocess.Popen(cmd, env=env or self.env, stdout=out, stderr=out,
                                            start_new_session=True)
        out.close()

    def start(self) -> None:
        if self.mode == "embedded":
            only_gateway = [] if self.with_workers else ["--workers", "0"]
            self._spawn("serve", cli_command("serve", *only_gateway))
        else:
            self.start_gateway()
            if self.with_workers:
                self.start_workers()

    def create_key(self, name: str) -> str:
        """A new API key of this service (through the operator's CLI)."""
        out = subprocess.run(cli_command("keys", "create", name), env=self.env, capture_output=True,
                             text=True, check=True, timeout=60).stdout
        return next(line.split()[-1] for line in out.splitlines() if line.startswith("key:"))

    def ready(self) -> None:
        """Wait until the service answers: with workers, until they are seen too."""
        if self.with_workers:
            self.wait_ready()
        else:
            self.wait_ready(queues=(), need_workers=False)

    def start_gateway(self) -> None:
        assert self.mode == "redis"
        self._spawn("gateway", cli_command("gateway"))

    def start_workers(self) -> None:
        """Start the gpu and checks workers that are not running."""
        assert self.mode == "redis"
        for queue in ("gpu", "checks"):
            if f"worker_{queue}" not in self.procs:
                self.start_worker(queue)

    def start_worker(self, queue: str, extra_env: dict[str, str] | None = None) -> None:
        """The worker of queue (process name worker_<queue>), with settings of its own in
        extra_env: a worker's environment is its configuration."""
        assert self.mode == "redis" and f"worker_{queue}" not in self.procs
        self._spawn(f"worker_{queue}",
                    cli_command("worker", "--queues", queue, "--name", f"{queue}@test"),
                    {**self.env, **(extra_env or {})})

    def stop_process(self, name: str, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        _signal_group(proc, sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait(10)
        # Pool children live in the same group; make sure none outlives its parent.
        _signal_group(proc, signal.SIGKILL)

    def stop(self) -> None:
        for name in list(self.procs):
            sig = signal.SIGQUIT if name.startswith("worker") else signal.SIGTERM
            self.stop_process(name, sig)

    def worker_pids(self, queue: str = "gpu") -> list[int]:
        """Parent pids of live workers consuming queue (from the workers table)."""
        from sqlalchemy import create_engine, text

        engine = create_engine(self._sqlalchemy_url())
        try:
            with engine.connect() as conn:
                rows = conn.execute(text("SELECT pid, queues FROM workers")).all()
        finally:
            engine.dispose()
        return [pid for pid, qs in rows if queue in qs.split(",")]

    def kill_workers(self, queue: str = "gpu") -> list[int]:
        """SIGKILL every worker of queue with its pool children (what an OOM kill does)."""
        pids = self.worker_pids(queue)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        if self.mode == "redis":
            for name in [n for n in self.procs if n == f"worker_{queue}"]:
                self.procs.pop(name).wait(10)
        return pids

    def kill_pool_children(self, queue: str = "gpu") -> list[int]:
        """SIGKILL the pool children of queue's workers, not the workers: what the kernel's OOM
        killer picks (the biggest process); Celery's parent then requeues the task itself."""
        children = [pid for parent in self.worker_pids(queue) for pid in _children(parent)]
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return children

    def wait_ready(self, timeout: float = 120, queues: tuple[str, ...] = ("gpu", "checks"),
                   need_workers: bool = True) -> None:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.logs()}")
            try:
                r = httpx.get(self.url + "/readyz", timeout=5)
                last = r.json()
                if not need_workers and r.status_code == 503:
                    checks = last["error"]["details"]
                    if all(c["ok"] for name, c in checks.items() if name != "workers"):
                        return
                if r.status_code == 200:
                    seen = last["checks"]["workers"].get("queues", {})
                    if all(seen.get(q) for q in queues):
                        return
            except httpx.HTTPError as exc:
                last = repr(exc)
            time.sleep(0.3)
        raise RuntimeError(f"service not ready after {timeout} s: {last}\n{self.logs()}")

    def logs(self, tail: int = 4000) -> str:
        out = []
        for p in sorted((self.data_dir / "logs").glob("*.log")):
            out.append(f"--- {p.name}\n{p.read_text(errors='replace')[-tail:]}")
        return "\n".join(out)

    # ---- inspection

    def client(self, key: str | None = "default", **kw: Any) -> httpx.Client:
        if key == "default":
            key = self.api_key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        kw.setdefault("timeout", 120)
        return httpx.Client(base_url=self.url, headers=headers, **kw)

    def _sqlalchemy_url(self) -> str:
        if self.database_url.startswith("postgresql://"):
            return self.database_url.replace("postgresql://", "postgresql+psycopg://", 1)
        return self.database_url

    def count_rows(self, table: str) -> int:
        from sqlalchemy import create_engine, text

        engine = create_engine(self._sqlalchemy_url())
        try:
            with engine.connect() as conn:
                return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar() or 0)
        finally:
            engine.dispose()

    def store_files(self) -> list[str]:
        store = self.data_dir / "store"
        tmp = self.data_dir / "tmp"
        files = [str(p.relative_to(self.data_dir)) for base in (store, tmp) if base.exists()
                 for p in base.rglob("*") if p.is_file()]
        return sorted(f for f in files if not Path(f).name.startswith(".ping"))

    def wait_job(self, job_id: str, key: str | None = "default", timeout: float = 180,
                 states: tuple[str, ...] = ("succeeded", "failed", "cancelled"),
                 interval: float = 0.2) -> list[dict[str, Any]]:
        """Poll until the job reaches one of states; returns every status seen."""
        seen = []
        with self.client(key) as c:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                r = c.get(f"/jobs/{job_id}")
                r.raise_for_status()
                seen.append(r.json())
                if seen[-1]["state"] in states:
                    return seen
                time.sleep(interval)
        raise AssertionError(f"job {job_id} still {seen[-1]['state'] if seen else '?'} after "
                             f"{timeout} s\n{self.logs()}")


def _children(pid: int) -> list[int]:
    """Pids whose parent is pid (Linux /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            # The command name (field 2) may hold spaces: the parent pid follows its ")".
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
    return out


def postgres_database(admin_url: str = POSTGRES_ADMIN_URL
                      ) -> tuple[str, Callable[[], None]] | None:
    """A fresh PostgreSQL database and its dropper. When PostgreSQL does not answer: under CI
    the test fails saying why; elsewhere None (tests/environment.py says why)."""
    problem = postgres_problem(admin_url)
    if problem is not None:
        if in_ci():
            missing("PostgreSQL", problem)
        return None
    import psycopg

    name = f"stitchsim_test_{uuid.uuid4().hex[:10]}"
    # It answered a moment ago: an error now is a real one, raised, not a reason to fall back.
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with contextlib.suppress(Exception), psycopg.connect(
                admin_url, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    base = admin_url.rsplit("/", 1)[0]
    return f"{base}/{name}", drop


def redis_db() -> tuple[str, Any]:
    require_redis()
    import redis

    # One db number per starter, so concurrent services (and test sessions) never share keys.
    for n in range(15, 1, -1):
        url = f"redis://{REDIS_HOST}/{n}"
        client = redis.Redis.from_url(url)
        if client.set("stitchsim-test-lock", str(os.getpid()), nx=True, ex=3600):
            client.flushdb()
            client.set("stitchsim-test-lock", str(os.getpid()), ex=3600)

            def release(client: Any = client) -> None:
                with contextlib.suppress(Exception):
                    client.flushdb()

            return url, release
    raise RuntimeError("no free Redis db number in 2..15")


class ServiceFactory:
    def __init__(self, tmp: pytest.TempPathFactory):
        self.tmp = tmp
        self.handles: list[ServiceHandle] = []
        self.cleanups: list[Any] = []

    def embedded(self, *, extra_env: dict[str, str] | None = None, start: bool = True,
                 workers: bool = True) -> ServiceHandle:
        data = self.tmp.mktemp("svc-embedded")
        port = free_port()
        env = {**os.environ, **FAST_ENV, "STITCHSIM_DATA_DIR": str(data),
               "STITCHSIM_PORT": str(port), **(extra_env or {})}
        for var in ("STITCHSIM_REDIS_URL", "STITCHSIM_DATABASE_URL", "STITCHSIM_STORE_URL"):
            env.pop(var, None)
        h = ServiceHandle("embedded", f"http://127.0.0.1:{port}", data, env,
                          database_url=f"sqlite:///{data / 'stitchsim.db'}",
                          with_workers=workers)
        self.handles.append(h)
        if start:
            h.start()
            h.ready()
        return h

    def redis(self, *, keys: bool = True, postgres: bool = True,
              extra_env: dict[str, str] | None = None, workers: bool = True,
              redis_url: str | None = None) -> ServiceHandle:
        """redis_url: a Redis of the caller's (say, one it restarts); default a free db number
        of the shared one at REDIS_HOST."""
        data = self.tmp.mktemp("svc-redis")
        port = free_port()
        if redis_url is None:
            redis_url, release = redis_db()
            self.cleanups.append(release)
        db_url = f"sqlite:///{data / 'stitchsim.db'}"
        pg = postgres_database() if postgres else None
        if pg is not None:
            db_url, drop = pg
            self.cleanups.append(drop)
        elif postgres:
            warnings.warn(f"this Redis-mode service keeps its job table in SQLite: "
                          f"{postgres_problem()}", stacklevel=2)
        env = {**os.environ, **FAST_ENV, "STITCHSIM_DATA_DIR": str(data),
               "STITCHSIM_PORT": str(port), "STITCHSIM_REDIS_URL": redis_url,
               "STITCHSIM_DATABASE_URL": db_url, **(extra_env or {})}
        env.pop("STITCHSIM_STORE_URL", None)
        if keys:
            env["STITCHSIM_REQUIRE_API_KEY"] = "true"
        h = ServiceHandle("redis", f"http://127.0.0.1:{port}", data, env, database_url=db_url,
                          redis_url=redis_url, with_workers=workers)
        self.handles.append(h)
        if keys:
            h.api_key = h.create_key("alice")
            h.other_key = h.create_key("bob")
        h.start()
        h.ready()
        return h

    def close(self) -> None:
        for h in self.handles:
            h.stop()
        for fn in reversed(self.cleanups):
            fn()


@pytest.fixture(scope="session")
def _session_services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceFactory]:
    factory = ServiceFactory(tmp_path_factory)
    yield factory
    factory.close()


# The session services run jobs for many test files, minutes apart: pool processes released
# after 60 s idle (the default) would import torch again, in the checks and the gpu pool, for
# each file's first job (~20 s each on two busy cores). Released after half an hour instead (no
# suite runs that long), a pool is still forked, and torch imported, only if a job needs it.
WARM_POOLS_ENV = {"STITCHSIM_WORKER_IDLE_RELEASE_S": "1800"}


@pytest.fixture(scope="session")
def live_service(_session_services: ServiceFactory) -> ServiceHandle:
    """`stitchsim-server serve` on the embedded default (no key needed on loopback); its
    pool processes stay once forked (WARM_POOLS_ENV)."""
    return _session_services.embedded(extra_env=WARM_POOLS_ENV)


@pytest.fixture(scope="session")
def redis_service(_session_services: ServiceFactory) -> ServiceHandle:
    """Gateway + separate Celery workers on the real Redis; keys required (two keys); its
    pool processes stay once forked (WARM_POOLS_ENV)."""
    return _session_services.redis(extra_env=WARM_POOLS_ENV)


GATEWAY_ONLY_ENV = {
    "STITCHSIM_REQUIRE_API_KEY": "true",
    "STITCHSIM_CHECK_TIMEOUT_S": "0",  # no checks worker: submissions are queued unchecked
    "STITCHSIM_QUOTA_RETRY_AFTER_S": "1",
}


@pytest.fixture(scope="session")
def gateway_service(_session_services: ServiceFactory) -> ServiceHandle:
    """`serve --workers 0`: the embedded gateway alone, keys required (.api_key and
    .other_key), spec checks off, quota answers with Retry-After 1. Accepted jobs stay queued
    and nothing trains: for tests of what the service answers, in seconds."""
    h = _session_services.embedded(extra_env=GATEWAY_ONLY_ENV, workers=False)
    h.api_key = h.create_key("alice")
    h.other_key = h.create_key("bob")
    return h


@pytest.fixture
def service_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceFactory]:
    factory = ServiceFactory(tmp_path_factory)
    yield factory
    factory.close()

