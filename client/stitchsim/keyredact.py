"""API keys never appear in a message: the one place that knows what a key looks like."""

from __future__ import annotations

import re
from collections.abc import Iterable

KEY_PREFIX = "ssk_"
"""How every key the service issues starts (stitchsim-server keys create)."""
REDACTED = KEY_PREFIX + "[redacted]"

_KEY_IN_TEXT = re.compile(re.escape(KEY_PREFIX) + r"[A-Za-z0-9_-]+")


def redact_keys(text: str, known: Iterable[str] = ()) -> str:
    """text with every API key in it masked: the service's own form, and `known` values
    given as keys whatever their form (an operator's key need not start with the prefix)."""
    for key in known:
        if key:
            text = text.replace(key, REDACTED)
    return _KEY_IN_TEXT.sub(REDACTED, text)


def keys_in_argv(argv: Iterable[str]) -> list[str]:
    """The values a command line gives --api-key, as `--api-key K` or `--api-key=K`."""
    args, found = list(argv), []
    for i, arg in enumerate(args):
        if arg == "--api-key" and i + 1 < len(args):
            found.append(args[i + 1])
        elif arg.startswith("--api-key="):
            found.append(arg.split("=", 1)[1])
    return found
