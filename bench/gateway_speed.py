"""What waiting for jobs costs the gateway: requests per progress change of a client waiting on a
long job, and plain status polls through FastAPI's normal stack under load.

    python bench/gateway_speed.py [--job-seconds 300] [--clients 50] [--rate 2] [--seconds 20]

Both run against a real `stitchsim-server serve --workers 0` (the gateway alone, embedded SQLite
job table, keys required, so every request pays the key check).

1. Waiting. Two jobs run --job-seconds each (default 300: a 5-minute job), driven by a stand-in
   worker in this process that writes what a worker writes, through the service's own core
   (jobs.claim, then jobs.heartbeat with new progress once a second, as the worker's tracker
   does; then the job ends, cancelled, so that no report is needed). One job is waited on by the
   SDK's Job.wait() as it is (long-polls with If-None-Match), the other by Job.wait(long_poll=0):
   the interval polling every older client does (0.5 s growing to 5 s). Printed per job: the
   progress changes written, the requests the client made (its callback sees every answer),
   requests per change, and how late the client saw changes on average. The gateway's request
   counters (/metrics) must add up to the two clients' requests. A naive client polling
   --rate times a second would make rate × job-seconds.

2. Polls. --clients clients each poll one job --rate times a second for --seconds, each on its own
   keep-alive connection, an open loop (requests are sent at fixed times; latency runs from the
   scheduled time, so a stall counts in every request it delays): p50/p99/max latency and the
   gateway's CPU per poll. The goal: p99 under 20 ms at 50 clients × 2/s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STATUS_ROUTES = ("/jobs/{job_id}", "/jobs/{job_id}?wait")


# ---------------------------------------------------------------- the service


@dataclass
class Gateway:
    port: int
    data: Path
    proc: subprocess.Popen[bytes] | None = None
    key: str = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        env = {**os.environ, "STITCHSIM_DATA_DIR": str(self.data),
               "STITCHSIM_PORT": str(self.port), "STITCHSIM_HOST": "127.0.0.1",
               "STITCHSIM_REQUIRE_API_KEY": "true", "OMP_NUM_THREADS": "1"}
        for var in ("STITCHSIM_REDIS_URL", "STITCHSIM_DATABASE_URL", "STITCHSIM_STORE_URL"):
            env.pop(var, None)
        return env

    def cli(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "stitchsim_worker.cli", *args]

    def start(self) -> None:
        log = open(self.data / "serve.log", "ab")  # noqa: SIM115 (closed with the process)
        self.proc = subprocess.Popen(self.cli("serve", "--workers", "0"), env=self.env,
                                     stdout=log, stderr=log, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the gateway exited:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    out = subprocess.run(self.cli("keys", "create", "bench"), env=self.env,
                                         text=True, capture_output=True, check=True,
                                         timeout=60).stdout
                    self.key = next(ln.split()[-1] for ln in out.splitlines()
                                    if ln.startswith("key:"))
                    return
            time.sleep(0.2)
        raise RuntimeError(f"the gateway did not start:\n{self.log()}")

    def log(self) -> str:
        return (self.data / "serve.log").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def cpu_s(self) -> float:
        """User + system CPU seconds of the gateway's processes so far."""
        assert self.proc is not None
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for pid in (self.proc.pid, *_children(self.proc.pid)):
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / tick
        return total

    def status_requests(self) -> float:
        """Requests answered on GET /jobs/{id}, plain and long-polls, any status."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        total = 0.0
        for route in STATUS_ROUTES:
            pattern = (r'stitchsim_http_requests_total\{method="GET",route="'
                       + re.escape(route) + r'",status="\d+"\} ([0-9.e+]+)')
            total += sum(float(v) for v in re.findall(pattern, text))
        return total


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
    return out


def insert_job(gw: Gateway) -> str:
    """A queued job of the bench key, written as a submission leaves it (the validated spec)."""
    import uuid

    from sqlalchemy import create_engine, text
    from stitchsim.models import Spec

    from tests.service.helpers import TINY_SPEC

    spec = {**TINY_SPEC, "front": {"checkpoint": "sha256:" + "a" * 64},
            "back": {"checkpoint": "sha256:" + "b" * 64}}
    job_id = uuid.uuid4().hex
    engine = create_engine(f"sqlite:///{gw.data / 'stitchsim.db'}")
    with engine.begin() as conn:
        owner = conn.execute(text("SELECT id FROM api_keys")).scalar_one()
        conn.execute(text(
            "INSERT INTO jobs (id, owner, state, spec_json, created_at, enqueued_at, attempts, "
            "cancel_requested, stage, done, total) VALUES (:id, :owner, 'queued', :spec, "
            "'2026-01-01 00:00:00.000000', '2026-01-01 00:00:00.000000', 0, 0, 'queued', 0, 0)"),
            {"id": job_id, "owner": owner, "spec": Spec.model_validate(spec).model_dump_json()})
    engine.dispose()
    return job_id


# ---------------------------------------------------------------- 1. waiting


@dataclass
class Waited:
    label: str
    changes: int = 0  # progress and state changes written to the row
    written_at: list[float] = field(default_factory=list)
    requests: int = 0
    seen_at: dict[tuple[str, int], float] = field(default_factory=dict)
    seconds: float = 0.0

    def lag_s(self) -> float:
        """Mean delay from a progress change written to the client seeing it (of those it
        saw)."""
        lags = [seen - self.written_at[done] for (state, done), seen in self.seen_at.items()
                if state == "running" and 0 < done < len(self.written_at)]
        return statistics.fmean(lags) if lags else 0.0


def stand_in_worker(gw: Gateway, job_id: str, seconds: float, out: Waited) -> None:
    """Run job_id as a worker does, for seconds: claim, progress once a second, end."""
    from stitchsim.models import Progress
    from stitchsim_service.core import jobs
    from stitchsim_service.core.context import Context
    from stitchsim_service.core.settings import Settings

    ctx = Context.open(Settings(data_dir=gw.data))
    time.sleep(2.0)  # queued for a while, as behind other jobs
    claim = jobs.claim(ctx, job_id, "bench@stand-in")
    assert claim is not None
    out.changes += 1
    total = int(seconds)
    start = time.monotonic()
    for done in range(total + 1):
        time.sleep(max(0.0, start + done - time.monotonic()))
        out.written_at.append(time.monotonic())
        jobs.heartbeat(ctx, claim, Progress(stage="training", done=done, total=total,
                                            eta_s=float(total - done)))
        out.changes += 1
    jobs.finish(ctx, claim, jobs.CANCELLED)
    out.changes += 1


def sdk_client(gw: Gateway, job_id: str, out: Waited, long_poll: float,
               timeout: float) -> None:
    from stitchsim import Client
    from stitchsim.errors import JobCancelled
    from stitchsim.models import JobStatus

    def seen(status: JobStatus) -> None:
        out.requests += 1
        out.seen_at.setdefault((status.state, status.progress.done), time.monotonic())

    t0 = time.monotonic()
    with Client(gw.url, gw.key) as client, contextlib.suppress(JobCancelled):
        # Bounded: a stand-in worker that dies leaves the job running, and the bench would
        # wait on it for ever.
        client.job(job_id).wait(timeout=timeout, progress=seen, long_poll=long_poll)
    out.seconds = time.monotonic() - t0


def bench_waiting(gw: Gateway, job_seconds: float) -> tuple[list[Waited], float, float]:
    runs = [(Waited("Job.wait() (long-polls)"), 30.0),
            (Waited("Job.wait(long_poll=0) (interval polls)"), 0.0)]
    before, cpu0 = gw.status_requests(), gw.cpu_s()
    threads = []
    for waited, long_poll in runs:
        job_id = insert_job(gw)
        threads += [threading.Thread(target=stand_in_worker, args=(gw, job_id, job_seconds,
                                                                    waited)),
                    threading.Thread(target=sdk_client, args=(gw, job_id, waited, long_poll,
                                                              job_seconds + 60))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    served = gw.status_requests() - before
    return [w for w, _ in runs], served, gw.cpu_s() - cpu0


# ---------------------------------------------------------------- 2. polls


class Conn:
    """One keep-alive HTTP/1.1 connection sending one prepared GET (a client that costs little
    beside the gateway it measures)."""

    def __init__(self, request: bytes):
        self.request = request
        self.reader: asyncio.StreamReader
        self.writer: asyncio.StreamWriter

    async def open(self, port: int) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", port)

    async def get(self) -> int:
        self.writer.write(self.request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        await self.reader.readexactly(length)
        return int(head[9:12])

    def close(self) -> None:
        self.writer.close()


@dataclass
class Polls:
    lat_ms: list[float] = field(default_factory=list)
    errors: int = 0
    seconds: float = 0.0
    cpu_s: float = 0.0

    def q(self, p: int) -> float:
        return statistics.quantiles(self.lat_ms, n=100, method="inclusive")[p - 1]


async def open_loop(gw: Gateway, job_id: str, clients: int, rate: float,
                    seconds: float) -> Polls:
    request = (f"GET /jobs/{job_id} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               f"Authorization: Bearer {gw.key}\r\n\r\n").encode()
    conns = [Conn(request) for _ in range(clients)]
    for c in conns:
        await c.open(gw.port)
        await c.get()  # warm, outside the measurement
    fig = Polls()
    rng = random.Random(0)
    loop = asyncio.get_running_loop()
    t0 = loop.time() + 0.2
    n = int(seconds * rate)

    async def client(c: Conn) -> None:
        phase = rng.random() / rate
        for k in range(n):
            due = t0 + phase + k / rate
            if (delay := due - loop.time()) > 0:
                await asyncio.sleep(delay)
            status = await c.get()
            fig.lat_ms.append((loop.time() - due) * 1000)
            fig.errors += status != 200

    cpu0, start = gw.cpu_s(), time.perf_counter()
    await asyncio.gather(*(client(c) for c in conns))
    fig.seconds, fig.cpu_s = time.perf_counter() - start, gw.cpu_s() - cpu0
    for c in conns:
        c.close()
    return fig


# ---------------------------------------------------------------- the run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--job-seconds", type=float, default=300.0,
                    help="how long each waited-on job runs (0: skip the waiting part)")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--rate", type=float, default=2.0, help="polls per second per client")
    ap.add_argument("--seconds", type=float, default=20.0, help="0: skip the polls part")
    ap.add_argument("--port", type=int, default=8700)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="stitchsim-gwspeed-") as tmp:
        gw = Gateway(args.port, Path(tmp))
        gw.start()
        try:
            waited = bench_waiting(gw, args.job_seconds) if args.job_seconds else None
            load = os.getloadavg()[0]
            polls = (asyncio.run(open_loop(gw, insert_job(gw), args.clients, args.rate,
                                           args.seconds)) if args.seconds else None)
            load = max(load, os.getloadavg()[0])
        finally:
            gw.stop()

    # Latency on a shared machine follows what else runs on it: the load average says.
    print(f"\n== gateway speed ({os.cpu_count()} cores, load average up to {load:.1f})")
    if waited is not None:
        runs, served, cpu = waited
        print(f"waiting on a {args.job_seconds:g} s job (progress written once a second, as a "
              "worker does):")
        for w in runs:
            print(f"  {w.label:40s} {w.changes} changes, {w.requests} requests = "
                  f"{w.requests / w.changes:.2f} per change; saw {len(w.seen_at)} of the "
                  f"changes, {w.lag_s():.2f} s after they were written on average")
        naive = args.rate * args.job_seconds
        print(f"  {'a client polling ' + f'{args.rate:g}/s':40s} {naive:.0f} requests = "
              f"{naive / runs[0].changes:.2f} per change")
        print(f"  gateway: {served:.0f} status requests answered (the clients made "
              f"{sum(w.requests for w in runs)}), {cpu:.1f} s CPU over both jobs")
    if polls is not None:
        n = len(polls.lat_ms)
        verdict = "met" if polls.q(99) < 20 else "NOT met"
        print(f"plain polls, {args.clients} clients x {args.rate:g}/s for {args.seconds:g} s "
              f"(GET /jobs/{{id}}, no ETag): p50 {polls.q(50):.1f} ms, p99 {polls.q(99):.1f} ms "
              f"(goal < 20 ms: {verdict}), max {max(polls.lat_ms):.1f} ms, "
              f"{n / polls.seconds:.0f} req/s, gateway CPU {polls.cpu_s / n * 1000:.2f} ms/poll, "
              f"errors {polls.errors}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
