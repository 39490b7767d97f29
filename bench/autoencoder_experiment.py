"""The autoencoder experiment of "Functional Alignment Can Mislead" on built-in data: a conv
autoencoder trained on shapes and one trained on digits, the shapes encoder stitched into the
digits decoder (cross-task pairing: each shape class paired with a digit class), beside the
clustered-noise floor and the identity ceiling. Writes the report page (with the grid of
inputs, the back model's reconstructions and the stitched model's) and the report JSON.

    python bench/autoencoder_experiment.py --out /tmp/ae        # trains the models (cached)
"""

from __future__ import annotations

import argparse
import base64
import time
from pathlib import Path

from stitchsim.models import Spec
from stitchsim_service.gateway.pages import render_report_page
from stitchsim_worker.engine import Resources, run_job
from stitchsim_worker.run_command import train_autoencoders


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("ae-experiment"))
    ap.add_argument("--epochs", type=int, default=5, help="stitch training epochs")
    args = ap.parse_args()
    for line in train_autoencoders(args.out):
        print(line, flush=True)
    fit = {"epochs": args.epochs, "max_train_samples": 800, "max_test_samples": 300}
    ae = {t: {"checkpoint": {"path": str(args.out / f"autoencoder_{t}.safetensors")}}
          for t in ("digits", "shapes")}
    spec = Spec.model_validate({
        "front": ae["shapes"], "back": ae["digits"], "dataset": "digits",
        "front_dataset": "shapes", "protocols": ["cross_task"], "objectives": ["slm", "dm"],
        "directions": "front_to_back", "layers": [{"front": "encoder", "back": "encoder"}],
        "controls": ["identity"], "train": fit, "control_settings": {"noise_sigmas": [0.3]},
    })
    t0 = time.perf_counter()
    report = run_job(spec, resources=Resources(cache_dir=args.out / "cache"))
    print(f"job: {time.perf_counter() - t0:.0f} s")
    for r in [*report.results, *report.controls]:
        print(f"{r.control or r.protocol:16s} {r.objective:4s} agreement {r.agreement:.3f} "
              f"{r.agreement_ci}  PSNR {r.value('psnr'):.1f} dB  retrieval {r.hard_agreement:.3f}")
    for note in report.notes:
        print("note:", note)
    (args.out / "report.json").write_text(report.model_dump_json(indent=1))
    (args.out / "report.html").write_text(render_report_page(report))
    for k, r in enumerate(x for x in report.results if x.grid is not None):
        assert r.grid is not None
        (args.out / f"grid_{k}_{r.objective}.png").write_bytes(base64.b64decode(r.grid.png))
    print(f"wrote {args.out}/report.html, report.json, grid_*.png")


if __name__ == "__main__":
    main()
