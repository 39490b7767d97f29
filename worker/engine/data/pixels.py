"""A split's images as the engine reads them: [0, 1] RGB float32, N x 3 x H x W, made batch by
batch from how they are stored.

Built-in sets are generated in memory as float tensors. Uploaded files are memory-mapped: a
batch is read from the file (uint8, or float), scaled to [0, 1] and expanded to three
channels when it is asked for, so a job holds one batch of pixels, not the dataset, whatever
the file's size (the kernel keeps what it read in its page cache, which it may drop). Pixels
are a Bank: the job context hands them to every stage that reads banks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from stitchsim.files.header import TensorInfo
from stitchsim_worker.engine.core.bank import Bank

_NUMPY = {"U8": "<u1", "F16": "<f2", "F32": "<f4", "F64": "<f8", "BF16": "<u2"}
_CHECK_ROWS = 1024


class Pixels(Bank):
    """N images, indexable like a bank (a slice, or a tensor of sample indices)."""

    def __init__(self, stored: torch.Tensor | np.ndarray, dtype: str = "F32"):
        # Not Bank.__init__: nothing is allocated, the samples are read where they are.
        n, c, h, w = stored.shape
        self.n, self.shape, self.dtype = n, (3, h, w), torch.float32
        self._stored, self._stored_dtype = stored, dtype
        self._ram, self._mm = None, None

    @classmethod
    def mapped(cls, path: Path, tensor: TensorInfo) -> Pixels:
        """The tensor's bytes in a (validated) safetensors file, memory-mapped read-only."""
        array = np.memmap(path, dtype=np.dtype(_NUMPY[tensor.dtype]), mode="r",
                          offset=tensor.start, shape=tensor.shape)
        return cls(array, tensor.dtype)

    @property
    def on_disk(self) -> bool:
        return isinstance(self._stored, np.ndarray)

    @property
    def stored_bytes(self) -> int:
        return int(self._stored.nbytes)

    def write(self, start: int, values: torch.Tensor) -> None:
        raise TypeError("a dataset's pixels are read-only")

    def head(self, n: int | None) -> Pixels:
        """The first n samples (all when n is None), without reading them."""
        if n is None or n >= self.n:
            return self
        return Pixels(self._stored[:n], self._stored_dtype)

    def __getitem__(self, idx: torch.Tensor | slice) -> torch.Tensor:
        stored = self._stored
        if isinstance(stored, torch.Tensor):
            return stored[idx]
        rows = stored[idx] if isinstance(idx, slice) else stored[np.asarray(idx)]
        return self._as_pixels(np.array(rows))  # a copy: the map stays untouched

    def _as_pixels(self, rows: np.ndarray) -> torch.Tensor:
        x = torch.from_numpy(rows)
        if self._stored_dtype == "U8":
            x = x.float().div_(255.0)
        elif self._stored_dtype == "BF16":
            x = x.view(torch.bfloat16).float()
        else:
            x = x.float()
        if x.shape[-3] == 1:
            x = x.expand(*x.shape[:-3], 3, *x.shape[-2:])
        return x.contiguous()

    def float_problem(self) -> str | None:
        """What is wrong with float pixels (NaN, outside [0, 1]), read in chunks; None when
        they are fine or stored as uint8."""
        if self._stored_dtype == "U8" or isinstance(self._stored, torch.Tensor):
            return None  # uint8 cannot be out of range; built-in sets are generated in range
        for start in range(0, self.n, _CHECK_ROWS):
            x = self[slice(start, start + _CHECK_ROWS)]
            if not torch.isfinite(x).all():
                return "holds NaN or infinite values"
            if x.min() < 0 or x.max() > 1:
                return "must lie in [0, 1]; scale them or store uint8"
        return None
