"""Exceptions the client raises on purpose.

Every error the service answers with (`{"error": {"code", "message", "details"}}`) becomes an
`APIError` subclass chosen by HTTP status, so callers can catch what they can act on (fix the
spec, retry later, check the key) without parsing messages. An `APIError` is the contract's
`Failure` (stitchsim.failure) the service raised, its code, message and details as they were;
a `JobFailed` carries the Failure the job ended with. Whose fault an error is and whether a
retry may help come from the error-code registry (`stitchsim.codes`), so the CLI's exit codes
follow the same table as the service.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stitchsim import codes
from stitchsim.failure import Failure

if TYPE_CHECKING:
    import httpx

    from stitchsim.models import ErrorInfo, JobStatus


class StitchsimError(Exception):
    """Base of every error raised by the stitchsim client."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


# ---------------------------------------------------------------- local


class UsageError(StitchsimError, ValueError):
    """Something on this side is wrong: a flag, the config, a file that is not there."""


class InvalidSpec(UsageError):
    """The spec fails the contract's validation before anything is sent."""

    def __init__(self, message: str, errors: list[dict[str, Any]] | None = None):
        super().__init__(message)
        self.errors = errors or []


class InvalidFile(Failure, UsageError):
    """A file to upload is not a safetensors file the service would accept: the Failure the
    contract's file checks raised (stitchsim.files), refused before anything is sent."""

    def __init__(self, message: str, code: str = "invalid_safetensors"):
        super().__init__(code, message)


class DatasetSourceError(UsageError):
    """A dataset to pack (a folder, an archive, a parquet, npz or WebDataset file) cannot be
    read as one; the message names the file and what to fix. Raised before anything is
    uploaded."""


class MissingExtra(UsageError):
    """An optional part of the client is not installed; the message names the pip command."""


# ---------------------------------------------------------------- transport and HTTP


class ConnectionFailed(StitchsimError):
    """The service could not be reached (after retries)."""

    def __init__(self, message: str, url: str):
        super().__init__(message)
        self.url = url


class APIError(Failure, StitchsimError):
    """The service answered with an error status: the Failure it raised, and the status."""

    _retry_by_status = False
    """For codes the registry does not know (a proxy's, a newer service's)."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int,
        code: str,
        details: Any = None,
        response: httpx.Response | None = None,
    ):
        super().__init__(code, message, details)
        self.status_code = status_code
        self.response = response

    def __str__(self) -> str:
        # The service writes what to fix into the message; details are for programs.
        return f"{self.message} ({self.code}, HTTP {self.status_code})"

    @property
    def retryable(self) -> bool:
        """Whether the same request may succeed later."""
        entry = codes.get(self.code)
        return entry.retry if entry else self._retry_by_status

    @property
    def is_user_error(self) -> bool | None:
        """Whether the user must change something; None for a code the registry lacks."""
        entry = codes.get(self.code)
        return entry.user_fault if entry else None

    @classmethod
    def from_response(cls, response: httpx.Response) -> APIError:
        code, message, details = _parse_error_body(response)
        kind = _BY_STATUS.get(response.status_code)
        if kind is None:
            kind = ServerError if response.status_code >= 500 else InvalidRequest
        return kind(
            message, status_code=response.status_code, code=code, details=details, response=response
        )


class InvalidRequest(APIError):
    """400/413/415/422: the request, spec, checkpoint or dataset was refused; fix and resend."""


class AuthenticationError(APIError):
    """401/403: the API key is missing, wrong or not allowed to do this."""


class NotFound(APIError):
    """404: no such job, checkpoint or report (or it belongs to another key)."""


class Conflict(APIError):
    """409: the resource is not in a state that allows this (e.g. report of a running job)."""


class RateLimited(APIError):
    """429: too many requests; retried automatically before this is raised."""

    _retry_by_status = True


class ServiceUnavailable(APIError):
    """502/503/504: the service or what it depends on is down; retried before this is raised."""

    _retry_by_status = True


class ServerError(APIError):
    """Any other 5xx: a bug or an outage on the service side."""


_BY_STATUS: dict[int, type[APIError]] = {
    400: InvalidRequest,
    401: AuthenticationError,
    403: AuthenticationError,
    404: NotFound,
    409: Conflict,
    413: InvalidRequest,
    415: InvalidRequest,
    422: InvalidRequest,
    429: RateLimited,
    502: ServiceUnavailable,
    503: ServiceUnavailable,
    504: ServiceUnavailable,
}


# ---------------------------------------------------------------- jobs


class JobError(StitchsimError):
    """A job did not end with a report."""

    def __init__(self, message: str, job_id: str, status: JobStatus | None = None):
        super().__init__(message)
        self.job_id = job_id
        self.status = status


class JobFailed(JobError):
    """The job ended `failed`; `code`/`message` are the service's reason."""

    def __init__(self, job_id: str, error: ErrorInfo | None, status: JobStatus | None = None):
        self.failure = (Failure(error.code, error.message, error.details) if error
                        else Failure("internal", "the service gave no reason"))
        """The Failure the job ended with, as the engine or the worker raised it."""
        reason = self.failure.message
        super().__init__(f"job {job_id} failed: {reason} ({self.code})", job_id, status)
        self.reason = reason

    @property
    def code(self) -> str:
        return self.failure.code

    @property
    def details(self) -> Any:
        return self.failure.details

    @property
    def is_user_error(self) -> bool:
        """Whether the spec or the files must change (the registry says so of the code), as
        opposed to an infrastructure failure a rerun may cure. Unknown codes count as the
        latter: telling CI to retry is the cheaper mistake."""
        entry = codes.get(self.code)
        return entry.user_fault if entry else False

    @property
    def retryable(self) -> bool:
        entry = codes.get(self.code)
        return entry.retry if entry else True


class JobCancelled(JobError):
    """The job ended `cancelled`."""


class WaitTimeout(JobError, TimeoutError):
    """`Job.wait` ran out of time; the job itself may still be running."""


# ---------------------------------------------------------------- helpers


def _parse_error_body(response: httpx.Response) -> tuple[str, str, Any]:
    fallback_code = f"http_{response.status_code}"
    fallback_message = response.reason_phrase or f"HTTP {response.status_code}"
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip()[:500]
        return fallback_code, text or fallback_message, None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        return (
            str(err.get("code") or fallback_code),
            str(err.get("message") or fallback_message),
            err.get("details"),
        )
    # A proxy or a framework default (FastAPI's {"detail": ...}) rather than our error shape.
    if isinstance(body, dict) and "detail" in body:
        detail = body["detail"]
        message = detail if isinstance(detail, str) else fallback_message
        return fallback_code, message, None if isinstance(detail, str) else detail
    return fallback_code, fallback_message, body
