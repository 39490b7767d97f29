"""Liveness, readiness and metrics."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import select
from starlette.responses import Response
from stitchsim.models import ErrorBody
from stitchsim_service.context import Context
from stitchsim_service.db import WorkerRow, utcnow
from stitchsim_service.deps import get_ctx
from stitchsim_service.errors import body
from stitchsim_service.metrics import REGISTRY

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
        cutoff = utcnow() - timedelta(seconds=max(30.0, 3 * ctx.settings.heartbeat_s))
        with ctx.db.read() as s:
            rows = s.scalars(select(WorkerRow).where(WorkerRow.last_seen >= cutoff)).all()
        queues: dict[str, int] = {}
        for r in rows:
            for q in r.queues.split(","):
                queues[q] = queues.get(q, 0) + 1
        if not queues.get("gpu"):
            raise RuntimeError("no worker consuming the 'gpu' queue was seen in the last "
                               f"{(utcnow() - cutoff).total_seconds():.0f} s")
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
    return JSONResponse(body("not_ready", f"not ready: {failing}", checks), status_code=503,
                        headers={"Retry-After": "5"})


@router.get("/metrics", summary="Prometheus metrics")
def metrics() -> Response:
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
