"""Bring your own data, end to end: a folder of PNGs in class subfolders and a parquet export
go from `stitchsim check --dataset` to a report through a real `stitchsim-server serve`, with
no conversion by hand; an unlabelled folder is packed and refused with the service's 422.

The images are the built-in digits the fixture models were trained on, written out as PNG
files and a Hugging Face-style parquet, so the models' accuracy in the report shows that every
image reached the service with its own class. Jobs are tiny (one point, one direction, the
standard protocol, one epoch on 200 samples).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from stitchsim import Client
from stitchsim.models import Report
from stitchsim_worker.engine.data.datasets import builtin

from tests.client.sources import hf_parquet, image_folder, png
from tests.client.test_e2e import service_args, stitchsim

TINY = [
    "--layers", "layer2", "--objectives", "slm", "--directions", "front_to_back",
    "--protocols", "standard", "--set", "train.epochs=1", "--threshold", "0.9",
    "--progress", "none", "--timeout", "240",
]  # fmt: skip
N = 250
NAMES = [f"digit{d}" for d in range(10)]  # sorted as the class ids are


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray]:
    """N digits (as the fixture models saw them in training) as uint8 H x W x C, with labels."""
    ds = builtin("digits_digit_only").train
    images = (ds.images[:N] * 255).round().to(dtype=ds.images.dtype).numpy()
    return images.transpose(0, 2, 3, 1).astype(np.uint8), ds.labels[:N].numpy()


def _check(live_service: Any, ckpts: Any, dataset: Path, out: Path, *extra: str) -> Any:
    return stitchsim(
        "check", str(ckpts.digits_resnet), str(ckpts.digits_resnet), *service_args(live_service),
        "--dataset", str(dataset), *TINY, "--json", str(out), *extra)


def test_a_folder_of_pngs_in_class_folders_goes_to_a_report(
        live_service: Any, ckpts: Any, digits: tuple[np.ndarray, np.ndarray],
        tmp_path: Path) -> None:
    images, labels = digits
    image_folder(tmp_path / "digits", images, labels, NAMES)
    run = _check(live_service, ckpts, tmp_path / "digits", tmp_path / "report.json")
    assert run.code == 0, run.err
    # What was packed, shown before the upload.
    assert f"stitchsim: packed {tmp_path / 'digits'} (ImageFolder) into " in run.err
    assert "stitchsim:   classes: 10 (digit0, digit1," in run.err
    assert "stitchsim:   train: 199 images (digit0 22, digit1 14," in run.err
    report = Report.model_validate_json((tmp_path / "report.json").read_text())
    assert report.verdict == "similar"
    # 20 % of each class (rounded) made the test split.
    assert report.dataset["n_train"] == 199 and report.dataset["n_test"] == 51
    assert report.dataset["n_classes"] == 10 and report.dataset["source_format"] == "imagefolder"
    assert report.dataset["test_split"] == ("made from the training split when packed: 20% of "
                                            "it, stratified by class, seed 0")
    # Every image arrived with its own class: the model recognises them as in training.
    assert report.front.accuracy > 0.85, report.front.accuracy


def test_a_parquet_export_goes_to_a_report(
        live_service: Any, ckpts: Any, digits: tuple[np.ndarray, np.ndarray],
        tmp_path: Path) -> None:
    images, labels = digits
    train = hf_parquet(tmp_path / "train.parquet", images[:200], labels[:200], NAMES)
    test = hf_parquet(tmp_path / "test.parquet", images[200:], labels[200:], NAMES)
    run = _check(live_service, ckpts, train, tmp_path / "report.json",
                 "--pack", f"test={test}")
    assert run.code == 0, run.err
    assert "(parquet) into" in run.err and "images from column 'image'" in run.err
    report = Report.model_validate_json((tmp_path / "report.json").read_text())
    assert report.dataset["source_format"] == "parquet"
    assert report.dataset["test_split"] == "given by the source"
    assert report.dataset["n_test"] == 50 and report.front.accuracy > 0.85


def test_unlabelled_images_are_stored_and_refused_by_a_job_that_needs_labels(
        live_service: Any, ckpts: Any, digits: tuple[np.ndarray, np.ndarray],
        tmp_path: Path) -> None:
    images, _ = digits
    loose = tmp_path / "loose"
    loose.mkdir()
    for i, image in enumerate(images[:60]):
        (loose / f"{i}.png").write_bytes(png(image))
    run = _check(live_service, ckpts, loose, tmp_path / "report.json")
    assert run.code == 2 and "no class folders" in run.err and "uploading" not in run.err
    run = _check(live_service, ckpts, loose, tmp_path / "report.json", "--pack",
                 "unlabelled=true")
    assert run.code == 2, run.err
    assert "has no labels, and this job needs them for: logits outputs" in run.err
    assert "(labels_needed)" in run.err
    # The upload was accepted and stored without labels; the job was refused.
    with Client(live_service.url, live_service.api_key) as client:
        mine = [d for d in client.datasets() if not d.builtin and not d.labelled]
    assert [(d.n_train, d.n_test, d.n_classes, d.source_format) for d in mine] == [
        (48, 12, None, "imagefolder")]
    assert mine[0].test_split is not None and "random" in mine[0].test_split
