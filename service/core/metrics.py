"""Prometheus metrics: the counters (the gateway's middleware counts requests into them) and
job figures read from the job table at scrape time (the table is the truth, and workers live
in other processes)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import case, func, select
from stitchsim.models import JOB_STATES
from stitchsim_service.core.db import JobRow
from stitchsim_service.core.queue import CHECKS_QUEUE, GPU_QUEUE
from stitchsim_service.core.workers import seen_by_queue

log = logging.getLogger("stitchsim.metrics")

REGISTRY = CollectorRegistry(auto_describe=True)

REQUESTS = Counter("stitchsim_http_requests_total", "HTTP requests",
                   ["method", "route", "status"], registry=REGISTRY)
LATENCY = Histogram("stitchsim_http_request_duration_seconds", "HTTP request latency",
                    ["method", "route"], registry=REGISTRY,
                    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5,
                             5, 10, 30, 60))
JOBS_SUBMITTED = Counter("stitchsim_jobs_submitted_total", "Jobs accepted with 202",
                         registry=REGISTRY)
JOBS_REJECTED = Counter("stitchsim_jobs_rejected_total", "Submissions refused", ["status"],
                        registry=REGISTRY)
UPLOAD_BYTES = Counter("stitchsim_upload_bytes_total", "Bytes of accepted uploads", ["kind"],
                       registry=REGISTRY)
JOB_WATCH_READS = Counter("stitchsim_job_watch_reads_total",
                          "Reads of the job table for the clients waiting on jobs (one per "
                          "interval for all of them, none while nobody waits)",
                          registry=REGISTRY)
JOB_WAITERS = Gauge("stitchsim_job_waiters",
                    "Requests waiting on a job now (long-polls, event streams)",
                    registry=REGISTRY)
JOBS_REQUEUED = Counter("stitchsim_jobs_requeued_total",
                        "Jobs the reaper put back after their worker vanished",
                        registry=REGISTRY)


DURATION_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600)


class JobTableCollector(Collector):
    """Job counts by state, broker queue depth, job durations, live workers."""

    def __init__(self) -> None:
        self.ctx = None  # set by the app at startup

    def collect(self) -> Iterator[GaugeMetricFamily | HistogramMetricFamily]:
        ctx = self.ctx
        if ctx is None:
            return
        try:
            yield from self._collect(ctx)
        except Exception as exc:  # a scrape must not fail because the table is busy
            log.warning("metrics collection failed: %s", exc)

    def _collect(self, ctx):  # type: ignore[no-untyped-def]
        states = GaugeMetricFamily("stitchsim_jobs", "Jobs in the job table by state",
                                   labels=["state"])
        with ctx.db.read() as s:
            counts = dict(s.execute(select(JobRow.state, func.count()).group_by(JobRow.state))
                          .all())
            cols = [func.sum(case((JobRow.duration_s <= b, 1), else_=0)) for b in
                    DURATION_BUCKETS]
            agg = s.execute(select(func.count(JobRow.duration_s), func.sum(JobRow.duration_s),
                                   *cols).where(JobRow.state == "succeeded")).one()
        for state in JOB_STATES:
            states.add_metric([state], counts.get(state, 0))
        yield states

        n, total = agg[0] or 0, agg[1] or 0.0
        buckets = [(str(float(b)), int(c or 0)) for b, c in zip(DURATION_BUCKETS, agg[2:],
                                                                   strict=True)]
        buckets.append(("+Inf", int(n)))
        yield HistogramMetricFamily("stitchsim_job_duration_seconds",
                                    "Run time of succeeded jobs (start to finish)",
                                    buckets=buckets, sum_value=float(total))

        seen = GaugeMetricFamily("stitchsim_workers", "Workers seen recently, by queue",
                                 labels=["queue"])
        per_queue = seen_by_queue(ctx)
        for q in (GPU_QUEUE, CHECKS_QUEUE):
            seen.add_metric([q], per_queue.get(q, 0))
        yield seen

        if ctx.queue is not None:
            depth = GaugeMetricFamily("stitchsim_queue_depth", "Messages waiting in the broker",
                                      labels=["queue"])
            for q in (GPU_QUEUE, CHECKS_QUEUE):
                d = ctx.queue.depth(q)
                if d is not None:
                    depth.add_metric([q], d)
            yield depth


COLLECTOR = JobTableCollector()
REGISTRY.register(COLLECTOR)
