"""A dataset source posted straight to POST /datasets (issue 38, item 7): a zip, an .npz, a
parquet or a tar is a source the client packs, not a torch.save checkpoint, and the answer
says how to pack it. The same zip sent as a checkpoint keeps the checkpoint hint. Against the
real gateway (`serve --workers 0`); nothing is stored."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fixtures_service import ServiceHandle


def _zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("cats/0.png", b"\x89PNG" + bytes(600))
    return buf.getvalue()


def _npz() -> bytes:
    buf = io.BytesIO()
    np.savez(buf, x_train=np.zeros((4, 8, 8), np.uint8), y_train=np.zeros(4, np.int64))
    return buf.getvalue()


def _parquet(tmp: Path) -> bytes:
    pq.write_table(pa.table({"label": list(range(100))}), tmp / "d.parquet")
    return (tmp / "d.parquet").read_bytes()


def _tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo("000001.png")
        info.size = 600
        tf.addfile(info, io.BytesIO(bytes(600)))
    return buf.getvalue()


@pytest.mark.parametrize("kind", ["zip", "npz", "parquet", "tar"])
def test_a_dataset_source_posted_to_datasets_is_told_to_be_packed(
        gateway_service: ServiceHandle, tmp_path: Path, kind: str) -> None:
    body = {"zip": _zip, "npz": _npz, "tar": _tar}.get(kind, lambda: _parquet(tmp_path))()
    key = gateway_service.create_key(f"hints-{kind}")  # its own: nothing else stored under it
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=gateway_service.url, headers=headers, timeout=60) as http:
        r = http.post("/datasets", files={"file": (f"d.{kind}", body)})
        assert r.status_code == 415, r.text
        message = r.json()["error"]["message"]
        assert "pack it into the service's dataset file with `stitchsim dataset pack" in message
        assert "torch.save" not in message and "export the weights" not in message
        listed = http.get("/datasets").json()
        items = listed.get("items", listed) if isinstance(listed, dict) else listed
        assert [d for d in items if not d.get("builtin")] == []
        if kind == "zip":  # as a checkpoint, a zip is most likely torch.save's
            r = http.post("/checkpoints", files={"file": ("m.zip", body)})
            assert r.status_code == 415 and "torch.save" in r.json()["error"]["message"]
