"""The `stitchsim` command: check, compare, jobs, report.

Exit codes (stable, for CI):
    0  check passed (similarity >= threshold); other commands: success
    1  check ran and the similarity is below the threshold
    2  usage, configuration or spec error (fix the command, the files or the spec)
    3  service or infrastructure error, including the service being unreachable (retry later)
    4  timed out waiting for the job
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, TextIO

from stitchsim import __version__, view
from stitchsim.config import Settings, deep_merge, load_settings
from stitchsim.errors import (
    APIError,
    AuthenticationError,
    ConnectionFailed,
    InvalidRequest,
    JobFailed,
    NotFound,
    StitchsimError,
    UsageError,
    WaitTimeout,
)
from stitchsim.junit import error_to_junit, report_to_junit
from stitchsim.models import JobStatus, Report
from stitchsim.sdk import Client, Job, ProgressPrinter

EXIT_PASS = 0
EXIT_BELOW_THRESHOLD = 1
EXIT_USAGE = 2
EXIT_SERVICE = 3
EXIT_TIMEOUT = 4
EXIT_INTERRUPTED = 130

log = logging.getLogger("stitchsim")


def exit_code_for(exc: BaseException) -> int:
    """The exit code an error ends the command with: whose fault it is comes from the
    error-code registry (stitchsim.codes) where the code is known, else from the HTTP status."""
    if isinstance(exc, WaitTimeout):
        return EXIT_TIMEOUT
    if isinstance(exc, UsageError):
        return EXIT_USAGE
    if isinstance(exc, JobFailed):
        return EXIT_USAGE if exc.is_user_error else EXIT_SERVICE
    if isinstance(exc, APIError) and exc.is_user_error is not None:
        return EXIT_USAGE if exc.is_user_error else EXIT_SERVICE
    if isinstance(exc, InvalidRequest | AuthenticationError | NotFound):
        return EXIT_USAGE
    # Everything else, including bugs in this client, must not read as "below threshold" (1).
    return EXIT_SERVICE


def _hint(exc: BaseException) -> str | None:
    if isinstance(exc, ConnectionFailed):
        return "is the service running? set --url, $STITCHSIM_URL or url in stitchsim.toml"
    if isinstance(exc, AuthenticationError):
        return "set --api-key or $STITCHSIM_API_KEY"
    if isinstance(exc, WaitTimeout):
        return f"follow it with `stitchsim jobs wait {exc.job_id}`, or raise --timeout"
    return None


# ---------------------------------------------------------------- argument parsing


def _parser() -> argparse.ArgumentParser:
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
    s.add_argument("--dataset", help="built-in name, dataset id, or a safetensors file to upload")
    s.add_argument(
        "--layers",
        help="'auto', or stitch pairs FRONT:BACK (or NAME for both) separated by commas",
    )
    s.add_argument("--objectives", help="comma-separated: hlm, slm, dm, fula")
    s.add_argument("--protocols", help="comma-separated: standard, invariance_aware")
    s.add_argument("--directions", choices=["front_to_back", "back_to_front", "both"])
    s.add_argument("--controls", help="comma-separated: clustered_noise, identity, shortcut")
    s.add_argument("--arch", help="timm architecture of both models (else from the files)")
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

    parser = argparse.ArgumentParser(
        prog="stitchsim",
        description="Functional similarity of neural networks, from a stitchsim service.",
        epilog="Exit codes: 0 pass/ok, 1 below threshold, 2 usage or spec error, "
        "3 service error (retry later), 4 timeout.",
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
    p.add_argument("reference", help="safetensors file or sha256: id")
    p.add_argument("candidate", help="safetensors file or sha256: id")
    p.add_argument("--junit-xml", metavar="FILE", help="write a JUnit XML report here")
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

    p = sub.add_parser("report", parents=[common], help="fetch a finished job's report")
    p.add_argument("job_id")
    p.add_argument("--format", choices=["json", "html", "table"], default="json")
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    p.set_defaults(func=cmd_report)
    return parser


def parse_layers(text: str) -> list[dict[str, str]] | str:
    text = text.strip()
    if text == "auto":
        return "auto"
    pairs = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        front, sep, back = item.partition(":")
        if not front or (sep and not back):
            raise UsageError(f"--layers: {item!r} is not FRONT:BACK or NAME")
        pairs.append({"front": front, "back": back if sep else front})
    if not pairs:
        raise UsageError("--layers: no stitch pairs given")
    return pairs


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text  # bare words such as `auto` or `resnet18`


def _set_path(target: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    if not all(keys):
        raise UsageError(f"--set: bad key {dotted!r}")
    node = target
    for key in keys[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    node[keys[-1]] = value


def spec_fields(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    """Spec fields from config [spec] < --spec file < dedicated flags < --set < threshold."""
    fields: dict[str, Any] = deep_merge({}, settings.spec)
    if args.spec:
        try:
            loaded = json.loads(Path(args.spec).read_text(encoding="utf-8"))
        except OSError as exc:
            raise UsageError(f"--spec: cannot read {args.spec}: {exc.strerror}") from None
        except ValueError as exc:
            raise UsageError(f"--spec: {args.spec} is not valid JSON: {exc}") from None
        if not isinstance(loaded, dict):
            raise UsageError(f"--spec: {args.spec} must hold a JSON object")
        fields = deep_merge(fields, loaded)
    if args.dataset:
        fields["dataset"] = args.dataset
    if args.layers:
        fields["layers"] = parse_layers(args.layers)
    for name in ("objectives", "protocols", "controls"):
        if getattr(args, name):
            fields[name] = _csv(getattr(args, name))
    if args.directions:
        fields["directions"] = args.directions
    if args.arch or args.arch_kwargs:
        kwargs = None
        if args.arch_kwargs:
            kwargs = _json_value(args.arch_kwargs)
            if not isinstance(kwargs, dict):
                raise UsageError("--arch-kwargs must be a JSON object")
        for side in ("front", "back"):
            ref = fields.setdefault(side, {})
            if not isinstance(ref, dict):
                raise UsageError(f"spec field {side!r} must be an object")
            if args.arch:
                ref["arch"] = args.arch
            if kwargs is not None:
                ref["arch_kwargs"] = kwargs
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--set: expected KEY=VALUE, got {item!r}")
        _set_path(fields, key.strip(), _json_value(value))
    if settings.threshold is not None:
        fields["threshold"] = settings.threshold
    return fields


def _settings(args: argparse.Namespace) -> Settings:
    flags = {
        key: getattr(args, key, None)
        for key in ("url", "api_key", "retries", "threshold", "timeout")
    }
    return load_settings(flags, config_file=getattr(args, "config", None))


def _client(settings: Settings) -> Client:
    return Client(settings.url, settings.api_key, retries=settings.retries)


# ---------------------------------------------------------------- commands


def cmd_check(args: argparse.Namespace, out: TextIO) -> int:
    started = time.monotonic()
    try:
        settings = _settings(args)
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
        with _client(settings) as client:
            job = client.compare(args.reference, args.candidate, spec=fields)
            report = _wait(job, args, settings, cancel=not args.keep_running)
            _write_outputs(job, args)
    except StitchsimError as exc:
        if args.junit_xml:
            _write(
                args.junit_xml,
                error_to_junit(
                    str(exc), kind=type(exc).__name__, time_s=time.monotonic() - started
                ),
            )
        raise

    print(_table(report), file=out)
    if args.junit_xml:
        _write(args.junit_xml, report_to_junit(report, time_s=time.monotonic() - started))
    if view.no_verdict_despite_threshold(report):
        # Not a pass and not "below threshold": the figures cannot be trusted, and what makes
        # them so is on the user's side (the dataset, arch kwargs or preprocessing).
        print(f"NO VERDICT: {view.verdict_reason(report)}", file=out)
        return EXIT_USAGE
    passed = _passed(report)
    s = report.summary
    threshold = s.threshold if s.threshold is not None else float(fields["threshold"])
    word, cmp = ("PASS", ">=") if passed else ("FAIL", "<")
    print(
        f"{word}: similarity {s.similarity:.4f} {cmp} threshold {threshold:.4f} "
        f"({s.similarity_protocol.replace('_', '-')} protocol, minimum over directions)",
        file=out,
    )
    for caveat in report.verdict_caveats:
        print(f"  caveat: {caveat}", file=out)
    return EXIT_PASS if passed else EXIT_BELOW_THRESHOLD


def _passed(report: Report) -> bool:
    if report.verdict is not None:
        return report.verdict == "similar"
    threshold = report.summary.threshold
    return threshold is None or report.summary.similarity >= threshold


def cmd_compare(args: argparse.Namespace, out: TextIO) -> int:
    settings = _settings(args)
    fields = spec_fields(args, settings)
    with _client(settings) as client:
        job = client.compare(args.front, args.back, spec=fields)
        if not args.wait:
            print(job.id, file=out)
            return EXIT_PASS
        return _wait_and_print(job, args, settings, out)


def _wait_and_print(job: Job, args: argparse.Namespace, settings: Settings,
                    out: TextIO) -> int:
    report = _wait(job, args, settings, cancel=False)
    _write_outputs(job, args)
    print(_table(report), file=out)
    return EXIT_PASS


def cmd_jobs_list(args: argparse.Namespace, out: TextIO) -> int:
    with _client(_settings(args)) as client:
        limit = getattr(args, "limit", 20)
        page = client.jobs(limit=limit)
    if getattr(args, "as_json", False):
        print(page.model_dump_json(indent=2), file=out)
        return EXIT_PASS
    if not page.items:
        print("no jobs", file=out)
        return EXIT_PASS
    rows = [("JOB", "STATE", "PROGRESS", "CREATED", "FINISHED")]
    for j in page.items:
        rows.append(
            (
                j.id,
                j.state,
                _progress_text(j),
                j.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                j.finished_at.strftime("%Y-%m-%d %H:%M:%S") if j.finished_at else "",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip(), file=out)
    if page.next_cursor:
        print(f"(more: --limit {limit * 2})", file=out)
    return EXIT_PASS


def cmd_jobs_show(args: argparse.Namespace, out: TextIO) -> int:
    with _client(_settings(args)) as client:
        status = client.job(args.job_id).status()
    if getattr(args, "as_json", False):
        print(status.model_dump_json(indent=2, exclude={"spec"}), file=out)
        return EXIT_PASS
    print(f"job       {status.id}", file=out)
    print(f"state     {status.state}", file=out)
    print(f"progress  {_progress_text(status)}", file=out)
    for name in ("created_at", "started_at", "finished_at"):
        value = getattr(status, name)
        if value:
            print(f"{name.split('_')[0]:<9} {value.isoformat()}", file=out)
    if status.attempts:
        print(f"attempts  {status.attempts}", file=out)
    if status.error:
        print(f"error     {status.error.message} ({status.error.code})", file=out)
    return EXIT_PASS


def cmd_jobs_cancel(args: argparse.Namespace, out: TextIO) -> int:
    with _client(_settings(args)) as client:
        status = client.job(args.job_id).cancel()
    print(f"{status.id}: {status.state}", file=out)
    return EXIT_PASS


def cmd_jobs_wait(args: argparse.Namespace, out: TextIO) -> int:
    settings = _settings(args)
    with _client(settings) as client:
        return _wait_and_print(client.job(args.job_id), args, settings, out)


def cmd_report(args: argparse.Namespace, out: TextIO) -> int:
    with _client(_settings(args)) as client:
        job = client.job(args.job_id)
        if args.format == "json":
            text = job.report_json()
        elif args.format == "html":
            text = job.report_html()
        else:
            text = _table(job.report())
    if args.output:
        _write(args.output, text)
        log.info("wrote %s", args.output)
    else:
        out.write(text if text.endswith("\n") else text + "\n")
    return EXIT_PASS


# ---------------------------------------------------------------- helpers


def _wait(job: Job, args: argparse.Namespace, settings: Settings, *, cancel: bool) -> Report:
    quiet = getattr(args, "quiet", False)
    printer = None
    if args.progress != "none" and not quiet:
        printer = ProgressPrinter(job_id=job.id, mode=args.progress)
    try:
        return job.wait(settings.timeout, progress=printer or False)
    except (WaitTimeout, KeyboardInterrupt):
        if cancel:
            _cancel_quietly(job)
        raise
    finally:
        if printer is not None:
            printer.close()


def _cancel_quietly(job: Job) -> None:
    # Best effort: a CI job that gave up should not leave a GPU busy, but a failure to cancel
    # must not hide why we gave up.
    try:
        job.client.http.request("DELETE", f"/jobs/{job.id}", retries=1)
        log.info("job %s cancelled", job.id)
    except StitchsimError as exc:
        log.warning("could not cancel job %s: %s", job.id, exc)


def _write_outputs(job: Job, args: argparse.Namespace) -> None:
    if getattr(args, "json", None):
        _write(args.json, job.report_json())
        log.info("wrote %s", args.json)
    if getattr(args, "html", None):
        _write(args.html, job.report_html())
        log.info("wrote %s", args.html)


def _write(path: str, text: str) -> None:
    try:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}") from None


def _table(report: Report) -> str:
    from stitchsim.table import format_table

    return format_table(report)


def _progress_text(status: JobStatus) -> str:
    p = status.progress
    if status.state in ("queued", "running") and p.total:
        return f"{p.stage} {p.done}/{p.total}"
    return p.stage if status.state == "running" else ""


def _setup_logging(quiet: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("stitchsim: %(message)s"))
    log.handlers = [h for h in log.handlers if isinstance(h, logging.NullHandler)] + [handler]
    log.setLevel(logging.WARNING if quiet else logging.INFO)
    log.propagate = False


def _raise_interrupt(signum: int, frame: FrameType | None) -> NoReturn:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the CLI; returns the exit code (the console script exits with it)."""
    out = out or sys.stdout
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: 0 for --help/--version, 2 for usage errors
        return int(exc.code or 0)
    _setup_logging(getattr(args, "quiet", False))
    # CI runners stop a job with SIGTERM; treat it like Ctrl-C so the job gets cancelled.
    try:
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    except ValueError:  # not the main thread (embedded use): leave signals alone
        previous = None
    func: Callable[[argparse.Namespace, TextIO], int] = args.func
    try:
        return func(args, out)
    except KeyboardInterrupt:
        print("stitchsim: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except StitchsimError as exc:
        print(f"stitchsim: error: {exc}", file=sys.stderr)
        hint = _hint(exc)
        if hint:
            print(f"stitchsim: hint: {hint}", file=sys.stderr)
        return exit_code_for(exc)
    except Exception as exc:  # a bug here must not exit 1, which means "below threshold"
        log.exception("internal error: %s", exc)
        return EXIT_SERVICE
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
