"""The embedded default's footprint: `stitchsim-server serve` from start to /readyz ready, and
the resident memory of serve and all its children while idle, then after one checked job
(and, with idle release on, once the workers let their torch processes go).

    python bench/footprint.py [--idle-release 60,0] [--port 8650] [--settle 8] [--no-job]

`--idle-release` runs the service once per value of STITCHSIM_WORKER_IDLE_RELEASE_S:
0 is the previous default (pool processes kept, each importing torch and the engine at start),
a positive value the new one (no pool process while idle). Prints, per run, the seconds to
ready, RSS and PSS (shared pages split between the processes that share them) of the process
tree, and the processes; then the ratios against the first run. The goal (issue 17): idle
RSS at most 1.2 GB and ready within 10 s on two cores.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MB = 1024 * 1024


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            kids.append(int(entry))
    return kids


def tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(_children(p))
    return out


def _field(path: str, name: str) -> int:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def memory(pid: int) -> tuple[int, int, list[str]]:
    """RSS and PSS of the tree under pid, and one line per process."""
    rss = pss = 0
    lines = []
    for p in tree(pid):
        r, s = _field(f"/proc/{p}/status", "VmRSS"), _field(f"/proc/{p}/smaps_rollup", "Pss")
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:90]
        except OSError:
            continue
        rss, pss = rss + r, pss + s
        lines.append(f"    pid {p:7d} rss {r / MB:7.0f} MB pss {s / MB:7.0f} MB  {cmd}")
    return rss, pss, lines


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited with {proc.returncode}")
        try:
            r = httpx.get(url + "/readyz", timeout=2)
            if r.status_code == 200:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"not ready after {timeout} s")


def _settled(pid: int, settle: float) -> tuple[int, int, list[str]]:
    """The tree's memory once it stopped growing for a while (pool children finish importing)."""
    last, still = -1, time.monotonic()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        rss, pss, lines = memory(pid)
        if abs(rss - last) > 5 * MB:
            last, still = rss, time.monotonic()
        elif time.monotonic() - still >= settle:
            return rss, pss, lines
        time.sleep(0.5)
    return memory(pid)


def _one_job(url: str) -> float:
    from stitchsim_worker.engine.models.zoo import make_checkpoint

    from tests.service.helpers import TINY_SPEC

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "m.safetensors"
        make_checkpoint(ckpt, "test_resnet", "digits", arch_kwargs={}, seed=0, epochs=1)
        with httpx.Client(base_url=url, timeout=300) as c, open(ckpt, "rb") as fh:
            ident = c.post("/checkpoints", files={"file": fh}).json()["id"]
            t0 = time.monotonic()
            r = c.post("/similarity", json={**TINY_SPEC, "front": {"checkpoint": ident},
                                            "back": {"checkpoint": ident}})
            r.raise_for_status()
            job = r.json()["job_id"]
            while c.get(f"/jobs/{job}").json()["state"] not in ("succeeded", "failed"):
                time.sleep(0.2)
            return time.monotonic() - t0


def run(idle_release: float, port: int, settle: float, job: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as data:
        t0 = time.monotonic()
        proc, log = start_serve(data, port, {"STITCHSIM_WORKER_IDLE_RELEASE_S": str(idle_release)})
        out: dict[str, Any] = {"idle_release": idle_release}
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_ready(url, proc, 300)
            out["ready_s"] = time.monotonic() - t0
            out["idle"] = _settled(proc.pid, settle)
            if job:
                out["job_s"] = _one_job(url)
                out["after_job"] = memory(proc.pid)
                if idle_release > 0:
                    time.sleep(idle_release + 3)
                    out["released"] = _settled(proc.pid, settle)
        finally:
            stop_group(proc)
            log.close()
    return out


def start_serve(data: str, port: int, extra_env: dict[str, str]
                ) -> tuple[subprocess.Popen[bytes], IO[bytes]]:
    """`stitchsim-server serve` on its embedded default in `data`, in its own process group,
    logging to data/serve.log (the caller closes the log)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "STITCHSIM_DATA_DIR": data,
           "STITCHSIM_PORT": str(port), **extra_env}
    for var in ("STITCHSIM_REDIS_URL", "STITCHSIM_DATABASE_URL", "STITCHSIM_STORE_URL"):
        env.pop(var, None)
    log = open(Path(data) / "serve.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "stitchsim_worker.cli", "serve"], env=env,
                            stdout=log, stderr=log, start_new_session=True)
    return proc, log


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """Stops `serve` and the workers it started (its process group); SIGKILL after 30 s."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle-release", default="0,60",
                        help="STITCHSIM_WORKER_IDLE_RELEASE_S per run, comma-separated")
    parser.add_argument("--port", type=int, default=8650)
    parser.add_argument("--settle", type=float, default=8.0,
                        help="seconds the memory must hold still to count as idle")
    parser.add_argument("--no-job", action="store_true", help="idle figures only")
    args = parser.parse_args()
    results = []
    for value in (float(v) for v in args.idle_release.split(",")):
        r = run(value, args.port, args.settle, not args.no_job)
        results.append(r)
        print(f"idle release {value:g} s: ready in {r['ready_s']:.1f} s", flush=True)
        for label in ("idle", "after_job", "released"):
            if label in r:
                rss, pss, lines = r[label]
                extra = f" (job took {r['job_s']:.1f} s)" if label == "after_job" else ""
                print(f"  {label:9s} rss {rss / MB:6.0f} MB, pss {pss / MB:6.0f} MB in "
                      f"{len(lines)} processes{extra}", flush=True)
                print("\n".join(lines), flush=True)
    base = results[0]
    for r in results[1:]:
        print(f"idle release {r['idle_release']:g} s vs {base['idle_release']:g} s: ready "
              f"{r['ready_s'] / base['ready_s']:.2f}x, idle rss "
              f"{r['idle'][0] / base['idle'][0]:.2f}x, idle pss "
              f"{r['idle'][1] / base['idle'][1]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
