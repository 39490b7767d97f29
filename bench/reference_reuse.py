"""What a second check against the same reference costs: `stitchsim-server serve` (the real
gateway, workers and local store), the demo models, the demo spec under the service's default
IRI method; first A-vs-R (reference vs retrained), then B-vs-R (reference vs shortcut). The
second reads the reference's IRIs, tensors and logits from the store (engine/core/refcache.py)
instead of computing them.

    python bench/reference_reuse.py [--models .stitchsim/demo/models] [--port 8660]

Prints each check's wall time (submit to succeeded), the engine's seconds by stage, its work
units, the reference cache's hits and the ratio of the second to the first (goal <= 0.55).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.footprint import _wait_ready, start_serve, stop_group  # noqa: E402


def demo_spec(path: Path) -> dict[str, Any]:
    """The demo spec under the service's default IRI method (no iri.method pinned)."""
    spec = json.loads(path.read_text())
    iri = {k: v for k, v in spec.get("iri", {}).items() if k != "method"}
    return {**spec, "iri": iri} if iri else {k: v for k, v in spec.items() if k != "iri"}


def by_part(stage_seconds: dict[str, float]) -> dict[str, float]:
    """Stage seconds grouped by their part (prepare, stitch, measures, control)."""
    parts: dict[str, float] = {}
    for stage, s in stage_seconds.items():
        part = stage.split(" ")[0]
        parts[part] = parts.get(part, 0.0) + s
    return {k: round(v, 1) for k, v in parts.items()}


def check(client: Any, front: Path, back: Path, spec: dict[str, Any]) -> dict[str, Any]:
    t0 = time.monotonic()
    job = client.compare(str(front), str(back), spec=spec)
    seen: list[Any] = []  # every status the long-polls answered: the last holds the units
    report = job.wait(timeout=3600, progress=seen.append)
    wall = time.monotonic() - t0
    status = seen[-1] if seen else None
    env = report.environment
    iri = [r.iri for r in report.results if r.iri is not None]
    return {"wall_s": round(wall, 1), "engine_s": env["seconds"],
            "stages": by_part(env["stage_seconds"]),
            "units": status.progress.total if status is not None else None,
            "cache": env["reference_cache"],
            "iri_hits": f"{sum(s.cache_hit for s in iri)}/{len(iri)}",
            "iri_seconds": round(sum(s.seconds for s in iri), 1),
            "similarity": report.summary.model_dump(mode="json").get("similarity"),
            "verdict": report.verdict}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, default=ROOT / ".stitchsim/demo/models")
    parser.add_argument("--spec", type=Path, default=ROOT / "examples/demo-spec.json")
    parser.add_argument("--port", type=int, default=8660)
    args = parser.parse_args()
    from stitchsim.sdk import Client
    from stitchsim_worker.run_command import train_demo_models

    for line in train_demo_models(args.models):
        print(line, flush=True)
    ref, a, b = (args.models / f"{n}.safetensors" for n in ("reference", "retrained", "shortcut"))
    spec = demo_spec(args.spec)
    print(f"spec: {json.dumps(spec)}", flush=True)
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as data:
        proc, log = start_serve(data, args.port, {"STITCHSIM_WORKER_IDLE_RELEASE_S": "0"})
        try:
            url = f"http://127.0.0.1:{args.port}"
            _wait_ready(url, proc, 300)
            with Client(url) as client:
                first = check(client, ref, a, spec)
                print(f"first  A-vs-R: {json.dumps(first)}", flush=True)
                second = check(client, ref, b, spec)
                print(f"second B-vs-R: {json.dumps(second)}", flush=True)
        finally:
            stop_group(proc)
            log.close()
    load1 = os.getloadavg()
    print(f"second / first: wall {second['wall_s'] / first['wall_s']:.2f}x, engine "
          f"{second['engine_s'] / first['engine_s']:.2f}x (goal <= 0.55x)")
    print(f"reference cache: first {first['cache']['hits']} hits / {first['cache']['written']} "
          f"written, second {second['cache']['hits']} hits / {second['cache']['misses']} misses")
    print(f"load average (1/5/15 min): before {load0[0]:.1f}/{load0[1]:.1f}/{load0[2]:.1f}, "
          f"after {load1[0]:.1f}/{load1[1]:.1f}/{load1[2]:.1f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
