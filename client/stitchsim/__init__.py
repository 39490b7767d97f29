"""stitchsim client: the contract models, the HTTP SDK and the `stitchsim` CLI."""

from stitchsim.errors import (
    APIError,
    AuthenticationError,
    Conflict,
    ConnectionFailed,
    InvalidFile,
    InvalidRequest,
    InvalidSpec,
    JobCancelled,
    JobError,
    JobFailed,
    NotFound,
    RateLimited,
    ServerError,
    ServiceUnavailable,
    StitchsimError,
    UsageError,
    WaitTimeout,
)
from stitchsim.models import JobStatus, Report, Spec, StoredObject
from stitchsim.sdk import Client, Job, file_sha256

__version__ = "0.1.0"

__all__ = [
    "APIError",
    "AuthenticationError",
    "Client",
    "Conflict",
    "ConnectionFailed",
    "InvalidFile",
    "InvalidRequest",
    "InvalidSpec",
    "Job",
    "JobCancelled",
    "JobError",
    "JobFailed",
    "JobStatus",
    "NotFound",
    "RateLimited",
    "Report",
    "ServerError",
    "ServiceUnavailable",
    "Spec",
    "StitchsimError",
    "StoredObject",
    "UsageError",
    "WaitTimeout",
    "file_sha256",
]
