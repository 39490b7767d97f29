"""Packing the datasets people have into the service's one dataset file.

    options   PackOptions: what a user may choose (format, test source, size, split, columns)
    deps      the `data` extra (numpy, Pillow, pyarrow): a clear error naming it when missing
    archives  zip and tar members read safely (no escaping paths, links or bombs)
    formats   one reader per catalogue entry of DATASET_FORMATS, and telling them apart
    images    image bytes and arrays to uint8 C x H x W at a common size
    labels    labels as found to class ids and names; the test split made from train
    writer    the safetensors file written image by image (memory flat in the dataset's size)
    pack      reading twice (sizes, then pixels), the summary, the file
    summary   PackSummary: what was found and done, as a report and as text

Everything but `options` and `summary` needs the extra, so this package imports it lazily:
`import stitchsim` works on a client installed without it.
"""

from __future__ import annotations

from pathlib import Path

from stitchsim.packing.options import PackOptions
from stitchsim.packing.summary import PackSummary

__all__ = ["PackOptions", "PackSummary", "pack_dataset", "is_service_file"]


def pack_dataset(source: str | Path, out: str | Path,
                 options: PackOptions | None = None) -> PackSummary:
    """Read `source` (any supported format), write the service's dataset file to `out` and
    return what was found and done. Raises DatasetSourceError (what to fix, naming the file)
    or MissingExtra (the `data` extra is not installed); `out` is only written whole."""
    from stitchsim.packing import deps
    from stitchsim.packing.formats import detect

    options = options or PackOptions()
    # The extra is checked before anything imports numpy, so its absence reads as what to do.
    deps.require(detect(Path(source), options.format))
    if options.test is not None:
        deps.require(detect(options.test))
    from stitchsim.packing.pack import pack

    return pack(Path(source), Path(out), options)


def is_service_file(path: str | Path) -> bool:
    """A file already in the service's format, uploaded as it is (no packing)."""
    p = Path(path)
    return p.is_file() and p.name.lower().endswith(".safetensors")
