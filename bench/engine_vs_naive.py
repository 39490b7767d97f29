"""Engine vs the naive stitching loop of published code, on one realistic CPU job.

The naive loop runs both full networks on every step (front forward to the stitch point via a
hook, back forward for the targets, and the stitched forward through the whole back network).
The engine caches what frozen models make fixed, solves dm in closed form and runs only
g_{>j} per step. Both use the same init, data order and losses, so their figures must match.

    python bench/engine_vs_naive.py [--arch resnet18] [--epochs 3] [--samples 1437]
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import timm
import torch
from stitchsim.models import Spec
from stitchsim_worker.engine import Resources, run_job
from stitchsim_worker.engine.data.datasets import builtin
from stitchsim_worker.engine.measures.metrics import evaluate, relative_distance
from stitchsim_worker.engine.models.loading import build_model, save_checkpoint
from stitchsim_worker.engine.models.rep import rep_of
from stitchsim_worker.engine.stitching.layer import LeastSquares, StitchLayer
from stitchsim_worker.engine.stitching.objectives import (
    hard_label_loss,
    latent_alignment_loss,
    soft_label_loss,
)
from stitchsim_worker.engine.stitching.train import LossInputs

OBJECTIVES = ["hlm", "slm", "dm", "fula"]


def _checkpoints(arch: str, root: Path) -> tuple[Path, Path]:
    paths = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        net = timm.create_model(arch, pretrained=False, num_classes=10)
        path = root / f"{arch}_{seed}.safetensors"
        save_checkpoint(net, path, arch, {"num_classes": 10})
        paths.append(path)
    return paths[0], paths[1]


class _Hooked:
    """Full forwards with hooks: capture features, or swap the stitch tensor in."""

    def __init__(self, net: torch.nn.Module, preprocess):  # type: ignore[no-untyped-def]
        self.net, self.preprocess = net, preprocess

    def run(
        self, x: torch.Tensor, capture: list[str], replace: tuple[str, torch.Tensor] | None = None
    ):  # type: ignore[no-untyped-def]
        feats: dict[str, torch.Tensor] = {}
        handles = []
        if replace is not None:
            name, z = replace
            handles.append(self.net.get_submodule(name).register_forward_hook(lambda m, i, o: z))
        for name in capture:
            handles.append(
                self.net.get_submodule(name).register_forward_hook(
                    lambda m, i, o, name=name: feats.__setitem__(name, o.clone())
                )
            )
        try:
            logits = self.net(self.preprocess(x))
        finally:
            for h in handles:
                h.remove()
        return logits, [feats[n] for n in capture]


def naive(spec: Spec, front_path: Path, back_path: Path) -> dict[tuple[str, str], float]:
    data = builtin("digits")
    f = build_model(spec.front, front_path, "", where="front", native_size=32)
    g = build_model(spec.back, back_path, "", where="back", native_size=32)
    hf, hg = _Hooked(f.net, f.preprocess), _Hooked(g.net, g.preprocess)
    stages = [x["module"] for x in g.net.feature_info]
    x_train, y_train = data.train.images, data.train.labels
    x_test, y_test = data.test.images, data.test.labels
    out = {}
    for pair in spec.layers:  # type: ignore[union-attr]
        i, j = pair.front, pair.back
        later = stages[stages.index(j) + 1 :]
        with torch.no_grad():
            a0 = hf.run(x_train[:2], [i])[1][0]
            b0 = hg.run(x_train[:2], [j])[1][0]
        for objective in spec.objectives:
            stitch = StitchLayer(
                rep_of(tuple(a0.shape[1:]), prefix_tokens=0, output_fmt="NCHW"),
                rep_of(tuple(b0.shape[1:]), prefix_tokens=0, output_fmt="NCHW"),
            )
            n_init = spec.train.init_samples
            ls = LeastSquares(stitch)
            for s in range(0, n_init, 256):
                with torch.no_grad():
                    xb = x_train[s : min(n_init, s + 256)]
                    ls.add(hf.run(xb, [i])[1][0], hg.run(xb, [j])[1][0])
            ls.solve()
            # Published code iterates for dm too; the engine solves it in closed form.
            settings = spec.train
            steps = settings.epochs * math.ceil(len(y_train) / settings.batch_size)
            opt = torch.optim.Adam(
                stitch.parameters(), lr=settings.lr, weight_decay=settings.weight_decay
            )
            sched = torch.optim.lr_scheduler.MultiStepLR(opt, [steps // 3, 2 * steps // 3], 0.1)
            gen = torch.Generator().manual_seed(settings.seed)
            for _ in range(settings.epochs):
                order = torch.randperm(len(y_train), generator=gen)
                for s in range(0, len(order), settings.batch_size):
                    idx = order[s : s + settings.batch_size].sort().values
                    xb = x_train[idx]
                    with torch.no_grad():
                        a = hf.run(xb, [i])[1][0]  # the whole front network, every step
                        g_logits, g_feats = hg.run(xb, [j, *later])
                    z = stitch(a)
                    if objective == "dm":
                        loss = relative_distance(z, g_feats[0])
                    else:
                        logits, h_later = hg.run(xb, later, replace=(j, z))
                        loss = NAIVE_LOSSES[objective](
                            LossInputs(logits, g_logits, y_train[idx], [z, *h_later], g_feats)
                        )
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    sched.step()
            with torch.no_grad():
                a = hf.run(x_test, [i])[1][0]
                h_logits = hg.run(x_test, [], replace=(j, stitch(a)))[0]
                g_logits = hg.run(x_test, [])[0]
            out[(i, objective)] = evaluate(h_logits, g_logits, y_test).figures.agreement
    return out


NAIVE_LOSSES = {"hlm": hard_label_loss, "slm": soft_label_loss, "fula": latent_alignment_loss}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--arch", default="resnet18")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--layers", default="layer1,layer2,layer3")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        front, back = _checkpoints(args.arch, root)
        layers = [{"front": n, "back": n} for n in args.layers.split(",")]
        spec = Spec.model_validate(
            {
                "front": {"checkpoint": {"path": str(front)}},
                "back": {"checkpoint": {"path": str(back)}},
                "layers": layers,
                "objectives": OBJECTIVES,
                "protocols": ["standard"],
                "directions": "front_to_back",
                "train": {"epochs": args.epochs},
            }
        )
        t0 = time.perf_counter()
        report = run_job(spec, resources=Resources(cache_dir=root / "cache"))
        t_engine = time.perf_counter() - t0
        t0 = time.perf_counter()
        reference = naive(spec, front, back)
        t_naive = time.perf_counter() - t0
    n = len(report.results)
    print(
        f"job: {args.arch} on 32x32 digits ({report.dataset['n_train']} train / "
        f"{report.dataset['n_test']} test), {len(layers)} stitch points x "
        f"{len(OBJECTIVES)} objectives, {args.epochs} epochs, {torch.get_num_threads()} threads"
    )
    print(f"engine: {t_engine:8.1f} s   ({t_engine / n:.2f} s per stitch)")
    print(f"naive:  {t_naive:8.1f} s   ({t_naive / n:.2f} s per stitch)")
    print(f"ratio:  {t_naive / t_engine:8.2f}x faster")
    worst = max(abs(r.agreement - reference[(r.front_layer, r.objective)]) for r in report.results)
    print(f"largest agreement difference engine vs naive: {worst:.2e}")
    for r in report.results:
        print(
            f"  {r.front_layer:8s} {r.objective:5s} engine {r.agreement:.4f}  naive "
            f"{reference[(r.front_layer, r.objective)]:.4f}"
        )


if __name__ == "__main__":
    main()
