"""Gateway speed before/after in one run: status polls (open loop, gateway CPU per poll,
saturation throughput per gateway process) and uploads against a plain file copy.

    python bench/gateway_speed.py [--baseline main] [--clients 50] [--rate 2] [--keys 1]
                                  [--seconds 20]
                                  [--size-mb 500] [--gateway-workers 2] [--port-base 8700]

"before" is the code of --baseline (a git ref of this repository, unpacked to a temp dir and
put first on PYTHONPATH), "after" is this working tree; both run as real `stitchsim-server
serve --workers 0` processes (the gateway alone, embedded SQLite job table) on loopback ports
from --port-base, with keys required, so every poll pays the key check.

Polls are an open loop: each client owns one keep-alive connection and sends at fixed times
(rate per second, random phase); a request's latency runs from its scheduled time, so a stall
shows in every request it delays (no coordinated omission). Gateway CPU is the utime+stime of
the gateway process and its children (uvicorn workers) over the phase, divided by requests.
The gateway's CPU with no requests at all, over --idle-seconds just before, is printed beside
the open loop's, with the per-poll figure net of it (context; the gross figure is the goal's).
Saturation: closed-loop connections sending back to back; req/s and CPU per request. The
client is a raw-socket HTTP/1.1 client, so its own cost stays small beside the gateway's; on a
machine with few cores it still competes for them, so saturation req/s is a floor, and
1000 / (CPU ms per poll) is the throughput one fully busy gateway process would give.

Uploads: a valid safetensors file of --size-mb, sent raw (curl -T, streaming) to
POST /checkpoints, timed beside shutil.copyfile of the same size on the same disk; gateway
peak RSS growth during the upload shows whether memory is flat in the file size.

Context, no code of ours: a bare ASGI app on uvicorn (polls; uploads received and dropped), a
raw asyncio protocol on uvloop (polls; uploads dropped, and hashed and written in two threads
as the gateway does), and SHA-256 alone over the file from the page cache: the floors of the
HTTP library, of the socket, and of the hash every upload must compute.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from service_bench import make_big_checkpoint  # noqa: E402

# ---------------------------------------------------------------- code under test


def unpack_ref(ref: str, dest: Path) -> Path:
    """The tree of git ref, unpacked; returns a dir to put first on PYTHONPATH, holding the
    three packages as the editable install maps them (service/, worker/, client/stitchsim)."""
    src = dest / "src"
    src.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", ref],
                             capture_output=True, check=True).stdout
    tar = dest / "ref.tar"
    tar.write_bytes(archive)
    with tarfile.open(tar) as tf:
        tf.extractall(src, filter="data")
    tar.unlink()
    farm = dest / "path"
    farm.mkdir()
    (farm / "stitchsim_service").symlink_to(src / "service")
    (farm / "stitchsim_worker").symlink_to(src / "worker")
    (farm / "stitchsim").symlink_to(src / "client" / "stitchsim")
    return farm


# ---------------------------------------------------------------- the service


@dataclass
class Gateway:
    name: str
    port: int
    data: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    key: str = ""
    owner: str = ""
    job_id: str = ""
    # (key, job id) of each poller identity: the seeded key first, then any of seed_keys().
    pollers: list[tuple[str, str]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cli(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "stitchsim_worker.cli", *args]

    def start(self, gateway_workers: int = 1) -> None:
        extra = ["--gateway-workers", str(gateway_workers)] if gateway_workers > 1 else []
        log = open(self.data / "serve.log", "ab")  # noqa: SIM115 (closed with the process)
        self.proc = subprocess.Popen(self.cli("serve", "--workers", "0", *extra), env=self.env,
                                     stdout=log, stderr=log, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} did not start:\n{self.log()}")

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

    def seed(self) -> None:
        """An API key and one queued job of its owner (written straight into the job table,
        as a submission would leave it: the validated spec with its defaults)."""
        out = subprocess.run(self.cli("keys", "create", "bench"), env=self.env, text=True,
                             capture_output=True, check=True, timeout=60).stdout
        self.key = next(ln.split()[-1] for ln in out.splitlines() if ln.startswith("key:"))
        from sqlalchemy import create_engine, text
        from stitchsim.models import Spec

        from tests.service.helpers import TINY_SPEC

        spec = dict(TINY_SPEC)
        spec["front"] = {"checkpoint": "sha256:" + "a" * 64}
        spec["back"] = {"checkpoint": "sha256:" + "b" * 64}
        spec_json = Spec.model_validate(spec).model_dump_json()
        engine = create_engine(f"sqlite:///{self.data / 'stitchsim.db'}")
        self.job_id = "0123456789abcdef0123456789abcdef"
        with engine.begin() as conn:
            self.owner = conn.execute(text("SELECT id FROM api_keys")).scalar_one()
            conn.execute(text(
                "INSERT INTO jobs (id, owner, state, spec_json, created_at, enqueued_at, "
                "attempts, cancel_requested, stage, done, total) VALUES (:id, :owner, "
                "'running', :spec, '2026-01-01 00:00:00.000000', '2026-01-01 00:00:00.000000',"
                " 1, 0, 'training', 3, 10)"),
                {"id": self.job_id, "owner": self.owner, "spec": spec_json})
        engine.dispose()
        r = httpx.get(f"{self.url}/jobs/{self.job_id}", timeout=10,
                      headers={"Authorization": f"Bearer {self.key}"})
        assert r.status_code == 200, r.text
        self.pollers = [(self.key, self.job_id)]

    def seed_keys(self, n: int) -> None:
        """n - 1 more keys, each owning a copy of the seeded job (as n users, each polling
        their own job with their own key)."""
        import secrets

        from sqlalchemy import create_engine, text
        from stitchsim_service.core.keys import KEY_PREFIX, hash_key

        engine = create_engine(f"sqlite:///{self.data / 'stitchsim.db'}")
        with engine.begin() as conn:
            job = dict(conn.execute(text("SELECT * FROM jobs WHERE id = :id"),
                                    {"id": self.job_id}).mappings().one())
            cols = ", ".join(job)
            marks = ", ".join(":" + c for c in job)
            for i in range(1, n):
                key = KEY_PREFIX + secrets.token_urlsafe(32)
                owner, job_id = f"k_bench{i:09d}", f"{i:032x}"
                conn.execute(text("INSERT INTO api_keys (id, name, key_hash, created_at) "
                                  "VALUES (:id, :name, :hash, :at)"),
                             {"id": owner, "name": f"bench{i}", "hash": hash_key(key),
                              "at": job["created_at"]})
                conn.execute(text(f"INSERT INTO jobs ({cols}) VALUES ({marks})"),
                             {**job, "id": job_id, "owner": owner})
                self.pollers.append((key, job_id))
        engine.dispose()

    def pids(self) -> list[int]:
        assert self.proc is not None
        return [self.proc.pid, *_descendants(self.proc.pid)]

    def cpu_s(self) -> dict[int, tuple[float, float]]:
        """(user, system) CPU seconds of each process of the gateway."""
        out = {}
        tick = os.sysconf("SC_CLK_TCK")
        for pid in self.pids():
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                out[pid] = (int(fields[11]) / tick, int(fields[12]) / tick)
        return out


def idle_cpu_ms_s(gw: Gateway, seconds: float) -> float:
    """The gateway's CPU per second with no request at all (its timers and threads): the
    part of an open-loop poll's CPU that does not depend on polls."""
    cpu0 = gw.cpu_s()
    time.sleep(seconds)
    return sum(_cpu_delta(cpu0, gw.cpu_s())) / seconds * 1000


def _descendants(pid: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            kids.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def _cpu_delta(before: dict[int, tuple[float, float]],
               after: dict[int, tuple[float, float]]) -> tuple[float, float]:
    user = sum(u - before.get(pid, (0.0, 0.0))[0] for pid, (u, _) in after.items())
    system = sum(s - before.get(pid, (0.0, 0.0))[1] for pid, (_, s) in after.items())
    return user, system


# ---------------------------------------------------------------- a light HTTP client


class Conn:
    """One keep-alive HTTP/1.1 connection sending one prepared GET."""

    def __init__(self, request: bytes):
        self.request = request
        self.reader: asyncio.StreamReader
        self.writer: asyncio.StreamWriter

    async def open(self, port: int) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", port)

    async def get(self) -> int:
        self.writer.write(self.request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        await self.reader.readexactly(length)
        return status

    def close(self) -> None:
        self.writer.close()


def _request(gw: Gateway, i: int = 0) -> bytes:
    key, job_id = gw.pollers[i % len(gw.pollers)] if gw.pollers else (gw.key, gw.job_id)
    return (f"GET /jobs/{job_id} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {key}\r\n\r\n").encode()


@dataclass
class PollFigures:
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    lat_ms: list[float] = field(default_factory=list)
    cpu_ms_per_req: float = 0.0
    sys_share: float = 0.0  # of that CPU, the kernel's (loopback TCP is charged to it)

    def record(self, latency_ms: float, status: int) -> None:
        self.lat_ms.append(latency_ms)
        self.requests += 1
        self.errors += status != 200

    def set_cpu(self, user_sys: tuple[float, float]) -> None:
        total = sum(user_sys)
        self.cpu_ms_per_req = total / max(self.requests, 1) * 1000
        self.sys_share = user_sys[1] / total if total else 0.0

    def q(self, p: int) -> float:
        return statistics.quantiles(self.lat_ms, n=100, method="inclusive")[p - 1]


async def _open_loop(gw: Gateway, clients: int, rate: float, seconds: float) -> PollFigures:
    conns = [Conn(_request(gw, i)) for i in range(clients)]
    for c in conns:
        await c.open(gw.port)
    for c in conns:  # warm: every connection once, outside the measurement
        await c.get()
    fig = PollFigures()
    rng = random.Random(0)
    loop = asyncio.get_running_loop()
    t0 = loop.time() + 0.2
    n = int(seconds * rate)

    async def client(c: Conn) -> None:
        phase = rng.random() / rate
        for k in range(n):
            due = t0 + phase + k / rate
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            status = await c.get()
            fig.record((loop.time() - due) * 1000, status)

    return await _drive(gw, conns, client, fig)


async def _drive(gw: Gateway, conns: list[Conn], client: Callable[[Conn], Awaitable[None]],
                 fig: PollFigures) -> PollFigures:
    """Run every client to its end, with the gateway's CPU and the wall time around them."""
    cpu0 = gw.cpu_s()
    start = time.perf_counter()
    await asyncio.gather(*(client(c) for c in conns))
    fig.seconds = time.perf_counter() - start
    fig.set_cpu(_cpu_delta(cpu0, gw.cpu_s()))
    for c in conns:
        c.close()
    return fig


async def _closed_loop(gw: Gateway, conns_n: int, seconds: float) -> PollFigures:
    conns = [Conn(_request(gw, i)) for i in range(conns_n)]
    for c in conns:
        await c.open(gw.port)
        await c.get()
    fig = PollFigures()
    stop = time.perf_counter() + seconds

    async def client(c: Conn) -> None:
        for _ in range(10_000_000):  # bounded
            if time.perf_counter() > stop:
                return
            t = time.perf_counter()
            status = await c.get()
            fig.record((time.perf_counter() - t) * 1000, status)

    return await _drive(gw, conns, client, fig)


def _run(coro: Any) -> Any:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


# ---------------------------------------------------------------- uploads


def _peak_rss_mb(gw: Gateway) -> float:
    total = 0.0
    for pid in gw.pids():
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
    return total


def bench_upload(gw: Gateway, work: Path, size_mb: int, salt: int, path: str = "/checkpoints",
                 expect: str = "201") -> dict[str, float]:
    src = work / f"up-{salt}.safetensors"
    size = make_big_checkpoint(src, size_mb, salt=salt)
    with open(src, "rb") as fh:  # in the page cache, for the copy and the upload alike
        while fh.read(16 << 20):
            pass
    # The plain copy of this very file, just before its upload: this disk is shared and its
    # speed drifts, so each upload is judged against a copy made under the same conditions.
    t = time.perf_counter()
    shutil.copyfile(src, work / "copy-dst.safetensors")
    copy_s = time.perf_counter() - t
    (work / "copy-dst.safetensors").unlink()
    rss0 = _peak_rss_mb(gw)
    peak = [rss0]
    done = False

    def sample() -> None:
        while not done:
            peak[0] = max(peak[0], _peak_rss_mb(gw))
            time.sleep(0.05)

    import threading

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    cpu0 = gw.cpu_s()
    t = time.perf_counter()
    out = subprocess.run(
        ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", "-T", str(src),
         "-H", "content-type: application/octet-stream", "-H", "Expect:",
         "-H", f"Authorization: Bearer {gw.key}", gw.url + path],
        capture_output=True, text=True, timeout=600)
    secs = time.perf_counter() - t
    user, system = _cpu_delta(cpu0, gw.cpu_s())
    done = True
    sampler.join()
    assert out.stdout == expect, (out.stdout, out.stderr, gw.log())
    src.unlink()
    return {"upload_mb_s": size / secs / 1e6, "copy_mb_s": size / copy_s / 1e6,
            "vs_copy": copy_s / secs, "rss_growth_mb": peak[0] - rss0,
            # Gateway CPU seconds per GB received: user (Python, SHA-256) and kernel
            # (loopback receive, page-cache writes).
            "user_s_per_gb": user / size * 1e9, "sys_s_per_gb": system / size * 1e9}


# ---------------------------------------------------------------- the run


def run_variant(name: str, pythonpath: Path | None, work: Path, port: int,
                args: argparse.Namespace) -> dict[str, Any]:
    data = work / f"data-{name}"
    data.mkdir()
    env = {**os.environ, "STITCHSIM_DATA_DIR": str(data), "STITCHSIM_PORT": str(port),
           "STITCHSIM_HOST": "127.0.0.1", "STITCHSIM_REQUIRE_API_KEY": "true",
           "STITCHSIM_MAX_UPLOAD_BYTES": str((args.size_mb + 64) << 20),
           "OMP_NUM_THREADS": "1"}
    for var in ("STITCHSIM_REDIS_URL", "STITCHSIM_DATABASE_URL", "STITCHSIM_STORE_URL"):
        env.pop(var, None)
    # The bench itself imports the contract and the test helpers of this tree; the service
    # under test gets the ref's code first on its path.
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (pythonpath, ROOT) if p)
    gw = Gateway(name, port, data, env)
    res: dict[str, Any] = {"name": name}
    gw.start()
    try:
        gw.seed()
        gw.seed_keys(args.keys)
        res["idle_ms_s"] = idle_cpu_ms_s(gw, args.idle_seconds)
        res["open"] = _run(_open_loop(gw, args.clients, args.rate, args.seconds))
        res["sat"] = _run(_closed_loop(gw, args.sat_conns, args.sat_seconds))
        if args.size_mb:
            ups = [bench_upload(gw, work, args.size_mb, salt=i + (100 if pythonpath else 0))
                   for i in range(args.uploads)]
            res["upload"] = {k: statistics.median(u[k] for u in ups) for k in ups[0]}
            res["upload"]["copies_mb_s"] = [u["copy_mb_s"] for u in ups]
    finally:
        gw.stop()
    if args.gateway_workers > 1 and pythonpath is None:
        data2 = work / f"data-{name}-multi"
        data2.mkdir()
        gw2 = Gateway(name + "-multi", port + 1, data2, {**env, "STITCHSIM_DATA_DIR": str(data2),
                                                         "STITCHSIM_PORT": str(port + 1)})
        gw2.start(args.gateway_workers)
        try:
            gw2.seed()
            gw2.seed_keys(args.keys)
            res["multi_open"] = _run(_open_loop(gw2, args.clients, args.rate, args.seconds))
            res["multi_sat"] = _run(_closed_loop(gw2, args.sat_conns, args.sat_seconds))
        finally:
            gw2.stop()
    return res


_FLOOR_APP = """
BODY = b'{"id": "x"}' * 150  # about a status body's size


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            await send({"type": m["type"] + ".complete"})
            if m["type"] == "lifespan.shutdown":
                return
    more = scope["method"] == "POST"
    while more:  # an upload: received and dropped, the receive path's own cost
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/json"), (b"content-length", b"%d" % len(BODY))]})
    await send({"type": "http.response.body", "body": BODY})
"""


_RAW_FLOOR = """
import asyncio, hashlib, os, queue, sys, threading

import uvloop

BODY = b'{"id": "x"}' * 150
POLL = (b"HTTP/1.1 200 OK\\r\\ncontent-type: application/json\\r\\ncontent-length: %d\\r\\n"
        b"\\r\\n" % len(BODY)) + BODY
DONE = b"HTTP/1.1 200 OK\\r\\ncontent-length: 0\\r\\nconnection: close\\r\\n\\r\\n"
SPOOL = sys.argv[2]


class Stage:
    # One thread applying fn to 4 MB pieces, as the gateway's spool does (a bounded queue).
    def __init__(self, fn):
        self.q = queue.Queue(4)
        self.t = threading.Thread(target=self.run, args=(fn,))
        self.t.start()

    def run(self, fn):
        while (piece := self.q.get()) is not None:
            fn(piece)


class Protocol(asyncio.Protocol):
    # Keep-alive GETs get a fixed body; a POST's body (Content-Length) is received, and to
    # /drop dropped, to /hash hashed (SHA-256) and written to a file in two threads.
    def connection_made(self, transport):
        self.t, self.buf, self.left = transport, b"", None

    def data_received(self, data):
        if self.left is None:
            self.buf += data
            while self.left is None and b"\\r\\n\\r\\n" in self.buf:
                head, _, self.buf = self.buf.partition(b"\\r\\n\\r\\n")
                if not head.startswith(b"POST"):
                    self.t.write(POLL)
                    continue
                self.left = next(int(ln[15:]) for ln in head.split(b"\\r\\n")
                                 if ln.lower().startswith(b"content-length:"))
                self.sink = head.split(b" ")[1] == b"/hash"
                if self.sink:
                    self.h, self.fd = hashlib.sha256(), os.open(SPOOL, os.O_WRONLY | os.O_CREAT)
                    self.stages = [Stage(lambda p: [self.h.update(c) for c in p]),
                                   Stage(lambda p: os.writev(self.fd, p))]
                    self.pending, self.n = [], 0
            if self.left is None:
                return
            data, self.buf = self.buf, b""
        self.left -= len(data)
        if self.sink and data:
            self.pending.append(data)
            self.n += len(data)
            if self.n >= 4 << 20 or not self.left:
                for st in self.stages:
                    st.q.put(self.pending)
                self.pending, self.n = [], 0
        if not self.left:
            if self.sink:
                for st in self.stages:
                    st.q.put(None)
                    st.t.join()
                os.close(self.fd)
                os.unlink(SPOOL)
            self.t.write(DONE)
            self.t.close()


async def main():
    server = await asyncio.get_running_loop().create_server(Protocol, "127.0.0.1",
                                                            int(sys.argv[1]))
    await server.serve_forever()


uvloop.run(main())
"""


def run_raw_floor(work: Path, port: int, args: argparse.Namespace) -> dict[str, Any]:
    """The same loads against a raw asyncio protocol on uvloop (no HTTP library, no ASGI):
    what the socket, the loop and, for uploads, SHA-256 plus the file writes cost here, so
    each floor can be told from uvicorn's and from ours."""
    d = work / "raw"
    d.mkdir()
    (d / "raw_floor.py").write_text(_RAW_FLOOR)
    gw = Gateway("raw asyncio", port, d, dict(os.environ))
    log = open(d / "serve.log", "ab")  # noqa: SIM115 (closed with the process)
    gw.proc = subprocess.Popen([sys.executable, str(d / "raw_floor.py"), str(port),
                                str(d / "spool")], stdout=log, stderr=log,
                               start_new_session=True)
    log.close()
    return _measure_floor(gw, work, args, {"drop": ("/drop", 8), "hash": ("/hash", 9)})


def _measure_floor(gw: Gateway, work: Path, args: argparse.Namespace,
                   uploads: dict[str, tuple[str, int]]) -> dict[str, Any]:
    """The poll loads, then each upload (name: (path, salt)), against a floor server; stops
    it after."""
    try:
        _wait_up(gw)
        gw.job_id, gw.key = "0" * 32, "none"
        out = {"name": gw.name, "open": _run(_open_loop(gw, args.clients, args.rate,
                                                         args.seconds)),
               "sat": _run(_closed_loop(gw, args.sat_conns, args.sat_seconds))}
        if args.size_mb:
            for name, (path, salt) in uploads.items():
                out[name] = bench_upload(gw, work, args.size_mb, salt=salt, path=path,
                                         expect="200")
        return out
    finally:
        gw.stop()


def sha256_alone(work: Path, size_mb: int) -> dict[str, float]:
    """SHA-256 of a file in the page cache, in 4 MB reads on one thread, beside a copy of it:
    the ceiling of any upload that hashes its bytes on one core (the content id is the
    file's SHA-256, one sequential pass)."""
    import hashlib

    src = work / "hash-alone.safetensors"
    size = make_big_checkpoint(src, size_mb, salt=11)
    buf = bytearray(4 << 20)
    with open(src, "rb", buffering=0) as fh:
        while fh.readinto(buf):
            pass
        fh.seek(0)
        h = hashlib.sha256()
        t = time.perf_counter()
        while n := fh.readinto(buf):
            h.update(memoryview(buf)[:n])
        hash_s = time.perf_counter() - t
    t = time.perf_counter()
    shutil.copyfile(src, work / "copy-dst.safetensors")
    copy_s = time.perf_counter() - t
    (work / "copy-dst.safetensors").unlink()
    src.unlink()
    return {"hash_mb_s": size / hash_s / 1e6, "copy_mb_s": size / copy_s / 1e6}


def _wait_up(gw: Gateway) -> None:
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(gw.url + "/", timeout=2).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(gw.log())
        time.sleep(0.2)


def run_floor(work: Path, port: int, args: argparse.Namespace) -> dict[str, Any]:
    """The same loads against a bare ASGI app on uvicorn (httptools, uvloop, no access log):
    what one request costs on this machine before any code of ours runs."""
    d = work / "floor"
    d.mkdir()
    (d / "floor_app.py").write_text(_FLOOR_APP)
    gw = Gateway("uvicorn floor", port, d, dict(os.environ))
    log = open(d / "serve.log", "ab")  # noqa: SIM115 (closed with the process)
    gw.proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "floor_app:app", "--port",
                                str(port), "--http", "httptools", "--loop", "uvloop",
                                "--no-access-log", "--log-level", "warning"], cwd=d,
                               stdout=log, stderr=log, start_new_session=True)
    log.close()
    return _measure_floor(gw, work, args, {"upload": ("/", 7)})


def _poll_line(label: str, f: PollFigures) -> str:
    return (f"{label}: p50 {f.q(50):.1f} ms, p99 {f.q(99):.1f} ms, max {max(f.lat_ms):.1f} ms, "
            f"{f.requests / f.seconds:.0f} req/s, gateway CPU {f.cpu_ms_per_req:.3f} ms/poll "
            f"({f.sys_share:.0%} kernel), "
            f"errors {f.errors}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", default=None, help="git ref for 'before' (e.g. main)")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--rate", type=float, default=2.0, help="polls per second per client")
    ap.add_argument("--keys", type=int, default=1,
                    help="API keys the clients poll with, each its own job (clients share "
                         "them round-robin; 1: every client the one key)")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--idle-seconds", type=float, default=10.0,
                    help="idle gateway CPU measured over this long, before the polls")
    ap.add_argument("--sat-conns", type=int, default=16)
    ap.add_argument("--sat-seconds", type=float, default=8.0)
    ap.add_argument("--size-mb", type=int, default=500, help="0: no upload bench")
    ap.add_argument("--uploads", type=int, default=2, help="uploads per variant (median)")
    ap.add_argument("--gateway-workers", type=int, default=2,
                    help="also run 'after' with this many gateway processes (1: skip)")
    ap.add_argument("--port-base", type=int, default=8700)
    ap.add_argument("--no-floor", dest="floor", action="store_false",
                    help="skip the bare-uvicorn context figures")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    results = []
    with tempfile.TemporaryDirectory(prefix="stitchsim-gwspeed-", dir=ROOT / ".bench-tmp"
                                     if (ROOT / ".bench-tmp").is_dir() else None) as tmp:
        work = Path(tmp)
        if args.baseline:
            farm = unpack_ref(args.baseline, work / "baseline")
            results.append(run_variant(f"before ({args.baseline})", farm, work,
                                       args.port_base, args))
        results.append(run_variant("after (this tree)", None, work, args.port_base + 10, args))
        floor = run_floor(work, args.port_base + 20, args) if args.floor else None
        raw = run_raw_floor(work, args.port_base + 21, args) if args.floor else None
        alone = sha256_alone(work, args.size_mb) if args.floor and args.size_mb else None

    print(f"\n== gateway speed: {args.clients} clients x {args.rate:g} polls/s open loop "
          f"({args.keys} key{'s' if args.keys > 1 else ''}), "
          f"{args.seconds:g} s; saturation {args.sat_conns} connections, {args.sat_seconds:g} s; "
          f"cores {os.cpu_count()}")
    if len(results) == 2:
        b, a = results
        print("ratios (after / before):")
        bo, ao = b["open"], a["open"]
        print(f"  gateway CPU per poll      x{ao.cpu_ms_per_req / bo.cpu_ms_per_req:.2f}"
              f"  ({bo.cpu_ms_per_req:.3f} -> {ao.cpu_ms_per_req:.3f} ms; goal <= 0.25 ms)")
        print(f"  open-loop p99             x{a['open'].q(99) / b['open'].q(99):.2f}"
              f"  ({b['open'].q(99):.1f} -> {a['open'].q(99):.1f} ms; goal <= 20 ms)")
        bs, as_ = (r["sat"].requests / r["sat"].seconds for r in (b, a))
        print(f"  saturation req/s, 1 proc  x{as_ / bs:.2f}  ({bs:.0f} -> {as_:.0f})")
        if args.size_mb:
            bu, au = b["upload"]["upload_mb_s"], a["upload"]["upload_mb_s"]
            print(f"  upload MB/s               x{au / bu:.2f}  ({bu:.0f} -> {au:.0f})")
    if args.size_mb:
        # This disk's write speed swings by several times within minutes (a shared machine):
        # each variant is judged against the median of every copy of the run, made just
        # before each upload of either variant.
        copy = statistics.median(c for r in results for c in r["upload"]["copies_mb_s"])
        print(f"uploads ({args.size_mb} MB, curl raw body, median of {args.uploads}) vs a plain "
              f"copy of the same file on the same disk ({copy:.0f} MB/s, median of the run's "
              "copies; goal >= 0.5):")
        for r in results:
            u = r["upload"]
            print(f"  {r['name']:24s} x{u['upload_mb_s'] / copy:.2f}  ({u['upload_mb_s']:.0f} "
                  f"MB/s; against the copy just before each: x{u['vs_copy']:.2f}; gateway RSS "
                  f"+{u['rss_growth_mb']:.0f} MB; gateway CPU per GB: user "
                  f"{u['user_s_per_gb']:.2f} s, kernel {u['sys_s_per_gb']:.2f} s)")
        contexts = []
        if floor is not None:
            contexts.append((floor["name"], floor["upload"], "body received and dropped"))
        if raw is not None:
            contexts.append((raw["name"], raw["drop"], "body received and dropped"))
            contexts.append((raw["name"], raw["hash"], "SHA-256 and file writes in two "
                                                       "threads, as ours"))
        for name, u, what in contexts:
            print(f"  {'context: ' + name:24s} x{u['upload_mb_s'] / copy:.2f}  "
                  f"({u['upload_mb_s']:.0f} MB/s, {what}; CPU per GB: "
                  f"user {u['user_s_per_gb']:.2f} s, kernel {u['sys_s_per_gb']:.2f} s)")
        if alone is not None:
            print(f"  {'context: SHA-256 alone':24s} x{alone['hash_mb_s'] / copy:.2f}  "
                  f"({alone['hash_mb_s']:.0f} MB/s on one thread from the page cache; a copy "
                  f"made just after: {alone['copy_mb_s']:.0f} MB/s)")
    for r in results:
        print(f"-- {r['name']}")
        print("  " + _poll_line("open loop ", r["open"]))
        o = r["open"]
        idle_per_poll = r["idle_ms_s"] / (o.requests / o.seconds)
        print(f"  idle gateway: {r['idle_ms_s']:.1f} ms CPU/s, {idle_per_poll:.3f} ms of each "
              f"open-loop poll; net of it {o.cpu_ms_per_req - idle_per_poll:.3f} ms/poll (the "
              "goal is judged on the gross figure above)")
        s = r["sat"]
        print("  " + _poll_line("saturation", s)
              + f"; one busy process: {1000 / s.cpu_ms_per_req:.0f} req/s")
        if "multi_open" in r:
            m, ms = r["multi_open"], r["multi_sat"]
            print(f"  {args.gateway_workers} gateway processes:")
            print("    " + _poll_line("open loop ", m))
            print("    " + _poll_line("saturation", ms) + f"; per process "
                  f"{ms.requests / ms.seconds / args.gateway_workers:.0f} req/s")
    for ctx, what in ((floor, "a bare ASGI app, no code of ours"),
                      (raw, "a raw asyncio protocol on uvloop: no HTTP library, no ASGI")):
        if ctx is None:
            continue
        print(f"-- context: {ctx['name']} ({what})")
        print("  " + _poll_line("open loop ", ctx["open"]))
        fs = ctx["sat"]
        print("  " + _poll_line("saturation", fs)
              + f"; one busy process: {1000 / fs.cpu_ms_per_req:.0f} req/s")
    if args.json:
        args.json.write_text(json.dumps(results, default=lambda o: {
            k: v for k, v in o.__dict__.items() if k != "lat_ms"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
