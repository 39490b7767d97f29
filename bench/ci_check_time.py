"""Time per check of the `ci` budget preset on this CPU for the demo models (issue 37 item 4):
in-process jobs (run_job, as `stitchsim-server run`) of the demo spec under the service's
default IRI method with `budget: "ci"`, into a fresh cache folder: first the reference vs the
retrained model (the reference cache cold: its IRIs, tensors and logits are made), then the
reference vs the shortcut model (warm: read back). Goal: at most 2 minutes a check.

    python bench/ci_check_time.py --models .stitchsim/demo/models   # torch's threads, as a worker
    OMP_NUM_THREADS=1 python bench/ci_check_time.py --models .stitchsim/demo/models --budget full

Prints, per check, wall and process CPU seconds (the machine may be shared: CPU seconds are
what the check itself took), the engine's seconds by part, the reference cache's hits, the
IRIs' median distances and steps, both protocols' figures, and the load average around it.
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

from bench.reference_reuse import by_part, demo_spec  # noqa: E402


def ci_spec(spec_file: Path, front: Path, back: Path, budget: str) -> Any:
    from stitchsim.models import Spec

    fields = {**demo_spec(spec_file), "budget": budget,
              "front": {"checkpoint": {"path": str(front)}},
              "back": {"checkpoint": {"path": str(back)}}}
    if budget != "full":  # the preset's training samples: the demo spec's own would win
        fields["train"] = {k: v for k, v in fields["train"].items() if k != "max_train_samples"}
    return Spec.model_validate(fields)


def timed_check(spec: Any, cache: Path) -> dict[str, Any]:
    from stitchsim_worker.engine import Resources, run_job

    load0 = os.getloadavg()[0]
    wall0, cpu0 = time.perf_counter(), time.process_time()
    report = run_job(spec, resources=Resources(cache_dir=cache))
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    env, s = report.environment, report.summary
    iri = [r.iri for r in report.results if r.iri is not None]
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
            "load_1min": [round(load0, 2), round(os.getloadavg()[0], 2)],
            "engine_s": env["seconds"], "parts": by_part(env["stage_seconds"]),
            "reference_cache": env.get("reference_cache"),
            "points": [p.front for p in spec.layers],
            # What ran: the ci budget resolves the training samples at the job's points.
            "samples": [report.method.settings.get("train.max_train_samples")
                        if report.method else None, spec.train.max_test_samples],
            "iri_median": sorted({round(r.median, 3) for r in iri}),
            "iri_steps_used": sorted({round(r.steps_used or r.steps) for r in iri}),
            "iri_converged": all(r.converged for r in iri),
            "similarity": s.similarity, "protocol": s.similarity_protocol,
            "by_protocol": s.by_protocol, "verdict": report.verdict,
            "caveats": [c.code for c in report.caveats or []]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=Path, default=ROOT / ".stitchsim/demo/models")
    ap.add_argument("--spec", type=Path, default=ROOT / "examples/demo-spec.json")
    ap.add_argument("--budget", default="ci")
    ap.add_argument("--cache", type=Path, help="default: a fresh temporary folder (cold)")
    ap.add_argument("--json", type=Path, help="write both checks' figures here")
    args = ap.parse_args()
    from stitchsim_worker.run_command import train_demo_models

    for line in train_demo_models(args.models):
        print(line, flush=True)
    ref, a, b = (args.models / f"{n}.safetensors" for n in ("reference", "retrained", "shortcut"))
    print(f"uptime: {os.popen('uptime').read().strip()}; torch threads "
          f"{__import__('torch').get_num_threads()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        cache = args.cache or Path(tmp)
        first = timed_check(ci_spec(args.spec, ref, a, args.budget), cache)
        print(f"first  (cold) reference vs retrained: {json.dumps(first)}", flush=True)
        second = timed_check(ci_spec(args.spec, ref, b, args.budget), cache)
        print(f"second (warm) reference vs shortcut:  {json.dumps(second)}", flush=True)
    print(f"uptime: {os.popen('uptime').read().strip()}")
    print(f"second / first: wall {second['wall_s'] / first['wall_s']:.2f}x, "
          f"cpu {second['cpu_s'] / first['cpu_s']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"budget": args.budget, "cpu_count": os.cpu_count(),
                                         "first": first, "second": second}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
