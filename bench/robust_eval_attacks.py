"""Robust agreement under the two robust-evaluation attacks (issue 36): the paper's
(`autoattack_paper`, the default: ART's AutoAttack as the invariance-aware paper's code calls
it) against Croce & Hein's reference APGD (`apgd`), on the same stitched models.

The job is tests/engine/test_protocols.py's robust-rows job (slm, the adversarial protocol at
alpha 0 and 1, layer3, 4 epochs on 400 digits, 300 test inputs, robust evaluation on) run on
the robust pair those tests use: two fast-adversarially trained test_resnet seeds (2 and 3,
as `demo-models --robust` makes them), trained into --models if missing. Each attack runs
its own job with the same seeds, so the stitched models are the same and only the attack
differs. Printed per attack and alpha: clean agreement, robust agreement with its interval,
how often the attack fools the stitched model (success) and the back model (transfer), and
the job's wall time.

    OMP_NUM_THREADS=1 python bench/robust_eval_attacks.py --models /tmp/robust
    python bench/robust_eval_attacks.py --front a.safetensors --back b.safetensors
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from stitchsim.models import Spec
from stitchsim_worker.engine import Resources, run_job
from stitchsim_worker.engine.models.robust import make_robust_checkpoint

ATTACKS = ("autoattack_paper", "apgd")
TRAIN = {"epochs": 4, "max_train_samples": 400, "max_test_samples": 300}


def robust_pair(root: Path) -> tuple[Path, Path]:
    """The robust seeds 2 and 3 of tests/engine/test_protocols.py's robust_seeds fixture."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for seed in (2, 3):
        path = root / f"robust_{seed}.safetensors"
        if not path.exists():
            t0 = time.perf_counter()
            clean, robust = make_robust_checkpoint(path, "test_resnet", "digits_digit_only",
                                                   seed=seed)
            print(f"trained {path.name}: clean {clean:.3f}, PGD-10 robust {robust:.3f} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
        paths.append(path)
    return paths[0], paths[1]


def job(front: Path, back: Path, attack: str, layer: str, cache: Path) -> None:
    spec = Spec.model_validate({
        "front": {"checkpoint": {"path": str(front)}},
        "back": {"checkpoint": {"path": str(back)}}, "directions": "front_to_back",
        "objectives": ["slm"], "protocols": ["adversarial"], "train": TRAIN,
        "layers": [{"front": layer, "back": layer}],
        "adversarial": {"evaluate": True, "alphas": [0, 1], "attack": attack},
    })
    t0 = time.perf_counter()
    report = run_job(spec, resources=Resources(cache_dir=cache))
    wall = time.perf_counter() - t0
    for r in report.results:
        rb = r.robust
        assert rb is not None
        step = f"{rb.step_size * 255:.3g}/255" if rb.step_size else "2 eps"
        print(f"{attack:17s} alpha {r.alpha:g}  {layer}  clean {r.agreement:.3f}  robust "
              f"{rb.agreement:.3f} [{rb.agreement_ci[0]:.3f}, {rb.agreement_ci[1]:.3f}]  "
              f"success {rb.success_rate:.3f}  transfer {rb.transfer_rate:.3f}  "
              f"(eps {rb.epsilon * 255:.3g}/255, first step {step}, {rb.steps} steps; "
              f"job {wall:.0f} s)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, default=Path("/tmp/stitchsim-robust-pair"))
    parser.add_argument("--front", type=Path)
    parser.add_argument("--back", type=Path)
    parser.add_argument("--layers", default="layer3")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/stitchsim-robust-eval-cache"))
    args = parser.parse_args()
    front, back = (args.front, args.back) if args.front else robust_pair(args.models)
    print(f"threads {os.environ.get('OMP_NUM_THREADS', 'all')}, load {os.getloadavg()[0]:.1f}")
    for layer in args.layers.split(","):
        for attack in ATTACKS:
            job(front, back, attack, layer, args.cache)


if __name__ == "__main__":
    main()
