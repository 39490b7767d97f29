"""Memory of a job against its dataset's size (issue 29): peak RSS of one `stitchsim-server
run` job on synthetic uint8 datasets of 1x, 4x and 16x a base size, the job itself the same
each time (one stitch point, one direction, the standard protocol, max_train_samples and
max_test_samples fixed), so only the dataset file grows.

    python bench/dataset_memory.py [--base 4000] [--scales 1,4,16] [--python PATH]...

Each `--python` interpreter runs the jobs (its own installed engine): give the one of another
checkout (e.g. /work/main/.venv/bin/python) to measure the engine before this change beside
the one after. The datasets are random 3 x 32 x 32 uint8 images (base train images, a quarter
as many test images, 10 classes) and the model a randomly initialised test_resnet: memory,
not accuracy, is measured. Prints per interpreter and scale: the file's size, the job's peak
RSS (the job process's VmHWM), its seconds, and the RSS against the 1x run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

MB = 1024 * 1024
SPEC = {
    "layers": [{"front": "layer2", "back": "layer2"}],
    "objectives": ["slm"],
    "protocols": ["standard"],
    "directions": "front_to_back",
    "train": {"epochs": 1, "max_train_samples": 512, "max_test_samples": 256},
}


def checkpoint(path: Path) -> None:
    import timm
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    net = timm.create_model("test_resnet", pretrained=False, num_classes=10)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(path),
              metadata={"arch": "test_resnet", "arch_kwargs": json.dumps({"num_classes": 10})})


def dataset(path: Path, n_train: int, seed: int) -> None:
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    n_test = n_train // 4
    save_file({
        "train_images": rng.integers(0, 256, (n_train, 3, 32, 32), dtype=np.uint8),
        "train_labels": np.arange(n_train, dtype=np.int64) % 10,
        "test_images": rng.integers(0, 256, (n_test, 3, 32, 32), dtype=np.uint8),
        "test_labels": np.arange(n_test, dtype=np.int64) % 10,
    }, str(path))


# The job's own high-water mark, read by the job process as it exits: VmHWM belongs to the
# process's memory map, which exec starts afresh (wait4's ru_maxrss would also count this
# benchmark's own memory, which the child had before it exec'd).
_WRAPPER = """
import atexit, runpy, sys
out = sys.argv[1]
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            open(out, "w").write(line.split()[1])
atexit.register(hwm)
sys.argv = ["stitchsim-server"] + sys.argv[2:]
runpy.run_module("stitchsim_worker.cli", run_name="__main__")
"""


def run_job(python: str, spec: Path, work: Path) -> tuple[int, float]:
    """(peak RSS in bytes, seconds) of one job in its own process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    hwm = work / "hwm"
    start = time.monotonic()
    proc = subprocess.run(
        [python, "-c", _WRAPPER, str(hwm), "run", str(spec), "--out", str(work / "r.json"),
         "--cache-dir", str(work / "cache"), "--quiet"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"{python}: the job failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return int(hwm.read_text()) * 1024, seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", type=int, default=4000, help="train images at 1x")
    p.add_argument("--scales", default="1,4,16")
    p.add_argument("--python", action="append", help="interpreter(s) to run the jobs with "
                   "(default: this one)")
    args = p.parse_args()
    scales = [int(s) for s in args.scales.split(",")]
    pythons = args.python or [sys.executable]
    with tempfile.TemporaryDirectory(prefix="stitchsim-dsmem-") as tmp:
        work = Path(tmp)
        checkpoint(work / "model.safetensors")
        rows = []
        for scale in scales:
            path = work / f"data{scale}.safetensors"
            dataset(path, args.base * scale, seed=scale)
            spec = work / f"spec{scale}.json"
            spec.write_text(json.dumps({
                **SPEC, "front": {"checkpoint": {"path": "model.safetensors"}},
                "back": {"checkpoint": {"path": "model.safetensors"}},
                "dataset": {"path": path.name}}))
            for python in pythons:
                rss, seconds = run_job(python, spec, work)
                rows.append((python, scale, path.stat().st_size, args.base * scale, rss, seconds))
                print(f"{python}  {scale:>3}x  file {path.stat().st_size / MB:7.1f} MB  "
                      f"train {args.base * scale:>7}  peak RSS {rss / MB:7.1f} MB  "
                      f"{seconds:6.1f} s", flush=True)
            path.unlink()
    print("\npeak RSS against the 1x run of the same interpreter:")
    for python in pythons:
        mine = [r for r in rows if r[0] == python]
        first = mine[0][4]
        ratios = ", ".join(f"{r[1]}x {r[4] / first:.2f}" for r in mine)
        growth = (mine[-1][4] - first) / MB
        print(f"  {python}: {ratios} ({growth:+.0f} MB from {mine[0][1]}x to {mine[-1][1]}x, "
              f"the file {(mine[-1][2] - mine[0][2]) / MB:+.0f} MB)")


if __name__ == "__main__":
    main()
