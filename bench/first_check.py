"""The first spec check of a Hugging Face folder after the service starts: `stitchsim-server
serve` (the real gateway and workers), two save_pretrained folders (tiny ViT and ConvNeXt,
random weights) uploaded, then one submission timed: the gateway answers once the checks
worker has checked the spec, within STITCHSIM_CHECK_TIMEOUT_S (30 s by default).

    python bench/first_check.py [--idle-release 0,60] [--port 8651]

Per STITCHSIM_WORKER_IDLE_RELEASE_S value: 0 keeps the pool process, which imports the engine
and warms up at start (engine.warm: transformers, torchvision's registry, the built-in data's
loader), and the check is timed once the worker logs that; 60 (the default) forks the pool
process when the check arrives, which then imports everything on the check's time. Prints the
seconds of the first check and of a second one (warm in both modes).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.footprint import _wait_ready, start_serve, stop_group  # noqa: E402


def _folders(root: Path) -> tuple[Path, Path]:
    from tests.engine.model_folders import CONVNEXT, VIT, hf_folder

    return (hf_folder(root, "ViTForImageClassification", VIT, processor=True),
            hf_folder(root, "ConvNextForImageClassification", CONVNEXT))


def _wait_for(log: Path, text: str, count: int, timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if log.read_text(errors="replace").count(text) >= count:
            return time.monotonic() - t0
        time.sleep(0.2)
    raise RuntimeError(f"{text!r} not logged after {timeout} s")


def run(idle_release: float, port: int, folders: tuple[Path, Path]) -> dict[str, Any]:
    from stitchsim import Client

    with tempfile.TemporaryDirectory() as data:
        log_path = Path(data) / "serve.log"
        t0 = time.monotonic()
        proc, log = start_serve(data, port, {
            "STITCHSIM_CALIBRATION": "off",
            "STITCHSIM_CHECK_TIMEOUT_S": "150",  # measured, not cut off
            "STITCHSIM_WORKER_IDLE_RELEASE_S": str(idle_release)})
        out: dict[str, Any] = {"idle_release": idle_release}
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_ready(url, proc, 300)
            out["ready_s"] = time.monotonic() - t0
            if idle_release == 0:
                _wait_for(log_path, "warmed up", 2, 300)  # the gpu and checks pool processes
                out["warm_s"] = time.monotonic() - t0
            with Client(url, timeout=300) as client:
                ids = [client.upload_checkpoint(f).id for f in folders]
                spec = {"front": {"checkpoint": ids[0]}, "back": {"checkpoint": ids[1]},
                        "layers": "auto", "objectives": ["dm"], "protocols": ["standard"],
                        "train": {"epochs": 1, "max_train_samples": 64}}
                for seed, label in enumerate(("first_check_s", "second_check_s")):
                    start = time.monotonic()  # another seed: another job, checked again
                    job = client.submit({**spec, "train": {**spec["train"], "seed": seed}})
                    out[label] = time.monotonic() - start
                    job.cancel()
        finally:
            stop_group(proc)
            log.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle-release", default="0,60")
    parser.add_argument("--port", type=int, default=8651)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folders = _folders(Path(tmp))
        for value in (float(v) for v in args.idle_release.split(",")):
            r = run(value, args.port, folders)
            warm = f", warmed up at {r['warm_s']:.1f} s" if "warm_s" in r else ""
            print(f"idle release {value:g} s: ready at {r['ready_s']:.1f} s{warm}; first check "
                  f"of an HF folder {r['first_check_s']:.1f} s, second "
                  f"{r['second_check_s']:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
