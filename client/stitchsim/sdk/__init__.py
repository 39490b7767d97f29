"""The HTTP SDK (httpx): a client, the jobs it starts, and a progress display.

    transport  one httpx connection pool and the retry policy
    plans      request plans: the SDK's logic once, driven sync or async
    core       uploads, spec assembly, submissions, listings (as plans)
    client     Client: the plans with blocking requests
    aclient    AsyncClient and AsyncJob: the same plans, awaited
    job        a job's status, waiting for it, its report
    progress   a job's progress on a terminal or in a CI log
"""

from stitchsim.sdk.aclient import AsyncClient, AsyncJob
from stitchsim.sdk.client import Client, file_sha256
from stitchsim.sdk.job import Job
from stitchsim.sdk.progress import ProgressPrinter
from stitchsim.sdk.transport import parse_retry_after

__all__ = ["AsyncClient", "AsyncJob", "Client", "Job", "ProgressPrinter", "file_sha256",
           "parse_retry_after"]
