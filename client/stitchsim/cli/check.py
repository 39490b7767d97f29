"""`stitchsim check`: compare a candidate with a reference and pass or fail, for CI."""

from __future__ import annotations

import argparse
import time
from typing import TextIO

from stitchsim import view
from stitchsim.cli.dataset import pack_options
from stitchsim.cli.exits import (
    EXIT_BELOW_THRESHOLD,
    EXIT_PASS,
    EXIT_USAGE,
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
from stitchsim.junit import error_to_junit, report_to_junit
from stitchsim.models import Report


def cmd_check(args: argparse.Namespace, out: TextIO) -> int:
    started = time.monotonic()
    try:
        settings = settings_from(args)
        fields = spec_fields(args, settings)
        if fields.get("threshold") is None:
            raise UsageError(
                "check needs a threshold: --threshold, $STITCHSIM_THRESHOLD, or threshold in "
                "the config file or the spec"
            )
        log.info(
            "checking %s against reference %s on %s (threshold %s)",
            args.candidate,
            args.reference,
            settings.url,
            fields["threshold"],
        )
        with client_for(settings) as client:
            job = client.compare(args.reference, args.candidate, spec=fields,
                                 dataset_options=pack_options(args))
            report = wait_for(job, args, settings, cancel=not args.keep_running)
            write_outputs(job, args)
    except StitchsimError as exc:
        if args.junit_xml:
            write_file(
                args.junit_xml,
                error_to_junit(
                    str(exc), kind=type(exc).__name__, time_s=time.monotonic() - started
                ),
            )
        raise

    print(table_text(report), file=out)
    for role, model in (("front", report.front), ("back", report.back)):
        if model.preprocess is not None and model.preprocess.source == "undetermined":
            print(f"PREPROCESSING UNDETERMINED ({role} model): {model.preprocess.note}",
                  file=out)
    if args.junit_xml:
        write_file(args.junit_xml, report_to_junit(report, time_s=time.monotonic() - started))
    if view.no_verdict_despite_threshold(report):
        # Not a pass and not "below threshold": the figures cannot be trusted, and what makes
        # them so is on the user's side (the dataset, arch kwargs or preprocessing).
        print(f"NO VERDICT: {report.verdict_reason}", file=out)
        return EXIT_USAGE
    ok = passed(report)
    s = report.summary
    threshold = s.threshold if s.threshold is not None else float(fields["threshold"])
    word, cmp = ("PASS", ">=") if ok else ("FAIL", "<")
    print(
        f"{word}: similarity {s.similarity:.4f} {cmp} threshold {threshold:.4f} "
        f"({s.similarity_protocol.replace('_', '-')} protocol, minimum over directions)",
        file=out,
    )
    for caveat in report.verdict_caveats:
        print(f"  caveat: {caveat}", file=out)
    return EXIT_PASS if ok else EXIT_BELOW_THRESHOLD


def passed(report: Report) -> bool:
    if report.verdict is not None:
        return report.verdict == "similar"
    threshold = report.summary.threshold
    return threshold is None or report.summary.similarity >= threshold
