"""The HTTP SDK (httpx): a client, the jobs it starts, and a progress display.

    transport  one httpx connection pool and the retry policy
    client     uploads, spec assembly, submissions, listings
    job        a job's status, waiting for it, its report
    progress   a job's progress on a terminal or in a CI log
"""

from stitchsim.sdk.client import Client, file_sha256
from stitchsim.sdk.job import Job
from stitchsim.sdk.progress import ProgressPrinter
from stitchsim.sdk.transport import parse_retry_after

__all__ = ["Client", "Job", "ProgressPrinter", "file_sha256", "parse_retry_after"]
