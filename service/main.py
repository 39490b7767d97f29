"""The FastAPI application: `uvicorn --factory stitchsim_service.main:create_app`."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import stitchsim
from fastapi import FastAPI
from stitchsim_service.context import Context
from stitchsim_service.errors import install_handlers
from stitchsim_service.metrics import COLLECTOR, MetricsMiddleware
from stitchsim_service.reaper import Reaper
from stitchsim_service.routers import checkpoints, datasets, health, jobs, similarity
from stitchsim_service.settings import Settings, get_settings

log = logging.getLogger("stitchsim.service")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        ctx = Context.open(settings, with_queue=True)
        settings.tmp_dir.mkdir(parents=True, exist_ok=True)
        _clean_tmp(settings)
        app.state.ctx = ctx
        COLLECTOR.ctx = ctx
        reaper = Reaper(ctx)
        reaper.start()
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
    app.add_middleware(MetricsMiddleware)
    for r in (checkpoints.router, datasets.router, similarity.router, jobs.router,
              health.router):
        app.include_router(r)
    return app


def _clean_tmp(settings: Settings) -> None:
    # Partial uploads of a gateway that died mid-upload; nothing else lives there.
    for p in settings.tmp_dir.glob("upload-*.part"):
        p.unlink(missing_ok=True)
