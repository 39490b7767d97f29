"""The FastAPI application: `uvicorn --factory stitchsim_service.gateway.main:create_app`."""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import stitchsim
from fastapi import FastAPI
from stitchsim.models import ErrorBody
from stitchsim_service.core.context import Context
from stitchsim_service.core.keys import REDACT_KEYS
from stitchsim_service.core.metrics import COLLECTOR
from stitchsim_service.core.reaper import Reaper
from stitchsim_service.core.settings import Settings, get_settings
from stitchsim_service.core.tmpfiles import remove_orphaned_uploads
from stitchsim_service.gateway.edge import BodyTimeoutMiddleware
from stitchsim_service.gateway.errors import install_handlers
from stitchsim_service.gateway.middleware import DisconnectMiddleware, MetricsMiddleware
from stitchsim_service.gateway.routers import (
    checkpoints,
    datasets,
    health,
    jobs,
    similarity,
    usage,
)
from stitchsim_service.gateway.watch import JobWatcher

log = logging.getLogger("stitchsim.service")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Loggers that print request paths (access lines, unhandled errors); installed here,
        # after uvicorn has configured its loggers.
        # Polls first: their lines are dropped before the redaction's regexes run on them.
        if not settings.access_log_polls:
            logging.getLogger("uvicorn.access").addFilter(jobs.QUIET_POLLS)
        for name in ("uvicorn.access", log.name):
            logging.getLogger(name).addFilter(REDACT_KEYS)
        ctx = Context.open(settings, with_queue=True)
        settings.tmp_dir.mkdir(parents=True, exist_ok=True)
        # Partial uploads of gateways that died mid-upload (this data dir may be shared).
        remove_orphaned_uploads(settings.tmp_dir)
        app.state.ctx = ctx
        app.state.watcher = JobWatcher(ctx, settings.job_watch_interval_s)
        COLLECTOR.ctx = ctx
        reaper = Reaper(ctx)
        reaper.start()
        # What start-up imported (FastAPI, pydantic schemas, SQLAlchemy, matplotlib for the
        # report pages) lives as long as the process: out of the collector's sight, so a full
        # collection walks only what requests allocate, not a pause of every poll behind it.
        gc.collect()
        gc.freeze()
        log.info("stitchsim gateway ready: store %s, %s broker, keys %s",
                 ctx.store.url, "embedded" if settings.embedded else "redis",
                 "required" if settings.keys_required else "optional on loopback")
        try:
            yield
        finally:
            reaper.stop()

    app = FastAPI(
        title="stitchsim",
        version=stitchsim.__version__,
        description="Functional similarity of neural networks, as a service: stitch one "
        "network's front into another's back and measure how well they agree.",
        lifespan=lifespan,
    )
    install_handlers(app)
    # Inside the metrics and the disconnect handling: a slow body is answered (408), counted.
    app.add_middleware(BodyTimeoutMiddleware, settings=settings)
    app.add_middleware(MetricsMiddleware)
    # Outside the metrics, so a disconnect is still counted (as a 499).
    app.add_middleware(DisconnectMiddleware)
    # Every route that needs a key can answer 401, and 503 when the job table or store is down.
    keyed = {s: {"model": ErrorBody} for s in (401, 503)}
    # Routes are matched in order: the status polls' router first, as the most requested.
    for r in (jobs.router, checkpoints.router, datasets.router, similarity.router,
              usage.router):
        app.include_router(r, responses=keyed)  # type: ignore[arg-type]
    app.include_router(health.router)
    return app
