"""Exceptions the client raises on purpose: every one a Failure (stitchsim.failure) with a
code of the error-code registry (stitchsim.codes).

Every error the service answers with (`{"error": {"code", "message", "details"}}`) becomes an
`APIError` subclass chosen by HTTP status, so callers can catch what they can act on (fix the
spec, retry later, check the key) without parsing messages; its code, message and details are
the service's as they were. A `JobFailed` is the Failure the job ended with (its code and
details), its message naming the job. What the client finds itself (a bad flag, a spec that
fails validation, a file or dataset it cannot read, a service it cannot reach, a wait that ran
out) carries a code of its own. Whose fault an error is and whether a retry may help come from
the registry, so the CLI's exit codes follow the same table as the service; every one reads
`MESSAGE (CODE)`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from stitchsim.failure import Failure
from stitchsim.validation import field_errors, validation_message

if TYPE_CHECKING:
    import httpx

    from stitchsim.models import ErrorInfo, JobStatus

_Usage = TypeVar("_Usage", bound="UsageError")


class StitchsimError(Failure):
    """Base of every error raised by the stitchsim client: a Failure whose code comes with
    its class unless one is given (the service's, the job's)."""

    code = "internal"
    _user_fault_if_unknown: bool | None = False
    """Whose fault a code the registry does not know is (a proxy's, a newer service's)."""
    _retry_if_unknown = False

    def __init__(self, message: str, *, code: str | None = None, details: Any = None,
                 retry_after: float | None = None):
        super().__init__(code or type(self).code, message, details, retry_after=retry_after)

    def __str__(self) -> str:
        return self.line()  # the one shape the CLI prints: what to fix, then the code

    @property
    def is_user_error(self) -> bool | None:
        """Whether the user must change something (the spec, the files, a flag, the key)."""
        entry = self.entry
        return entry.user_fault if entry else self._user_fault_if_unknown

    @property
    def retryable(self) -> bool:
        """Whether the same request (or job) may succeed later unchanged."""
        entry = self.entry
        return entry.retry if entry else self._retry_if_unknown


# ---------------------------------------------------------------- local


class UsageError(StitchsimError, ValueError):
    """Something on this side is wrong: a flag, the config, a file that is not there."""

    code = "invalid_usage"

    @classmethod
    def from_validation(cls: type[_Usage], what: str,
                        errors: Iterable[Mapping[str, Any]]) -> _Usage:
        """The error for pydantic's errors, in the one shape (stitchsim.validation)."""
        fields = field_errors(errors)
        return cls(validation_message(what, fields), details=fields)


class InvalidSpec(UsageError):
    """The spec fails the contract's validation before anything is sent; `details` lists
    every field error as `{field, message, type}`, as the service's `invalid_spec` does."""

    code = "invalid_spec"


class InvalidFile(UsageError):
    """A file to upload is not a safetensors file the service would accept: the code and
    message the contract's file checks (stitchsim.files) gave, refused before anything is
    sent."""

    code = "invalid_safetensors"


class DatasetSourceError(UsageError):
    """A dataset to pack (a folder, an archive, a parquet, npz or WebDataset file) cannot be
    read as one; the message names the file and what to fix. Raised before anything is
    uploaded."""

    code = "invalid_dataset_source"


class MissingExtra(UsageError):
    """An optional part of the client is not installed; the message names the pip command."""

    code = "missing_extra"


# ---------------------------------------------------------------- transport and HTTP


class ConnectionFailed(StitchsimError):
    """The service could not be reached (after retries)."""

    code = "connection_failed"

    def __init__(self, message: str, url: str):
        super().__init__(message)
        self.url = url


class APIError(StitchsimError):
    """The service answered with an error status: the Failure it raised, and the status."""

    _user_fault_if_unknown = None  # the class, chosen by status, says more than a guess

    def __init__(
        self,
        message: str,
        *,
        status_code: int,
        code: str,
        details: Any = None,
        response: httpx.Response | None = None,
    ):
        super().__init__(message, code=code, details=details)
        self.status_code = status_code
        self.response = response

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

    _retry_if_unknown = True


class ServiceUnavailable(APIError):
    """502/503/504: the service or what it depends on is down; retried before this is raised."""

    _retry_if_unknown = True


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

    code = "job_failed"

    def __init__(self, message: str, job_id: str, status: JobStatus | None = None, *,
                 code: str | None = None, details: Any = None):
        super().__init__(message, code=code, details=details)
        self.job_id = job_id
        self.status = status


class JobFailed(JobError):
    """The job ended `failed`: the Failure it ended with (its code and details, as the engine
    or the worker raised it); the message names the job, `reason` is the engine's own words.
    Unknown codes count as the service's fault, and a rerun may cure them: telling CI to retry
    is the cheaper mistake."""

    _retry_if_unknown = True

    def __init__(self, job_id: str, error: ErrorInfo | None, status: JobStatus | None = None):
        code, reason, details = ((error.code, error.message, error.details) if error
                                 else ("internal", "the service gave no reason", None))
        super().__init__(f"job {job_id} failed: {reason}", job_id, status, code=code,
                         details=details)
        self.reason = reason
        """What the engine or the worker said, without the job's id."""

    @property
    def failure(self) -> Failure:
        """The job's Failure as the engine or the worker raised it (its own message)."""
        return Failure(self.code, self.reason, self.details)


class JobCancelled(JobError):
    """The job ended `cancelled`."""

    code = "cancelled"


class WaitTimeout(JobError, TimeoutError):
    """`Job.wait` ran out of time; the job itself may still be running."""

    code = "wait_timeout"


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
