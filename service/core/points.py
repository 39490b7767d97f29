"""A checkpoint's stitch points, without the HTTP: what GET /checkpoints/{id}/points does.

The gateway imports no torch, so a check worker builds the model on the meta device (the
header's keys and shapes, no weights read) as the spec check would, and answers with every
stitchable module output, its shape, the stage outputs and what `layers: "auto"` picks. The
request takes one of the key's pending-check slots, as a submission's check does.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError
from stitchsim.failure import Failure
from stitchsim.models import StitchPoints
from stitchsim_service.core import objects
from stitchsim_service.core.context import Context
from stitchsim_service.core.errors import NotFoundError
from stitchsim_service.core.queue import POINTS_TASK, CheckOutcome
from stitchsim_service.core.submit import pending_check

log = logging.getLogger("stitchsim.points")

DEFAULT_TIMEOUT_S = 30.0
"""How long to wait where the operator switched spec checks off (check_timeout_s = 0)."""


def stitch_points(ctx: Context, owner: str, checkpoint_id: str,
                  ref: dict[str, Any]) -> StitchPoints:
    """The points of one of owner's checkpoints; `ref` holds the ModelRef fields that change
    what is built (arch, arch_kwargs, input_size), None ones left out."""
    if objects.owned(ctx, owner, "checkpoints", checkpoint_id) is None:
        raise NotFoundError("checkpoint", checkpoint_id, hint="; upload it with POST /checkpoints")
    assert ctx.queue is not None
    timeout = ctx.settings.check_timeout_s or DEFAULT_TIMEOUT_S
    given = {k: v for k, v in ref.items() if v is not None}
    with pending_check(ctx, owner, timeout) as slot:
        out = ctx.queue.ask_checker(POINTS_TASK, [checkpoint_id, given], timeout, slot.token)
        slot.running = isinstance(out, CheckOutcome) and out.running
    if isinstance(out, CheckOutcome):
        raise Failure("spec_check_busy",
                      f"no check worker listed the stitch points in time ({out.note}); retry "
                      "after the time Retry-After gives", {"check_timeout_s": timeout},
                      retry_after=ctx.settings.check_retry_after_s)
    if "failure" in out:
        raise Failure.from_dict(out["failure"])
    try:
        return StitchPoints.model_validate(out.get("points"))
    except ValidationError as exc:
        log.error("a check worker answered unreadable stitch points: %s", exc)
        raise Failure("internal", "the check worker's answer could not be read") from None
