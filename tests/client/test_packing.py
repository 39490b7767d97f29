"""`stitchsim dataset pack`: every reader on a small dataset written here (PNG class folders
and zips and tars of them, a Hugging Face-style parquet, .npz, WebDataset tars, the service's
own file), what the packed file holds (every image with its class, the test split made
stratified when none is given), the summary, and the bad inputs, each refused naming the file
and what to fix, with nothing written."""

from __future__ import annotations

import io
import json
import stat
import tarfile
import zipfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from stitchsim.catalogue import DATASET_FORMATS
from stitchsim.cli import main
from stitchsim.errors import DatasetSourceError, MissingExtra
from stitchsim.files.dataset import check_dataset
from stitchsim.packing import PackOptions, pack_dataset
from stitchsim.packing.formats import MODULES, reader

from tests.client.sources import (
    hf_parquet,
    image_folder,
    png,
    random_images,
    read_packed,
    tar_of,
    webdataset_tar,
    zip_of,
)
from tests.service.helpers import safetensors_bytes

NAMES = ["ant", "bee", "cat"]


def _dataset(n: int = 60, size: tuple[int, int] = (12, 12), seed: int = 0
             ) -> tuple[np.ndarray, np.ndarray]:
    return random_images(n, size, seed=seed), np.arange(n) % len(NAMES)


def _as_stored(images: np.ndarray) -> list[bytes]:
    """Source images (N x H x W [x C]) as the packed file holds them, one bytes per image."""
    chw = images[:, None] if images.ndim == 3 else images.transpose(0, 3, 1, 2)
    return [im.tobytes() for im in np.ascontiguousarray(chw)]


def _packed_pairs(t: dict[str, np.ndarray]) -> Counter[tuple[bytes, int]]:
    return Counter((im.tobytes(), int(y)) for s in ("train", "test")
                   for im, y in zip(t[f"{s}_images"], t[f"{s}_labels"], strict=True))


def _expected(images: np.ndarray, labels: np.ndarray) -> Counter[tuple[bytes, int]]:
    return Counter(zip(_as_stored(images), (int(y) for y in labels), strict=True))


# ---------------------------------------------------------------- readers


def test_image_folder_keeps_every_image_with_its_class_and_makes_a_stratified_test_split(
        tmp_path: Path) -> None:
    images, labels = _dataset()
    image_folder(tmp_path / "pets", images, labels, NAMES)
    (tmp_path / "pets" / "README.txt").write_text("not an image")
    out = tmp_path / "pets.safetensors"
    summary = pack_dataset(tmp_path / "pets", out)

    t = read_packed(out)
    assert t["train_images"].shape == (48, 3, 12, 12) and t["test_images"].shape == (12, 3, 12, 12)
    assert t["train_images"].dtype == np.uint8 and t["train_labels"].dtype == np.int64
    assert _packed_pairs(t) == _expected(images, labels)  # every image, with its own class
    # 20 % of each class, so both splits keep the classes' shares.
    assert Counter(t["test_labels"].tolist()) == {0: 4, 1: 4, 2: 4}
    # Shuffled, so a prefix (max_train_samples) holds every class.
    assert set(t["train_labels"][:6].tolist()) == {0, 1, 2}

    info = check_dataset(out)
    assert info.classes == tuple(NAMES) and info.source_format == "imagefolder"
    assert info.test_split is not None and info.test_split.made
    assert (info.test_split.fraction, info.test_split.seed, info.test_split.stratified) == (
        0.2, 0, True)
    text = summary.text()
    assert "classes: 3 (ant, bee, cat)" in text
    assert "train: 48 images (ant 16, bee 16, cat 16)" in text
    assert "test: 12 images (ant 4, bee 4, cat 4); made from the training split" in text
    assert "3 x 12 x 12 uint8" in text and "README.txt" in text
    # The same source and options give the same bytes: the service stores it once.
    again = tmp_path / "again.safetensors"
    pack_dataset(tmp_path / "pets", again)
    assert again.read_bytes() == out.read_bytes()


def test_train_and_test_folders_in_a_folder_a_zip_and_a_tar_pack_alike(tmp_path: Path) -> None:
    images, labels = _dataset(90)
    root = tmp_path / "data"
    image_folder(root / "train", images[:60], labels[:60], NAMES)
    image_folder(root / "val", images[60:], labels[60:], NAMES)
    sources = [root, zip_of(root, tmp_path / "data.zip", prefix="data/"),
               tar_of(root, tmp_path / "data.tar.gz", prefix="data/")]
    packed = []
    for i, src in enumerate(sources):
        out = tmp_path / f"{i}.safetensors"
        summary = pack_dataset(src, out)
        assert summary.format == "imagefolder" and not summary.test_split.made
        packed.append(read_packed(out))
    first = packed[0]
    assert len(first["train_labels"]) == 60 and len(first["test_labels"]) == 30
    assert Counter(x.tobytes() for x in first["test_images"]) == Counter(
        _as_stored(images[60:]))
    for other in packed[1:]:
        assert all(np.array_equal(first[k], other[k]) for k in first)


def test_parquet_export_reads_images_labels_and_class_names(tmp_path: Path) -> None:
    images, labels = _dataset(50)
    train = hf_parquet(tmp_path / "train-00000-of-00001.parquet", images, labels, NAMES)
    test_images, test_labels = _dataset(20, seed=1)
    test = hf_parquet(tmp_path / "test-00000-of-00001.parquet", test_images, test_labels, NAMES)
    out = tmp_path / "hf.safetensors"
    summary = pack_dataset(train, out, PackOptions(test=test))
    t = read_packed(out)
    assert _packed_pairs(t) == _expected(images, labels) + _expected(test_images, test_labels)
    assert len(t["test_labels"]) == 20 and summary.classes == tuple(NAMES)
    assert check_dataset(out).classes == tuple(NAMES)  # ClassLabel names, from the export
    assert "images from column 'image', labels from 'label'" in summary.text()


def test_npz_of_arrays_in_either_layout(tmp_path: Path) -> None:
    grey, labels = random_images(60, channels=1), np.arange(60) % 4
    np.savez(tmp_path / "keras.npz", x_train=grey, y_train=labels)
    summary = pack_dataset(tmp_path / "keras.npz", tmp_path / "a.safetensors")
    t = read_packed(tmp_path / "a.safetensors")
    assert t["train_images"].shape[1:] == (1, 12, 12)  # grey stays one channel
    assert _packed_pairs(t) == _expected(grey, labels) and summary.test_split.made

    rgb = random_images(30)
    floats = rgb.transpose(0, 3, 1, 2).astype(np.float32) / 255  # N x C x H x W in [0, 1]
    np.savez_compressed(tmp_path / "ours.npz", train_images=floats[:20],
                        train_labels=np.arange(20) % 2, test_images=floats[20:],
                        test_labels=np.arange(10) % 2, extra=np.zeros(3))
    summary = pack_dataset(tmp_path / "ours.npz", tmp_path / "b.safetensors")
    t = read_packed(tmp_path / "b.safetensors")
    assert Counter(x.tobytes() for x in t["test_images"]) == Counter(_as_stored(rgb[20:]))
    assert not summary.test_split.made and "arrays not read: extra" in summary.text()


def test_webdataset_tars_with_cls_and_txt_labels(tmp_path: Path) -> None:
    images, labels = _dataset(60)
    tar = webdataset_tar(tmp_path / "shard-000000.tar", images, labels.tolist())
    summary = pack_dataset(tar, tmp_path / "a.safetensors")
    assert summary.format == "webdataset"
    assert _packed_pairs(read_packed(tmp_path / "a.safetensors")) == _expected(images, labels)

    named = webdataset_tar(tmp_path / "named.tar", images, [NAMES[y] for y in labels],
                           label_ext="txt")
    summary = pack_dataset(named, tmp_path / "b.safetensors")
    assert summary.classes == tuple(NAMES)
    assert _packed_pairs(read_packed(tmp_path / "b.safetensors")) == _expected(images, labels)


def test_the_services_own_file_repacks_floats_to_uint8(tmp_path: Path) -> None:
    rgb = random_images(30)
    chw = rgb.transpose(0, 3, 1, 2)
    src = tmp_path / "float.safetensors"
    src.write_bytes(safetensors_bytes({
        "train_images": chw[:20].astype(np.float32) / 255, "train_labels": np.arange(20) % 2,
        "test_images": chw[20:].astype(np.float32) / 255, "test_labels": np.arange(10) % 2}))
    summary = pack_dataset(src, tmp_path / "u8.safetensors")
    t = read_packed(tmp_path / "u8.safetensors")
    assert t["train_images"].dtype == np.uint8 and summary.format == "safetensors"
    assert Counter(x.tobytes() for x in t["train_images"]) == Counter(_as_stored(rgb[:20]))


def test_unlabelled_images_are_stored_without_labels_only_when_asked(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    for i, image in enumerate(random_images(50)):
        (loose / f"{i}.png").write_bytes(png(image))
    with pytest.raises(DatasetSourceError, match="no class folders.*--unlabelled"):
        pack_dataset(loose, tmp_path / "x.safetensors")
    summary = pack_dataset(loose, tmp_path / "u.safetensors", PackOptions(unlabelled=True))
    t = read_packed(tmp_path / "u.safetensors")
    assert set(t) == {"train_images", "test_images"} and len(t["test_images"]) == 10
    info = check_dataset(tmp_path / "u.safetensors")
    assert not info.labelled and info.test_split is not None
    assert not info.test_split.stratified and "classes: none (unlabelled" in summary.text()


def test_mixed_sizes_go_to_the_most_common_size_or_the_one_given(tmp_path: Path) -> None:
    root = tmp_path / "mixed"
    images, labels = _dataset(60)
    image_folder(root, images, labels, NAMES)
    big = random_images(3, (24, 36), seed=5)  # 2:3, so centre-cropped to a square
    for i, image in enumerate(big):
        (root / "ant" / f"big{i}.png").write_bytes(png(image))
    summary = pack_dataset(root, tmp_path / "a.safetensors")
    assert summary.image_shape == (3, 12, 12)
    assert summary.sizes_found == {(12, 12): 60, (24, 36): 3}
    assert "3 of 63 images resized to 12x12 (the most common size)" in summary.text()
    t = read_packed(tmp_path / "a.safetensors")
    # The 60 of the common size are stored untouched.
    stored = Counter(x.tobytes() for s in ("train", "test") for x in t[f"{s}_images"])
    assert sum(stored[b] for b in _as_stored(images)) == 60

    summary = pack_dataset(root, tmp_path / "b.safetensors", PackOptions(size="8x16"))
    assert read_packed(tmp_path / "b.safetensors")["train_images"].shape[1:] == (3, 8, 16)
    assert "63 of 63 images resized to 8x16 (the size given)" in summary.text()


# ---------------------------------------------------------------- bad input


def _zip_with(tmp_path: Path, name: str, info: zipfile.ZipInfo, data: bytes) -> Path:
    images, labels = _dataset(60)
    folder = tmp_path / "ok"
    image_folder(folder, images, labels, NAMES)
    out = zip_of(folder, tmp_path / name)
    with zipfile.ZipFile(out, "a") as zf:
        zf.writestr(info, data)
    return out


def _tar_with(tmp_path: Path, info: tarfile.TarInfo, data: bytes = b"") -> Path:
    images, labels = _dataset(60)
    folder = tmp_path / "ok"
    image_folder(folder, images, labels, NAMES)
    out = tar_of(folder, tmp_path / "bad.tar")
    with tarfile.open(out, "a") as tf:
        tf.addfile(info, io.BytesIO(data) if data else None)
    return out


def _bomb(tmp_path: Path) -> Path:
    out = tmp_path / "bomb.zip"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf, zf.open("ant/0.png", "w") as fh:
        for _ in range(80):
            fh.write(bytes(1024 * 1024))  # 80 MiB of zeros, a few hundred KB compressed
    return out


def _symlink_zip(tmp_path: Path) -> Path:
    info = zipfile.ZipInfo("bee/link.png")
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    return _zip_with(tmp_path, "link.zip", info, b"/etc/passwd")


def _symlink_tar(tmp_path: Path) -> Path:
    info = tarfile.TarInfo("bee/link.png")
    info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
    return _tar_with(tmp_path, info)


def _escaping_tar(tmp_path: Path) -> Path:
    info = tarfile.TarInfo("../../escape.png")
    info.size = 3
    return _tar_with(tmp_path, info, b"png")


def _one_class(tmp_path: Path) -> Path:
    images, _ = _dataset(30)
    image_folder(tmp_path / "one", images, np.zeros(30, dtype=int), NAMES)
    return tmp_path / "one"


def _unreadable(tmp_path: Path) -> Path:
    images, labels = _dataset(60)
    image_folder(tmp_path / "broken", images, labels, NAMES)
    (tmp_path / "broken" / "bee" / "0001.png").write_bytes(b"\x89PNG but not really")
    (tmp_path / "broken" / "cat" / "empty.jpg").write_bytes(b"")
    return tmp_path / "broken"


def _empty(tmp_path: Path) -> Path:
    (tmp_path / "empty" / "ant").mkdir(parents=True)
    (tmp_path / "empty" / "ant" / "notes.txt").write_text("x")
    return tmp_path / "empty"


def _parquet_without_labels(tmp_path: Path) -> Path:
    images, labels = _dataset(60)
    return hf_parquet(tmp_path / "fine.parquet", images, labels, NAMES,
                      label_column="fine_label")


def _too_few(tmp_path: Path) -> Path:
    images, labels = _dataset(24)
    image_folder(tmp_path / "few", images, labels, NAMES)
    return tmp_path / "few"


BAD = {
    "no images": (_empty, "found no images"),
    "one class": (_one_class, "one class only \\('ant'\\)"),
    "unreadable images": (_unreadable, "2 unreadable images: bee/0001.png .*cat/empty.jpg"),
    "parquet without a label column": (
        _parquet_without_labels,
        "no label column .*its columns: image \\(struct<bytes: binary, path: string>\\), "
        "fine_label \\(int64\\); name the label column"),
    "zip escaping its root": (
        lambda p: _zip_with(p, "escape.zip", zipfile.ZipInfo("../../escape.png"), b"x"),
        "'../../escape.png' points outside the archive's root"),
    "zip with a symlink": (_symlink_zip, "'bee/link.png' is a symbolic link"),
    "zip bomb": (_bomb, "unpacks to 83886080 bytes .*times\\), more than the 100 times this "
                 "client accepts"),
    "tar with a symlink": (_symlink_tar, "'bee/link.png' is a link"),
    "tar escaping its root": (_escaping_tar, "points outside the archive's root"),
    "too few images for a test split": (_too_few, "24 images give 6 test images .* at least 10"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_sources_are_refused_naming_the_file_and_writing_nothing(
        tmp_path: Path, case: str) -> None:
    make, message = BAD[case]
    src = make(tmp_path)
    out = tmp_path / "out" / "packed.safetensors"
    with pytest.raises(DatasetSourceError, match=message) as info:
        pack_dataset(src, out)
    assert str(info.value).startswith(f"{src}: ")
    assert not out.exists() and not list(tmp_path.glob("out/.*part"))


def test_parquet_columns_named_that_do_not_exist_list_the_columns(tmp_path: Path) -> None:
    images, labels = _dataset(60)
    src = hf_parquet(tmp_path / "d.parquet", images, labels, NAMES, label_column="fine_label")
    with pytest.raises(DatasetSourceError, match="no column 'lbl' \\(label_column\\); its "
                       "columns: image .*, fine_label \\(int64\\)"):
        pack_dataset(src, tmp_path / "o.safetensors", PackOptions(label_column="lbl"))
    pack_dataset(src, tmp_path / "o.safetensors", PackOptions(label_column="fine_label"))
    assert check_dataset(tmp_path / "o.safetensors").classes == tuple(NAMES)


def test_an_image_that_fails_to_decode_midway_leaves_no_file(tmp_path: Path) -> None:
    images, labels = _dataset(60)
    root = tmp_path / "trunc"
    image_folder(root, images, labels, NAMES)
    whole = (root / "bee" / "0001.png").read_bytes()
    (root / "bee" / "0001.png").write_bytes(whole[: len(whole) // 2])  # header fine, data cut
    out = tmp_path / "t.safetensors"
    with pytest.raises(DatasetSourceError, match="bee/0001.png"):
        pack_dataset(root, out)
    assert list(tmp_path.glob("*.safetensors")) == [] and list(tmp_path.glob(".*part")) == []


# ---------------------------------------------------------------- CLI, extra, catalogue


def test_cli_pack_prints_what_it_found(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    images, labels = _dataset()
    image_folder(tmp_path / "pets", images, labels, NAMES)
    out = io.StringIO()
    code = main(["dataset", "pack", str(tmp_path / "pets"), str(tmp_path / "p.safetensors"),
                 "--size", "8", "--test-fraction", "0.5"], out=out)
    lines = out.getvalue().splitlines()
    assert code == 0 and lines[0].startswith(f"packed {tmp_path / 'pets'} (ImageFolder) into ")
    assert "  train: 30 images (ant 10, bee 10, cat 10)" in lines
    assert any(line.startswith("  images: 3 x 8 x 8 uint8, the size given") for line in lines)
    assert main(["dataset", "pack", str(tmp_path / "pets" / "ant"),
                 str(tmp_path / "q.safetensors")], out=io.StringIO()) == 2
    assert "no class folders" in capsys.readouterr().err
    assert main(["dataset", "pack", str(tmp_path / "pets"), str(tmp_path / "q.safetensors"),
                 "--size", "2000"], out=io.StringIO()) == 2
    assert "sides must lie in 1..1024" in capsys.readouterr().err


def test_a_client_without_the_data_extra_names_the_pip_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "pyarrow" else find_spec(name, *a))
    images, labels = _dataset(60)
    src = hf_parquet(tmp_path / "d.parquet", images, labels, NAMES)
    with pytest.raises(MissingExtra, match="needs pyarrow.*pip install 'stitchsim\\[data\\]'"):
        pack_dataset(src, tmp_path / "o.safetensors")


def test_every_catalogued_format_has_its_reader() -> None:
    assert set(MODULES) == set(DATASET_FORMATS.names)
    for name in DATASET_FORMATS.names:
        module = __import__(MODULES[name], fromlist=["NAME"])
        assert name == module.NAME and callable(reader(name))


def test_packing_options_for_a_dataset_not_uploaded_from_a_path_are_refused() -> None:
    from stitchsim import Client
    from stitchsim.errors import UsageError

    with Client("http://127.0.0.1:9") as client, pytest.raises(  # nothing listens: no request
            UsageError, match="packing options apply to a dataset uploaded from a file or "
            "folder, but dataset is 'digits'"):
        client.compare("sha256:" + "0" * 64, "sha256:" + "1" * 64, dataset="digits",
                       dataset_options={"size": 64})


def test_pack_options_parse_sizes_and_refuse_unknown_fields() -> None:
    assert PackOptions(size="48x64").size == (48, 64) and PackOptions(size=32).size == (32, 32)
    for bad in ({"size": "big"}, {"test_fraction": 1.5}, {"format": "hdf5"}, {"colour": 1}):
        with pytest.raises(ValueError):
            PackOptions.model_validate(bad)
    assert json.loads(PackOptions(size="8").model_dump_json())["size"] == [8, 8]
