"""Liveness, readiness and metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response
from stitchsim.failure import Failure
from stitchsim.models import ErrorBody
from stitchsim_service.core.context import Context
from stitchsim_service.core.metrics import REGISTRY
from stitchsim_service.core.queue import GPU_QUEUE
from stitchsim_service.core.workers import seen_by_queue, seen_window_s
from stitchsim_service.gateway.deps import get_ctx
from stitchsim_service.gateway.errors import answer

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process is up")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


def _check(fn: Any) -> dict[str, Any]:
    try:
        out = fn()
        return {"ok": True, **(out or {})}
    except Exception as exc:
        return {"ok": False, "error": str(exc)[:300]}


@router.get("/readyz", summary="Job table, store and broker reachable, workers seen",
            responses={503: {"model": ErrorBody, "description": "not ready; details say why"}})
def readyz(ctx: Context = Depends(get_ctx)) -> JSONResponse:
    def workers() -> dict[str, Any]:
        queues = seen_by_queue(ctx)
        if not queues.get(GPU_QUEUE):
            raise RuntimeError(f"no worker consuming the {GPU_QUEUE!r} queue was seen in the "
                               f"last {seen_window_s(ctx):.0f} s")
        return {"queues": queues}

    checks = {
        "database": _check(ctx.db.ping),
        "store": _check(ctx.store.ping),
        "broker": _check(ctx.queue.ping if ctx.queue else lambda: None),
        "workers": _check(workers),
    }
    if all(c["ok"] for c in checks.values()):
        return JSONResponse({"status": "ready", "checks": checks})
    failing = ", ".join(k for k, c in checks.items() if not c["ok"])
    return answer(Failure("not_ready", f"not ready: {failing}", checks, retry_after=5))


class PrometheusText(Response):
    """Prometheus's text exposition, with the content type prometheus_client gives it: the
    answer and the OpenAPI document both take it from here."""

    media_type = CONTENT_TYPE_LATEST


@router.get("/metrics", summary="Prometheus metrics", response_class=PrometheusText,
            responses={200: {"description": "the Prometheus text exposition format",
                             "content": {PrometheusText.media_type: {
                                 "schema": {"type": "string"}}}}})
async def metrics() -> PrometheusText:
    # The job figures are read from the table while generating: off the loop.
    return PrometheusText(await run_in_threadpool(generate_latest, REGISTRY))
