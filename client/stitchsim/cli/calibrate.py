"""`stitchsim calibrate`: a gate file from checks of the user's own benign retrains."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TextIO

from stitchsim.calibration import GateFile, flat_figures, width_warning
from stitchsim.cli.exits import EXIT_PASS, log
from stitchsim.cli.output import wait_for, write_file
from stitchsim.cli.spec_args import client_for, settings_from, spec_fields
from stitchsim.errors import UsageError
from stitchsim.models import Report
from stitchsim.sdk import Job, file_sha256
from stitchsim.sdk.client import ID_RE


def cmd_calibrate(args: argparse.Namespace, out: TextIO) -> int:
    settings = settings_from(args)
    fields = spec_fields(args, settings)
    fields.pop("threshold", None)  # a gate reads its own limits
    _refuse_twins([args.reference, *args.benign])
    log.info("calibrating a gate: %s against %d benign retrains on %s", args.reference,
             len(args.benign), settings.url)

    def wait(job: Job) -> Report:
        return wait_for(job, args, settings, cancel=True)

    with client_for(settings) as client:
        gate = client.calibrate(args.reference, args.benign, spec=fields,
                                false_alarm_rate=args.false_alarm_rate,
                                gate=args.gate_figures, wait=wait)
    warning = width_warning(gate)
    if warning:
        log.warning("%s", warning)
    flat = flat_figures(gate)
    if flat:
        log.warning("%s: the same value on every benign retrain, so the limit is that value and "
                    "any new model that differs fails it; more retrains or more test samples "
                    "(train.max_test_samples) give it a spread", ", ".join(flat))
    write_file(args.output, gate.model_dump_json(indent=1) + "\n")
    print(gate_table(gate), file=out)
    print(f"wrote {args.output}: {gate.gated_figures} gated figures, false-alarm rate "
          f"{gate.false_alarm_rate:.2%} per new benign model (limits at "
          f"{gate.limit_in_sd:.2f} benign sd); use it with `stitchsim check REF NEW --gate "
          f"{args.output}`", file=out)
    return EXIT_PASS


def _refuse_twins(models: list[str]) -> None:
    """Before any upload: the same bytes given twice (or the reference given as a retrain)
    would make a band of one model counted twice. Folders are compared once stored."""
    seen: dict[str, str] = {}
    for model in models:
        path = Path(model)
        if path.is_dir() or not (path.is_file() or ID_RE.match(model)):
            continue  # a folder, or a path the upload will name as missing
        key = model if ID_RE.match(model) else file_sha256(path)
        if key in seen:
            raise UsageError(f"calibrate: {model} and {seen[key]} are the same model; the "
                             "benign retrains must be distinct trainings, none the reference")
        seen[key] = model


def gate_table(gate: GateFile) -> str:
    """The gated figures first, then the recorded ones: band and limit of each."""
    rows = sorted(gate.figures.items(), key=lambda kv: not kv[1].gated)
    width = max(len(name) for name, _ in rows)
    lines = [f"{'figure':<{width}}  gated      mean      sd       min       max     limit"]
    lines += [f"{name:<{width}}  {'yes' if b.gated else 'no':<5}  {b.mean:8.4f}  {b.sd:.4f}  "
              f"{b.min:8.4f}  {b.max:8.4f}  {b.limit:8.4f}" for name, b in rows]
    return "\n".join(lines)


def gate_figures(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def false_alarm_rate(text: str) -> float:
    try:
        rate = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 < rate < 0.5:
        raise argparse.ArgumentTypeError(f"expected a rate in (0, 0.5) such as 0.01, got {text}")
    return rate


def add_parser(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]
               ) -> None:
    from stitchsim.calibration import ADVISED_MODELS, DEFAULT_FALSE_ALARM_RATE, DEFAULT_GATED

    p = sub.add_parser(
        "calibrate", parents=parents,
        help="a gate file from checks of benign retrains of the reference",
        description="Check each BENIGN retrain against REFERENCE under one spec (the "
        "reference's IRIs are made once and reused), and write a gate file: per figure the "
        "checks report, the benign n, mean, sd, min, max and a limit, a one-sided Student t "
        "prediction bound for one new benign model (limit = mean - t(1 - a/m, n - 1) * sd * "
        "sqrt(1 + 1/n), the false-alarm rate a split over the m gated figures). Use it with "
        f"`stitchsim check REF NEW --gate FILE`. At least 3 retrains, {ADVISED_MODELS} or more "
        "advised: independent trainings (other seeds, data orders) of the recipe the "
        "candidate comes from. docs/client.md, \"Choosing a gate\".")
    p.add_argument("reference", help="safetensors file, model folder or sha256: id")
    p.add_argument("benign", nargs="+", metavar="BENIGN",
                   help="benign retrains of the reference (files, folders or ids)")
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="where to write the gate file (JSON, sealed by a digest)")
    p.add_argument("--false-alarm-rate", type=false_alarm_rate, metavar="A",
                   default=DEFAULT_FALSE_ALARM_RATE,
                   help="the chance that a new benign retrain fails some gated figure "
                   f"(family-wise; default {DEFAULT_FALSE_ALARM_RATE:g})")
    p.add_argument("--gate-figures", type=gate_figures, metavar="KINDS",
                   help="which figures gate, comma-separated: a protocol (its agreement at "
                   "each point and direction), agreement, similarity, accuracy, "
                   "endpoint_agreement, a measure (cka), or all; default "
                   f"{','.join(DEFAULT_GATED)}. The others are recorded, not tested")
    p.add_argument("--timeout", help="seconds to wait for each job; 0 = no limit (default "
                   "3600)")
    p.add_argument("--progress", choices=["auto", "bar", "lines", "none"], default="auto",
                   help="progress display on stderr (auto: a bar on a terminal, lines "
                   "otherwise)")
    p.set_defaults(func=cmd_calibrate)
