"""Do another model's predictions survive on a front model's IRIs? The diagnostic behind the
demo's choice of architecture (README, "Two commands").

For each stitch point, IRIs of the front model are synthesised with the service's IRI code and
defaults, then both models read them. Printed per point: the IRIs' median final distance, the
front model's agreement on IRIs with itself on the real inputs (near 1: the IRIs fool it), and
the back model's (near 1: it shares the front model's invariances up to that point, so the
invariance-aware protocol can agree there). Models are the demo's unless given.

    python bench/iri_transfer.py                                  # the demo's models
    python bench/iri_transfer.py --front a.safetensors --back b.safetensors --points act1,layer1
    python bench/iri_transfer.py --narrow                         # timm's default widths

Trains the models it needs into --models (cached), like `stitchsim-server demo-models`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from stitchsim.models import IRISettings, ModelRef
from stitchsim_worker.engine.core.bank import Bank, BankBuilder
from stitchsim_worker.engine.data.datasets import builtin
from stitchsim_worker.engine.iri.synthesis import synthesize
from stitchsim_worker.engine.measures.metrics import agreement_per_sample
from stitchsim_worker.engine.models.loading import build_model
from stitchsim_worker.engine.models.network import Network
from stitchsim_worker.engine.models.zoo import make_checkpoint
from stitchsim_worker.run_command import DEMO_ARCH, train_demo_models

DATASET = "digits_digit_only"


def narrow_models(root: Path) -> tuple[Path, Path]:
    """Two seeds at timm's default test_resnet widths, the demo's old models."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for seed in (0, 1):
        path = root / f"narrow-{seed}.safetensors"
        if not path.exists():
            make_checkpoint(path, DEMO_ARCH, DATASET, seed=seed, epochs=8)
        paths.append(path)
    return paths[0], paths[1]


def network(path: Path) -> Network:
    # The zoo trains with timm's config of the architecture: say so instead of measuring it.
    ref = ModelRef(checkpoint={"path": str(path)}, preprocess="timm")
    return Network(build_model(ref, path, path.name, where="front", native_size=32),
                   32, torch.device("cpu"), path.stem)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", type=Path, default=Path(".stitchsim/bench-models"))
    p.add_argument("--front", type=Path)
    p.add_argument("--back", type=Path)
    p.add_argument("--narrow", action="store_true", help="timm's default test_resnet widths")
    p.add_argument("--points", default="act1,layer1,layer2,layer3")
    p.add_argument("--n", type=int, default=128, help="training inputs to synthesise IRIs of")
    args = p.parse_args()

    if args.front is None or args.back is None:
        if args.narrow:
            args.front, args.back = narrow_models(args.models)
        else:
            train_demo_models(args.models)
            args.front = args.models / "reference.safetensors"
            args.back = args.models / "retrained.safetensors"
    f, g = network(args.front), network(args.back)
    x = builtin(DATASET).train.images[: args.n]
    with torch.no_grad():
        real_f, real_g = f.logits(x), g.logits(x)
    settings = IRISettings().at("low")  # the digits: 32 px
    print(f"front {args.front.name}, back {args.back.name}, {args.n} inputs of {DATASET}, "
          f"IRIs at the service's defaults (line {settings.converged_below})")
    print(f"{'point':<10}{'IRI median':>12}{'front on IRIs':>15}{'back on IRIs':>14}{'s':>7}")
    for point in args.points.split(","):
        t0 = time.perf_counter()
        made = synthesize(f.front(point), _bank(x), settings, BankBuilder(2**32),
                          torch.device("cpu"), lambda _n: None)
        iris = made.images.all()
        with torch.no_grad():
            front_agrees = float(agreement_per_sample(f.logits(iris), real_f).mean())
            back_agrees = float(agreement_per_sample(g.logits(iris), real_g).mean())
        print(f"{point:<10}{float(torch.tensor(made.final).median()):>12.3f}"
              f"{front_agrees:>15.3f}{back_agrees:>14.3f}{time.perf_counter() - t0:>7.1f}")


def _bank(x: torch.Tensor) -> Bank:
    bank = BankBuilder(2**32).new(len(x), tuple(x.shape[1:]))
    bank.write(0, x)
    return bank


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
