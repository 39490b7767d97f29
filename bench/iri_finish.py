"""How many steps the default `paper` IRIs need to finish (issue 36), per stitch point.

The default method takes the paper's 200 steps of 1/255, then rounds of 100 of the same steps
while the batch median is at or above 0.9 x converged_below. This bench runs the demo's
reference model (trained into --models as `stitchsim-server demo-models` does, when missing)
to the whole cap at each point and prints the median relative distance at every round end,
the steps the rule stops at (the first round end under the aim), and the time. The generator
returns only each sample's final distance, so the bench reads the distances it computes per
step (it wraps the distance function of the synthesis module; nothing else changes).

    python bench/iri_finish.py                              # act1, layer1, layer2; 64 inputs
    python bench/iri_finish.py --points layer2 --n 128
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from stitchsim.models import IRISettings, ModelRef
from stitchsim_worker.engine.core.bank import BankBuilder
from stitchsim_worker.engine.data.datasets import builtin
from stitchsim_worker.engine.iri import synthesis
from stitchsim_worker.engine.iri.synthesis import EXTRA_ROUNDS_AIM
from stitchsim_worker.engine.models.loading import build_model
from stitchsim_worker.engine.models.network import Network

CPU = torch.device("cpu")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", type=Path, default=Path(".stitchsim/demo/models"))
    p.add_argument("--model", default="reference")
    p.add_argument("--points", default="act1,layer1,layer2")
    p.add_argument("--n", type=int, default=64, help="training inputs (one batch)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    from stitchsim_worker.run_command import train_demo_models

    for line in train_demo_models(args.models):
        print(line, flush=True)
    torch.set_num_threads(args.threads)
    path = args.models / f"{args.model}.safetensors"
    model = build_model(ModelRef(checkpoint={"path": str(path)}), path, "", where="front",
                        native_size=32)
    net = Network(model, model.preprocess.input_size, CPU, "front")
    banks = BankBuilder(1 << 30)
    images = builtin("digits_digit_only").train.images[: args.n]
    pixels = banks.new(args.n, tuple(images.shape[1:]))
    pixels.write(0, images)

    medians: list[float] = []
    measure = synthesis.per_sample_distance

    def spy(feats: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        d = measure(feats, target)
        medians.append(float(d.detach().quantile(0.5)))
        return d

    synthesis.per_sample_distance = spy  # type: ignore[assignment]
    default = IRISettings().at("low")  # the digits: 32 px
    aim = EXTRA_ROUNDS_AIM * default.converged_below
    # The whole cap: the rule's stop is read off the trace.
    settings = default.model_copy(update={"converged_below": 1e-9})
    for point in args.points.split(","):
        medians.clear()
        t0, c0 = time.perf_counter(), time.process_time()
        synthesis.synthesize(net.front(point), pixels, settings, banks, CPU, lambda _n: None)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        # A round's steps each measure the iterate before them; the round then measures its
        # last iterate: round ends sit after every round's length + 1 entries.
        ends, at = {}, -1
        done = 0
        for length in settings.round_lengths():
            at += length + 1
            done += length
            ends[done] = round(medians[at], 4)
        stop = next((s for s, m in ends.items() if m < aim), None)
        print(json.dumps({"point": point, "start": round(medians[0], 4), "median_at": ends,
                          "steps_under_the_rule": stop, "n": args.n, "wall_s": round(wall, 1),
                          "cpu_s": round(cpu, 1)}), flush=True)


if __name__ == "__main__":
    main()
