"""The `stitchsim` command's entry point: parse, run the command, map errors to exit codes."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from types import FrameType
from typing import NoReturn, TextIO

from stitchsim.cli.exits import (
    EXIT_INTERRUPTED,
    EXIT_SERVICE,
    exit_code_for,
    hint_for,
    log,
)
from stitchsim.cli.parser import build_parser
from stitchsim.failure import Failure
from stitchsim.keyredact import redact_keys


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
    parser = build_parser()
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
    except Failure as exc:  # every error of the client is one; the engine's files checks too
        # The service's words may echo what it was sent: a key is never printed.
        print(f"stitchsim: error: {redact_keys(exc.line())}", file=sys.stderr)
        hint = hint_for(exc)
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
