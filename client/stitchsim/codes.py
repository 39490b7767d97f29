"""The error-code registry: every `code` the service, the workers, the engine and the client
put in an error, with what it means for whoever receives it.

One entry per code: the HTTP status the gateway answers it with (None for codes that never
are an HTTP answer: how a job ended, a report warning, what the client finds on its side),
whether it is the user's fault (fix the spec, the files or the key; the CLI exits 2) or not
(the CLI exits 3), and whether the same request or job may succeed later unchanged. The
gateway's error mapping, the worker's job outcomes and the client's exceptions and exit codes
all read this table; nothing else holds a status for a code. Standard library only, so every
process can import it for nothing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Code:
    code: str
    status: int | None
    """HTTP status when the gateway answers with it; None: never an HTTP answer (how a job
    ended, a report warning, what the client finds on its side)."""
    user_fault: bool
    """The user must change something (spec, files, key); else it is the service's side."""
    retry: bool
    """The same request (or job) may succeed later without change."""
    meaning: str


def _c(code: str, status: int | None, user_fault: bool, retry: bool, meaning: str) -> Code:
    return Code(code, status, user_fault, retry, meaning)


_GENERIC = (
    # One per HTTP status, for errors that carry no code of ours (routing, framework, proxy).
    _c("bad_request", 400, True, False, "the request is malformed (body, form, header)"),
    _c("unauthorized", 401, True, False, "no valid API key was sent"),
    _c("forbidden", 403, True, False, "this key may not do that"),
    _c("not_found", 404, True, False, "no such job, object or endpoint (for this key)"),
    _c("method_not_allowed", 405, True, False, "the endpoint does not take this method"),
    _c("conflict", 409, False, True, "the resource is not in a state that allows this"),
    _c("request_timeout", 408, True, True, "the request's headers or body arrived too slowly"),
    _c("too_large", 413, True, False, "a file or body is over the service's size limit"),
    _c("unsupported_media_type", 415, True, False, "the body has a content type not accepted"),
    _c("invalid", 422, True, False, "the request was understood but refused"),
    _c("too_many_requests", 429, False, True, "slow down; Retry-After says when"),
    _c("internal", 500, False, False, "a bug of ours (service, worker or client); the "
       "service logs its own"),
    _c("unavailable", 503, False, True, "the service is down or restarting"),
)
_ENTRIES = _GENERIC + (
    _c("error", None, False, False, "any other HTTP error; its status says which"),
    # Requests: submissions and uploads.
    _c("invalid_request", 422, True, False, "query or path parameters fail validation"),
    _c("invalid_spec", 422, True, False, "the spec fails validation or cannot work"),
    _c("local_path_refused", 422, True, False, "local paths work only in stitchsim-server run"),
    _c("unknown_dataset", 422, True, False, "no built-in or uploaded dataset of that name"),
    _c("invalid_safetensors", 422, True, False, "the file is not a safetensors file we accept"),
    _c("unsupported_format", 415, True, False, "the file is a pickle, zip or other format"),
    _c("invalid_dataset", 422, True, False, "the file does not hold a usable dataset"),
    _c("invalid_model_config", 422, True, False, "a model folder's config.json (or "
       "preprocessor_config.json) is not JSON, too large, names no known architecture or asks "
       "for remote code"),
    _c("invalid_model_folder", 422, True, False, "a model folder lacks a file its layout "
       "needs (config.json, a weights shard)"),
    _c("labels_needed", 422, True, False, "the dataset has no labels, and the job asks for "
       "figures that read them"),
    _c("idempotency_conflict", 409, True, False, "the Idempotency-Key was used for another "
       "request"),
    _c("too_many_jobs", 429, False, True, "the key has as many jobs in flight as allowed"),
    _c("compute_quota_exceeded", 429, False, True, "the key's queued and running jobs already "
       "hold as much estimated work as allowed"),
    _c("too_many_checks", 429, False, True, "the key has as many spec checks pending as "
       "allowed"),
    _c("too_many_uploads", 429, False, True, "the key (or the service) is receiving as many "
       "uploads at once as allowed"),
    _c("too_many_connections", 503, False, True, "the service has as many connections open as "
       "it allows"),
    _c("quota_exceeded", 413, True, False, "the key's storage quota would be exceeded"),
    _c("in_use", 409, False, True, "an active job of the key uses the object"),
    _c("builtin", 409, True, False, "built-in datasets cannot be deleted"),
    _c("job_not_finished", 409, False, True, "the job has no report yet"),
    _c("job_failed", 409, False, False, "the job failed: it has no report"),
    _c("job_cancelled", 409, False, False, "the job was cancelled: it has no report"),
    _c("job_finished", 409, False, False, "the job already ended and cannot be cancelled"),
    _c("report_unavailable", 503, False, True, "the report cannot be read from the store now"),
    _c("spec_check_busy", 503, False, True, "no spec check answered in time; the job was not "
       "queued"),
    _c("spec_check_timeout", 422, True, False, "checking the spec ran past the check's time "
       "limit: its own models (arch_kwargs, config.json) are too large or slow to build; the "
       "same spec would time out again"),
    _c("broker_unavailable", 503, False, True, "the job queue is unreachable"),
    _c("store_unavailable", 503, False, True, "the blob store cannot be read or written"),
    _c("database_unavailable", 503, False, True, "the job table is unreachable"),
    _c("not_ready", 503, False, True, "job table, store, broker or workers are not ready"),
    # The engine: what a spec, a checkpoint or a dataset cannot do (at submission or in the job).
    _c("unknown_arch", 422, True, False, "not an architecture of a registered model source"),
    _c("invalid_arch_kwargs", 422, True, False, "create_model refuses these keyword arguments"),
    _c("invalid_checkpoint", 422, True, False, "the checkpoint cannot be read as weights"),
    _c("weights_mismatch", 422, True, False, "the weights do not fit the architecture"),
    _c("class_mismatch", 422, True, False, "the model's classes do not fit the dataset's"),
    _c("unknown_layer", 422, True, False, "no such module to stitch at"),
    _c("unstitchable_point", 422, True, False, "the stitch point's output cannot be stitched"),
    _c("invalid_input_size", 422, True, False, "the model cannot take that input size"),
    _c("images_too_small", 422, True, False, "the dataset's images are too small for a model"),
    _c("model_too_large", 422, True, False, "a model of the spec has more parameters than the "
       "service builds"),
    _c("device_unavailable", 422, True, False, "the spec asks for a device the workers do not "
       "have"),
    _c("job_too_large", 422, True, False, "the job would take more than the service allows"),
    # How a job ended, when not with a report (JobStatus.error; never an HTTP answer).
    _c("cancelled", None, False, False, "the job was cancelled"),
    _c("attempts_exhausted", None, False, False, "the job's worker died on every attempt"),
    _c("worker_broken", None, False, True, "the worker cannot load its compute engine"),
    _c("not_picked_up", None, False, True, "a worker took the job and never started it while "
       "it ran nothing (a stuck worker); the job did not run"),
    _c("time_limit", None, False, False, "the job ran past the time limit"),
    _c("out_of_memory", None, False, False, "the worker or the GPU ran out of memory"),
    _c("engine_error", None, False, False, "the engine failed unexpectedly (a bug of ours)"),
    # The client: what it refuses or meets before, or without, an answer of the service
    # (its exceptions carry these; never an HTTP answer).
    _c("invalid_usage", None, True, False, "a flag, the configuration or a local file is "
       "wrong; found by the client before anything is sent"),
    _c("invalid_dataset_source", None, True, False, "a dataset to pack (a folder, an archive, "
       "a parquet, npz or WebDataset file) cannot be read as one"),
    _c("missing_extra", None, True, False, "an optional part of the client is not installed; "
       "the message names the pip command"),
    _c("baseline_refused", None, True, False, "the baseline does not compare with this check "
       "(other settings, model or dataset), or its file was edited"),
    _c("gate_refused", None, True, False, "the calibrated gate file was edited, or was "
       "calibrated for another reference, dataset, spec or method than this check's"),
    _c("connection_failed", None, False, True, "the service could not be reached, after "
       "retries"),
    _c("upload_mismatch", None, False, True, "the service stored an upload under another "
       "sha256 than the file's: the file changed during the upload or the bytes were altered "
       "in transit"),
    _c("wait_timeout", None, False, True, "waiting for the job ran out of time; the job may "
       "still be running"),
    # Report warnings.
    _c("near_chance", None, True, False, "a model predicts at chance: wrong dataset, arch "
       "kwargs or preprocessing; no verdict"),
)

CODES: dict[str, Code] = {c.code: c for c in _ENTRIES}
assert len(CODES) == len(_ENTRIES), "a code is registered twice"

GENERIC: dict[int, str] = {c.status: c.code for c in _GENERIC if c.status is not None}
"""The code of an HTTP error that carries none of ours (routing, framework, proxy)."""


def get(code: str) -> Code | None:
    """The registry entry of code, or None for a code this version does not know."""
    return CODES.get(code)


def status_of(code: str) -> int:
    """The HTTP status the gateway answers code with; KeyError for codes that have none."""
    status = CODES[code].status
    if status is None:
        raise KeyError(f"{code!r} is not an HTTP error code")
    return status
