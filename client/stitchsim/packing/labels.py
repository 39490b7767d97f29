"""Labels as found (class names or ids) to class ids and names, and the splits: the test split
made from the training split when the source has none, and each split's order.

Both use one seeded generator, so packing the same source with the same options writes the
same bytes (the service stores it once, by content). Each split is shuffled: the service reads
prefixes of a split (train.max_train_samples, max_test_samples), and a prefix of a folder
read class by class would hold one class.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stitchsim.errors import DatasetSourceError
from stitchsim.files.dataset import TestSplit
from stitchsim.files.limits import MAX_CLASSES, MIN_SAMPLES
from stitchsim.packing.records import Label


@dataclass(frozen=True)
class Classes:
    names: tuple[str, ...]
    ids: dict[str, np.ndarray]
    """Per source split: each record's class id (int64), in the order read."""


def class_ids(source: Path, labels: dict[str, list[Label]], wheres: dict[str, list[str]],
              hf_names: list[str] | None) -> Classes:
    every = [(s, i, y) for s, ys in labels.items() for i, y in enumerate(ys)]
    missing = [(s, i) for s, i, y in every if y is None]
    if missing:
        s, i = missing[0]
        raise DatasetSourceError(f"{source}: {len(missing)} images have no label (e.g. "
                                 f"{wheres[s][i]}); label them all, or pack without labels "
                                 "(--unlabelled)")
    if all(isinstance(y, int) and not isinstance(y, bool) for _, _, y in every):
        return _from_ids(source, labels, hf_names)
    if all(isinstance(y, str) for _, _, y in every):
        return _from_names(source, labels)
    raise DatasetSourceError(f"{source}: some labels are integers and some are names; use one "
                             "kind for all")


def _from_ids(source: Path, labels: dict[str, list[Label]], hf_names: list[str] | None
              ) -> Classes:
    ids = {s: np.asarray(ys, dtype=np.int64) for s, ys in labels.items()}
    low = min(int(a.min()) for a in ids.values())
    high = max(int(a.max()) for a in ids.values())
    if low < 0:
        raise DatasetSourceError(
            f"{source}: labels go down to {low}; class ids are 0 or more (Hugging Face writes -1 "
            "for 'no label': pack such a split without labels, or leave it out)")
    if high >= MAX_CLASSES:
        raise DatasetSourceError(f"{source}: labels go up to {high}; the service takes class ids "
                                 f"below {MAX_CLASSES}")
    names = hf_names if hf_names and len(hf_names) > high else [str(i) for i in range(high + 1)]
    _at_least_two(source, ids["train"], names)
    return Classes(tuple(names), ids)


def _from_names(source: Path, labels: dict[str, list[Label]]) -> Classes:
    names = sorted({str(y) for y in labels["train"]})
    unknown = sorted({str(y) for s, ys in labels.items() if s != "train" for y in ys}
                     - set(names))
    if unknown:
        raise DatasetSourceError(
            f"{source}: the test split has classes the training split lacks: "
            f"{', '.join(unknown[:10])}; every test class needs training images")
    index = {name: i for i, name in enumerate(names)}
    ids = {s: np.asarray([index[str(y)] for y in ys], dtype=np.int64) for s, ys in labels.items()}
    if len(names) > MAX_CLASSES:
        raise DatasetSourceError(f"{source}: {len(names)} classes; the service takes at most "
                                 f"{MAX_CLASSES}")
    _at_least_two(source, ids["train"], names)
    return Classes(tuple(names), ids)


def _at_least_two(source: Path, train: np.ndarray, names: list[str]) -> None:
    present = np.unique(train)
    if len(present) < 2:
        which = f" ({names[int(present[0])]!r})" if len(present) else ""
        raise DatasetSourceError(
            f"{source}: the training split holds one class only{which}; comparing classifiers "
            "needs at least two classes (one folder, or one label value, per class)")


def make_test_split(source: Path, n: int, ids: np.ndarray | None, fraction: float,
                    seed: int) -> tuple[np.ndarray, np.ndarray, TestSplit]:
    """(train indices, test indices, how): stratified by class when labelled, so every class
    keeps its share; a class of one image stays in train."""
    rng = np.random.default_rng([seed, 1])
    if ids is None:
        order = rng.permutation(n)
        k = round(n * fraction)
        test, train = order[:k], order[k:]
    else:
        tests, trains = [], []
        for c in np.unique(ids):
            members = rng.permutation(np.flatnonzero(ids == c))
            k = min(round(len(members) * fraction), len(members) - 1)
            tests.append(members[:k])
            trains.append(members[k:])
        test, train = np.concatenate(tests), np.concatenate(trains)
    for split, idx in (("train", train), ("test", test)):
        if len(idx) < MIN_SAMPLES:
            raise DatasetSourceError(
                f"{source}: {n} images give {len(idx)} {split} images at a test fraction of "
                f"{fraction:g}; each split needs at least {MIN_SAMPLES}: add images, change "
                "the fraction (test_fraction=, --test-fraction) or give a test split")
    how = TestSplit(made=True, fraction=fraction, seed=seed, stratified=ids is not None)
    return np.sort(train), np.sort(test), how


def shuffled(idx: np.ndarray, seed: int, split: str) -> np.ndarray:
    """The split's order in the file: seeded, one stream per split."""
    return np.random.default_rng([seed, 2, 0 if split == "train" else 1]).permutation(idx)


def check_size(source: Path, split: str, n: int) -> None:
    if n < MIN_SAMPLES:
        raise DatasetSourceError(f"{source}: the {split} split holds {n} images; each split "
                                 f"needs at least {MIN_SAMPLES}")
