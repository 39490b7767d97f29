"""The upload spool (gateway.uploads._Spool) on its own: whatever the pieces the body arrives
in (tiny, odd, more than one vectored write takes), the file on disk is the body and the
hash is its SHA-256, computed while streaming; sizes over the cap are refused at once."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import struct
from pathlib import Path

import pytest
from stitchsim.failure import Failure
from stitchsim_service.gateway.uploads import _IOV_MAX, _Spool


def _body(n_data: int) -> bytes:
    header = json.dumps({"t": {"dtype": "U8", "shape": [n_data],
                               "data_offsets": [0, n_data]}}).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + random.Random(0).randbytes(n_data)


def _spool(tmp_path: Path, limit: int = 1 << 30) -> _Spool:
    path = tmp_path / "upload.part"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    return _Spool("file", None, path, limit, 1 << 20, fd)


@pytest.mark.parametrize("sizes", ["tiny", "odd", "big"])
def test_spool_writes_and_hashes_the_body(tmp_path: Path, sizes: str) -> None:
    body = _body(9 << 20)
    rng = random.Random(1)
    pick = {"tiny": lambda: rng.randint(1, 64),  # > _IOV_MAX chunks in one flush
            "odd": lambda: rng.randint(1, 300_000), "big": lambda: 3 << 20}[sizes]

    async def run() -> tuple[str, int]:
        spool = _spool(tmp_path)
        i = 0
        while i < len(body):
            n = pick() if i > 200_000 or sizes != "tiny" else 4096
            if spool.add(body[i:i + n]):
                await spool.flush()
            i += n
        up = await spool.finish()
        return up.sha256, up.size

    if sizes == "tiny":
        body = body[: (_IOV_MAX * 3 * 64) + 300_000]  # enough tiny chunks, still quick
    digest, size = asyncio.run(run())
    assert size == len(body)
    assert digest == hashlib.sha256(body).hexdigest()
    assert (tmp_path / "upload.part").read_bytes() == body


def test_spool_refuses_beyond_the_cap_and_leaves_nothing(tmp_path: Path) -> None:
    body = _body(1 << 20)

    async def run() -> None:
        spool = _spool(tmp_path, limit=len(body) - 1)
        try:
            for i in range(0, len(body), 65536):
                if spool.add(body[i:i + 65536]):
                    await spool.flush()
        except Failure:
            spool.abort()
            raise

    with pytest.raises(Failure) as err:
        asyncio.run(run())
    assert err.value.code == "too_large"
    assert not (tmp_path / "upload.part").exists()
