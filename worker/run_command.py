"""In-process commands of `stitchsim-server`: `run` (one job, no HTTP), `points` (a model's
stitch points), `calibrate` (this host's device figures) and `demo-models` (small reference
checkpoints trained on built-in data)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from stitchsim.models import Spec

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def add_run_parser(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="run one comparison in-process and write its report")
    run.add_argument("spec", type=Path, help="spec JSON; relative paths are read from its folder")
    run.add_argument("--out", type=Path, help="write the JSON report here (else to stdout)")
    run.add_argument("--cache-dir", type=Path, default=Path(".stitchsim/cache"), help="IRI cache")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.set_defaults(func=run_command)

    points = sub.add_parser("points", help="list a timm architecture's stitch points")
    points.add_argument("arch")
    points.add_argument(
        "--kwargs", default="{}", help='create_model kwargs as JSON, e.g. {"img_size": 32}'
    )
    points.add_argument("--all", action="store_true", help="every module output, not just stages")
    points.set_defaults(func=points_command)

    cal = sub.add_parser("calibrate", help="measure this host's device for the job budget "
                         "(what a job worker announces at start)")
    cal.add_argument("--refresh", action="store_true", help="probe again, ignoring the cache")
    cal.add_argument("--json", dest="as_json", action="store_true",
                     help="one line of JSON (null when uncalibrated: STITCHSIM_CALIBRATION=off, "
                     "or auto on a CPU)")
    cal.set_defaults(func=calibrate_command)

    demo = sub.add_parser("demo-models", help="train small demo checkpoints on built-in data")
    demo.add_argument("out", type=Path, help="folder for the .safetensors files")
    demo.add_argument("--half", action="store_true",
                      help="store the weights in float16 (half the file; the demo's committed "
                      "checkpoints in examples/demo-models are made so)")
    demo.add_argument("--robust", action="store_true",
                      help="also train two adversarially robust seeds (robust.safetensors, "
                      "robust_b.safetensors; fast adversarial training at 8/255, a few "
                      "minutes each on a CPU)")
    demo.add_argument("--autoencoders", action="store_true",
                      help="also train the conv autoencoder on digits and on shapes "
                      "(autoencoder_digits/shapes.safetensors: the autoencoder experiment)")
    demo.set_defaults(func=demo_models_command)


def _resolve_paths(raw: Any, base: Path) -> Any:
    """{"path": "x"} relative to the spec file, so a spec travels with its checkpoints."""
    if isinstance(raw, dict):
        if set(raw) == {"path"} and isinstance(raw["path"], str):
            return {"path": str((base / Path(raw["path"]).expanduser()).resolve())}
        return {k: _resolve_paths(v, base) for k, v in raw.items()}
    if isinstance(raw, list):
        return [_resolve_paths(v, base) for v in raw]
    return raw


def load_spec(path: Path) -> Spec:
    raw = json.loads(path.read_text())
    return Spec.model_validate(_resolve_paths(raw, path.parent))


class _Bar:
    """A tqdm bar over the job's work units, relabelled with each stage."""

    def __init__(self, enabled: bool):
        from tqdm import tqdm

        self._bar = tqdm(total=0, unit="batch", disable=not enabled, dynamic_ncols=True)

    def __call__(self, stage: str, done: int, total: int, eta_s: float | None) -> None:
        if self._bar.total != total:
            self._bar.total = total
        self._bar.set_description(stage[:48], refresh=False)
        # tqdm's own remaining time reads all units at one pace; the engine's knows better.
        if eta_s is not None:
            self._bar.set_postfix_str(f"ETA {eta_s:.0f} s", refresh=False)
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        self._bar.close()


class _TracebacksToFile(logging.Filter):
    """`run` logs to the user's terminal: engine tracebacks go to a file there instead, as
    they go to the worker's log in the service, and the log line says where."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info:
            with self.path.open("a") as f:
                f.write("".join(traceback.format_exception(*record.exc_info)) + "\n")
            record.exc_info, record.exc_text = None, None
            record.msg = f"{record.getMessage()} (traceback in {self.path})"
            record.args = ()
        return True


def run_command(args: argparse.Namespace) -> int:
    from stitchsim.failure import Failure
    from stitchsim.table import format_table
    from stitchsim.validation import validation_failure
    from stitchsim_worker.engine import Resources, run_job

    try:
        spec = load_spec(args.spec)
    except (OSError, json.JSONDecodeError) as e:
        print(f"error: cannot read spec {args.spec}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except ValidationError as e:
        # The words the service and the client use for the same spec: one shape.
        print(f"error: {validation_failure('invalid_spec', 'invalid spec', e.errors()).line()}",
              file=sys.stderr)
        return EXIT_USAGE
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    bar = _Bar(enabled=not args.quiet)
    tracebacks = _TracebacksToFile(args.cache_dir / "failures.log")
    engine_log = logging.getLogger("stitchsim.engine")
    engine_log.addFilter(tracebacks)
    try:
        report = run_job(spec, resources=Resources(cache_dir=args.cache_dir), progress=bar)
    except Failure as e:
        bar.close()
        print(f"error: {e.line()}", file=sys.stderr)
        # The registry says whose fault: the spec's (fix it) or ours (report it).
        return EXIT_USAGE if e.entry is not None and e.entry.user_fault else EXIT_FAILED
    finally:
        engine_log.removeFilter(tracebacks)
    bar.close()
    text = report.model_dump_json(indent=2)
    if args.out:
        args.out.write_text(text)
        print(format_table(report))
    else:
        print(format_table(report), file=sys.stderr)
        print(text)
    return EXIT_OK


def points_command(args: argparse.Namespace) -> int:
    from stitchsim.failure import Failure
    from stitchsim_worker.engine import list_stitch_points

    try:
        points = list_stitch_points(args.arch, json.loads(args.kwargs))
    except Failure as e:
        print(f"error: {e.line()}", file=sys.stderr)
        return EXIT_USAGE
    except json.JSONDecodeError as e:
        print(f"error: --kwargs is not JSON: {e}", file=sys.stderr)
        return EXIT_USAGE
    print("\n".join(points["all"] if args.all else points["stages"]))
    print(f"# auto: {', '.join(points['auto'])}", file=sys.stderr)
    return EXIT_OK


CALIBRATION_SIZES = (32, 64, 128, 224, 384)
"""Input sides `calibrate` prints the figures at."""


def calibrate_command(args: argparse.Namespace) -> int:
    from stitchsim_service.core.settings import get_settings
    from stitchsim_worker.calibration import parse_stand_in

    settings = get_settings()
    if settings.calibration == "off":
        cal = None
    elif settings.calibration in ("auto", "probe"):
        from stitchsim_worker.calibration import calibrate
        from stitchsim_worker.engine.core.device import pick_device

        device = pick_device("auto")
        # auto: a CPU keeps the flat figures, measured on the reference CPU; a probe on a
        # shared CPU host reads its neighbours' load as the device's speed.
        if settings.calibration == "auto" and device.type == "cpu":
            cal = None
        else:
            cal = calibrate(settings.resolved_cache_dir / "calibration", device,
                            refresh=args.refresh)
    else:
        cal = parse_stand_in(settings.calibration)
    if args.as_json:
        print(json.dumps(cal.as_dict() if cal else None))
        return EXIT_OK
    limit = settings.max_job_units
    if cal is None:
        print(f"calibration off: {settings.seconds_per_unit:g} s a unit at every input size, "
              f"job limit {limit or 'none'} units (STITCHSIM_SECONDS_PER_UNIT, "
              "STITCHSIM_MAX_JOB_UNITS)")
        return EXIT_OK
    print(cal.text())
    print(f"{'input':>6}  {'s/unit':>10}  {'job limit (units)':>18}  {'limit in worker time':>20}")
    for size in CALIBRATION_SIZES:
        spu = cal.seconds_per_unit(size)
        units = cal.job_limit(limit, size) if limit else None
        shown = f"{units:,}" if units else "none"
        hours = f"{units * spu / 3600:.1f} h" if units else "-"
        print(f"{size:>4} px  {spu:>10.3g}  {shown:>18}  {hours:>20}")
    return EXIT_OK


# The demo's models: a test_resnet whose stem and first stage are wide enough to be close to
# invertible on 32 px inputs, as the papers' CIFAR ResNet-18 is. At timm's default widths
# (stem 16, first stage 32) a ReLU layer already discards enough that two seeds share no
# invariances even at the stem (bench/iri_transfer.py --narrow: the back model's agreement on
# IRIs 0.11-0.13 at every point), and the demo could not show the shallow-to-deep shape.
DEMO_ARCH = "test_resnet"
DEMO_ARCH_KWARGS: dict[str, object] = {"stem_width": 64, "channels": [128, 128, 128, 192]}
DEMO_EPOCHS = 8
DEMO_MODELS = {  # file name: (dataset, seed)
    "reference.safetensors": ("digits_digit_only", 0),
    "retrained.safetensors": ("digits_digit_only", 1),
    "shortcut.safetensors": ("digits_marker", 0),
}


def train_demo_models(out: Path, names: tuple[str, ...] = tuple(DEMO_MODELS), *,
                      half: bool = False, say: Callable[[str], None] | None = None) -> list[str]:
    """Train the demo models (of `names`) that `out` does not have yet; one line per model.
    half: stored in float16 (the checkpoints committed in examples/demo-models); say: a line
    per epoch as each model trains."""
    import torch
    from stitchsim_worker.engine.models.zoo import make_checkpoint

    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for name in names:
        dataset, seed = DEMO_MODELS[name]
        path = out / name

        def epoch_line(epoch: int, epochs: int, loss: float, name: str = name) -> None:
            if say is not None:
                say(f"  {name}: epoch {epoch}/{epochs}, training loss {loss:.3f}")

        if path.exists():
            lines.append(f"{path}: exists")
            continue
        acc = make_checkpoint(path, DEMO_ARCH, dataset, seed=seed, epochs=DEMO_EPOCHS,
                              arch_kwargs=DEMO_ARCH_KWARGS, on_epoch=epoch_line,
                              dtype=torch.float16 if half else None)
        lines.append(f"{path}: {DEMO_ARCH} trained on {dataset}, test accuracy {acc:.3f}")
        if say is not None:
            say(lines[-1])
    return lines


AUTOENCODER_TASKS = ("digits", "shapes")
AUTOENCODER_KWARGS: dict[str, object] = {"width": 16, "latent": 16}
AUTOENCODER_EPOCHS = 10


def train_autoencoders(out: Path) -> list[str]:
    """The conv autoencoder on each of two built-in tasks (the autoencoder experiment of
    Functional Alignment Can Mislead), those `out` does not have yet; one line per model."""
    from stitchsim_worker.engine.models.zoo import make_autoencoder_checkpoint

    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for task in AUTOENCODER_TASKS:
        path = out / f"autoencoder_{task}.safetensors"
        if path.exists():
            lines.append(f"{path}: exists")
            continue
        error = make_autoencoder_checkpoint(path, task, epochs=AUTOENCODER_EPOCHS,
                                            arch_kwargs=AUTOENCODER_KWARGS)
        lines.append(f"{path}: conv_autoencoder trained on {task}, test relative "
                     f"reconstruction error {error:.3f}")
    return lines


def demo_models_command(args: argparse.Namespace) -> int:
    def say(line: str) -> None:
        print(line, flush=True)

    for line in train_demo_models(args.out, half=args.half, say=say):
        if line.endswith(": exists"):  # the trained ones were said as they finished
            say(line)
    if args.autoencoders:
        for line in train_autoencoders(args.out):
            print(line, flush=True)
    if args.robust:
        for name, seed in ROBUST_DEMO_MODELS.items():
            _robust_demo_model(args.out / name, seed)
    return EXIT_OK


# Two robust seeds: the invariance-aware paper's robust <-> robust pairing beside robust <->
# standard (reference.safetensors); the seeds differ from the standard ones'.
ROBUST_DEMO_MODELS = {"robust.safetensors": 2, "robust_b.safetensors": 3}


def _robust_demo_model(path: Path, seed: int) -> None:
    from stitchsim_worker.engine.models.robust import make_robust_checkpoint

    if path.exists():
        print(f"{path}: exists")
        return
    clean, robust = make_robust_checkpoint(path, "test_resnet", "digits_digit_only", seed=seed)
    print(f"{path}: test_resnet adversarially trained on digits_digit_only (seed {seed}), "
          f"test accuracy {clean:.3f}, under PGD-10 at 8/255 {robust:.3f}", flush=True)
