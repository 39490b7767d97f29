"""The command line: every command, its options and its help."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from stitchsim import __version__, catalogue
from stitchsim.cli import calibrate, dataset, points
from stitchsim.cli.check import cmd_check
from stitchsim.cli.jobs import (
    cmd_compare,
    cmd_jobs_cancel,
    cmd_jobs_list,
    cmd_jobs_show,
    cmd_jobs_wait,
    cmd_report,
)
from stitchsim.gates import AUTO, AUTO_FALSE_ALARMS, AUTO_FALSE_ALARMS_SOURCE, AUTO_K
from stitchsim.keyredact import keys_in_argv, redact_keys
from stitchsim.probes import BUILTIN_PROBES


class Parser(argparse.ArgumentParser):
    """argparse, whose usage errors echo what was typed: a key given before the command
    (`stitchsim --api-key ssk_... check`) is read as the command's name and would be printed
    in clear into a CI log."""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def]
        self._keys = keys_in_argv(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        keys = getattr(self, "_keys", None) or keys_in_argv(sys.argv[1:])
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {redact_keys(message, keys)}\n")


def _escaped(text: str) -> str:
    return text.replace("%", "%%")  # argparse formats help with %


def _drop(text: str) -> float | str:
    if text == AUTO:
        return AUTO
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number or 'auto', got {text!r}") from None


def _gate_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "gates (MLflow-style; exit 1 when one fails, 5 in the warn band)")
    g.add_argument(
        "--baseline", metavar="FILE|JOB_ID|self",
        help="the report to compare with: a report JSON file, a job id, or 'self' (the "
        "reference compared with itself, reused from an earlier job by its hash). Refused "
        "when made of another reference or dataset, or under other settings")
    g.add_argument("--recompute-baseline", action="store_true",
                   help="redo a baseline made under other settings under this check's")
    g.add_argument(
        "--gate", metavar="FILE",
        help="a gate file of `stitchsim calibrate`: fail when any gated figure (agreement per "
        "point, accuracy ...) crosses its limit, the benign band of your own retrains. "
        "Refused when calibrated for another reference, dataset, spec or method")
    g.add_argument("--max-drop", type=_drop, metavar="X|auto",
                   help="fail when the similarity is more than X below the baseline's; "
                   f"auto: more than {AUTO_K:g} x the baseline's own 95%% interval "
                   f"half-width, which false-alarms on up to {round(AUTO_FALSE_ALARMS * 100)}%% "
                   "of benign retrains "
                   f"({_escaped(AUTO_FALSE_ALARMS_SOURCE)}): prefer --gate "
                   "(docs/client.md, choosing a gate)")
    g.add_argument("--max-relative-drop", type=float, metavar="F",
                   help="fail when it falls by more than the fraction F of the baseline's")
    g.add_argument("--max-drop-per-point", type=float, metavar="X",
                   help="fail when a stitch point's agreement is more than X below the "
                   "baseline's at that point")
    g.add_argument("--min-point-agreement", type=float, metavar="X",
                   help="fail when a stitch point's agreement is below X")
    g.add_argument("--warn-below", type=float, metavar="X",
                   help="warn (exit 5) when the similarity is below X but no gate fails")
    g.add_argument("--fail-on-caveat", action="store_true",
                   help="fail on any caveat: unconverged IRIs, a model at chance")


def build_parser() -> argparse.ArgumentParser:
    # SUPPRESS: an option left out on `jobs list` must not erase one given on `jobs`.
    common = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    g = common.add_argument_group("service")
    g.add_argument("--url", help="service URL ($STITCHSIM_URL; default http://127.0.0.1:8000)")
    g.add_argument("--api-key", help="API key ($STITCHSIM_API_KEY)")
    g.add_argument("--config", help="config file ($STITCHSIM_CONFIG; default stitchsim.toml)")
    g.add_argument("--retries", type=int, help="retries per request ($STITCHSIM_RETRIES; 5)")
    g.add_argument("-q", "--quiet", action="store_true", help="print only results and errors")

    spec = argparse.ArgumentParser(add_help=False)
    s = spec.add_argument_group("spec (later options override earlier sources)")
    s.add_argument("--spec", metavar="FILE", help="JSON file with spec fields")
    s.add_argument(
        "--dataset",
        help="built-in name, dataset id, or a dataset to upload: the service's .safetensors "
        "file, or a folder/archive/parquet/npz/WebDataset tar, packed first (see `stitchsim "
        "dataset pack`)",
    )
    s.add_argument(
        "--pack",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="packing option for --dataset (size=64, test_fraction=0.3, unlabelled=true, "
        "label_column=fine_label, test=PATH ...; as `stitchsim dataset pack` takes them)",
    )
    s.add_argument(
        "--probe", action="append", default=[], metavar="NAME_OR_PATH",
        help="a probe set to evaluate every stitch on beside the dataset (repeatable): a "
        f"built-in probe ({', '.join(BUILTIN_PROBES)}), any built-in dataset, a dataset id, "
        "or a dataset to upload as --dataset takes it",
    )
    s.add_argument(
        "--layers",
        help="'auto', or stitch pairs FRONT:BACK (or NAME for both) separated by commas",
    )
    for flag, kind in (("--objectives", catalogue.OBJECTIVES), ("--protocols", catalogue.PROTOCOLS),
                       ("--controls", catalogue.CONTROLS)):
        s.add_argument(flag, help=f"comma-separated, of: {_escaped(kind.help())}")
    s.add_argument("--directions", choices=["front_to_back", "back_to_front", "both"])
    s.add_argument("--budget", choices=list(catalogue.BUDGETS.names),
                   help="a preset of samples and stitch points (full: the spec's; ci: 64 "
                   "training samples, more where a stitch needs them, and at most 2 of the "
                   "auto points, for a gate on every pull request)")
    s.add_argument("--arch", help="architecture of both models (else from the files): a timm "
                   "name, or SOURCE:NAME such as torchvision:resnet50")
    s.add_argument("--arch-kwargs", metavar="JSON", help="e.g. '{\"num_classes\": 10}'")
    s.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any spec field by dotted path, value as JSON (e.g. train.epochs=2, iri.steps=50)",
    )
    s.add_argument(
        "--threshold", type=float, help="similarity needed to pass ($STITCHSIM_THRESHOLD)"
    )

    wait = argparse.ArgumentParser(add_help=False)
    w = wait.add_argument_group("waiting and output")
    w.add_argument("--timeout", help="seconds to wait for the job; 0 = no limit (default 3600)")
    w.add_argument(
        "--progress",
        choices=["auto", "bar", "lines", "none"],
        default="auto",
        help="progress display on stderr (auto: a bar on a terminal, lines otherwise)",
    )
    w.add_argument("--json", metavar="FILE", help="write the JSON report here")
    w.add_argument("--html", metavar="FILE", help="write the HTML report here")

    parser = Parser(
        prog="stitchsim",
        description="Functional similarity of neural networks, from a stitchsim service.",
        epilog="Exit codes: 0 pass/ok, 1 below threshold or a gate failed, 2 usage or spec "
        "error (or a baseline that does not compare), 3 service error (retry later), "
        "4 timeout, 5 warn band (check passed but below --warn-below).",
    )
    parser.add_argument("--version", action="version", version=f"stitchsim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "check",
        parents=[common, spec, wait],
        help="compare a candidate with a reference and pass or fail (for CI)",
        description="Upload (or reuse) REFERENCE and CANDIDATE, compare them, print a table, "
        "and exit 0 when the similarity reaches the threshold, 1 when it does not. The "
        "reference is always the front model, so work that depends only on it (its IRIs) is "
        "cached by the service across checks.",
    )
    p.add_argument("reference", help="safetensors file, model folder (save_pretrained or timm "
                   "hub layout) or sha256: id")
    p.add_argument("candidate", help="safetensors file, model folder (save_pretrained or timm "
                   "hub layout) or sha256: id")
    p.add_argument("--junit-xml", metavar="FILE", help="write a JUnit XML report here")
    p.add_argument("--markdown", metavar="FILE",
                   help="write the outcome as Markdown here (a CI summary or PR comment)")
    _gate_arguments(p)
    p.add_argument(
        "--keep-running",
        action="store_true",
        help="leave the job running on timeout or interrupt (default: cancel it)",
    )
    p.set_defaults(func=cmd_check)

    p = sub.add_parser(
        "compare",
        parents=[common, spec, wait],
        help="start a comparison (and optionally wait for its report)",
    )
    p.add_argument("front", help="safetensors file or sha256: id")
    p.add_argument("back", help="safetensors file or sha256: id")
    p.add_argument("--wait", action="store_true", help="wait and print the results table")
    p.set_defaults(func=cmd_compare)

    # `stitchsim jobs --json` lists, as `stitchsim jobs list --json` does.
    listing = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    listing.add_argument("--limit", type=int, help="jobs per page (default 20)")
    listing.add_argument("--json", dest="as_json", action="store_true", help="print JSON")
    p = sub.add_parser(
        "jobs", parents=[common, listing], help="list, show, wait for or cancel jobs"
    )
    jobs = p.add_subparsers(dest="jobs_command", metavar="ACTION")
    p.set_defaults(func=cmd_jobs_list)
    q = jobs.add_parser("list", parents=[common, listing], help="your jobs, newest first (default)")
    q.set_defaults(func=cmd_jobs_list)
    q = jobs.add_parser("show", parents=[common], help="state and progress of a job")
    q.add_argument("job_id")
    q.add_argument(
        "--json", dest="as_json", action="store_true", default=argparse.SUPPRESS, help="print JSON"
    )
    q.set_defaults(func=cmd_jobs_show)
    q = jobs.add_parser("cancel", parents=[common], help="cancel a job")
    q.add_argument("job_id")
    q.set_defaults(func=cmd_jobs_cancel)
    q = jobs.add_parser("wait", parents=[common, wait], help="wait for a job and print results")
    q.add_argument("job_id")
    q.set_defaults(func=cmd_jobs_wait)

    calibrate.add_parser(sub, [common, spec])
    dataset.add_parser(sub)
    points.add_parser(sub, common)

    p = sub.add_parser("report", parents=[common], help="fetch a finished job's report")
    p.add_argument("job_id")
    p.add_argument("--format", choices=["json", "html", "table"], default="json")
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    p.set_defaults(func=cmd_report)
    return parser
