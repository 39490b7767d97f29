"""The two IRI methods side by side (issue 26): does the `fast` method give the invariance-aware
agreement the paper's method gives?

For each architecture (two seeds of it, trained here on the built-in digits with seeds no test
uses, cached in --models), at three stitch points from shallow to deep, one in-process job per
method runs the invariance-aware protocol (dm: closed form, so the figure is the IRIs', not a
training run's), and prints per point: each method's agreement with its 95 % interval, the
IRIs' median feature distance and RMS pixel distance from x, and whether `fast`'s agreement
lies in `paper`'s interval. With --match, `fast` is stopped at paper's median feature distance
per point (iri.stop_below at that median, no extra rounds), so the two are compared at the same
distance too.

    python bench/iri_methods.py                       # the small version below
    python bench/iri_methods.py --n 512 --match       # larger, at matched distance

Measured 2026-12-03 on two cores shared with other jobs (load ~20), --n 64 --test 300, the
test fixtures' narrow models (timm's default test_resnet widths, seeds 0 and 1; test_vit seed 0
in front of the resnet): agreement [paper's 95 % CI] and the IRIs' median feature distance /
median RMS pixel distance from x.

    resnet act1        paper 0.113 [0.083, 0.143] 0.481 / 0.472   fast 0.293 (outside) 0.140 / 0.378
    resnet layer2      paper 0.098 [0.070, 0.132] 0.400 / 0.517   fast 0.113 (inside)  0.057 / 0.505
    resnet layer4      paper 0.104 [0.076, 0.139] 0.182 / 0.525   fast 0.120 (inside)  0.043 / 0.554
    vit blocks.0>layer1 paper 0.114 [0.086, 0.149] 0.020 / 0.421  fast 0.121 (inside)  0.018 / 0.407
    vit blocks.2>layer2 paper 0.105 [0.077, 0.140] 0.067 / 0.429  fast 0.099 (inside)  0.019 / 0.398
    vit blocks.5>layer4 paper 0.130 [0.096, 0.164] 0.340 / 0.460  fast 0.112 (inside)  0.062 / 0.407

Paper 382 s and 235 s, fast 148 s and 124 s for the three points. On these narrow models the
back model reads either method's IRIs as noise (agreement ~0.1, chance) except at the resnet
stem, where fast's IRIs (converged, 0.14) get 0.29 and paper's (unconverged, 0.48) 0.11:
fast is NOT within paper's interval there, and paper's IRIs did not converge at act1 and
layer2 (nor at the vit's last block). Equivalence is not shown, so the default is paper.

The same run on the demo's widths (`--archs test_resnet --n 64`: seeds 21 and 22, 4 epochs,
test accuracy 0.992 and 0.994; models no test or demo uses):

    act1    paper 0.362 [0.326, 0.398] 0.415 / 0.260   fast 0.977 (outside) 0.020 / 0.039
    layer1  paper 0.159 [0.126, 0.195] 0.369 / 0.340   fast 0.960 (outside) 0.031 / 0.114
    layer2  paper 0.118 [0.089, 0.148] 0.595 / 0.445   fast 0.413 (outside) 0.105 / 0.330

Paper 832 s, fast 126 s. Paper's 200 steps of 1/255 leave these IRIs unconverged at every
point (0.37-0.60, far from x in pixels); fast's converge and land close to x (0.04 rms at the
stem), and the back model agrees on them far more: the methods measure different things here.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from stitchsim.models import ResultRow, Spec
from stitchsim_worker.engine import Resources, run_job
from stitchsim_worker.engine.models.zoo import make_checkpoint

DATASET = "digits_digit_only"
ARCHS: dict[str, tuple[dict[str, Any], list[str]]] = {
    # Seeds 21 and 22: no test or demo model is trained with them.
    "test_resnet": ({"stem_width": 64, "channels": [128, 128, 128, 192]},
                    ["act1", "layer1", "layer2"]),
    "test_vit": ({"img_size": 32}, ["blocks.0", "blocks.2", "blocks.5"]),
}
SEEDS = (21, 22)


def models(root: Path, arch: str, epochs: int) -> tuple[Path, Path]:
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for seed in SEEDS:
        path = root / f"{arch}-{seed}.safetensors"
        if not path.exists():
            acc = make_checkpoint(path, arch, DATASET, seed=seed, epochs=epochs,
                                  arch_kwargs=ARCHS[arch][0])
            print(f"trained {path.name}: test accuracy {acc:.3f}", flush=True)
        paths.append(path)
    return paths[0], paths[1]


def pair(point: str) -> dict[str, str]:
    """"layer2" (the same name in both models) or "blocks.2@layer2" (front@back)."""
    front, _, back = point.partition("@")
    return {"front": front, "back": back or front}


def job(front: Path, back: Path, points: list[str], iri: dict[str, Any], n: int, test: int,
        cache: Path) -> list[ResultRow]:
    spec = Spec.model_validate({
        "front": {"checkpoint": {"path": str(front)}, "preprocess": "timm"},
        "back": {"checkpoint": {"path": str(back)}, "preprocess": "timm"},
        "dataset": DATASET, "layers": [pair(p) for p in points],
        "objectives": ["dm"], "protocols": ["invariance_aware"], "directions": "front_to_back",
        "train": {"max_train_samples": n, "max_test_samples": test}, "iri": iri,
    })
    return run_job(spec, resources=Resources(cache_dir=cache)).results


def compare(label: str, front: Path, back: Path, points: list[str],
            args: argparse.Namespace) -> None:
    runs: dict[str, list[ResultRow]] = {}
    for method in ("paper", "fast"):
        t0 = time.perf_counter()
        runs[method] = job(front, back, points, {"method": method}, args.n, args.test, args.cache)
        print(f"# {label} {method}: {time.perf_counter() - t0:.0f} s", flush=True)
    if args.match:
        for point, row in zip(points, runs["paper"], strict=True):
            assert row.iri is not None
            matched = {"method": "fast", "extra_rounds": 0, "stop_below": max(row.iri.median, 1e-3)}
            runs.setdefault("fast@d", []).extend(
                job(front, back, [point], matched, args.n, args.test, args.cache))
    for i, point in enumerate(points):
        ref = runs["paper"][i]
        for method, rows in runs.items():
            r = rows[i]
            assert r.iri is not None
            lo, hi = ref.agreement_ci
            inside = "" if method == "paper" else ("yes" if lo <= r.agreement <= hi else "NO")
            print(f"{label:<12}{point:<10}{method:<8}{r.agreement:>10.3f}"
                  f"{f'[{r.agreement_ci[0]:.3f}, {r.agreement_ci[1]:.3f}]':>16}"
                  f"{r.iri.median:>10.3f}{r.iri.pixel_rms or 0:>8.3f}"
                  f"{r.iri.pixel_median or 0:>8.3f}{inside:>7}{r.seconds:>7.0f}", flush=True)


def demo(models: Path, cache: Path) -> None:
    """The demo's two checks (examples/demo-spec.json, in-process) under each method: the
    similarity each gives, to place the demo's threshold between them."""
    from stitchsim_worker.run_command import train_demo_models

    for line in train_demo_models(models):
        print(line, flush=True)
    base = json.loads((Path(__file__).parents[1] / "examples/demo-spec.json").read_text())
    checks = {"seeds": ("reference", "retrained", "digits_digit_only"),
              "shortcut": ("shortcut", "reference", "digits_marker")}
    for method in ("paper", "fast"):
        for name, (f, b, dataset) in checks.items():
            spec = Spec.model_validate({
                **base, "dataset": dataset, "iri": {"method": method},
                "front": {"checkpoint": {"path": str(models / f"{f}.safetensors")}},
                "back": {"checkpoint": {"path": str(models / f"{b}.safetensors")}}})
            r = run_job(spec, resources=Resources(cache_dir=cache))
            cells = "; ".join(
                f"{row.front_layer} {row.protocol} {row.agreement:.3f}"
                + (f" (IRIs {row.iri.median:.2f}, px {row.iri.pixel_median:.2f})"
                   if row.iri else "") for row in r.results)
            print(f"{method} {name}: similarity {r.summary.similarity:.3f}; {cells}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", type=Path, default=Path(".stitchsim/bench-models"))
    p.add_argument("--cache", type=Path, default=Path(".stitchsim/bench-cache"))
    p.add_argument("--archs", default=",".join(ARCHS))
    p.add_argument("--pair", action="append", default=[], metavar="LABEL=FRONT:BACK:P1,P2,P3",
                   help="compare these checkpoints at these points (P: a name in both, or "
                   "front@back) instead of training models")
    p.add_argument("--n", type=int, default=96, help="training inputs (IRIs) per point")
    p.add_argument("--test", type=int, default=300, help="test inputs")
    p.add_argument("--epochs", type=int, default=4, help="training epochs of the models")
    p.add_argument("--match", action="store_true",
                   help="also run fast stopped at paper's median distance per point")
    p.add_argument("--demo", type=Path, metavar="MODELS",
                   help="instead: the demo's two checks under each method (models trained "
                   "into MODELS when missing, as demo-models does)")
    args = p.parse_args()
    if args.demo:
        demo(args.demo, args.cache)
        return
    print(f"{'pair':<12}{'point':<10}{'method':<8}{'agreement':>10}{'95% CI':>16}"
          f"{'feat. med':>10}{'px rms':>8}{'px med':>8}{'in CI':>7}{'s':>7}")
    for pair in args.pair:
        label, rest = pair.split("=", 1)
        front, back, points = rest.split(":")
        compare(label, Path(front), Path(back), points.split(","), args)
    if not args.pair:
        for arch in args.archs.split(","):
            front, back = models(args.models, arch, args.epochs)
            compare(arch, front, back, ARCHS[arch][1], args)


if __name__ == "__main__":
    main()
