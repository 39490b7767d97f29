"""Celery configuration shared by gateway and workers, and the gateway's side of the queue.

The gateway sends tasks by name: it never imports worker code (and so never imports torch).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from celery import Celery
from celery.exceptions import TimeoutError as CeleryTimeout
from kombu.transport import TRANSPORT_ALIASES, sqlalchemy as kombu_sqla
from pydantic import ValidationError
from sqlalchemy import event
from stitchsim.failure import Failure
from stitchsim.models import Estimate
from stitchsim_service.core.settings import Settings

log = logging.getLogger("stitchsim.queue")

GPU_QUEUE = "gpu"
CHECKS_QUEUE = "checks"
RUN_TASK = "stitchsim.run_job"
CHECK_TASK = "stitchsim.check_spec"
POINTS_TASK = "stitchsim.stitch_points"


class _EmbeddedChannel(kombu_sqla.Channel):
    def _engine_from_config(self) -> Any:
        # kombu hands every transport option to create_engine, including polling_interval,
        # which create_engine refuses; and SQLite wants WAL + a busy timeout for several
        # processes (gateway, two workers) to share one broker file.
        opts = self.connection.client.transport_options.copy()
        for key in ("queue_tablename", "message_tablename", "callback", "errback",
                    "max_retries", "interval_start", "interval_step", "interval_max",
                    "retry_errors", "polling_interval"):
            opts.pop(key, None)
        from sqlalchemy import create_engine

        engine = create_engine(self.connection.client.hostname, **opts)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _rec: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine


class EmbeddedTransport(kombu_sqla.Transport):
    """kombu's SQLAlchemy transport, usable with SQLite by several processes."""

    Channel = _EmbeddedChannel


TRANSPORT_ALIASES["stitchsim-sqla"] = "stitchsim_service.core.queue:EmbeddedTransport"


def broker_url(settings: Settings) -> str:
    if settings.redis_url:
        return settings.redis_url
    return f"stitchsim-sqla+sqlite:///{settings.data_dir.resolve() / 'broker.db'}"


def soft_time_limit_s(settings: Settings) -> int:
    """When a job is told to stop (SoftTimeLimitExceeded): 30 s before the hard limit kills it."""
    return max(settings.job_time_limit_s - 30, 1)


def celery_config(settings: Settings) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "broker_url": broker_url(settings),
        "result_backend": settings.result_backend,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        # Work survives a dead worker: the message is acknowledged only after the task ran, and
        # a pool child killed mid-task (OOM, kill -9) puts it back. The attempt cap in the job
        # table stops a job that kills every worker from looping.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_time_limit": settings.job_time_limit_s,
        "task_soft_time_limit": soft_time_limit_s(settings),
        "task_default_queue": GPU_QUEUE,
        "task_routes": {RUN_TASK: {"queue": GPU_QUEUE}, CHECK_TASK: {"queue": CHECKS_QUEUE},
                        POINTS_TASK: {"queue": CHECKS_QUEUE}},
        "result_expires": 3600,
        "broker_connection_retry_on_startup": True,
        "worker_send_task_events": False,
        "task_send_sent_event": False,
        "worker_hijack_root_logger": False,
        "worker_concurrency": settings.worker_concurrency,
        # A pool child imports torch and timm before it reports up (4.5 s on a busy 2-core
        # machine); Celery's default of 4 s kills it and forks another, over and over.
        "worker_proc_alive_timeout": 120.0,
        # Cold shutdown (SIGQUIT, or a second SIGTERM) gives running tasks this long, then
        # stops them; acks late puts their messages back.
        "worker_soft_shutdown_timeout": settings.shutdown_grace_s,
        # Keep running on a broker blip: the job table dedups the redelivery that follows.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
    }
    if settings.redis_url:
        vt = settings.resolved_visibility_timeout_s
        conf["broker_transport_options"] = {"visibility_timeout": vt}
        conf["result_backend_transport_options"] = {"visibility_timeout": vt}
    else:
        conf["broker_transport_options"] = {
            "polling_interval": settings.broker_poll_s,
            "connect_args": {"timeout": 30},
        }
        # The SQLite broker has no fanout: no remote control, no gossip, no revoke; cancel is
        # cooperative through the job table.
        conf["worker_enable_remote_control"] = False
    return conf


def make_celery(settings: Settings) -> Celery:
    app = Celery("stitchsim", set_as_current=False)
    app.conf.update(celery_config(settings))
    return app


CHECK_ANSWER_MARGIN_S = 5.0
"""How much longer than a check task's own time limit the gateway waits for its answer: a
check that ran out of its time (spec_check_timeout, the spec's fault) answers within it."""
CHECK_KILL_MARGIN_S = 10.0
"""From a check task's soft time limit (it answers spec_check_timeout) to its hard kill."""


def check_queue_wait_s(timeout: float) -> float:
    """How long a check task may wait in the checks queue before it expires unstarted: behind
    one other key's check of the same time limit and its answer. Each key has one pending
    check at most (max_pending_checks_per_key), so with the checks worker busy on another
    key's legal but slow check, a valid spec is answered in its own time plus at most one
    check's time limit instead of expiring behind it (503 spec_check_busy)."""
    return timeout + CHECK_ANSWER_MARGIN_S


def check_answer_wait_s(timeout: float) -> float:
    """How long the gateway waits for a check's answer: its queue wait, its own time limit,
    and the margin for the answer to travel."""
    return check_queue_wait_s(timeout) + timeout + CHECK_ANSWER_MARGIN_S


def check_slot_lifetime_s(timeout: float) -> float:
    """The longest a check task can live: waiting in the queue until it expires
    (check_queue_wait_s), then running until it is killed (`timeout` + CHECK_KILL_MARGIN_S).
    A key's pending-check slot is held that long at most when nobody frees it
    (quotas.take_check_slot)."""
    return check_queue_wait_s(timeout) + timeout + CHECK_KILL_MARGIN_S


@dataclass
class CheckOutcome:
    checked: bool
    failure: Failure | None = None
    """Why the spec cannot run: the engine's Failure, as the check task carried it."""
    note: str = ""
    busy: bool = False
    """No answer in time: the checkers are busy or gone; the spec is unchecked."""
    running: bool = False
    """The task may still be queued or running (the wait ran out): its slot is not free."""
    estimate: Estimate | None = None
    """What the check counted (the job's progress plan)."""

    @classmethod
    def answered(cls, out: dict[str, Any] | None) -> CheckOutcome:
        """The check task's answer ({"estimate": ...} or {"failure": ...}; see
        stitchsim_worker.runner.check_spec_doc)."""
        out = out or {}
        if "failure" in out:
            return cls(True, failure=Failure.from_dict(out["failure"]))
        try:
            estimate = Estimate.model_validate(out["estimate"]) if "estimate" in out else None
        except ValidationError:
            log.warning("the spec check answered an unreadable estimate %r", out["estimate"])
            estimate = None
        return cls(True, estimate=estimate)


class JobQueue:
    """What the gateway needs from Celery: enqueue a job, check a spec, read queue depth."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.celery = make_celery(settings)

    def enqueue(self, job_id: str, attempt_hint: int = 0) -> None:
        self.celery.send_task(
            RUN_TASK,
            args=[job_id],
            queue=GPU_QUEUE,
            task_id=f"{job_id}-{attempt_hint}",
            ignore_result=True,
            retry=True,
            retry_policy={"max_retries": 2, "interval_start": 0, "interval_step": 0.5,
                          "interval_max": 1},
        )

    def check_spec(self, spec: dict[str, Any], timeout: float, slot: str | None = None
                   ) -> CheckOutcome:
        if timeout <= 0:
            return CheckOutcome(False, note="spec check disabled")
        out = self.ask_checker(CHECK_TASK, [spec], timeout, slot)
        return out if isinstance(out, CheckOutcome) else CheckOutcome.answered(out)

    def ask_checker(self, task: str, args: list[Any], timeout: float, slot: str | None = None
                    ) -> dict[str, Any] | CheckOutcome:
        """A check worker's answer to `task`, or why none came (an unchecked outcome). The
        task expires unstarted after check_queue_wait_s(timeout) and is told to stop after
        `timeout` of running (it answers spec_check_timeout); `slot`, the key's pending-check
        slot, goes with it for the worker to free when the task really ends."""
        try:
            result = self.celery.send_task(
                task, args=args, kwargs={"slot": slot} if slot else {}, queue=CHECKS_QUEUE,
                expires=check_queue_wait_s(timeout), soft_time_limit=timeout,
                time_limit=timeout + CHECK_KILL_MARGIN_S,
                retry=True, retry_policy={"max_retries": 1, "interval_start": 0},
            )
        except Exception as exc:  # broker trouble: the enqueue that follows will say so
            log.warning("%s not sent: %s", task, exc)
            return CheckOutcome(False, note=f"spec check not sent: {exc}")
        try:
            out = result.get(timeout=check_answer_wait_s(timeout), interval=0.05,
                             propagate=True)
        except CeleryTimeout:
            # Still queued behind others' checks (a check that ran out of time would have
            # answered spec_check_timeout by now): busy, and its slot stays taken.
            return CheckOutcome(False, note=f"no spec check answer within {timeout:g} s",
                                busy=True, running=True)
        except Exception as exc:
            # The checker died on this spec (killed for memory, a time limit) or is broken:
            # unchecked either way, and an unchecked spec must not reach a GPU worker.
            log.warning("%s failed unexpectedly: %r", task, exc)
            return CheckOutcome(False, note=f"spec check failed: {type(exc).__name__}",
                                busy=True)
        finally:
            with contextlib.suppress(Exception):  # forgetting is housekeeping only
                result.forget()
        return out or {}

    def depth(self, queue: str) -> int | None:
        try:
            with self.celery.connection_for_read() as conn:
                return int(_declare(conn, queue).message_count)
        except Exception:
            return None

    def ping(self, timeout: float = 3.0) -> None:
        with self.celery.connection_for_read() as conn:
            conn.ensure_connection(max_retries=1, timeout=timeout)
            # A real round trip: ensure_connection alone is lazy on virtual transports.
            _declare(conn, GPU_QUEUE)


def _declare(conn: Any, queue: str) -> Any:
    # Not passive: Redis only "has" a queue while it holds messages, so a passive declare of an
    # empty queue fails. Declaring is idempotent on both our transports.
    return conn.default_channel.queue_declare(queue=queue, durable=True, auto_delete=False)
