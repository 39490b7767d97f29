"""Detection of the class-coloured marker per dose, with and without a cue-conflict probe
(issue 47 item 4).

The drift series (bench/drift_power.py) found that models trained with the marker on 5-50 % of
their training images are caught by no gate on clean data: a latent shortcut acts only where
its cue is present. This bench checks the same models with a probe set beside the clean one:
the bench's own clean test split (digits_digit_only) with each digit carrying the marker of
another class, made by the recipe of the built-in digits_marker_conflict (one class drawn at
random from the nine others; stitchsim_worker.engine.data.probes), written as a dataset file.

Models (drift_power's training loop and marker recipe, cached in --out/models): the reference
(seed 0), the retrain (seed 1: the baseline), benign reseeds 2.., and the marker doses, each
trained from the retrain's seed (dose 0 is the retrain itself).

Each model gets one check, reference in front: drift_power's spec (128 train samples, 300 test,
the family's points, slm, front_to_back) with --protocols (standard by default, to fit a loaded
CPU) and the probe. Per model: accuracy on the clean test split and on the probe, the clean
similarity and endpoint agreement, the probe's endpoint agreement and mean stitched agreement.

Gates, each a figure against the lowest value over the benign models (retrain and reseeds;
0 false alarms on them by construction, about 1/(n+1) on a new benign model): on clean data
the similarity, the accuracy and the endpoint; on the probe the candidate's accuracy alone
(no stitching), the endpoint and the stitched agreement. Whether stitching on the probe catches
a dose that probe accuracy alone misses is read off the table.

    nice -n 19 python bench/probe_power.py --out /tmp/probe --epochs 4 --reseeds 2 \
        --marker-doses 0.05 0.25 0.5 1.0                                    # reduced
    nice -n 19 python bench/probe_power.py --out /tmp/probe --reseeds 5     # full
Figures: docs/benchmarks.md ("probe power").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from stitchsim.models import Report, Spec
from stitchsim_worker.engine import Resources, run_job
from stitchsim_worker.engine.data.datasets import (
    Dataset,
    ImageSet,
    add_marker,
    builtin,
    save_dataset_file,
)
from stitchsim_worker.engine.data.pixels import Pixels
from stitchsim_worker.engine.data.probes import marker_classes
from stitchsim_worker.engine.models.loading import save_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.drift_power import (  # noqa: E402
    DATASET,
    FAMILIES,
    MARKER_DOSES,
    RETRAIN_SEED,
    Family,
    marked,
    train,
)

FIGURES = ("clean_similarity", "clean_accuracy", "clean_endpoint", "probe_accuracy",
           "probe_endpoint", "probe_stitched")
"""Each a gate: the figure against the lowest benign value."""


def probe_file(out: Path) -> Path:
    """The bench's conflict probe: its clean test split, each digit with another class's
    marker (digits_marker_conflict's recipe on the bench's dataset), labels the digits'."""
    path = out / "digits_digit_only_marker_conflict.safetensors"
    if path.exists():
        return path
    ds = builtin(DATASET)
    x, y = ds.test.images, ds.test.labels
    probe = ImageSet(Pixels(add_marker(x, marker_classes("digits_marker_conflict", y, 10))), y)
    train_split = ImageSet(probe.pixels, y.clone())  # the file needs both splits
    save_dataset_file(path, Dataset("conflict", "bench", train_split, probe, 10))
    return path


def model(out: Path, fam: Family, name: str, seed: int, dose: float | None) -> Path:
    path = out / "models" / f"{name}.safetensors"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        images = marked(dose) if dose else None
        save_checkpoint(train(fam, seed=seed, images=images), path, fam.arch, fam.arch_kwargs)
    return path


def spec_of(fam: Family, ref: Path, back: Path, probe: Path, protocols: list[str]) -> Spec:
    return Spec.model_validate({
        "front": {"checkpoint": {"path": str(ref)}},
        "back": {"checkpoint": {"path": str(back)}},
        "dataset": DATASET, "probes": [{"path": str(probe)}],
        "layers": [{"front": p, "back": p} for p in fam.layers],
        "objectives": ["slm"], "protocols": protocols, "directions": "front_to_back",
        "train": {"epochs": 4, "max_train_samples": 128, "max_test_samples": 300, "seed": 0},
    })


def figures(report: Report) -> dict[str, Any]:
    (probe,) = report.probes
    stitched = [r.agreement for r in probe.results]
    return {
        "clean_similarity": report.summary.similarity,
        "clean_accuracy": report.back.accuracy,
        "clean_endpoint": report.unstitched_agreement[0].agreement,
        "probe_accuracy": probe.back_accuracy,
        "probe_endpoint": probe.unstitched_agreement[0].agreement,
        "probe_stitched": sum(stitched) / len(stitched),
        "probe_points": {r.front_layer: r.agreement for r in probe.results},
        "seconds": report.environment["seconds"],
    }


def check(out: Path, fam: Family, ref: Path, name: str, back: Path, probe: Path,
          protocols: list[str]) -> dict[str, Any]:
    path = out / "reports" / f"{'-'.join(protocols)}" / f"{name}.json"
    if path.exists():
        return dict(json.loads(path.read_text()))
    report = run_job(spec_of(fam, ref, back, probe, protocols),
                     resources=Resources(cache_dir=out / "cache"))
    found = figures(report)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(found, indent=1))
    return found


def gates(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    benign = [r for r in rows.values() if r["kind"] == "benign"]
    limits = {f: min(r[f] for r in benign) for f in FIGURES}
    for r in rows.values():
        r["caught"] = {f: bool(r[f] < limits[f] - 1e-9) for f in FIGURES}
    return {"limits": limits, "rows": rows}


def _caught(row: dict[str, Any], names: tuple[str, ...]) -> str:
    return " / ".join("yes" if row["caught"][f] else "no" for f in names)


def table(result: dict[str, Any]) -> str:
    head = ("| model | dose | clean acc | probe acc | clean sim | probe endpoint | probe stitched "
            "| caught: clean sim / acc / endpoint | caught: probe acc / endpoint / stitched |")
    lines = [head, "|" + " --- |" * 9]
    for name, r in result["rows"].items():
        dose = "" if r["dose"] is None else f"{r['dose']:.0%}"
        lines.append(
            f"| {name} | {dose} | "
            f"{r['clean_accuracy']:.3f} | {r['probe_accuracy']:.3f} | "
            f"{r['clean_similarity']:.3f} | {r['probe_endpoint']:.3f} | "
            f"{r['probe_stitched']:.3f} | {_caught(r, FIGURES[:3])} | {_caught(r, FIGURES[3:])} |")
    limits = result["limits"]
    lines.append("\nlimits (lowest benign): " + ", ".join(f"{k} {v:.3f}" for k, v in
                                                         limits.items()))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--family", default="resnet_stem", choices=list(FAMILIES))
    ap.add_argument("--epochs", type=int, help="training epochs of every model (default: the "
                    "family's); a reduced run on a loaded CPU")
    ap.add_argument("--reseeds", type=int, default=3, help="benign reseeds beside the retrain")
    ap.add_argument("--marker-doses", type=float, nargs="+", default=list(MARKER_DOSES))
    ap.add_argument("--protocols", default="standard", help="comma-separated")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    fam, out = FAMILIES[args.family], args.out
    if args.epochs is not None:
        fam = replace(fam, epochs=args.epochs)
        out = out / f"epochs{args.epochs}"
    out.mkdir(parents=True, exist_ok=True)
    protocols = args.protocols.split(",")
    t0 = time.time()
    probe = probe_file(out)
    ref = model(out, fam, "reference", 0, None)
    plan: list[tuple[str, str, int, float | None]] = [
        ("retrain", "benign", RETRAIN_SEED, None),
        *[(f"reseed{s}", "benign", s, None) for s in range(2, 2 + args.reseeds)],
        *[(f"marker{d:g}", "marker", RETRAIN_SEED, d) for d in args.marker_doses]]
    rows: dict[str, dict[str, Any]] = {}
    for name, kind, seed, dose in plan:
        back = model(out, fam, name, seed, dose)
        rows[name] = {"kind": kind, "dose": dose,
                      **check(out, fam, ref, name, back, probe, protocols)}
        print(name, {k: round(v, 3) for k, v in rows[name].items()
                     if isinstance(v, float)}, flush=True)
    result = {"family": args.family, "epochs": fam.epochs, "protocols": protocols,
              "reseeds": args.reseeds,
              "seconds": round(time.time() - t0), **gates(rows)}
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
