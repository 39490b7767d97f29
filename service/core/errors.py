"""What the core refuses: the contract's Failure (stitchsim.failure), each carrying a code of
the registry (stitchsim.codes), which says what HTTP status the gateway answers with, whether
it is the user's fault and whether a retry may help. The core never names a status itself."""

from __future__ import annotations

from typing import Any

from stitchsim.failure import Failure


class NotFoundError(Failure):
    """No such thing for this key: the same answer whether it does not exist or belongs to
    another key. (A Failure whose constructor writes the message; it travels as any other.)"""

    def __init__(self, what: str, ident: str, details: dict[str, Any] | None = None,
                 hint: str = ""):
        # The id comes from the caller: cut short, so a hostile one is not echoed back whole.
        shown = ident if len(ident) <= 80 else ident[:77] + "..."
        super().__init__("not_found", f"{what} {shown} not found{hint}",
                         {"id": shown, **(details or {})})

