"""Configuration, from STITCHSIM_* environment variables (one place for every knob)."""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

_FIGURE = r"[0-9]*\.?[0-9]+(?:[eE]-?[0-9]+)?"
CALIBRATION_PATTERN = rf"^(?:auto|probe|off|{_FIGURE}|[0-9]+:{_FIGURE}(?:,[0-9]+:{_FIGURE})*)$"

LOOPBACK_NAMES = {"localhost", "ip6-localhost"}


def is_loopback(host: str | None) -> bool:
    if host is None:
        return False
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="STITCHSIM_", extra="ignore")

    data_dir: Path = Field(
        default=Path(".stitchsim"),
        description="where the embedded default keeps its job table, broker, store and cache",
    )
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL of the job table; default sqlite:///<data_dir>/stitchsim.db",
    )
    store_url: str | None = Field(
        default=None,
        description="blob store: a directory, or an fsspec URL such as s3://bucket/prefix; "
        "default <data_dir>/store",
    )
    redis_url: str | None = Field(
        default=None,
        description="Celery broker and result backend; unset = embedded SQLite broker",
    )
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    require_api_key: bool | None = Field(
        default=None,
        description="true = keys even on loopback; keys are always required when host is "
        "not loopback and for clients connecting from beyond loopback",
    )
    max_upload_bytes: int = Field(
        default=2 * 1024**3, ge=1024, description="largest checkpoint or dataset file (413 "
        "beyond). What a larger cap costs: the spool (data_dir/tmp) and the store hold the "
        "file while it is received and for as long as it is kept (counted in the key's "
        "storage quota), and with a remote store (s3://) each worker downloads it into its cache "
        "once; "
        "a job's memory does not grow with it (uint8 datasets are memory-mapped and read batch "
        "by batch). 2 GiB holds about 14,000 images at 3x224x224 or 700,000 at 3x32x32")
    max_header_bytes: int = Field(default=16 * 1024**2, ge=1024)
    max_spec_bytes: int = Field(default=1024**2, ge=1024)
    check_timeout_s: float = Field(
        default=30.0, ge=0, description="how long submission waits for the spec check"
    )
    check_retry_after_s: int = Field(
        default=15, ge=1, description="Retry-After sent with 503 when no spec check answered "
        "in time (the job is not queued unchecked)")
    max_model_params: int = Field(
        default=2_000_000_000, ge=1, description="parameters a model of a spec may have, "
        "counted on the meta device before anything is allocated (422 model_too_large)")
    max_model_modules: int = Field(
        default=2_500, ge=1, description="modules a model of a spec may have (timm's largest "
        "have ~1,200); a config whose layer fields alone ask for more (3 modules a layer at "
        "least) is refused before it is built, and the spec check's build stops past it (422 "
        "model_too_large), so a legal but deep config costs a check worker well under a "
        "second, not its time limit")
    max_job_units: int | None = Field(
        default=1_000_000, ge=1, description="work units (about one batch through a network "
        "part; a default 4-point digits job in both directions and protocols is ~12k) a job "
        "may take, counted at the spec check as its progress plan counts them (422 "
        "job_too_large with the fields to shrink)")
    max_active_units_per_key: int | None = Field(
        default=3_000_000, ge=1, description="estimated work units (each job's estimate.units) "
        "a key may have queued or running at once (429 compute_quota_exceeded beyond); "
        "`stitchsim-server keys limits --max-units` overrides it per key")
    seconds_per_unit: float = Field(
        default=0.04, gt=0, description="a work unit's run time on the workers where they are "
        "not calibrated (STITCHSIM_CALIBRATION=off, or no job worker announced one yet), and "
        "in the gateway's 429 compute-quota messages")
    calibration: str = Field(
        default="auto", pattern=CALIBRATION_PATTERN, description="how job workers price a "
        "work unit: auto (probe on a GPU; a CPU keeps the flat figures, which were measured "
        "on the 2-core reference CPU), probe (a short measured probe at worker start, cached "
        "by device and torch version, on any device), off (STITCHSIM_SECONDS_PER_UNIT and "
        "STITCHSIM_MAX_JOB_UNITS as they are), or stand-in figures: seconds a unit "
        "(0.0002) or per input side "
        "(32:0.002,224:0.0002). The spec check scales the job limit and the estimate by the "
        "slowest job worker's figures at the job's input size")
    max_activation_bytes: int | None = Field(
        default=4 * 1024**3, ge=1024, description="activation memory one batch may need at the "
        "model's largest module output, estimated from the spec check's meta forward before "
        "anything is allocated (422 job_too_large beyond)")
    check_memory_bytes: int | None = Field(
        default=8 * 1024**3, ge=256 * 1024**2, description="address-space limit (RLIMIT_AS) "
        "of the process that runs spec checks: a spec that gets past the estimates still "
        "cannot take the host's memory")
    max_pending_checks_per_key: int = Field(
        default=1, ge=1, description="spec checks one key may have waiting at once, across "
        "every gateway process sharing the job table (429 too_many_checks beyond): one key's "
        "slow specs cannot fill the checks queue ahead of another key's; at 1, another key's "
        "valid spec waits behind at most one check's time limit (STITCHSIM_CHECK_TIMEOUT_S)")
    job_time_limit_s: int = Field(default=4 * 3600, ge=10)
    visibility_timeout_s: int | None = Field(
        default=None, description="Redis redelivery timeout; default time limit + 1 h"
    )
    max_attempts: int = Field(default=3, ge=1, le=100)
    heartbeat_s: float = Field(default=5.0, gt=0)
    stale_after_s: float = Field(default=60.0, gt=0)
    reap_interval_s: float = Field(default=15.0, gt=0)
    pickup_timeout_s: float = Field(
        default=300.0, gt=0, description="how long a job may wait to be started after the "
        "reaper sent it again (a worker had taken it and not started it) while that worker is "
        "alive and runs nothing; beyond, the job fails with not_picked_up instead of waiting "
        "silently. Above a pool process's start (fork and torch import) on a loaded machine")
    max_active_jobs_per_key: int = Field(
        default=100, ge=1, description="jobs a key may have queued or running at once (429 "
        "beyond); `stitchsim-server keys limits` overrides it per key")
    max_stored_bytes_per_key: int = Field(
        default=50 * 1024**3, ge=0, description="bytes of checkpoints and datasets a key may "
        "keep stored (413 beyond); overridable per key like the job limit")
    quota_retry_after_s: int = Field(
        default=30, ge=1, description="Retry-After sent with 429 when a key has too many jobs")
    body_read_timeout_s: float = Field(
        default=30.0, gt=0, description="longest wait for the next piece of a request body "
        "(408 beyond; the upload's spool file is removed)")
    min_body_rate_bytes_s: int = Field(
        default=16 * 1024, ge=0, description="once body_read_timeout_s has passed, a body must "
        "have arrived at this average rate (408 below): a byte every few seconds is refused")
    gateway_workers: int = Field(
        default=1, ge=1, le=64, description="gateway processes serving the one port "
        "(uvicorn workers); they share only the job table and the store")
    access_log_polls: bool = Field(
        default=False, description="write an access line for each answered status poll "
        "(200 or 304 to GET /jobs/{id}, long-polls included); off, polls are only counted in "
        "/metrics: they are most of the traffic")
    max_connections: int = Field(
        default=500, ge=1, description="uvicorn's --limit-concurrency for each gateway "
        "process: with this many connections open or requests in flight (long-polls and "
        "event streams included), a new request gets uvicorn's 503 and its connection is "
        "closed. Idle and slow connections are bounded by the reverse proxy in front "
        "(docs/deploy.md)")
    job_watch_interval_s: float = Field(
        default=0.5, gt=0, le=10, description="how often a gateway process reads the rows of "
        "the jobs its clients wait on (long-polls, event streams), in one query for all of "
        "them; a change shows to a waiting client within this time")
    max_concurrent_uploads: int = Field(
        default=32, ge=1, description="requests with a file body received at once per "
        "gateway process (429 beyond)")
    max_concurrent_uploads_per_key: int = Field(
        default=4, ge=1, description="of those, how many one key may send at once (429 beyond)")
    upload_retry_after_s: int = Field(
        default=5, ge=1, description="Retry-After sent when no upload slot is free")
    worker_idle_release_s: float = Field(
        default=60.0, ge=0, description="a worker's pool processes (each holding torch and "
        "the engine, ~1 GB) exit after this long without a task, and are forked again, light, "
        "when the next task arrives: an idle service holds no torch process. 0: keep them, "
        "with the engine loaded at start (no import on a job's first second)")
    cache_dir: Path | None = Field(default=None, description="worker cache; <data_dir>/cache")
    reference_cache_max_bytes: int = Field(
        default=20 * 1024**3, ge=0, description="the reference cache (a reference model's "
        "IRIs, tensors and logits, kept in the store under refcache/ and shared by every "
        "worker) is pruned to this size after each write, least recently used first: in a "
        "local store, and in each worker's copies of a remote store's entries (a bucket's "
        "refcache/ prefix is pruned by its lifecycle rule)")
    worker_concurrency: int = Field(default=1, ge=1)
    shutdown_grace_s: float = Field(
        default=10.0, ge=0, description="on a cold worker shutdown, how long running jobs may "
        "finish before they are stopped and put back in the queue")
    broker_poll_s: float = Field(default=0.2, gt=0, description="embedded broker poll interval")
    poll_after_s: int = Field(default=2, ge=1, description="Retry-After sent with 202")
    log_level: str = "info"

    @model_validator(mode="after")
    def _limits_consistent(self) -> Settings:
        if self.visibility_timeout_s is not None and (
            self.visibility_timeout_s <= self.job_time_limit_s
        ):
            # Redis hands an unacknowledged task to another worker after the visibility
            # timeout: a job allowed to run longer would run twice.
            raise ValueError(
                "STITCHSIM_VISIBILITY_TIMEOUT_S must exceed STITCHSIM_JOB_TIME_LIMIT_S"
            )
        if self.stale_after_s <= 2 * self.heartbeat_s:
            raise ValueError("STITCHSIM_STALE_AFTER_S must exceed twice STITCHSIM_HEARTBEAT_S")
        return self

    # Derived values: computed, so that one env var (data_dir) moves everything.
    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir.resolve() / 'stitchsim.db'}"

    @property
    def resolved_store_url(self) -> str:
        return self.store_url or str(self.data_dir.resolve() / "store")

    @property
    def resolved_cache_dir(self) -> Path:
        return (self.cache_dir or self.data_dir / "cache").resolve()

    @property
    def tmp_dir(self) -> Path:
        return (self.data_dir / "tmp").resolve()

    @property
    def embedded(self) -> bool:
        return not self.redis_url

    @property
    def broker_url(self) -> str:
        if self.redis_url:
            return self.redis_url
        return f"sqla+sqlite:///{self.data_dir.resolve() / 'broker.db'}"

    @property
    def result_backend(self) -> str:
        if self.redis_url:
            return self.redis_url
        return f"db+sqlite:///{self.data_dir.resolve() / 'results.db'}"

    @property
    def resolved_visibility_timeout_s(self) -> int:
        return self.visibility_timeout_s or self.job_time_limit_s + 3600

    @property
    def keys_required(self) -> bool:
        # Beyond loopback keys are always required: an explicit "false" cannot open the service
        # to the network.
        return bool(self.require_api_key) or not is_loopback(self.host)


@lru_cache
def get_settings() -> Settings:
    return Settings()
