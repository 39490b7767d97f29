"""What a refused file raises: a Failure (stitchsim.failure) whose code of the registry
(stitchsim.codes) comes with its class, and a message that says what to fix."""

from __future__ import annotations

import reprlib
from typing import Any

from stitchsim.failure import Failure


class SafetensorsError(Failure, ValueError):
    """The file is not a safetensors file we accept; ``message`` says what to fix."""

    code = "invalid_safetensors"

    def __init__(self, message: str, *, details: Any = None):
        super().__init__(type(self).code, message, details)


class UnsupportedFormat(SafetensorsError):
    """The file is another format (pickle, zip, numpy …): refused without parsing it."""

    code = "unsupported_format"


class InvalidDataset(SafetensorsError):
    """A valid safetensors file that does not hold a usable dataset."""

    code = "invalid_dataset"


# Values from the file appear in error messages cut short: a message must not echo megabytes
# of a hostile header back (or into logs).
_SHORT = reprlib.Repr()
_SHORT.maxstring = 60
_SHORT.maxother = 60
_SHORT.maxlong = 30
_SHORT.maxlist = _SHORT.maxdict = 10


def show(value: Any) -> str:
    return _SHORT.repr(value)
