"""The `data` extra: the readers need numpy and Pillow (and pyarrow for parquet), which a
client installed for CI alone does without. Missing ones are named with the pip command."""

from __future__ import annotations

import importlib.util

from stitchsim.catalogue import DATASET_FORMATS
from stitchsim.errors import MissingExtra

INSTALL = "pip install 'stitchsim[data]'"
_DISTRIBUTIONS = {"PIL": "Pillow"}
"""Import names whose distribution on PyPI is named otherwise."""


def require(format_name: str) -> None:
    """Raise MissingExtra unless every package the format's reader needs is importable."""
    entry = DATASET_FORMATS[format_name]
    missing = [_DISTRIBUTIONS.get(m, m) for m in entry.needs if not _importable(m)]
    if missing:
        raise MissingExtra(
            f"reading {entry.label} datasets needs {', '.join(missing)}, which this client was "
            f"installed without; install the client's data extra: {INSTALL}")


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a module blocked in sys.modules
        return False
