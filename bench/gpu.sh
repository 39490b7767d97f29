#!/usr/bin/env bash
# One realistic job on a GPU machine, in one call: resnet18 on 32x32 digits, 9 stitch points,
# objectives slm and fula, both protocols, both directions, through `stitchsim-server run`;
# prints the stage timings from the report's environment.stage_seconds and the total, and on a
# GPU its utilisation (mean and share of samples above 50 %) and peak memory, sampled by
# nvidia-smi every 200 ms while the job runs.
#
#   bash bench/gpu.sh                  # fresh machine: installs into .venv, then the full job
#   bash bench/gpu.sh --quick          # 3 points, 1 epoch, few samples: a check that runs on CPU
#   bash bench/gpu.sh --python /path/to/python   # use an environment that has the project
#
# Options: --quick, --python PY (skip the install), --out DIR (default $OUT, else
# .stitchsim/bench-gpu), --device auto|cpu|cuda (default auto: the GPU when there is one).
# Writes DIR/spec.json, DIR/report.json, DIR/table.txt, DIR/timings.json and, on a GPU,
# DIR/gpu_samples.csv. Exits non-zero when the job fails
# or the report lacks rows.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
python=""
out="${OUT:-.stitchsim/bench-gpu}"
device="auto"
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --python) python="$2"; shift ;;
    --out) out="$2"; shift ;;
    --device) device="$2"; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

t0=$(date +%s)
if [ -z "$python" ]; then
  # A fresh, bare machine: the project from this checkout into a venv, torch pinned by
  # constraints.txt (the CUDA build on a GPU machine's default index).
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt \
    ./client -e .
  python=.venv/bin/python
fi
echo "install: $(( $(date +%s) - t0 )) s"
mkdir -p "$out"
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version \
  --format=csv,noheader || echo "no nvidia-smi: running on $(nproc) CPU cores"

QUICK="$quick" OUT_DIR="$out" DEVICE="$device" PYTHONUNBUFFERED=1 "$python" - <<'EOF'
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

quick = os.environ["QUICK"] == "1"
out = Path(os.environ["OUT_DIR"]).resolve()
ckpt_dir = out / "checkpoints"
ckpt_dir.mkdir(parents=True, exist_ok=True)

# Depth order; resnet18's stage outputs and the first block of each stage (the second block's
# output is the stage's own).
POINTS = ["act1", "layer1.0", "layer1", "layer2.0", "layer2", "layer3.0", "layer3",
          "layer4.0", "layer4"]
points = ["act1", "layer2", "layer4"] if quick else POINTS

# Two resnet18s (pretrained=False: nothing is downloaded), timed apart from the job: trained
# independently by the zoo (on the CPU) for the real run; random-init for --quick, where only
# the mechanics and the timings' shape matter.
t = time.perf_counter()
accs: dict = {}
for seed in (0, 1):
    path = ckpt_dir / f"resnet18_seed{seed}{'_init' if quick else ''}.safetensors"
    if path.is_file():
        continue
    if quick:
        import timm
        import torch
        from stitchsim_worker.engine.models.loading import save_checkpoint

        torch.manual_seed(seed)
        net = timm.create_model("resnet18", pretrained=False, num_classes=10)
        save_checkpoint(net, path, "resnet18", {"num_classes": 10})
    else:
        from stitchsim_worker.engine.models.zoo import make_checkpoint

        accs[seed] = round(make_checkpoint(path, "resnet18", "digits", seed=seed, epochs=4,
                                           lr=3e-3), 3)
print(f"checkpoints: {time.perf_counter() - t:.1f} s (test accuracy {accs or '-'})", flush=True)
suffix = "_init" if quick else ""

def gpu_summary(path: Path) -> dict:
    """Mean utilisation, the share of samples above 50 % and the peak memory in use, from
    nvidia-smi's "util, MiB" lines; lines it could not fill ("[N/A]") are skipped."""
    samples = []
    for line in path.read_text().splitlines():
        try:
            util, mib = (float(v) for v in line.split(",")[:2])
        except ValueError:
            continue
        samples.append((util, mib))
    if not samples:
        return {}
    utils = [u for u, _ in samples]
    return {"samples": len(samples), "util_mean_pct": round(sum(utils) / len(utils), 1),
            "util_above_50pct_share": round(sum(u > 50 for u in utils) / len(utils), 3),
            "memory_peak_mib": max(m for _, m in samples)}


spec = {
    "front": {"checkpoint": {"path": str(ckpt_dir / f"resnet18_seed0{suffix}.safetensors")}},
    "back": {"checkpoint": {"path": str(ckpt_dir / f"resnet18_seed1{suffix}.safetensors")}},
    "dataset": "digits",
    "layers": [{"front": p, "back": p} for p in points],
    "objectives": ["slm", "fula"],
    "protocols": ["standard", "invariance_aware"],
    "directions": "both",
    "threshold": 0.9,
    "device": os.environ["DEVICE"],
}
if quick:
    spec["train"] = {"epochs": 1, "max_train_samples": 256, "max_test_samples": 128}
    spec["iri"] = {"steps": 5, "extra_rounds": 0}
(out / "spec.json").write_text(json.dumps(spec, indent=2))

t = time.perf_counter()
cache = out / "cache"
# A fresh cache each time: IRIs cached by an earlier run would hide their cost.
subprocess.run(["rm", "-rf", str(cache)], check=True)
# The GPU's own view of the job, from outside the process: utilisation and memory in use.
samples_path = out / "gpu_samples.csv"
sampler = None
if shutil.which("nvidia-smi"):
    sampler = subprocess.Popen(
        ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits",
         "-lms", "200"], stdout=samples_path.open("w"), stderr=subprocess.DEVNULL)
# The results table goes to table.txt: the timings are what this prints.
with open(out / "table.txt", "w") as table:
    run = subprocess.run([sys.executable, "-m", "stitchsim_worker.cli", "run",
                          str(out / "spec.json"), "--out", str(out / "report.json"),
                          "--cache-dir", str(cache), "--quiet"], stdout=table)
wall = time.perf_counter() - t
gpu: dict = {}
if sampler is not None:
    sampler.terminate()
    sampler.wait()
    gpu = gpu_summary(samples_path)
if run.returncode != 0:
    sys.exit(f"stitchsim-server run failed with {run.returncode}")

report = json.loads((out / "report.json").read_text())
env = report["environment"]
stages = env["stage_seconds"]
expected = 2 * len(points) * 2 * 2  # directions x points x objectives x protocols
rows = report["results"]
width = max(len(k) for k in [*stages, "total (process)"]) + 2
print(f"\ndevice {env['device']} ({env.get('device_name', '')}), torch {env['torch']}, "
      f"{len(points)} points, {len(rows)} rows")
print(f"{'stage':<{width}}{'seconds':>10}{'share':>8}")
for name, secs in sorted(stages.items(), key=lambda kv: -kv[1]):
    print(f"{name:<{width}}{secs:>10.2f}{secs / env['seconds']:>8.1%}")
print(f"{'total (job)':<{width}}{env['seconds']:>10.2f}")
print(f"{'total (process)':<{width}}{wall:>10.2f}")
iri = [r["iri"] for r in rows if r.get("iri")]
if iri:
    print(f"IRIs: median final distance {sorted(i['median'] for i in iri)[len(iri) // 2]:.3f}, "
          f"converged {sum(i['converged'] for i in iri)}/{len(iri)}")
if gpu:
    print(f"GPU: utilisation {gpu['util_mean_pct']:.0f} % on average, above 50 % in "
          f"{gpu['util_above_50pct_share']:.0%} of {gpu['samples']} samples; peak memory "
          f"{gpu['memory_peak_mib']:.0f} MiB (whole device, nvidia-smi)")
if "peak_memory_mib" in env:
    print(f"peak memory allocated by the job's tensors: {env['peak_memory_mib']:.0f} MiB")
print(f"similarity {report['summary']['similarity']:.3f} "
      f"({report['summary']['similarity_protocol']}), verdict {report['verdict']}")
(out / "timings.json").write_text(json.dumps(
    {"device": env["device"], "device_name": env.get("device_name"), "points": points,
     "rows": len(rows), "job_seconds": env["seconds"], "process_seconds": round(wall, 3),
     "stage_seconds": stages, "gpu": gpu}, indent=2))
if len(rows) != expected:
    sys.exit(f"expected {expected} result rows, got {len(rows)}")
EOF
echo "total: $(( $(date +%s) - t0 )) s"
