"""The invariance-aware figure against the paper's scale (issue 45 item 1): which of the IRIs'
stopping target, the number of stitch-training IRIs and the stitch's epochs moves the deep
points towards the paper's figure, and at what cost.

Per family, a reference (seed 0) in front of 3 benign retrains (seeds 1, 2, 3: drift_power's
retrain, reseed2, reseed3, so the two benches share their models) at the family's points; per
grid cell, one factor changed from the service's default, every check an in-process job
(run_job, as `stitchsim-server run`) with both protocols:

    default     the default spec (paper IRIs stop when the batch median is under
                0.9 x converged_below = 0.225; 128 training samples; 4 stitch epochs)
    target0.1   IRIs run on until the median is under 0.1
    floor       IRIs run to the method's cap (1,200 steps); the round-end medians show
                whether the last rounds still improved (the floor: no improvement over a round)
    epochs30    30 stitch epochs (the paper's)
    iris256     256 training samples (IRIs): a step of the trend where 1,000 is too dear
    iris1000    1,000 training samples (IRIs): the paper synthesises the whole split
    irisall     every training sample of the split

Families: `demo` (the demo's recipe on the digits, drift_power's "resnet"), `resnet18` (timm's
ResNet-18 at 32 px on the built-in `shapes` set: 2,000 generated images, nothing
downloaded), `convnext` (drift_power's). The reference's IRIs are cached and shared by the
three checks of a cell (as the service caches them); a cell that reuses another cell's IRIs
(epochs30 those of default) is charged their synthesis. Cost = wall seconds and work units
(the engine's progress units actually done: IRIs at the steps they took) of the three checks.

Results: one JSON per family, --json-dir/iri_scale.<date>.<family>.json, rewritten after each
cell so a cut-off run leaves what it measured.

    nice -n 19 env OMP_NUM_THREADS=1 python bench/iri_scale.py --families demo
    python bench/iri_scale.py --families demo resnet18 --cells default target0.1 epochs30

Figures: docs/benchmarks.md ("invariance-aware figure at scale"); decision: docs/method.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from functools import partial
from pathlib import Path
from typing import Any

import torch
from drift_power import FAMILIES, Family, Variant as DriftVariant, model_file, train
from stitchsim.models import Report, Spec
from stitchsim_worker.engine import Resources, run_job
from stitchsim_worker.engine.data.datasets import builtin
from stitchsim_worker.engine.iri import synthesis
from stitchsim_worker.engine.iri.synthesis import EXTRA_ROUNDS_AIM

BENIGN_SEEDS = (1, 2, 3)
# drift_power's names for the same seeds, so its cached models serve both benches.
DRIFT_NAMES = {0: "reference", 1: "retrain", 2: "reseed2", 3: "reseed3"}
TINY = 1e-6  # a convergence line no IRI reaches: the rounds run to the cap


@dataclass(frozen=True)
class Setup:
    family: Family
    dataset: str


SETUPS = {
    "demo": Setup(FAMILIES["resnet"], "digits_digit_only"),
    "resnet18": Setup(Family("resnet18", {"num_classes": 10}, ["act1", "layer1", "layer2"], 8),
                      "shapes"),
    "convnext": Setup(FAMILIES["convnext"], "digits_digit_only"),
}

# One factor at a time from the default: (iri fields, train fields).
CELLS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "default": ({}, {}),
    "target0.1": ({"converged_below": 0.1 / EXTRA_ROUNDS_AIM}, {}),
    "floor": ({"converged_below": TINY}, {}),
    "epochs30": ({}, {"epochs": 30}),
    "iris256": ({}, {"max_train_samples": 256}),  # the trend, where 1,000 does not fit
    "iris1000": ({}, {"max_train_samples": 1000}),
    "irisall": ({}, {"max_train_samples": None}),  # None: the split's length, set per family
}


# ------------------------------------------------------------------ models


def accuracy_on(net: torch.nn.Module, dataset: str) -> float:
    from drift_power import _norm

    ds = builtin(dataset)
    mean, std = _norm(net)
    with torch.no_grad():
        pred = torch.cat([net((x - mean) / std).argmax(-1) for x in ds.test.images.split(256)])
    return float((pred == ds.test.labels).float().mean())


def models(out: Path, name: str, setup: Setup) -> list[Path]:
    """The reference, then the benign retrains: drift_power's model files (its training, its
    seeds), on the family's dataset."""
    ds = builtin(setup.dataset)
    paths: list[Path] = []
    for seed, vname in DRIFT_NAMES.items():
        make = partial(train, setup.family, seed=seed, images=ds.train.images,
                       labels=ds.train.labels)
        path, _ = model_file(out, name, setup.family, DriftVariant(vname, "benign", 0, make),
                             Path())
        meta = path.with_suffix(".json")
        info = json.loads(meta.read_text())
        if "seed" not in info:  # the recorded seed, and the accuracy on the family's own set
            info.update(seed=seed, accuracy=accuracy_on(_load(path, setup.family),
                                                        setup.dataset))
            meta.write_text(json.dumps(info))
        paths.append(path)
    return paths


def _load(path: Path, fam: Family) -> torch.nn.Module:
    import timm
    from safetensors.torch import load_file

    net = timm.create_model(fam.arch, pretrained=False, **fam.arch_kwargs)
    net.load_state_dict(load_file(str(path)))
    return net.eval()


# ------------------------------------------------------------------ checks


def spec_of(setup: Setup, front: Path, back: Path, cell: str, test: int) -> Spec:
    iri, train_fields = CELLS[cell]
    train_fields = dict(train_fields)
    if "max_train_samples" in train_fields and train_fields["max_train_samples"] is None:
        train_fields["max_train_samples"] = len(builtin(setup.dataset).train.labels)
    return Spec.model_validate({
        "front": {"checkpoint": {"path": str(front)}},
        "back": {"checkpoint": {"path": str(back)}},
        "dataset": setup.dataset,
        "layers": [{"front": p, "back": p} for p in setup.family.layers],
        "objectives": ["slm"], "protocols": ["standard", "invariance_aware"],
        "directions": "front_to_back",
        # Cells that stop off the line have unconverged IRIs by design: read them anyway.
        "iri": {**iri, "accept_unconverged": True},
        "train": {"epochs": 4, "max_train_samples": 128, "max_test_samples": test, "seed": 0,
                  **train_fields},
    })


class MedianTrace:
    """The batch medians the synthesis measures at every step (bench/iri_finish.py's spy on
    the distance function): a cell's round-end medians show whether its IRIs still moved."""

    def __init__(self) -> None:
        self.medians: list[float] = []
        self._measure = synthesis.per_sample_distance

    def __enter__(self) -> MedianTrace:
        def spy(feats: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            d = self._measure(feats, target)
            self.medians.append(float(d.detach().quantile(0.5)))
            return d
        synthesis.per_sample_distance = spy  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        synthesis.per_sample_distance = self._measure  # type: ignore[assignment]


def round_end_medians(medians: list[float], lengths: list[int]) -> list[float]:
    """iri_finish's reading: a round's steps each measure the iterate before them, then the
    round measures its last iterate (one batch only)."""
    ends, at = [], -1
    for length in lengths:
        at += length + 1
        if at >= len(medians):
            break
        ends.append(round(medians[at], 4))
    return ends


def check(setup: Setup, front: Path, back: Path, cell: str, test: int, cache: Path
          ) -> dict[str, Any]:
    done: list[int] = [0, 0]

    def progress(_stage: str, d: int, total: int, _eta: float | None) -> None:
        done[:] = [d, total]

    spec = spec_of(setup, front, back, cell, test)
    t0 = time.perf_counter()
    with MedianTrace() as trace:
        report = run_job(spec, resources=Resources(cache_dir=cache), progress=progress)
    row = {"seconds": round(time.perf_counter() - t0, 1), "units": done[0],
           "units_budget": done[1], "points": by_point(report)}
    made = [r for r in report.results if r.iri is not None and not r.iri.cache_hit]
    if made and spec.train.max_train_samples <= spec.iri.batch_size:
        row["round_end_medians"] = _per_point_trace(trace.medians, made,
                                                    spec.iri.round_lengths())
    return row


def _per_point_trace(medians: list[float], made: list[Any], lengths: list[int]
                     ) -> dict[str, list[float]] | None:
    """Splits one-batch traces per point, in the order the points were made: each point's
    steps, plus one measure per round it ran (its last iterate). None where the count does not
    add up (something else measured distances in the job)."""
    out: dict[str, list[float]] = {}
    at = 0
    for r in made:
        n = int(round(r.iri.steps_used or r.iri.steps))
        count = n + len([x for x in _cumulative(lengths) if x <= n])
        out[r.front_layer] = round_end_medians(medians[at:at + count], lengths)
        at += count
    return out if at == len(medians) else None


def _cumulative(lengths: list[int]) -> list[int]:
    total, out = 0, []
    for length in lengths:
        total += length
        out.append(total)
    return out


def by_point(report: Report) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in report.results:
        p = out.setdefault(r.front_layer, {})
        p[r.protocol] = r.agreement
        if r.iri is not None:
            p["iri_median"] = r.iri.median
            p["iri_steps_used"] = r.iri.steps_used
            p["iri_seconds"] = r.iri.seconds
            p["iri_cache_hit"] = r.iri.cache_hit
            p["iri_n"] = r.iri.n
    return out


# ------------------------------------------------------------------ cells


def iri_key(cell: str) -> str:
    """Cells whose IRIs are the same: the same IRI fields and training samples."""
    iri, train_fields = CELLS[cell]
    return json.dumps([iri, train_fields.get("max_train_samples", 128)], sort_keys=True)


def summary(checks: list[dict[str, Any]], borrowed: dict[str, float]) -> dict[str, Any]:
    """Per point: mean (and spread) over the benign retrains of each protocol's agreement;
    the IRIs' median relative distance; the cell's cost (borrowed IRIs charged)."""
    points: dict[str, Any] = {}
    for p in checks[0]["points"]:
        ia = [c["points"][p]["invariance_aware"] for c in checks]
        std = [c["points"][p]["standard"] for c in checks]
        points[p] = {"invariance_aware": round(statistics.mean(ia), 4),
                     "ia_min": round(min(ia), 4), "ia_max": round(max(ia), 4),
                     "standard": round(statistics.mean(std), 4),
                     "iri_median": checks[0]["points"][p].get("iri_median")}
    return {"points": points,
            "seconds": round(sum(c["seconds"] for c in checks) + borrowed["seconds"], 1),
            "units": sum(c["units"] for c in checks) + int(borrowed["units"])}


def _own_iri_cost(checks: list[dict[str, Any]]) -> dict[str, float]:
    """What the first check paid for the IRIs the others found cached."""
    return {"seconds": checks[0]["seconds"] - min(c["seconds"] for c in checks[1:]),
            "units": checks[0]["units"] - min(c["units"] for c in checks[1:])}


def _made_by(cells: dict[str, Any]) -> dict[str, dict[str, float]]:
    """iri_key -> the IRIs' cost, from the cells that synthesised their own (an earlier run's
    cells too: a resumed run charges a cell that borrows their IRIs)."""
    return {c.get("iri_key", iri_key(name) + json.dumps(list(c["points"]))):
            _own_iri_cost(c["checks"]) for name, c in cells.items()
            if not any(c["iri_cost_borrowed"].values())}


def run_family(name: str, setup: Setup, cells: list[str], out: Path, test: int,
               previous: dict[str, Any] | None, write: Callable[[dict[str, Any]], None]
               ) -> dict[str, Any]:
    """The cells in order; a previous run's JSON keeps its cells (a cell asked for again is
    measured again)."""
    print(f"{name}: models", flush=True)
    paths = models(out, name, setup)
    kept = {k: v for k, v in (previous or {}).get("cells", {}).items() if k not in cells}
    result: dict[str, Any] = {
        "family": name, "arch": setup.family.arch, "arch_kwargs": setup.family.arch_kwargs,
        "dataset": setup.dataset, "test_samples": test,
        "points": list(dict.fromkeys([*(previous or {}).get("points", []),
                                      *setup.family.layers])),
        "models": {p.stem: json.loads(p.with_suffix(".json").read_text()) for p in paths},
        "cells": kept, "not_run": [c for c in CELLS if c not in kept]}
    made = _made_by(kept)
    for cell in cells:
        checks = []
        for back in paths[1:]:
            print(f"  {cell} vs {back.stem} ...", flush=True)
            checks.append(check(setup, paths[0], back, cell, test, out / "cache"))
        key = iri_key(cell) + json.dumps(setup.family.layers)
        hit = all(v.get("iri_cache_hit") for v in checks[0]["points"].values())
        borrowed = made.get(key, {"seconds": 0.0, "units": 0}) if hit else {
            "seconds": 0.0, "units": 0}
        if not hit:
            made[key] = _own_iri_cost(checks)
        result["cells"][cell] = {"setting": CELLS[cell], "iri_key": key, "checks": checks,
                                 "iri_cost_borrowed": borrowed, **summary(checks, borrowed)}
        result["not_run"].remove(cell)
        _print_cell(cell, result["cells"][cell])
        write(result)
    return result


def _print_cell(cell: str, c: dict[str, Any]) -> None:
    pts = "  ".join(f"{p} {v['invariance_aware']:.3f} ({v['ia_min']:.2f}-{v['ia_max']:.2f}) "
                    f"std {v['standard']:.3f} d {v['iri_median']:.3f}"
                    for p, v in c["points"].items())
    print(f"  {cell}: {pts}; {c['seconds']:.0f} s, {c['units']} units", flush=True)


def point_units(cell: dict[str, Any]) -> dict[str, float]:
    """A cell's units apportioned to its points: each point's IRI steps at the engine's rate
    (invariance_aware.iri_units, steps actually taken), the rest (stitches, controls) shared
    equally. Lets a cell run at fewer points be priced against the default at the same ones."""
    from stitchsim_worker.engine.protocols.invariance_aware import IRI_STEP_UNITS

    first = cell["checks"][0]["points"]
    iri = {p: IRI_STEP_UNITS * (v.get("iri_steps_used") or 0) * (v.get("iri_n") or 0) / 256
           for p, v in first.items()}
    rest = (cell["units"] - sum(iri.values())) / len(iri)
    return {p: u + rest for p, u in iri.items()}


def markdown(result: dict[str, Any]) -> str:
    """The family's cells as docs/benchmarks.md's table: per point the invariance-aware mean
    (range over the retrains) / the standard protocol / the IRIs' median distance (steps); the
    cost against the default cell's at the same points."""
    cells = result["cells"]
    # Every point any cell ran (a --points run records only its own subset).
    points = list(dict.fromkeys(p for c in cells.values() for p in c["points"]))
    base = point_units(cells["default"]) if "default" in cells else None
    head = ["cell", *points, "wall s", "units", "cost"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cell, c in cells.items():
        pts = [_point_cell(c["points"].get(p), c["checks"][0]["points"].get(p))
               for p in points]
        mine = point_units(c)
        cost = (f"{sum(mine.values()) / sum(base[p] for p in mine):.2f}x" if base else "-")
        lines.append("| " + " | ".join([cell, *pts, f"{c['seconds']:.0f}", str(c["units"]),
                                        cost]) + " |")
    return "\n".join(lines)


def _point_cell(v: dict[str, Any] | None, first: dict[str, Any] | None) -> str:
    if v is None or first is None:
        return "not run"
    steps = first.get("iri_steps_used")
    return (f"{v['invariance_aware']:.2f} ({v['ia_min']:.2f}-{v['ia_max']:.2f}) / "
            f"{v['standard']:.2f} / {v['iri_median']:.3f} ({steps:.0f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/stitchsim-drift"),
                    help="models and IRI cache (drift_power's --out: its models are reused)")
    ap.add_argument("--families", nargs="+", default=["demo", "resnet18", "convnext"],
                    choices=list(SETUPS))
    ap.add_argument("--cells", nargs="+", default=list(CELLS), choices=list(CELLS))
    ap.add_argument("--points", nargs="+", help="only these of the family's points")
    ap.add_argument("--test-samples", type=int, default=300)
    ap.add_argument("--json-dir", type=Path, default=Path("bench/results"))
    ap.add_argument("--date", default=date.today().isoformat())
    ap.add_argument("--table", action="store_true", help="print the families' JSONs as "
                    "markdown tables, run nothing")
    args = ap.parse_args()
    if args.table:
        for name in args.families:
            path = args.json_dir / f"iri_scale.{args.date}.{name}.json"
            if path.exists():
                print(f"{name}:\n{markdown(json.loads(path.read_text()))}")
        return
    torch.set_num_threads(max(1, torch.get_num_threads()))
    for name in args.families:
        path = args.json_dir / f"iri_scale.{args.date}.{name}.json"

        def write(result: dict[str, Any], path: Path = path) -> None:
            path.write_text(json.dumps(result, indent=1))

        setup = SETUPS[name]
        if args.points:  # a subset of the family's points (the deep ones, when time is short)
            setup = Setup(Family(setup.family.arch, setup.family.arch_kwargs, args.points,
                                 setup.family.epochs), setup.dataset)
        previous = json.loads(path.read_text()) if path.exists() else None
        run_family(name, setup, args.cells, args.out, args.test_samples, previous, write)
        print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
