"""`stitchsim check`: compare a candidate with a reference and pass, warn or fail, for CI."""

from __future__ import annotations

import argparse
import time
from typing import Any, TextIO

from stitchsim import view
from stitchsim.cli import baseline as baselines, gate as calibrated
from stitchsim.cli.dataset import pack_options
from stitchsim.cli.exits import (
    EXIT_BELOW_THRESHOLD,
    EXIT_PASS,
    EXIT_USAGE,
    EXIT_WARN,
    log,
)
from stitchsim.cli.output import (
    table_text,
    wait_for,
    write_file,
    write_outputs,
)
from stitchsim.cli.spec_args import client_for, settings_from, spec_fields
from stitchsim.errors import (
    StitchsimError,
    UsageError,
)
from stitchsim.gates import (
    AUTO,
    AUTO_FALSE_ALARMS,
    AUTO_FALSE_ALARMS_SOURCE,
    AUTO_HINT_ABOVE,
    GateOptions,
    Outcome,
    evaluate,
)
from stitchsim.junit import error_to_junit, report_to_junit
from stitchsim.markdown import error_markdown, outcome_markdown
from stitchsim.models import Report

_EXITS = {"pass": EXIT_PASS, "warn": EXIT_WARN, "fail": EXIT_BELOW_THRESHOLD}


def gate_options(args: argparse.Namespace) -> GateOptions:
    return GateOptions(
        max_drop=args.max_drop, max_relative_drop=args.max_relative_drop,
        max_drop_per_point=args.max_drop_per_point,
        min_point_agreement=args.min_point_agreement, warn_below=args.warn_below,
        fail_on_caveat=args.fail_on_caveat,
    )


def _asks_for_a_gate(options: GateOptions, args: argparse.Namespace) -> bool:
    return options.needs_baseline or options.min_point_agreement is not None or (
        options.warn_below is not None) or bool(args.gate)


def _auto_hint(options: GateOptions) -> None:
    if options.max_drop == AUTO and AUTO_FALSE_ALARMS > AUTO_HINT_ABOVE:
        log.warning("hint: --max-drop auto fails up to about %d%% of benign retrains (%s); "
                    "calibrate a gate on your own retrains instead: stitchsim calibrate REF B1 "
                    "B2 ... -o gate.json, then check --gate gate.json",
                    round(AUTO_FALSE_ALARMS * 100), AUTO_FALSE_ALARMS_SOURCE.split(":")[0])


def cmd_check(args: argparse.Namespace, out: TextIO) -> int:
    started = time.monotonic()
    try:
        settings = settings_from(args)
        fields = spec_fields(args, settings)
        options = gate_options(args)
        if fields.get("threshold") is None and not _asks_for_a_gate(options, args):
            raise UsageError(
                "check needs a threshold (--threshold, $STITCHSIM_THRESHOLD, or threshold in "
                "the config file or the spec) or a gate (--gate, --max-drop, --warn-below ...)"
            )
        if options.needs_baseline and not args.baseline:
            raise UsageError("--max-drop, --max-relative-drop and --max-drop-per-point need "
                             "--baseline (a report file, a job id, or self)")
        if options.max_drop == AUTO and args.baseline == baselines.SELF:
            raise UsageError(
                "--max-drop auto needs a baseline that has an interval: the reference against "
                "itself has none (its limit would be 0.0000, failing every candidate that is "
                "not the reference); give a fixed --max-drop (e.g. 0.05) with --baseline self, "
                "or --max-drop auto with the report of a benign retrain (--baseline "
                "report.json or a job id)")
        gate = calibrated.load(args.gate, args.reference, fields) if args.gate else None
        _auto_hint(options)
        log.info("checking %s against reference %s on %s (threshold %s)", args.candidate,
                 args.reference, settings.url, fields.get("threshold"))
        with client_for(settings) as client:
            report, base, url = _run(client, args, settings, fields)
            outcome = evaluate(report, base and base.report, options,
                               baseline_source=base and base.source)
            if gate is not None:
                outcome = calibrated.apply(outcome, report, gate, args.gate)
    except StitchsimError as exc:
        _write_error(args, exc, time.monotonic() - started)
        raise

    print(table_text(report), file=out)
    for role, model in (("front", report.front), ("back", report.back)):
        if model.preprocess is not None and model.preprocess.source == "undetermined":
            print(f"PREPROCESSING UNDETERMINED ({role} model): {model.preprocess.note}",
                  file=out)
    if args.junit_xml:
        write_file(args.junit_xml, report_to_junit(report, time_s=time.monotonic() - started,
                                                   outcome=outcome))
    if args.markdown:
        write_file(args.markdown, outcome_markdown(report, outcome, report_url=url))
    if view.no_verdict_despite_threshold(report):
        # Not a pass and not "below threshold": the figures cannot be trusted, and what makes
        # them so is on the user's side (the dataset, arch kwargs or preprocessing, or IRI
        # steps too few to converge).
        print(f"NO VERDICT: {report.verdict_reason}", file=out)
        return EXIT_USAGE
    _print_outcome(report, outcome, out)
    return _EXITS[outcome.status]


def _run(client: Any, args: argparse.Namespace, settings: Any, fields: dict[str, Any]
         ) -> tuple[Report, baselines.Baseline | None, str | None]:
    """The new report and the baseline it is gated against (refused unless it compares)."""
    base = None
    if args.baseline:
        reference = baselines.reference_id(args.reference)
        base = baselines.load(client, args.baseline, reference, fields, args, settings)
        differing = baselines.precheck(base, reference, fields)
        if differing:
            if not args.recompute_baseline:
                baselines.refuse_early(base, differing)
            base = baselines.recompute(client, base, fields, args, settings)
    job = client.compare(args.reference, args.candidate, spec=fields,
                         dataset_options=pack_options(args))
    report = wait_for(job, args, settings, cancel=not args.keep_running)
    write_outputs(job, args)
    if base is not None:
        base = baselines.settle(client, base, report, fields, args, settings)
    url = f"{client.base_url.rstrip('/')}/jobs/{job.id}/report.html"
    return report, base, url


def _write_error(args: argparse.Namespace, exc: StitchsimError, seconds: float) -> None:
    if args.junit_xml:
        write_file(args.junit_xml,
                   error_to_junit(str(exc), kind=type(exc).__name__, time_s=seconds))
    if args.markdown:
        write_file(args.markdown, error_markdown(str(exc)))


def _print_outcome(report: Report, outcome: Outcome, out: TextIO) -> None:
    """The outcome line (as before gates: the threshold's), each further gate, the caveats."""
    s = report.summary
    threshold = next((g for g in outcome.gates if g.name == "threshold"), None)
    versus = ""
    if threshold is not None and threshold.limit is not None:
        versus = f" {'>=' if threshold.status == 'pass' else '<'} threshold {threshold.limit:.4f}"
    print(f"{outcome.status.upper()}: similarity {s.similarity:.4f}{versus} "
          f"({s.similarity_protocol.replace('_', '-')} protocol, minimum over directions)",
          file=out)
    if outcome.baseline_similarity is not None:
        print(f"  baseline: similarity {outcome.baseline_similarity:.4f}, "
              f"{outcome.baseline_source}", file=out)
    for gate in outcome.gates:
        if gate is not threshold:
            print(f"  {gate.status}: {gate.name}: {gate.message}", file=out)
    for caveat in report.verdict_caveats:
        print(f"  caveat: {caveat}", file=out)


def passed(report: Report) -> bool:
    if report.verdict is not None:
        return report.verdict == "similar"
    threshold = report.summary.threshold
    return threshold is None or report.summary.similarity >= threshold
