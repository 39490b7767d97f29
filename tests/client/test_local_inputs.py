"""Local inputs that must never reach the service (issue 38, items 4, 5 and 7): a model or
dataset folder with a symbolic link to a file outside it, a crafted .npz whose member declares
far more data than it holds, an empty class folder, a WebDataset tar detected by itself, an
image Pillow cannot read. The CLI runs as a subprocess, as a user runs it, against the real
gateway (`serve --workers 0`); what the service stored afterwards is asked of it directly."""

from __future__ import annotations

import io
import json
import os
import struct
import tarfile
import zipfile
from pathlib import Path

import httpx
import numpy as np
import pytest
from stitchsim.errors import DatasetSourceError
from stitchsim.files.folder import InvalidModelFolder, pack_model_folder
from stitchsim.files.header import read_header
from stitchsim.packing import pack_dataset

from tests.client.files import write_safetensors
from tests.client.sources import image_folder, png, random_images
from tests.client.test_e2e import stitchsim
from tests.fixtures_models import Untrained
from tests.fixtures_service import ServiceHandle

HF = {"model_type": "vit", "architectures": ["ViTForImageClassification"], "num_labels": 10}
NAMES = ["ant", "bee", "cat"]
SECRET = "outside-the-folder: not to be uploaded"


@pytest.fixture
def key(gateway_service: ServiceHandle, request: pytest.FixtureRequest) -> str:
    return gateway_service.create_key(request.node.name[:40])


def _stored(svc: ServiceHandle, key: str, kind: str) -> list[dict[str, object]]:
    r = httpx.get(f"{svc.url}/{kind}", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    r.raise_for_status()
    body = r.json()
    items = body.get("items", body) if isinstance(body, dict) else body
    return [i for i in items if not i.get("builtin")]


def _model_folder(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(HF))
    write_safetensors(root / "model.safetensors", b"weights" * 8, metadata={"format": "pt"})
    return root


def _secret(tmp_path: Path) -> Path:
    secret = tmp_path / "elsewhere" / "secret.json"
    secret.parent.mkdir()
    secret.write_text(json.dumps({"token": SECRET}))
    return secret


# ---------------------------------------------------------------- item 4: links


def test_points_refuses_a_model_folder_linking_outside_and_stores_nothing(
        gateway_service: ServiceHandle, key: str, tmp_path: Path) -> None:
    folder = _model_folder(tmp_path / "cloned")
    os.symlink(_secret(tmp_path), folder / "preprocessor_config.json")
    run = stitchsim("points", str(folder), "--url", gateway_service.url, "--api-key", key,
                    timeout=120)
    assert run.code == 2, (run.code, run.err)
    assert ("preprocessor_config.json is a symbolic link to "
            f"{tmp_path / 'elsewhere' / 'secret.json'}, outside the folder") in run.err
    assert "Traceback" not in run.err
    assert _stored(gateway_service, key, "checkpoints") == []


def test_the_hugging_face_caches_own_links_still_pack(tmp_path: Path) -> None:
    repo = tmp_path / "hub" / "models--org--tiny"
    snap = repo / "snapshots" / "0123abc"
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo / "blobs" / "c0ffee").write_text(json.dumps(HF))
    write_safetensors(repo / "blobs" / "beef", b"weights" * 8, metadata={"format": "pt"})
    os.symlink("../../blobs/c0ffee", snap / "config.json")
    os.symlink("../../blobs/beef", snap / "model.safetensors")
    packed = pack_model_folder(snap, tmp_path / "a.safetensors")
    assert json.loads(read_header(packed.path).metadata["config.json"]) == HF

    # Out of the repository's folder, even into the same cache, is outside.
    other = tmp_path / "hub" / "models--org--other" / "blobs"
    other.mkdir(parents=True)
    (other / "f00d").write_text(json.dumps({"image_mean": [0.5] * 3}))
    os.symlink(other / "f00d", snap / "preprocessor_config.json")
    with pytest.raises(InvalidModelFolder, match="preprocessor_config.json is a symbolic link "
                       "to .*models--org--other/blobs/f00d, outside the folder"):
        pack_model_folder(snap, tmp_path / "b.safetensors")
    assert not (tmp_path / "b.safetensors").exists()


def test_a_dataset_folder_follows_links_inside_it_and_refuses_one_outside(
        tmp_path: Path) -> None:
    images = random_images(60, seed=3)
    root = tmp_path / "pets"
    image_folder(root, images, np.arange(60) % 3, NAMES)
    # A link between class folders stays inside: it is read like any image.
    os.symlink(root / "ant" / "0000.png", root / "bee" / "alias.png")
    summary = pack_dataset(root, tmp_path / "ok.safetensors")
    assert summary.train.n + summary.test.n == 61
    outside = tmp_path / "private.png"
    outside.write_bytes(png(images[0]))
    os.symlink(outside, root / "cat" / "leak.png")
    with pytest.raises(DatasetSourceError, match="cat/leak.png is a symbolic link to "
                       f"{outside}, outside the folder {root}"):
        pack_dataset(root, tmp_path / "bad.safetensors")
    assert not (tmp_path / "bad.safetensors").exists()
    # A link to a folder outside is refused the same way (it would not even be walked).
    (root / "cat" / "leak.png").unlink()
    (tmp_path / "photos").mkdir()
    os.symlink(tmp_path / "photos", root / "dog")
    with pytest.raises(DatasetSourceError, match="dog is a symbolic link to "
                       f"{tmp_path / 'photos'}, outside the folder"):
        pack_dataset(root, tmp_path / "bad.safetensors")


def test_check_refuses_a_dataset_folder_linking_outside_before_any_upload(
        gateway_service: ServiceHandle, key: str, untrained: Untrained, tmp_path: Path
) -> None:
    root = tmp_path / "pets"
    image_folder(root, random_images(60), np.arange(60) % 3, NAMES)
    os.symlink(_secret(tmp_path), root / "ant" / "x.png")
    run = stitchsim("check", str(untrained.front), str(untrained.back),
                    "--dataset", str(root), "--url", gateway_service.url, "--api-key", key,
                    "--threshold", "0.9", "--progress", "none", timeout=120)
    assert run.code == 2, (run.code, run.err)
    assert "ant/x.png is a symbolic link to" in run.err and "Traceback" not in run.err
    # Item 7: every local input is checked before anything is uploaded.
    assert _stored(gateway_service, key, "checkpoints") == []
    assert _stored(gateway_service, key, "datasets") == []


# ---------------------------------------------------------------- item 5: crafted npz


def _npy(shape: tuple[int, ...], descr: str, data: bytes) -> bytes:
    header = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode()
    header += b" " * (-(10 + len(header) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + data


def _crafted_npz(path: Path, declared: int) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("x_train.npy", _npy((declared // 144, 12, 12), "|u1", bytes(1024)))
        zf.writestr("y_train.npy", _npy((declared // 144,), "<i8", bytes(1024)))
    return path


@pytest.mark.parametrize("declared", [100 * 10**9, 4 * 10**9])
def test_an_npz_declaring_more_than_it_holds_is_refused_by_the_cli(
        tmp_path: Path, declared: int) -> None:
    src = _crafted_npz(tmp_path / "crafted.npz", declared)
    run = stitchsim("dataset", "pack", str(src), str(tmp_path / "out.safetensors"), timeout=120)
    assert run.code == 2, (run.code, run.err)
    n = declared // 144
    assert (f"{src}: array x_train declares shape [{n}, 12, 12] of uint8 ({n * 144:,} bytes) "
            "but holds 1,024 bytes of data") in run.err
    assert "Traceback" not in run.err and "pickle" not in run.err
    assert not (tmp_path / "out.safetensors").exists()


def test_an_npz_of_python_objects_is_refused_as_a_pickle(tmp_path: Path) -> None:
    src = tmp_path / "objects.npz"
    np.savez(src, x_train=np.array([{"a": 1}] * 20, dtype=object), y_train=np.zeros(20))
    with pytest.raises(DatasetSourceError, match="array x_train holds Python objects "
                       "\\(object\\), which only a pickle can read"):
        pack_dataset(src, tmp_path / "o.safetensors")


# ---------------------------------------------------------------- item 7: messages


def test_an_empty_class_folder_is_named_in_what_is_printed_before_the_upload(
        tmp_path: Path) -> None:
    root = tmp_path / "pets"
    image_folder(root, random_images(60), np.arange(60) % 3, NAMES)
    (root / "dog").mkdir()
    (root / "eel").mkdir()
    (root / "eel" / "README.txt").write_text("no images yet")
    run = stitchsim("dataset", "pack", str(root), str(tmp_path / "p.safetensors"), timeout=120)
    assert run.code == 0, run.err
    assert ("class folders with no images, left out: dog, eel (3 classes remain)"
            in run.out), run.out


def test_an_image_pillow_cannot_read_is_named_without_a_python_object(tmp_path: Path) -> None:
    root = tmp_path / "pets"
    image_folder(root, random_images(60), np.arange(60) % 3, NAMES)
    (root / "bee" / "0001.png").write_bytes(b"not an image at all")
    with pytest.raises(DatasetSourceError) as info:
        pack_dataset(root, tmp_path / "o.safetensors")
    assert "bee/0001.png (not an image file Pillow can read" in str(info.value)
    assert "object at 0x" not in str(info.value) and "BytesIO" not in str(info.value)


def _webdataset(out: Path, label_ext: str) -> Path:
    with tarfile.open(out, "w") as tf:
        for i, image in enumerate(random_images(30)):
            for name, data in ((f"{i:06d}.png", png(image)), (f"{i:06d}.{label_ext}", b"1")):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return out


def test_a_webdataset_tar_told_by_its_members_gets_webdataset_messages(tmp_path: Path) -> None:
    # Samples with a label file of an unknown kind: a WebDataset by its layout (key.ext
    # pairs), not a folder of classes.
    src = _webdataset(tmp_path / "shards.tar", "label")
    with pytest.raises(DatasetSourceError) as info:
        pack_dataset(src, tmp_path / "o.safetensors")
    message = str(info.value)
    assert "ImageFolder" not in message and "class folders" not in message, message
    assert "sample '000000' has no label (label, png)" in message
    assert "read as a WebDataset" in message and "--format" in message


def test_check_with_a_bad_dataset_archive_uploads_no_checkpoint(
        gateway_service: ServiceHandle, key: str, untrained: Untrained, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.zip"
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("../../escape.png", png(random_images(1)[0]))
    run = stitchsim("check", str(untrained.front), str(untrained.back), "--dataset", str(bad),
                    "--url", gateway_service.url, "--api-key", key, "--threshold", "0.9",
                    "--progress", "none", timeout=120)
    assert run.code == 2, (run.code, run.err)
    assert "'../../escape.png' points outside the archive's root" in run.err
    assert "uploading" not in run.err
    assert _stored(gateway_service, key, "checkpoints") == []
