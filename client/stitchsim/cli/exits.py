"""Exit codes (stable, for CI), and which one an error ends the command with.

    0  check passed: every gate holds (similarity >= threshold, drops within the limits,
       per-point limits, no caveat with --fail-on-caveat); other commands: success
    1  check ran and a gate failed: the similarity is below the threshold, or dropped more
       than --max-drop / --max-relative-drop below the baseline, a stitch point broke
       --min-point-agreement / --max-drop-per-point, or a caveat with --fail-on-caveat
    2  usage, configuration or spec error (fix the command, the files or the spec), a report
       with no verdict although a threshold was given (a model at chance, or IRIs that did not
       converge without iri.accept_unconverged: NO VERDICT), or a baseline that
       does not compare (another reference, dataset or method: --recompute-baseline)
    3  service or infrastructure error, including the service being unreachable (retry later)
    4  timed out waiting for the job
    5  check ran, no gate failed, but the similarity is below --warn-below (the warn band)
"""

from __future__ import annotations

import logging

from stitchsim.errors import (
    AuthenticationError,
    ConnectionFailed,
    InvalidRequest,
    NotFound,
    StitchsimError,
    WaitTimeout,
)
from stitchsim.failure import Failure

EXIT_PASS = 0
EXIT_BELOW_THRESHOLD = 1
EXIT_USAGE = 2
EXIT_SERVICE = 3
EXIT_TIMEOUT = 4
EXIT_WARN = 5
EXIT_INTERRUPTED = 130

log = logging.getLogger("stitchsim")


def exit_code_for(exc: BaseException) -> int:
    """The exit code an error ends the command with: whose fault it is comes from the
    error-code registry (stitchsim.codes) where the code is known, else from the HTTP status."""
    if isinstance(exc, WaitTimeout):
        return EXIT_TIMEOUT
    user_fault = _user_fault(exc)
    if user_fault is not None:
        return EXIT_USAGE if user_fault else EXIT_SERVICE
    if isinstance(exc, InvalidRequest | AuthenticationError | NotFound):
        return EXIT_USAGE  # a code the registry lacks (a proxy's): the status says whose
    # Everything else, including bugs in this client, must not read as "below threshold" (1).
    return EXIT_SERVICE


def _user_fault(exc: BaseException) -> bool | None:
    """Whose fault by the registry; None where it cannot say (no Failure, an unknown code)."""
    if isinstance(exc, StitchsimError):
        return exc.is_user_error
    if isinstance(exc, Failure) and exc.entry is not None:
        return exc.entry.user_fault
    return None


def hint_for(exc: BaseException) -> str | None:
    if isinstance(exc, ConnectionFailed):
        return "is the service running? set --url, $STITCHSIM_URL or url in stitchsim.toml"
    if isinstance(exc, AuthenticationError):
        return "set --api-key or $STITCHSIM_API_KEY"
    if isinstance(exc, WaitTimeout):
        return f"follow it with `stitchsim jobs wait {exc.job_id}`, or raise --timeout"
    return None
