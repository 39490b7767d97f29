"""Dataset sources as people have them, written in a test: PNG class folders (and zips and
tars of them), Hugging Face-style parquet, .npz, WebDataset tars. Each builder takes images
(N x H x W x C uint8) and class ids, so a test can compare what was packed with what it
wrote."""

from __future__ import annotations

import io
import json
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image


def random_images(n: int, size: tuple[int, int] = (12, 12), channels: int = 3,
                  seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    shape = (n, *size) if channels == 1 else (n, *size, channels)
    return rng.integers(0, 256, shape, dtype=np.uint8)


def png(image: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return buf.getvalue()


def image_folder(root: Path, images: np.ndarray, labels: np.ndarray,
                 names: list[str]) -> dict[str, int]:
    """ROOT/CLASS/NNNN.png; returns each file's label by its path relative to root."""
    found = {}
    for i, (image, y) in enumerate(zip(images, labels, strict=True)):
        rel = f"{names[y]}/{i:04d}.png"
        (root / names[y]).mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(png(image))
        found[rel] = int(y)
    return found


def zip_of(folder: Path, out: Path, prefix: str = "") -> Path:
    with zipfile.ZipFile(out, "w") as zf:
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                zf.write(p, prefix + p.relative_to(folder).as_posix())
    return out


def tar_of(folder: Path, out: Path, prefix: str = "") -> Path:
    with tarfile.open(out, "w:gz" if out.name.endswith("gz") else "w") as tf:
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                tf.add(p, prefix + p.relative_to(folder).as_posix())
    return out


def hf_parquet(out: Path, images: np.ndarray, labels: np.ndarray, names: list[str],
               *, image_column: str = "image", label_column: str = "label") -> Path:
    """What `datasets.Dataset.to_parquet` writes for an Image and a ClassLabel feature."""
    structs = [{"bytes": png(im), "path": f"{i}.png"} for i, im in enumerate(images)]
    table = pa.table({
        image_column: pa.array(structs, type=pa.struct([("bytes", pa.binary()),
                                                        ("path", pa.string())])),
        label_column: pa.array(labels.astype(np.int64)),
    })
    features = {image_column: {"_type": "Image"},
                label_column: {"_type": "ClassLabel", "names": names}}
    meta = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    pq.write_table(table.replace_schema_metadata(meta), out)
    return out


def webdataset_tar(out: Path, images: np.ndarray, labels: list[int | str],
                   label_ext: str = "cls") -> Path:
    with tarfile.open(out, "w") as tf:
        for i, (image, y) in enumerate(zip(images, labels, strict=True)):
            for name, data in ((f"shard/{i:06d}.png", png(image)),
                               (f"shard/{i:06d}.{label_ext}", str(y).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return out


def read_packed(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a packed file, read with the safetensors library itself."""
    from safetensors.numpy import load_file

    return load_file(str(path))
