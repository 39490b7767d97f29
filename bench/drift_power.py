"""The drift gate measured as an instrument (issue 37 item 2): how much the check's figure moves
between benign retrains and between reruns of one check, and which harmful changes it catches,
beside an accuracy gate and a CKA gate.

Models (trained here on the built-in digits, cached in --out/models, seeds no test uses):
per family, the reference (seed 0) and the baseline's retrain (seed 1); benign: the reference
re-saved (a byte copy; its figure must equal the reference's self figure), reseeds 2.., one more
epoch of the retrain at lr 3e-4, the retrain's init with another batch order; harmful, by dose,
all from the retrain's seed (so dose 0 is the retrain itself): the class-coloured marker on a
share of the training images, label noise, global magnitude pruning of the retrain, and a
fine-tune of the retrain that drops two classes (8 and 9).

Each check is an in-process job (run_job, as `stitchsim-server run`) of the reference in front
against the model: the demo's spec (128 train samples, 300 test, 3 points, slm,
front_to_back) with measures [cka], under the default IRI method (the paper's 200 steps, then
rounds of 100 while the batch median is short of the line; --extra-rounds overrides the
number of rounds, as earlier runs did with 4). The reference's IRIs are cached,
so they are made once per point. A rerun of a check with the same seeds is deterministic (same
cached IRIs, same stitch seed), so the reruns vary `train.seed` (the stitch's init and batch
order); the IRIs are not re-synthesised per rerun (their seed is fixed: a CI rerun reuses them).

Gates: the baseline is check(reference, retrain) with train.seed 0; the stitching gate fails
when baseline similarity - similarity > max_drop, max_drop = the largest benign drop over all
benign checks and reruns (so 0 false alarms on the benign set by construction of the threshold
on it; the --max-drop auto figure is reported beside: k x the baseline's own interval). The
accuracy gate fails when accuracy falls by more than 1 point below the retrain's; the CKA gate
fails when CKA (real inputs) falls by more than its largest benign drop (the same 0 false
alarms). Detection rate per dose = share of its reruns that fail.

    python bench/drift_power.py --out /tmp/drift --reruns 1 --families resnet   # reduced
    python bench/drift_power.py --out /tmp/drift --reruns 5                      # full
    python bench/drift_power.py --out /tmp/drift --budget ci                     # ci preset
    python bench/drift_power.py --out /tmp/drift --families resnet --reruns 2 \
        --per-point --budget ci --agree-with full.json   # ci's decisions against the full's

Under --budget ci the spec keeps its test samples and points and leaves the training samples
to the preset (64, raised where a stitch needs more); --ci-train-samples sets them instead, as
a user following a report's too-few-vectors warning would.

--marker-doses / --noise-doses / --prune-doses set the series; --per-point adds each point's
figures and a per-point gate (the stem is where the demo's shortcut shows).

Figures: docs/benchmarks.md ("drift power").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import timm
import torch
import torch.nn.functional as F
from stitchsim.gates import AUTO_K
from stitchsim.models import Report, Spec
from stitchsim_worker.engine import Resources, run_job
from stitchsim_worker.engine.data.datasets import add_marker, builtin
from stitchsim_worker.engine.models.loading import save_checkpoint

DATASET = "digits_digit_only"
REFERENCE_SEED, RETRAIN_SEED = 0, 1


@dataclass(frozen=True)
class Family:
    arch: str
    arch_kwargs: dict[str, Any]
    layers: list[str]
    epochs: int


FAMILIES = {
    # The demo's recipe (stitchsim-server demo-models: DEMO_ARCH, DEMO_ARCH_KWARGS, 8 epochs).
    "resnet": Family("test_resnet", {"num_classes": 10, "stem_width": 64,
                                     "channels": [128, 128, 128, 192]},
                     ["act1", "layer1", "layer2"], 8),
    # A second family: timm's tiny ConvNeXt (LayerNorm, GELU, depthwise convs), 3 stages.
    # The demo's stem (64 wide: close to invertible on 32 px inputs) on timm's default stages:
    # a tenth of the demo's training cost, for a reduced run on a loaded CPU (act1 only: the
    # stem is the demo's).
    "resnet_stem": Family("test_resnet", {"num_classes": 10, "stem_width": 64},
                          ["act1", "layer1", "layer2"], 8),
    "convnext": Family("test_convnext", {"num_classes": 10},
                       ["stages.0", "stages.1", "stages.2"], 8),
}

MARKER_DOSES = (0.05, 0.10, 0.25, 0.50, 1.0)
NOISE_DOSES = (0.10, 0.30, 0.50)
PRUNE_DOSES = (0.30, 0.50, 0.70)
DROPPED = (8, 9)


# ------------------------------------------------------------------ training


def _norm(net: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    cfg = timm.data.resolve_data_config({}, model=net)
    return (torch.tensor(cfg["mean"]).view(1, 3, 1, 1), torch.tensor(cfg["std"]).view(1, 3, 1, 1))


def train(fam: Family, *, seed: int, order_seed: int | None = None,
          images: torch.Tensor | None = None, labels: torch.Tensor | None = None,
          start: torch.nn.Module | None = None, epochs: int | None = None, lr: float = 3e-3,
          one_cycle: bool = True, batch_size: int = 64) -> torch.nn.Module:
    """zoo.train_classifier's loop, with the data, the batch order and the start open."""
    ds = builtin(DATASET)
    pixels = ds.train.images if images is None else images
    y = ds.train.labels if labels is None else labels
    torch.manual_seed(seed)
    net = start if start is not None else timm.create_model(fam.arch, pretrained=False,
                                                            **fam.arch_kwargs)
    mean, std = _norm(net)
    epochs = fam.epochs if epochs is None else epochs
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=1e-4)
    steps = epochs * ((len(y) + batch_size - 1) // batch_size)
    sched = (torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps)
             if one_cycle else None)
    g = torch.Generator().manual_seed(seed if order_seed is None else order_seed)
    net.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(y), generator=g).split(batch_size):
            loss = F.cross_entropy(net((pixels[idx] - mean) / std), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()
    return net.eval()


def accuracy(net: torch.nn.Module) -> float:
    ds = builtin(DATASET)
    mean, std = _norm(net)
    with torch.no_grad():
        pred = net((ds.test.images - mean) / std).argmax(-1)
    return float((pred == ds.test.labels).float().mean())


def marked(share: float, seed: int = 5) -> torch.Tensor:
    """The training images with the class-coloured marker on `share` of them."""
    ds = builtin(DATASET)
    n = len(ds.train.labels)
    pick = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:round(share * n)]
    out = ds.train.images.clone()
    out[pick] = add_marker(out[pick], ds.train.labels[pick])
    return out


def noisy(share: float, seed: int = 6) -> torch.Tensor:
    """The training labels with `share` of them replaced by another class."""
    y = builtin(DATASET).train.labels.clone()
    g = torch.Generator().manual_seed(seed)
    pick = torch.randperm(len(y), generator=g)[:round(share * len(y))]
    y[pick] = (y[pick] + torch.randint(1, 10, (len(pick),), generator=g)) % 10
    return y


def pruned(net: torch.nn.Module, share: float) -> torch.nn.Module:
    """Global magnitude pruning of every conv and linear weight."""
    import torch.nn.utils.prune as prune

    params = [(m, "weight") for m in net.modules()
              if isinstance(m, torch.nn.Conv2d | torch.nn.Linear)]
    prune.global_unstructured(params, pruning_method=prune.L1Unstructured, amount=share)
    for m, name in params:
        prune.remove(m, name)
    return net.eval()


@dataclass
class Variant:
    name: str
    kind: str  # reference | baseline | benign | marker | noise | prune | drop
    dose: float
    make: Callable[[], torch.nn.Module] | None  # None: a copy of the reference file


@dataclass(frozen=True)
class Doses:
    """The harmful series' doses (--marker-doses, --noise-doses, --prune-doses)."""

    marker: tuple[float, ...] = MARKER_DOSES
    noise: tuple[float, ...] = NOISE_DOSES
    prune: tuple[float, ...] = PRUNE_DOSES


def variants(fam: Family, load: Callable[[str], torch.nn.Module], reseeds: int,
             epochs: int | None = None, doses: Doses = Doses()) -> list[Variant]:
    """Every model trains `epochs` (the family's when None)."""
    if epochs is not None:
        fam = Family(fam.arch, fam.arch_kwargs, fam.layers, epochs)

    def retrain() -> torch.nn.Module:
        return load("retrain")

    def without_two() -> torch.nn.Module:
        ds = builtin(DATASET)
        keep = ~torch.isin(ds.train.labels, torch.tensor(DROPPED))
        return train(fam, seed=RETRAIN_SEED, images=ds.train.images[keep],
                     labels=ds.train.labels[keep], start=retrain(), epochs=2, lr=1e-3)

    out = [Variant("reference", "reference", 0, lambda: train(fam, seed=REFERENCE_SEED)),
           Variant("retrain", "baseline", 0, lambda: train(fam, seed=RETRAIN_SEED)),
           Variant("resaved", "benign", 0, None)]
    out += [Variant(f"reseed{s}", "benign", 0, lambda s=s: train(fam, seed=s))
            for s in range(2, 2 + reseeds)]
    out += [Variant("epoch+1", "benign", 0, lambda: train(
                fam, seed=RETRAIN_SEED, start=retrain(), epochs=1, lr=3e-4, one_cycle=False)),
            Variant("order", "benign", 0, lambda: train(fam, seed=RETRAIN_SEED, order_seed=77))]
    out += [Variant(f"marker{d:g}", "marker", d, lambda d=d: train(
        fam, seed=RETRAIN_SEED, images=marked(d))) for d in doses.marker]
    out += [Variant(f"noise{d:g}", "noise", d, lambda d=d: train(
        fam, seed=RETRAIN_SEED, labels=noisy(d))) for d in doses.noise]
    out += [Variant(f"prune{d:g}", "prune", d, lambda d=d: pruned(retrain(), d))
            for d in doses.prune]
    out += [Variant("drop2", "drop", 1, without_two)]
    return out


# ------------------------------------------------------------------ checks


@dataclass(frozen=True)
class Sizes:
    """The check's spec: the demo's by default (128 train, 300 test, its 3 points)."""

    train: int = 128
    test: int = 300
    points: int = 3
    extra_rounds: int | None = None  # None: the default method's own
    ci_train: int | None = None  # under a preset: the spec's own training samples (they win)


def spec_of(fam: Family, front: Path, back: Path, seed: int, budget: str,
            sizes: Sizes = Sizes()) -> Spec:
    fields: dict[str, Any] = {
        "front": {"checkpoint": {"path": str(front)}},
        "back": {"checkpoint": {"path": str(back)}},
        "dataset": DATASET,
        "layers": [{"front": p, "back": p} for p in fam.layers[:sizes.points]],
        "objectives": ["slm"], "protocols": ["standard", "invariance_aware"],
        "directions": "front_to_back", "measures": ["cka"],
        "train": {"epochs": 4, "max_train_samples": sizes.train,
                  "max_test_samples": sizes.test, "seed": seed},
    }
    if sizes.extra_rounds is not None:
        fields["iri"] = {"extra_rounds": sizes.extra_rounds}
    if budget != "full":  # the preset's training samples; the test samples and points as asked
        fields["budget"] = budget
        fields["train"] = {"epochs": 4, "max_test_samples": sizes.test, "seed": seed}
        if sizes.ci_train is not None:
            fields["train"]["max_train_samples"] = sizes.ci_train
    return Spec.model_validate(fields)


def figures(report: Report) -> dict[str, Any]:
    s = report.summary
    cka = [m.value for m in report.measures if m.measure == "cka" and m.input == "real"]
    rows = [r for r in report.results if r.protocol == s.similarity_protocol]
    half = [(r.agreement_ci[1] - r.agreement_ci[0]) / 2 for r in rows]
    iri = [r.iri.median for r in report.results if r.iri is not None]
    return {"similarity": s.similarity, "protocol": s.similarity_protocol,
            "standard": s.by_protocol.get("standard"),
            "invariance_aware": s.by_protocol.get("invariance_aware"),
            "cka": sum(cka) / len(cka) if cka else None,
            "ci_half_width": sum(half) / len(half) if half else None,
            "iri_median_distance": max(iri) if iri else None,
            "points": by_point(report)}


def by_point(report: Report) -> dict[str, dict[str, float]]:
    """Each stitch point's agreement under each protocol (a per-point gate reads these)."""
    out: dict[str, dict[str, float]] = {}
    for r in report.results:
        out.setdefault(r.front_layer, {})[r.protocol] = r.agreement
    return out


@dataclass
class Bench:
    out: Path
    budget: str
    sizes: Sizes = Sizes()
    per_point: bool = False
    log: list[str] = field(default_factory=list)

    def check(self, fam: Family, tag: str, back: Path, seed: int, ref: Path) -> dict[str, Any]:
        z = self.sizes
        own = "" if z.ci_train is None else f"-own{z.ci_train}"
        path = (self.out / "reports" / f"{self.budget}-{z.train}-{z.test}-{z.points}-"
                f"{z.extra_rounds}{own}" / f"{tag}.seed{seed}.json")
        if path.exists():
            cached = json.loads(path.read_text())
            # Rows from before per-point figures: the first rerun is made again for them
            # (the same figures: a check with the same seeds and cached IRIs is deterministic).
            if "points" in cached or seed != 0 or not self.per_point:
                return cached
        t0 = time.perf_counter()
        report = run_job(spec_of(fam, ref, back, seed, self.budget, self.sizes),
                         resources=Resources(cache_dir=self.out / "cache"))
        row = {**figures(report), "seconds": time.perf_counter() - t0}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(row))
        print(f"  check {tag} seed {seed}: {row['similarity']:.4f} std "
              f"{row['standard']:.4f} cka {row['cka']} ({row['seconds']:.0f} s)", flush=True)
        return row


def model_file(out: Path, name: str, fam: Family, v: Variant, ref: Path) -> tuple[Path, float]:
    path = out / "models" / name / f"{v.name}.safetensors"  # --epochs: another --out
    meta = path.with_suffix(".json")
    if path.exists() and meta.exists():
        return path, json.loads(meta.read_text())["accuracy"]
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if v.make is None:
        shutil.copyfile(ref, path)
        acc = json.loads(ref.with_suffix(".json").read_text())["accuracy"]
    else:
        net = v.make()
        acc = accuracy(net)
        save_checkpoint(net, path, fam.arch, fam.arch_kwargs)
    meta.write_text(json.dumps({"accuracy": acc}))
    print(f"  model {name}/{v.name}: accuracy {acc:.4f} ({time.perf_counter() - t0:.0f} s)",
          flush=True)
    return path, acc


def loader(out: Path, name: str, fam: Family) -> Callable[[str], torch.nn.Module]:
    from safetensors.torch import load_file

    def load(v: str) -> torch.nn.Module:
        net = timm.create_model(fam.arch, pretrained=False, **fam.arch_kwargs)
        net.load_state_dict(load_file(str(out / "models" / name / f"{v}.safetensors")))
        return net.eval()
    return load


def run_family(b: Bench, name: str, reseeds: int, reruns: int, only: set[str] | None,
               epochs: int | None = None, doses: set[str] | None = None,
               series: Doses = Doses()) -> dict[str, Any]:
    fam = FAMILIES[name]
    rows: dict[str, Any] = {}
    ref: Path | None = None
    for v in variants(fam, loader(b.out, name, fam), reseeds, epochs, series):
        if only and v.kind not in only and v.kind not in ("reference", "baseline"):
            continue
        if doses and v.kind not in ("reference", "baseline") and v.name not in doses:
            continue
        path, acc = model_file(b.out, name, fam, v, ref or Path())
        if v.kind == "reference":
            ref = path
        assert ref is not None
        # The baseline and the benign set get every rerun (the spread); harmful ones too.
        checks = [b.check(fam, f"{name}.{v.name}", path, s, ref) for s in range(reruns)]
        rows[v.name] = {"kind": v.kind, "dose": v.dose, "accuracy": acc, "checks": checks}
    return rows


# ------------------------------------------------------------------ gates


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def gates(rows: dict[str, Any]) -> dict[str, Any]:
    base = rows["retrain"]
    b_sim, b_cka = base["checks"][0]["similarity"], base["checks"][0]["cka"]
    b_acc = base["accuracy"]
    benign = [r for r in rows.values() if r["kind"] in ("benign", "baseline")]
    sim_drops = [b_sim - c["similarity"] for r in benign for c in r["checks"]]
    cka_drops = [b_cka - c["cka"] for r in benign for c in r["checks"] if c["cka"] is not None]
    max_drop = max(0.0, *sim_drops)
    cka_max = max(0.0, *cka_drops) if cka_drops else 0.0
    spread = {k: max(c["similarity"] for c in r["checks"]) - min(c["similarity"]
                                                                  for c in r["checks"])
              for k, r in rows.items()}
    # --max-drop auto: AUTO_K x the baseline's own interval half-width (stitchsim.gates).
    auto = AUTO_K * base["checks"][0]["ci_half_width"]
    per: dict[str, Any] = {}
    for k, r in rows.items():
        sims = [c["similarity"] for c in r["checks"]]
        ckas = [c["cka"] for c in r["checks"] if c["cka"] is not None]
        per[k] = {
            "kind": r["kind"], "dose": r["dose"], "accuracy": r["accuracy"],
            "similarity": _mean(sims), "rerun_range": spread[k],
            "standard": _mean([c["standard"] for c in r["checks"]]),
            "invariance_aware": _mean([c["invariance_aware"] for c in r["checks"]]),
            "cka": _mean(ckas) if ckas else None,
            "stitch_gate": _mean([float(b_sim - s > max_drop + 1e-9) for s in sims]),
            "auto_gate": _mean([float(b_sim - s > auto + 1e-9) for s in sims]),
            "accuracy_gate": float(b_acc - r["accuracy"] > 0.01),
            "cka_gate": _mean([float(b_cka - c > cka_max + 1e-9) for c in ckas]) if ckas else None,
            "seconds": _mean([c["seconds"] for c in r["checks"]]),
        }
    half = base["checks"][0]["ci_half_width"]
    point_gates = per_point_gates(rows)
    for k, pg in point_gates.get("rows", {}).items():
        per[k]["points"] = pg
    same = ("resaved" not in rows or "reference" not in rows
            or rows["resaved"]["checks"] == [{**c, "seconds": r["seconds"]} for c, r in zip(
                rows["reference"]["checks"], rows["resaved"]["checks"], strict=True)])
    return {"resaved_equals_reference": same, "baseline_similarity": b_sim,
            "baseline_cka": b_cka, "baseline_accuracy": b_acc,
            "max_drop": max_drop, "cka_max_drop": cka_max, "benign_drops": sim_drops,
            "baseline_ci_half_width": half, "auto_k": AUTO_K, "auto_max_drop": AUTO_K * half,
            "largest_benign_drop_over_half_width": max_drop / half if half else None,
            "point_max_drop": point_gates.get("max_drop"), "rows": per}


def per_point_gates(rows: dict[str, Any]) -> dict[str, Any]:
    """A stitching gate per point on the invariance-aware agreement (the first rerun, which
    carries per-point figures): fails when the point's drop from the baseline's exceeds the
    largest benign drop at that point."""
    first = {k: r["checks"][0].get("points") for k, r in rows.items()}
    base = first.get("retrain")
    if not base or any(v is None for v in first.values()):
        return {}
    ia = "invariance_aware"
    drops = {p: max(0.0, *[base[p][ia] - first[k][p][ia] for k, r in rows.items()
                           if r["kind"] in ("benign", "baseline")]) for p in base}
    return {"max_drop": drops, "rows": {
        k: {p: {"standard": f[p].get("standard"), ia: f[p][ia],
                "gate": float(base[p][ia] - f[p][ia] > drops[p] + 1e-9)} for p in base}
        for k, f in first.items()}}


def table(name: str, g: dict[str, Any]) -> str:
    lines = [f"{name}: baseline (reference vs retrain) similarity {g['baseline_similarity']:.4f}"
             f", its 95% interval half-width {g['baseline_ci_half_width']:.4f}; max-drop from "
             f"benign {g['max_drop']:.4f}; auto {g['auto_max_drop']:.4f}; CKA gate drop "
             f"{g['cka_max_drop']:.4f}; resaved = reference: {g['resaved_equals_reference']}",
             f"{'model':<11}{'acc':>7}{'std':>8}{'ia':>8}{'sim':>8}{'range':>7}{'cka':>8}"
             f"{'stitch':>8}{'auto':>6}{'acc>1pt':>8}{'cka':>6}{'s':>6}"]
    for k, r in g["rows"].items():
        cka = f"{r['cka']:.4f}" if r["cka"] is not None else "-"
        ckag = f"{r['cka_gate']:.1f}" if r["cka_gate"] is not None else "-"
        lines.append(f"{k:<11}{r['accuracy']:>7.3f}{r['standard']:>8.4f}"
                     f"{r['invariance_aware']:>8.4f}{r['similarity']:>8.4f}"
                     f"{r['rerun_range']:>7.3f}{cka:>8}{r['stitch_gate']:>8.1f}"
                     f"{r['auto_gate']:>6.1f}"
                     f"{r['accuracy_gate']:>8.1f}{ckag:>6}{r['seconds']:>6.0f}")
    return "\n".join(lines + point_table(g))


def point_table(g: dict[str, Any]) -> list[str]:
    """Per point: standard / invariance-aware agreement and the point's gate (1 = fails)."""
    drops = g.get("point_max_drop")
    if not drops:
        return []
    lines = ["per point (std / ia / gate at the largest benign drop: "
             + ", ".join(f"{p} {d:.4f}" for p, d in drops.items()) + ")",
             f"{'model':<11}" + "".join(f"{p:>22}" for p in drops)]
    for k, r in g["rows"].items():
        cells = [f"{c['standard']:.3f}/{c['invariance_aware']:.3f}/{c['gate']:.0f}"
                 for c in r["points"].values()]
        lines.append(f"{k:<11}" + "".join(f"{c:>22}" for c in cells))
    return lines


GATES = ("stitch_gate", "auto_gate", "cka_gate")


def agreement(mine: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Per family and gate: the models whose decision (share of reruns failing, rounded to a
    pass/fail by majority) differs between two runs of the bench (the ci budget against the
    full), over the models both ran."""
    out: dict[str, Any] = {}
    for name, fam in mine["families"].items():
        if name not in other["families"]:
            continue
        a, b = fam["gates"]["rows"], other["families"][name]["gates"]["rows"]
        both = [k for k in a if k in b]
        out[name] = {"models": len(both), **{
            g: {"differ": [k for k in both if _fails(a[k][g]) != _fails(b[k][g])]}
            for g in GATES}}
        # Per-point gates at the points both runs stitch.
        shared = set(a[both[0]].get("points", {})) & set(b[both[0]].get("points", {}))
        for p in sorted(shared):
            out[name][f"{p}_gate"] = {"differ": [
                k for k in both
                if _fails(a[k]["points"][p]["gate"]) != _fails(b[k]["points"][p]["gate"])]}
    return out


def _fails(rate: float | None) -> bool:
    return rate is not None and rate > 0.5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/stitchsim-drift"))
    ap.add_argument("--families", nargs="+", default=["resnet", "convnext"],
                    choices=list(FAMILIES))
    ap.add_argument("--reseeds", type=int, default=5)
    ap.add_argument("--reruns", type=int, default=5, help="checks per model (train.seed 0..)")
    ap.add_argument("--only", nargs="*", help="kinds to run beside reference and baseline "
                    "(benign marker noise prune drop)")
    ap.add_argument("--budget", default="full", help="full: the demo's spec; ci: the preset")
    ap.add_argument("--epochs", type=int, help="training epochs of every model (default: "
                    "the family's, 8 as the demo)")
    ap.add_argument("--models", nargs="*", help="only these variants (reseed2 marker0.25 ...)"
                    " beside the reference and the retrain")
    ap.add_argument("--train-samples", type=int, default=128)
    ap.add_argument("--test-samples", type=int, default=300)
    ap.add_argument("--points", type=int, default=3, help="the first N of the family's points")
    ap.add_argument("--extra-rounds", type=int, help="iri.extra_rounds (default: the method's)")
    ap.add_argument("--marker-doses", type=float, nargs="+", default=list(MARKER_DOSES),
                    help="shares of training images with the marker")
    ap.add_argument("--noise-doses", type=float, nargs="+", default=list(NOISE_DOSES))
    ap.add_argument("--prune-doses", type=float, nargs="+", default=list(PRUNE_DOSES))
    ap.add_argument("--json", type=Path, help="default: OUT/drift_power.<budget>.json")
    ap.add_argument("--per-point", action="store_true", help="make the first rerun of cached "
                    "checks again where it lacks per-point figures (runs from before them)")
    ap.add_argument("--ci-train-samples", type=int, help="under --budget ci: the spec's own "
                    "train.max_train_samples (as a report's too-few-vectors warning advises)")
    ap.add_argument("--agree-with", type=Path, help="another run's JSON (the full budget's): "
                    "list the models whose gate decisions differ from it")
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    sizes = Sizes(args.train_samples, args.test_samples, args.points, args.extra_rounds,
                  args.ci_train_samples)
    b = Bench(args.out, args.budget, sizes, per_point=args.per_point)
    result: dict[str, Any] = {"budget": args.budget, "reruns": args.reruns,
                              "sizes": vars(b.sizes), "epochs": args.epochs,
                              "reseeds": args.reseeds, "doses": {
                                  "marker": args.marker_doses, "noise": args.noise_doses,
                                  "prune": args.prune_doses},
                              "load_before": os.getloadavg(), "families": {}}
    for name in args.families:
        print(f"{name}:", flush=True)
        rows = run_family(b, name, args.reseeds, args.reruns,
                          set(args.only) if args.only else None, args.epochs,
                          set(args.models) if args.models else None,
                          Doses(tuple(args.marker_doses), tuple(args.noise_doses),
                                tuple(args.prune_doses)))
        g = gates(rows)
        result["families"][name] = {"checks": rows, "gates": g}
        print(table(name, g), flush=True)
    result["load_after"] = os.getloadavg()
    if args.agree_with:
        result["agreement"] = agreement(result, json.loads(args.agree_with.read_text()))
        print(f"decisions against {args.agree_with}: {json.dumps(result['agreement'])}")
    out = args.json or args.out / f"drift_power.{args.budget}.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
