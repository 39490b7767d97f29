"""The service's dataset file, written image by image: the header first (every size is known
from the first read), then each image straight to its place, so packing needs memory for one
image, not for the dataset. Written to a temporary name beside the target and renamed only
once it is whole and passes the service's own validator."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path

import numpy as np

from stitchsim.files.dataset import check_dataset
from stitchsim.files.errors import SafetensorsError

_ALIGN = 8


class DatasetWriter:
    def __init__(self, out: Path, counts: dict[str, int], chw: tuple[int, int, int],
                 labelled: bool, metadata: dict[str, str]):
        self.out, self.chw = out, chw
        self.image_bytes = int(np.prod(chw))
        entries: dict[str, dict[str, object]] = {}
        offset = 0
        # Labels first: int64 at 8-byte aligned offsets, then the uint8 images.
        if labelled:
            for split in ("train", "test"):
                size = counts[split] * 8
                entries[f"{split}_labels"] = {"dtype": "I64", "shape": [counts[split]],
                                              "data_offsets": [offset, offset + size]}
                offset += size
        for split in ("train", "test"):
            size = counts[split] * self.image_bytes
            entries[f"{split}_images"] = {"dtype": "U8", "shape": [counts[split], *chw],
                                          "data_offsets": [offset, offset + size]}
            offset += size
        header = json.dumps({"__metadata__": metadata, **entries}, sort_keys=True,
                            separators=(",", ":")).encode()
        header += b" " * (-(8 + len(header)) % _ALIGN)
        self.data_start = 8 + len(header)
        self.size = self.data_start + offset
        self.offsets = {name: self.data_start + int(e["data_offsets"][0])  # type: ignore[index]
                        for name, e in entries.items()}
        out.parent.mkdir(parents=True, exist_ok=True)
        # Not mkstemp: its 0600 would stay on the file; this one gets the umask's permissions.
        self.tmp = out.with_name(f".{out.name}.{os.getpid()}.{secrets.token_hex(4)}.part")
        self.fh = open(self.tmp, "x+b")  # noqa: SIM115 (closed by finish or abort)
        self.fh.write(len(header).to_bytes(8, "little") + header)
        self.fh.truncate(self.size)

    def labels(self, split: str, ids: np.ndarray) -> None:
        self.fh.seek(self.offsets[f"{split}_labels"])
        self.fh.write(np.ascontiguousarray(ids, dtype="<i8").tobytes())

    def image(self, split: str, position: int, chw: np.ndarray) -> None:
        assert chw.shape == self.chw and chw.dtype == np.uint8
        self.fh.seek(self.offsets[f"{split}_images"] + position * self.image_bytes)
        self.fh.write(chw.tobytes())

    def finish(self) -> int:
        """Close, validate and move into place; the file's size."""
        self.fh.close()
        try:
            check_dataset(self.tmp)
        except SafetensorsError as exc:  # a bug of the packer, not the user's data
            self.abort()
            raise RuntimeError(f"the packed file fails the service's checks: {exc}") from exc
        os.replace(self.tmp, self.out)
        return self.size

    def abort(self) -> None:
        with contextlib.suppress(OSError):
            self.fh.close()
        self.tmp.unlink(missing_ok=True)
