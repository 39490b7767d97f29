"""Per-sample tensors computed once per job: frozen models make them fixed.

A bank lives in RAM while the job's memory budget allows, else in a memory-mapped file, so
datasets larger than RAM would hold in one piece still work.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch


class Bank:
    """N samples of one fixed per-sample shape, indexable by a tensor of sample indices."""

    def __init__(self, n: int, shape: tuple[int, ...], dtype: torch.dtype, spill: Path | None):
        self.n, self.shape, self.dtype = n, shape, dtype
        self._mm: np.memmap | None = None
        if spill is None:
            self._ram: torch.Tensor | None = torch.empty((n, *shape), dtype=dtype)
        else:
            self._ram = None
            np_dtype = torch.empty((), dtype=dtype).numpy().dtype
            self._mm = np.lib.format.open_memmap(
                spill, mode="w+", dtype=np_dtype, shape=(n, *shape)
            )

    @staticmethod
    def nbytes(n: int, shape: tuple[int, ...], dtype: torch.dtype) -> int:
        return n * int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()

    def write(self, start: int, values: torch.Tensor) -> None:
        values = values.detach().to("cpu", self.dtype)
        if self._ram is not None:
            self._ram[start : start + len(values)] = values
        else:
            assert self._mm is not None
            self._mm[start : start + len(values)] = values.numpy()

    def __getitem__(self, idx: torch.Tensor | slice) -> torch.Tensor:
        if self._ram is not None:
            return self._ram[idx]
        assert self._mm is not None
        if isinstance(idx, slice):
            return torch.from_numpy(np.ascontiguousarray(self._mm[idx]))
        return torch.from_numpy(self._mm[idx.numpy()])

    def __len__(self) -> int:
        return self.n

    def all(self) -> torch.Tensor:
        return self[slice(0, self.n)]


class BankBuilder:
    """Creates banks, spilling to disk once the job's budget for RAM banks is spent."""

    def __init__(self, budget_bytes: int, spill_dir: Path | None = None):
        self.budget = budget_bytes
        self.used = 0
        self._spill_root = spill_dir
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._count = 0

    def _spill_path(self) -> Path:
        if self._tmp is None:
            if self._spill_root is not None:
                self._spill_root.mkdir(parents=True, exist_ok=True)
            self._tmp = tempfile.TemporaryDirectory(prefix="stitchsim-bank-", dir=self._spill_root)
        self._count += 1
        return Path(self._tmp.name) / f"bank{self._count}.npy"

    def new(self, n: int, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> Bank:
        size = Bank.nbytes(n, shape, dtype)
        if self.used + size <= self.budget:
            self.used += size
            return Bank(n, shape, dtype, None)
        return Bank(n, shape, dtype, self._spill_path())

    def compute(
        self,
        n: int,
        batch_size: int,
        fn: Callable[[slice], tuple[torch.Tensor, ...]],
        on_batch: Callable[[], None] | None = None,
    ) -> list[Bank]:
        """Run fn over [0, n) in batches; each returned tensor fills its own bank."""
        banks: list[Bank] = []
        for start in range(0, n, batch_size):
            sl = slice(start, min(n, start + batch_size))
            with torch.no_grad():
                outs = fn(sl)
            if not banks:
                banks = [self.new(n, tuple(o.shape[1:]), o.dtype) for o in outs]
            for bank, out in zip(banks, outs, strict=True):
                bank.write(start, out)
            if on_batch is not None:
                on_batch()
        return banks

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def batches(
    n: int, batch_size: int, generator: torch.Generator | None = None
) -> Iterator[torch.Tensor]:
    """Sample indices in minibatches; shuffled when a generator is given (sorted within a batch
    so that disk-backed banks read forwards)."""
    order = torch.randperm(n, generator=generator) if generator is not None else torch.arange(n)
    for start in range(0, n, batch_size):
        idx = order[start : start + batch_size]
        yield idx.sort().values if generator is not None else idx
