"""ImageFolder: one folder per class holding its images (torchvision's layout), in a
directory or in a zip or tar of one.

    ROOT/CLASS/IMAGE                    one split: the test split is made from it
    ROOT/train/CLASS/IMAGE, ROOT/test/CLASS/IMAGE
                                        both splits (test may be called val, valid,
                                        validation or testing; train may be training)

Images are told by their extension (png, jpg, jpeg, bmp, gif, ppm, pgm, tif, tiff, webp);
other files, dot files and macOS's __MACOSX/ are skipped (and counted in a note). Class names
are the folder names, sorted (label = index). An archive whose contents sit in one folder
(`dataset.zip` holding `dataset/cats/...`) is read from inside that folder. Images directly
in a split's folder, beside class folders, are skipped as torchvision skips them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath

from stitchsim.errors import DatasetSourceError
from stitchsim.packing.archives import Tree, hidden, open_tree
from stitchsim.packing.images import IMAGE_SUFFIXES
from stitchsim.packing.options import PackOptions
from stitchsim.packing.records import Found, Record, Stream

NAME = "imagefolder"
SPLIT_FOLDERS = {"train": ("train", "training"),
                 "test": ("test", "testing", "val", "valid", "validation")}


def _depth(path: str) -> int:
    return len(PurePosixPath(path).parts)


def _root(images: list[str]) -> str:
    """The folder everything sits in, when an archive or folder wraps the dataset in one."""
    prefix = ""
    while images and all(_depth(p) >= 3 for p in images):
        first = {PurePosixPath(p).parts[0] for p in images}
        if len(first) != 1 or first & {n for names in SPLIT_FOLDERS.values() for n in names}:
            break
        top = first.pop()
        prefix += top + "/"
        images = [p[len(top) + 1:] for p in images]
    return prefix


def _split_folder(tops: set[str], split: str) -> str | None:
    by_lower = {t.lower(): t for t in tops}
    return next((by_lower[n] for n in SPLIT_FOLDERS[split] if n in by_lower), None)


def read(path: Path, options: PackOptions) -> Found:
    tree = open_tree(path)
    files = [f for f in tree.files() if not hidden(f)]
    images = [f for f in files if f.lower().endswith(IMAGE_SUFFIXES)]
    notes = []
    if len(files) > len(images):
        odd = sorted(set(files) - set(images))
        notes.append(f"skipped {len(odd)} files that are not images by their extension "
                     f"(e.g. {odd[0]})")
    if not images:
        raise DatasetSourceError(
            f"{path}: found no images (files ending in {', '.join(IMAGE_SUFFIXES)}); an "
            "ImageFolder holds one folder per class with the images in it")
    prefix = _root(images)
    rel = {f: f[len(prefix):] for f in images}
    tops = {PurePosixPath(r).parts[0] for r in rel.values() if _depth(r) > 1}
    train_dir = _split_folder(tops, "train")
    groups: dict[str, list[str]] = {}
    folders = {"train": prefix}
    if train_dir is None:
        groups["train"] = images
    else:
        test_dir = _split_folder(tops, "test")
        for split, folder in (("train", train_dir), ("test", test_dir)):
            if folder is not None:
                groups[split] = [f for f in images if rel[f].startswith(folder + "/")]
                folders[split] = f"{prefix}{folder}/"
        used = sum(len(g) for g in groups.values())
        if used < len(images):
            notes.append(f"skipped {len(images) - used} images outside the "
                         f"{' and '.join(f'{d}/' for d in (train_dir, test_dir) if d)} folders")
        rel = {f: r.split("/", 1)[1] for f, r in rel.items() if _depth(r) > 1}
    splits = {}
    for split, members in groups.items():
        labels = _labels(path, folders[split], members, rel, options, notes)
        if not options.unlabelled:
            _note_empty_classes(tree, folders[split], set(labels.values()), notes)
        splits[split] = Stream(f"{path}:{split}", _scanner(tree, members, labels))
    return Found(NAME, path, splits, labelled=not options.unlabelled, notes=notes)


def _labels(path: Path, folder: str, members: list[str], rel: dict[str, str],
            options: PackOptions, notes: list[str]) -> dict[str, str | None]:
    if options.unlabelled:
        return dict.fromkeys(members)
    nested = [f for f in members if _depth(rel[f]) > 1]
    where = f"{folder}" if folder else "its top folder"
    if not nested:
        raise DatasetSourceError(
            f"{path}: found {len(members)} images in {where} but no class folders; an "
            "ImageFolder holds one folder per class (ROOT/CLASS/IMAGE.png). Put the images "
            "into class folders, or pack them without labels (--unlabelled)")
    if len(nested) < len(members):
        notes.append(f"skipped {len(members) - len(nested)} images in {where} that sit beside "
                     "the class folders, in no class")
        members[:] = nested
    return {f: PurePosixPath(rel[f]).parts[0] for f in nested}


def _note_empty_classes(tree: Tree, folder: str, classes: set[str | None],
                        notes: list[str]) -> None:
    """Class folders with no image in them (empty, or holding other files only) are no class:
    say which, as torchvision would find them missing too."""
    children = {PurePosixPath(d[len(folder):]).parts[0] for d in tree.folders()
                if d.startswith(folder) and len(d) > len(folder)}
    empty = sorted(c for c in children - classes if not hidden(c))
    if empty:
        where = f"{folder}: " if folder else ""
        notes.append(f"{where}class folders with no images, left out: {', '.join(empty)} "
                     f"({len(classes)} classes remain)")


def _scanner(tree: Tree, members: list[str], labels: dict[str, str | None]
             ) -> Callable[[], Iterator[Record]]:
    wanted = set(members)

    def scan() -> Iterator[Record]:
        for rel, data in tree.read(wanted):
            yield Record(rel, labels[rel], data)

    return scan
