"""GET /usage: what the calling key uses of its quotas."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from stitchsim.models import ErrorBody, Usage
from stitchsim_service.core import quotas
from stitchsim_service.core.context import Context
from stitchsim_service.gateway.deps import get_ctx, get_owner

router = APIRouter(tags=["usage"])


@router.get("/usage", response_model=Usage, responses={401: {"model": ErrorBody}},
            summary="Your jobs in flight and bytes stored, against your quotas")
def get_usage(ctx: Context = Depends(get_ctx), owner: str = Depends(get_owner)) -> Usage:
    with ctx.db.read() as s:
        return quotas.usage(s, ctx.settings, owner)
