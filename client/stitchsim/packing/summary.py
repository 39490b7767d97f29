"""What packing found and did: shown by `stitchsim dataset pack` and logged by an upload that
packs, so the user sees the classes, counts and sizes the service will get before any job."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from stitchsim.catalogue import DATASET_FORMATS
from stitchsim.files.dataset import TestSplit

_SHOWN_CLASSES = 10
_SHOWN_SIZES = 4


@dataclass(frozen=True)
class SplitCount:
    n: int
    per_class: dict[str, int] = field(default_factory=dict)
    """Images per class name, in class order (empty when unlabelled)."""

    def text(self) -> str:
        if not self.per_class:
            return f"{self.n} images"
        shown = list(self.per_class.items())
        parts = ", ".join(f"{name} {k}" for name, k in shown[:_SHOWN_CLASSES])
        more = f", ... ({len(shown) - _SHOWN_CLASSES} more classes)" if len(
            shown) > _SHOWN_CLASSES else ""
        return f"{self.n} images ({parts}{more})"


@dataclass(frozen=True)
class PackSummary:
    source: Path
    format: str
    """The catalogue name of the reader that read it."""
    out: Path
    out_bytes: int
    classes: tuple[str, ...] | None
    """Class names, index = label; None when unlabelled."""
    train: SplitCount
    test: SplitCount
    test_split: TestSplit
    image_shape: tuple[int, int, int]
    """C x H x W of every stored image (uint8)."""
    sizes_found: dict[tuple[int, int], int]
    """(H, W) as found, with how many images had it, most common first."""
    resized: int
    """Images brought to the stored size from another one."""
    size_chosen: str
    """Why the stored size: "given" (size=) or "the most common size"."""
    notes: tuple[str, ...] = ()
    test_source: Path | None = None

    @property
    def labelled(self) -> bool:
        return self.classes is not None

    def lines(self) -> list[str]:
        c, h, w = self.image_shape
        label = DATASET_FORMATS.label(self.format)
        src = f"{self.source}" + (f" + {self.test_source} (test)" if self.test_source else "")
        out = [f"packed {src} ({label}) into {self.out} ({human_size(self.out_bytes)})"]
        if self.classes is None:
            out.append("  classes: none (unlabelled: a job refuses it where a figure needs "
                       "labels)")
        else:
            names = ", ".join(self.classes[:_SHOWN_CLASSES])
            more = ", ..." if len(self.classes) > _SHOWN_CLASSES else ""
            out.append(f"  classes: {len(self.classes)} ({names}{more})")
        out.append(f"  train: {self.train.text()}")
        out.append(f"  test: {self.test.text()}; {self.test_split.describe()}")
        found = ", ".join(f"{sh}x{sw} ({k})" for (sh, sw), k in
                          list(self.sizes_found.items())[:_SHOWN_SIZES])
        if len(self.sizes_found) > _SHOWN_SIZES:
            found += f", ... ({len(self.sizes_found)} sizes in all)"
        out.append(f"  images: {c} x {h} x {w} uint8, {self.size_chosen}; sizes found: {found}")
        out.extend(f"  note: {n}" for n in self.notes)
        return out

    def text(self) -> str:
        return "\n".join(self.lines())


def human_size(n: float) -> str:
    """Bytes as people read them: 512 B, 1.5 MB (decimal units, as upload progress shows)."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"
