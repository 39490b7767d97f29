"""stitchsim client: the contract (models, catalogue, error codes and the Failure, built-in
datasets, file checks), the HTTP SDK and the `stitchsim` CLI.

Names are imported on first use (PEP 562), so `import stitchsim.models` costs the contract
alone: the engine and the service import it without httpx or the SDK.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    **dict.fromkeys(
        ("APIError", "AuthenticationError", "Conflict", "ConnectionFailed",
         "DatasetSourceError", "InvalidFile", "InvalidRequest", "InvalidSpec", "JobCancelled",
         "JobError", "JobFailed", "MissingExtra", "NotFound", "RateLimited", "ServerError",
         "ServiceUnavailable", "StitchsimError", "UsageError", "WaitTimeout"),
        "stitchsim.errors",
    ),
    **dict.fromkeys(("JobStatus", "Report", "Spec", "StoredObject"), "stitchsim.models"),
    "Failure": "stitchsim.failure",
    **dict.fromkeys(("AsyncClient", "AsyncJob", "Client", "Job", "file_sha256"),
                    "stitchsim.sdk"),
    **dict.fromkeys(("PackOptions", "PackSummary", "pack_dataset"), "stitchsim.packing"),
}

__all__ = sorted(_EXPORTS)

def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'stitchsim' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once found, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
