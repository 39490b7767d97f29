"""Calibrated gates judged on held-out models (issue 46 item 4): false alarms on benign
retrains the limits never saw, and the harmful models each gate catches.

Per family (bench/drift_power.py's FAMILIES, its training loop, its checks and its harmful
series): the reference (seed 0); a CALIBRATION set of 8 benign retrains (seeds 100-107, each
seed its own init and batch order) and a HELD-OUT set of 8 more: 4 reseeds (200-203), 2 with
one more epoch than the recipe (204, 205), 2 with their own batch order (init 206/207, order
306/307). Every training is independent; the seeds are recorded; the bench stops if two
models share their weights (the same bytes). Harmful: drift_power's doses (marker, label
noise, pruning of the seed-1 retrain, the class-dropping fine-tune).

Each model is checked once against the reference (seed 0 of the stitch: a rerun with the same
seed is the same figure, drift_power's finding). Gates, each at a 1 % family-wise false-alarm
rate where it is calibrated (stitchsim.calibration's Student t prediction bound, limits set
on the calibration set only):

- calibrated per-point standard + accuracy (the default), per-point standard alone,
  calibrated similarity, calibrated accuracy alone, calibrated CKA alone, accuracy + CKA;
- `--max-drop auto` with each calibration model in turn as the baseline (8 x 8 pairs);
- the largest-benign-drop limit: the similarity's largest drop over the calibration set,
  from its first model as the baseline.

Per gate: false alarms on the held-out benign models with a 95 % Clopper-Pearson interval
(scipy.stats.binomtest), and the harmful models it fails.

    nice -n 10 python bench/drift_heldout.py --out /tmp/heldout --families resnet --budget ci
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from scipy import stats
from stitchsim.gates import AUTO_K

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.drift_power import (  # noqa: E402
    FAMILIES,
    REFERENCE_SEED,
    Bench,
    Family,
    Sizes,
    Variant,
    loader,
    model_file,
    train,
    variants,
)
from bench.gate_choice import (  # noqa: E402
    GATES as CALIBRATED,  # noqa: E402
    fails,
    figures_of,
    limits_of,
)

CALIBRATION_SEEDS = tuple(range(100, 108))


@dataclass(frozen=True)
class Trained:
    name: str
    role: str  # reference | calibration | held_out | harmful
    seeds: dict[str, int]
    make: Callable[[], torch.nn.Module] | None


def benign(fam: Family) -> list[Trained]:
    out = [Trained(f"cal{s}", "calibration", {"init": s, "order": s},
                   lambda s=s: train(fam, seed=s)) for s in CALIBRATION_SEEDS]
    out += [Trained(f"held{s}", "held_out", {"init": s, "order": s},
                    lambda s=s: train(fam, seed=s)) for s in (200, 201, 202, 203)]
    out += [Trained(f"held{s}-epoch+1", "held_out", {"init": s, "order": s},
                    lambda s=s: train(fam, seed=s, epochs=fam.epochs + 1)) for s in (204, 205)]
    out += [Trained(f"held{s}-order{s + 100}", "held_out", {"init": s, "order": s + 100},
                    lambda s=s: train(fam, seed=s, order_seed=s + 100)) for s in (206, 207)]
    return out


def harmful(fam: Family, load: Callable[[str], torch.nn.Module]) -> list[Trained]:
    keep = ("baseline", "marker", "noise", "prune", "drop")
    return [Trained(v.name, "harmful" if v.kind != "baseline" else "source", {}, v.make)
            for v in variants(fam, load, 0) if v.kind in keep]


def unique_weights(paths: dict[str, Path]) -> None:
    """Stop when two models are the same bytes: a band of one model counted twice."""
    seen: dict[str, str] = {}
    for name, path in paths.items():
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest in seen:
            raise SystemExit(f"{name} and {seen[digest]} share their weights: every training "
                             "of the bench must be independent")
        seen[digest] = name


def interval(k: int, n: int) -> list[float]:
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    return [round(ci.low, 4), round(ci.high, 4)]


def calibrated_gates(cal: list[dict[str, Any]], held: dict[str, dict[str, Any]],
                     bad: dict[str, dict[str, Any]]) -> dict[str, Any]:
    cal_figures = [figures_of(r) for r in cal]
    out = {}
    for label, kinds in CALIBRATED.items():
        limits = limits_of(cal_figures, kinds)
        alarms = [n for n, r in held.items() if fails(limits, figures_of(r))]
        out[label] = {"figures": len(limits), "false_alarms": alarms,
                      "false_alarm_rate": [len(alarms), len(held)],
                      "interval_95": interval(len(alarms), len(held)),
                      "caught": [n for n, r in bad.items() if fails(limits, figures_of(r))]}
    return out


def baseline_gates(cal: list[dict[str, Any]], held: dict[str, dict[str, Any]],
                   bad: dict[str, dict[str, Any]]) -> dict[str, Any]:
    def sim(r: dict[str, Any]) -> float:
        return float(r["checks"][0]["similarity"])

    pairs = [(b, h) for b in cal for h in held.values()]
    auto = [sim(b) - sim(h) > AUTO_K * b["checks"][0]["ci_half_width"] + 1e-9 for b, h in pairs]
    caught_auto = {n: sum(sim(b) - sim(r) > AUTO_K * b["checks"][0]["ci_half_width"] + 1e-9
                          for b in cal) / len(cal) for n, r in bad.items()}
    base = cal[0]
    largest = max(0.0, *[sim(base) - sim(r) for r in cal[1:]])
    alarms = [n for n, r in held.items() if sim(base) - sim(r) > largest + 1e-9]
    return {
        "auto (each calibration model as the baseline)": {
            "false_alarm_rate": [sum(auto), len(pairs)],
            "interval_95": interval(sum(auto), len(pairs)),
            "caught_share_of_baselines": caught_auto,
            "caught": [n for n, share in caught_auto.items() if share > 0.5]},
        "largest benign drop (similarity)": {
            "limit": largest, "false_alarms": alarms,
            "false_alarm_rate": [len(alarms), len(held)],
            "interval_95": interval(len(alarms), len(held)),
            "caught": [n for n, r in bad.items() if sim(base) - sim(r) > largest + 1e-9]},
    }


def run_family(b: Bench, name: str, family: dict[str, Any], save: Callable[[], None]) -> None:
    """Benign models first, then the harmful ones, into `family`; `save` after each check
    (a run stopped early leaves what it measured), with the gates once the calibration set
    and one held-out model are in."""
    fam = FAMILIES[name]
    ref_variant = Variant("reference", "reference", 0, lambda: train(fam, seed=REFERENCE_SEED))
    ref, _ = model_file(b.out, name, fam, ref_variant, Path())
    models = [*benign(fam), *harmful(fam, loader(b.out, name, fam))]
    rows: dict[str, dict[str, Any]] = {}
    paths = {"reference": ref}
    family.update(models=rows, complete=False)
    for m in models:
        path, acc = model_file(b.out, name, fam, Variant(m.name, m.role, 0, m.make), ref)
        paths[m.name] = path
        unique_weights(paths)
        if m.role == "source":
            continue  # the harmful series' start, not judged
        check = b.check(fam, f"{name}.{m.name}", path, 0, ref)
        rows[m.name] = {"role": m.role, "seeds": m.seeds, "accuracy": acc, "checks": [check]}
        family["gates"] = gates_of(rows)
        save()
    family["complete"] = True


def gates_of(rows: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    cal = [r for r in rows.values() if r["role"] == "calibration"]
    held = {n: r for n, r in rows.items() if r["role"] == "held_out"}
    bad = {n: r for n, r in rows.items() if r["role"] == "harmful"}
    if len(cal) < len(CALIBRATION_SEEDS) or not held:
        return None
    return {**calibrated_gates(cal, held, bad), **baseline_gates(cal, held, bad)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/stitchsim-heldout"))
    ap.add_argument("--families", nargs="+", default=["resnet", "convnext"],
                    choices=list(FAMILIES))
    ap.add_argument("--budget", default="ci", help="full: the demo's spec; ci: the preset")
    ap.add_argument("--json", type=Path, help="default: OUT/drift_heldout.<budget>.json")
    args = ap.parse_args()
    b = Bench(args.out, args.budget, Sizes())
    result: dict[str, Any] = {"budget": args.budget, "rate": 0.01,
                              "load_before": os.getloadavg(), "families": {}}
    out = args.json or args.out / f"drift_heldout.{args.budget}.json"

    def save() -> None:
        out.write_text(json.dumps({**result, "load_now": os.getloadavg()}, indent=1) + "\n")

    for name in args.families:
        print(f"{name}:", flush=True)
        result["families"][name] = family = {}
        run_family(b, name, family, save)
        for label, g in (family.get("gates") or {}).items():
            k, n = g["false_alarm_rate"]
            print(f"  {label:<46} held-out false alarms {k}/{n} {g['interval_95']}  caught "
                  f"{len(g['caught'])}: {' '.join(g['caught'])}", flush=True)
    result["load_after"] = os.getloadavg()
    save()
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
