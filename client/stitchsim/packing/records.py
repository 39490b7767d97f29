"""What a reader hands the packer: records, one per image, in a fixed order per split."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from stitchsim.files.dataset import TestSplit

if TYPE_CHECKING:  # the data extra's: readers may be told apart without it
    import numpy as np

Label = int | str | None
"""A class id, a class name, or None (unlabelled), as the source has it."""


@dataclass(frozen=True)
class Record:
    where: str
    """What names this image in a message: a path inside the source, "row 17"."""
    label: Label
    data: bytes | np.ndarray
    """Encoded image file bytes, or uint8 pixels H x W or H x W x C (C = 1 or 3)."""


@dataclass(frozen=True)
class Stream:
    """One split of a source: `scan()` yields its records, the same ones in the same order
    each time (the packer reads twice: sizes first, pixels second)."""

    name: str
    scan: Callable[[], Iterator[Record]]


@dataclass
class Found:
    """A source as its reader understood it."""

    format: str
    source: Path
    splits: dict[str, Stream]
    """"train", and "test" when the source has one."""
    labelled: bool
    class_names: list[str] | None = None
    """Names of integer labels (index = label), when the source has them (Hugging Face's
    ClassLabel); string labels name themselves."""
    notes: list[str] = field(default_factory=list)
    test_split: TestSplit | None = None
    """How a given test split came to be, when the source says (a packed file re-packed);
    None: given by the source, or made by the packer when the source has none."""
