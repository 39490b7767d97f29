"""What the submission-time spec check costs: the meta-device check (no weights read, no
parameter memory) against preparing the models for real, as the check did before.

    python bench/spec_check.py [--archs resnet18 vit_small_patch16_224 ...]

Prints, per architecture, seconds of both (the first call in a process, and a warm one as in a
long-lived check worker), the warm ratio, and peak RSS growth.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CASES = {
    "resnet18": {"num_classes": 10},
    "resnet50": {"num_classes": 10},
    "vit_small_patch16_224": {"num_classes": 10, "img_size": 32},
    "convnext_tiny": {"num_classes": 10},
}

_CHILD = r"""
import json, resource, sys, time
from pathlib import Path
import torch
from stitchsim.models import Spec
from stitchsim_worker.engine import Resources, check_spec
from stitchsim_worker.engine.data.datasets import load_dataset
from stitchsim_worker.engine.models.loading import build_model
from stitchsim_worker.engine.models.network import Network

mode, path = sys.argv[1], sys.argv[2]
spec = Spec.model_validate({"front": {"checkpoint": {"path": path}},
                            "back": {"checkpoint": {"path": path}}, "layers": "auto"})
res = Resources(cache_dir=Path(sys.argv[3]))


def check():
    if mode == "meta":
        check_spec(spec, resources=res)
        return
    # What the check did before: both models built and loaded on the CPU.
    data = load_dataset(spec.dataset, res, spec.train)
    for where in ("front", "back"):
        ref = getattr(spec, where)
        model = build_model(ref, Path(path), "", where=where, native_size=data.image_size)
        Network(model, data.image_size, torch.device("cpu"), where).auto_points()


before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
times = []
for _ in range(3):  # the first call in a process pays for warming up; a check worker lives on
    t0 = time.perf_counter()
    check()
    times.append(time.perf_counter() - t0)
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(json.dumps({"cold": times[0], "warm": min(times[1:]), "rss_mb": grown}))
"""


def _measure(mode: str, ckpt: Path, cache: Path) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", _CHILD, mode, str(ckpt), str(cache)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--archs", nargs="*", default=list(CASES))
    args = parser.parse_args()
    import timm
    from stitchsim_worker.engine.models.loading import save_checkpoint

    print(f"{'arch':<24}{'full cold':>10}{'meta cold':>10}{'full warm':>10}{'meta warm':>10}"
          f"{'ratio':>7}{'full MB':>9}{'meta MB':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for arch in args.archs:
            kwargs = CASES.get(arch, {"num_classes": 10})
            ckpt = Path(tmp) / f"{arch}.safetensors"
            save_checkpoint(timm.create_model(arch, pretrained=False, **kwargs), ckpt, arch,
                            kwargs)
            full = _measure("full", ckpt, Path(tmp))
            meta = _measure("meta", ckpt, Path(tmp))
            print(f"{arch:<24}{full['cold']:>10.2f}{meta['cold']:>10.2f}{full['warm']:>10.2f}"
                  f"{meta['warm']:>10.2f}{meta['warm'] / full['warm']:>7.2f}"
                  f"{full['rss_mb']:>9.0f}{meta['rss_mb']:>9.0f}")
    print("(MB: peak RSS growth during the check; importing torch and timm is not counted)")


if __name__ == "__main__":
    main()
