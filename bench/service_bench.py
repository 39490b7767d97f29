"""Service speed, both modes (embedded default and Redis): upload throughput of a 500 MB
checkpoint beside a plain file copy, submit → worker start latency, and status-poll latency
under 50 concurrent pollers.

    python bench/service_bench.py [--size-mb 500] [--pollers 50] [--modes embedded,redis]

Its polls are a closed loop (each poller sends again as soon as answered), so under 50 pollers
p99 measures one process's saturation; bench/gateway_speed.py measures polls as an open loop
(fixed arrival rate), uploads against a copy, and main's code beside this tree's.

Starts real services (as the tests do: `stitchsim-server serve`, or a gateway plus Celery
workers on the Redis at 127.0.0.1:6379) in a temp dir, prints figures and ratios, and
optionally writes them as JSON. Loopback only; every loop is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fixtures_service import ServiceFactory, ServiceHandle  # noqa: E402


class TempDirs:
    """What ServiceFactory needs of pytest's tmp_path_factory, outside pytest."""

    def __init__(self, base: Path):
        self.base = base

    def mktemp(self, name: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=name + "-", dir=self.base))


def make_big_checkpoint(path: Path, size_mb: int, salt: int) -> int:
    """A valid safetensors file of about size_mb MB (U8 tensors, one per 64 MB)."""
    chunk = 64 * 1024 * 1024
    total = size_mb * 1024 * 1024
    sizes = [chunk] * (total // chunk) + ([total % chunk] if total % chunk else [])
    header: dict[str, Any] = {"__metadata__": {"salt": str(salt)}}
    off = 0
    for i, n in enumerate(sizes):
        header[f"t{i}"] = {"dtype": "U8", "shape": [n], "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    block = os.urandom(1024 * 1024)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        for n in sizes:
            for _ in range(n // len(block)):
                fh.write(block)
            fh.write(block[: n % len(block)])
    return path.stat().st_size


def _drop_cache_hint(path: Path) -> None:
    # Keep the comparison fair: both the copy and the upload read a file the page cache holds.
    with open(path, "rb") as fh:
        while fh.read(16 * 1024 * 1024):
            pass


def bench_upload(svc: ServiceHandle, work: Path, size_mb: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    src = work / "big-copy.safetensors"
    size = make_big_checkpoint(src, size_mb, salt=0)
    _drop_cache_hint(src)
    # Both sides go through the page cache (no fsync on either), so the ratio compares the
    # service's receive/hash/store path with the kernel's copy.
    t = time.perf_counter()
    shutil.copyfile(src, work / "copied.safetensors")
    copy_s = time.perf_counter() - t
    (work / "copied.safetensors").unlink()
    src.unlink()
    out["file_copy_mb_s"] = size / copy_s / 1e6

    hows = ["raw", "multipart"] + (["curl"] if shutil.which("curl") else [])
    for i, how in enumerate(hows):
        f = work / f"big-{how}.safetensors"
        make_big_checkpoint(f, size_mb, salt=i + 1)  # new bytes: no dedup shortcut
        _drop_cache_hint(f)
        t = time.perf_counter()
        if how == "curl":
            # A C client: what the service itself can take, without httpx's own cost.
            auth = ["-H", f"Authorization: Bearer {svc.api_key}"] if svc.api_key else []
            code = subprocess.run(
                ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--data-binary",
                 f"@{f}", "-H", "content-type: application/octet-stream", *auth,
                 svc.url + "/checkpoints"], capture_output=True, text=True, timeout=600,
            ).stdout
            secs = time.perf_counter() - t
            assert code == "201", code
        else:
            with svc.client(timeout=600) as c, open(f, "rb") as fh:
                if how == "raw":
                    r = c.post("/checkpoints", content=fh,
                               headers={"content-type": "application/octet-stream"})
                else:
                    r = c.post("/checkpoints", files={"file": (f.name, fh)})
                secs = time.perf_counter() - t
            assert r.status_code == 201, r.text
        f.unlink()
        out[f"upload_{how}_mb_s"] = size / secs / 1e6
        out[f"upload_{how}_vs_copy"] = out[f"upload_{how}_mb_s"] / out["file_copy_mb_s"]
    out["size_mb"] = size / 1e6
    return out


def _tiny_spec(front: str, back: str) -> dict[str, Any]:
    return {"front": {"checkpoint": front}, "back": {"checkpoint": back},
            "layers": [{"front": "layer1", "back": "layer1"}], "protocols": ["standard"],
            "directions": "front_to_back",
            "train": {"epochs": 1, "max_train_samples": 100, "max_test_samples": 50}}


def _ts(s: str) -> float:
    return datetime.fromisoformat(s).timestamp()


def bench_start_latency(svc: ServiceHandle, front: str, back: str, n: int) -> dict[str, Any]:
    post_s, queue_s, total_s = [], [], []
    with svc.client() as c:
        for i in range(n):
            spec = _tiny_spec(front, back)
            spec["train"]["seed"] = i
            t0 = time.time()
            r = c.post("/similarity", json=spec)
            t1 = time.time()
            assert r.status_code == 202, r.text
            job = r.json()["job_id"]
            seen = svc.wait_job(job, states=("running", "succeeded", "failed", "cancelled"))
            st = seen[-1]
            assert st["started_at"], st
            started = _ts(st["started_at"])
            post_s.append(t1 - t0)
            queue_s.append(started - _ts(st["created_at"]))
            total_s.append(started - t0)
            c.delete(f"/jobs/{job}")  # free the worker for the next sample
            svc.wait_job(job)
    return {"submit_post_s_median": statistics.median(post_s),
            "created_to_started_s_median": statistics.median(queue_s),
            "submit_to_started_s_median": statistics.median(total_s),
            "submit_to_started_s_max": max(total_s), "samples": n}


async def _poll(url: str, headers: dict[str, str], job: str, pollers: int,
                seconds: float) -> list[float]:
    lat: list[float] = []
    limits = httpx.Limits(max_connections=pollers, max_keepalive_connections=pollers)
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits,
                                 timeout=30) as c:
        stop = time.perf_counter() + seconds

        async def one() -> None:
            for _ in range(100_000):  # bounded
                if time.perf_counter() > stop:
                    return
                t = time.perf_counter()
                r = await c.get(f"/jobs/{job}")
                lat.append(time.perf_counter() - t)
                assert r.status_code == 200, r.text

        await asyncio.gather(*(one() for _ in range(pollers)))
    return lat


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_polls(svc: ServiceHandle, job: str, pollers: int, seconds: float) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {svc.api_key}"} if svc.api_key else {}
    gateway = svc.procs.get("serve") or svc.procs["gateway"]
    cpu0 = _cpu_s(gateway.pid)
    lat = asyncio.run(_poll(svc.url, headers, job, pollers, seconds))
    cpu = _cpu_s(gateway.pid) - cpu0
    lat.sort()
    q = statistics.quantiles(lat, n=100)
    return {"pollers": pollers, "requests": len(lat), "req_per_s": len(lat) / seconds,
            "p50_ms": q[49] * 1000, "p99_ms": q[98] * 1000, "max_ms": lat[-1] * 1000,
            # Robust to a busy machine: what one poll costs the gateway process.
            "gateway_cpu_ms_per_request": cpu / len(lat) * 1000}


def run_mode(mode: str, factory: ServiceFactory, args: argparse.Namespace,
             work: Path) -> dict[str, Any]:
    limit = {"STITCHSIM_MAX_UPLOAD_BYTES": str((args.size_mb + 64) * 1024 * 1024)}
    svc = (factory.embedded(extra_env=limit) if mode == "embedded"
           else factory.redis(keys=True, extra_env=limit))
    res: dict[str, Any] = {"mode": mode, "database": svc.database_url.split(":", 1)[0]}
    res["upload"] = bench_upload(svc, work, args.size_mb)
    ck = [make_small(work, i) for i in range(2)]
    with svc.client() as c:
        ids = []
        for p in ck:
            with open(p, "rb") as fh:
                ids.append(c.post("/checkpoints", files={"file": fh}).json()["id"])
    res["start"] = bench_start_latency(svc, ids[0], ids[1], args.start_samples)
    with svc.client() as c:
        job = c.get("/jobs", params={"limit": 1}).json()["items"][0]["id"]
    res["poll"] = bench_polls(svc, job, args.pollers, args.poll_seconds)
    return res


def make_small(work: Path, seed: int) -> Path:
    from stitchsim_worker.engine.models.zoo import make_checkpoint

    path = work / f"small{seed}.safetensors"
    if not path.exists():
        make_checkpoint(path, "test_resnet", "digits", seed=seed, epochs=1)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=500)
    ap.add_argument("--pollers", type=int, default=50)
    ap.add_argument("--poll-seconds", type=float, default=10.0)
    ap.add_argument("--start-samples", type=int, default=5)
    ap.add_argument("--modes", default="embedded,redis")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    results = []
    with tempfile.TemporaryDirectory(prefix="stitchsim-bench-") as tmp:
        work = Path(tmp)
        factory = ServiceFactory(TempDirs(work))  # type: ignore[arg-type]
        try:
            for mode in args.modes.split(","):
                results.append(run_mode(mode, factory, args, work))
                factory.close()
                factory = ServiceFactory(TempDirs(work))  # type: ignore[arg-type]
        finally:
            factory.close()

    for r in results:
        u, s, p = r["upload"], r["start"], r["poll"]
        print(f"\n== {r['mode']} (job table: {r['database']})")
        line = (f"upload {u['size_mb']:.0f} MB: plain copy {u['file_copy_mb_s']:.0f} MB/s; "
                f"httpx raw body {u['upload_raw_mb_s']:.0f} MB/s (x{u['upload_raw_vs_copy']:.2f} "
                f"of copy); httpx multipart {u['upload_multipart_mb_s']:.0f} MB/s "
                f"(x{u['upload_multipart_vs_copy']:.2f})")
        if "upload_curl_mb_s" in u:
            line += (f"; curl raw body {u['upload_curl_mb_s']:.0f} MB/s "
                     f"(x{u['upload_curl_vs_copy']:.2f})")
        print(line)
        print(f"submit: POST {s['submit_post_s_median'] * 1000:.0f} ms (includes the spec "
              f"check); created->started {s['created_to_started_s_median'] * 1000:.0f} ms; "
              f"submit->started median {s['submit_to_started_s_median'] * 1000:.0f} ms, max "
              f"{s['submit_to_started_s_max'] * 1000:.0f} ms ({s['samples']} jobs)")
        print(f"status polls, {p['pollers']} concurrent: p50 {p['p50_ms']:.1f} ms, p99 "
              f"{p['p99_ms']:.1f} ms, max {p['max_ms']:.1f} ms, {p['req_per_s']:.0f} req/s "
              f"({p['requests']} requests; gateway CPU {p['gateway_cpu_ms_per_request']:.1f} ms "
              "per poll; pollers and gateway share the machine)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
