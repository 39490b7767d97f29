"""What compaction saves on the demo's seeds check, and what it changes (issue 48 item 2).

Compaction (iri.extra_rounds_stop_at_aim): in the IRIs' extra rounds, a sample already under
the rounds' aim (0.9 x converged_below) leaves the batch, so a round steps only the samples that
keep the median up. The bench runs the demo's first check (reference vs retrained, the demo
spec, the service's default IRI method) in-process twice into fresh caches, without and with
it, and prints per stitch point the IRIs' steps per sample, the sample-steps against the cap
(every sample taking every round), the final median distance, the IRI seconds, and the
invariance-aware agreement; then the figure the verdict uses.

    nice -n 19 python bench/iri_compaction.py --models examples/demo-models --json out.json
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

from bench.reference_reuse import demo_spec  # noqa: E402


def run(spec_file: Path, models: Path, compaction: bool) -> dict[str, Any]:
    from stitchsim.models import Spec
    from stitchsim_worker.engine import Resources, run_job

    fields = {**demo_spec(spec_file),
              "front": {"checkpoint": {"path": str(models / "reference.safetensors")}},
              "back": {"checkpoint": {"path": str(models / "retrained.safetensors")}}}
    fields["iri"] = {**fields.get("iri", {}), "extra_rounds_stop_at_aim": compaction}
    spec = Spec.model_validate(fields)
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as cache:
        t0 = time.perf_counter()
        report = run_job(spec, resources=Resources(cache_dir=Path(cache)))
        wall = time.perf_counter() - t0
    points = []
    for r in report.results:
        if r.iri is None:
            continue
        steps = r.iri.steps_used or r.iri.steps
        points.append({"point": r.front_layer, "n": r.iri.n, "steps_per_sample": round(steps, 1),
                       "sample_steps": round(steps * r.iri.n),
                       "cap_sample_steps": r.iri.steps * r.iri.n,
                       "median": round(r.iri.median, 4), "iri_s": round(r.iri.seconds, 1),
                       "agreement": round(r.agreement, 4)})
    return {"compaction": compaction, "wall_s": round(wall, 1),
            "load_1min": [round(load0, 2), round(os.getloadavg()[0], 2)],
            "points": points, "similarity": report.summary.similarity,
            "verdict": report.verdict}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=Path, default=ROOT / "examples/demo-models")
    ap.add_argument("--spec", type=Path, default=ROOT / "examples/demo-spec.json")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    runs = []
    for compaction in (False, True):
        runs.append(run(args.spec, args.models, compaction))
        print(json.dumps(runs[-1]), flush=True)
    off, on = runs
    for a, b in zip(off["points"], on["points"], strict=True):
        saved = 1 - b["sample_steps"] / a["sample_steps"]
        print(f"{a['point']:>8}: sample-steps {a['sample_steps']} -> {b['sample_steps']} "
              f"({saved:.0%} saved; cap {a['cap_sample_steps']}), median {a['median']} -> "
              f"{b['median']}, agreement {a['agreement']} -> {b['agreement']}")
    print(f"similarity {off['similarity']} -> {on['similarity']}; wall {off['wall_s']} s -> "
          f"{on['wall_s']} s")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
