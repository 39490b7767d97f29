"""WebDataset: a tar of samples, each sample the files that share a key (the path up to the
first dot of the file name: `shard/000017.jpg` and `shard/000017.cls` are sample
`shard/000017`), kept together in the tar as WebDataset writes them.

A sample's image is its file with an image extension (jpg, jpeg, png, webp, bmp, ppm, pgm,
tif, tiff, gif; the first of these, in that order, if it has several); its label is, in this
order of preference, `.cls` (an integer as text), `.json` (an integer, or an object with
"label", "cls" or "class") or `.txt` (a class name, or an integer). Other files (`.seg.png`,
`.meta.json` ...) are ignored. One tar is one split; a second tar (`test`) gives the test
split. Read forwards only, so compressed tars are never re-read from the start.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

from stitchsim.packing.archives import TarTree, hidden
from stitchsim.packing.options import PackOptions
from stitchsim.packing.records import Found, Label, Record, Stream

NAME = "webdataset"
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp", "ppm", "pgm", "tif", "tiff", "gif")
LABEL_EXTS = ("cls", "json", "txt")
_KEY = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")  # webdataset's own base_plus_ext
_JSON_KEYS = ("label", "cls", "class")


def split_key(path: str) -> tuple[str, str] | None:
    m = _KEY.match(path)
    return (m.group(1), m.group(2).lower()) if m else None


def _samples(tree: TarTree, options: PackOptions) -> tuple[list[tuple[str, str, str | None]],
                                                          list[str]]:
    """(key, image member, label member) per sample in tar order, and notes."""
    samples: list[tuple[str, str, str | None]] = []
    seen: set[str] = set()
    notes: list[str] = []
    loose = 0
    groups: list[tuple[str, dict[str, str]]] = []
    for rel in tree.files():
        parsed = split_key(rel)
        if hidden(rel) or parsed is None:
            loose += 1
            continue
        key, ext = parsed
        if groups and groups[-1][0] == key:
            groups[-1][1][ext] = rel
            continue
        if key in seen:
            raise tree.error(f"the files of sample {key!r} are not together in the tar; "
                             "WebDataset keeps each sample's files next to each other")
        seen.add(key)
        groups.append((key, {ext: rel}))
    for key, files in groups:
        image = next((files[e] for e in IMAGE_EXTS if e in files), None)
        if image is None:
            raise tree.error(f"sample {key!r} has no image ({', '.join(sorted(files))}); "
                             f"each sample needs one of .{', .'.join(IMAGE_EXTS)}")
        label = None
        if not options.unlabelled:
            label = next((files[e] for e in LABEL_EXTS if e in files), None)
            if label is None:
                raise tree.error(
                    f"sample {key!r} has no label ({', '.join(sorted(files))}); give each "
                    "sample a .cls, .json or .txt file, or pack without labels (--unlabelled)")
        samples.append((key, image, label))
    if not samples:
        raise tree.error("holds no WebDataset samples (files KEY.jpg, KEY.png ... with "
                         "KEY.cls, KEY.json or KEY.txt)")
    if loose:
        notes.append(f"skipped {loose} files that belong to no sample")
    return samples, notes


def parse_label(tree: TarTree, member: str, data: bytes) -> Label:
    ext = member.rsplit(".", 1)[-1].lower()
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise tree.error(f"{member} is not UTF-8 text") from None
    if ext == "json":
        try:
            value = json.loads(text)
        except ValueError:
            raise tree.error(f"{member} is not valid JSON") from None
        if isinstance(value, dict):
            value = next((value[k] for k in _JSON_KEYS if k in value), None)
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise tree.error(f"{member}: expected an integer label, or an object with "
                             f"{', '.join(_JSON_KEYS)}")
        return value
    if ext == "cls" or text.lstrip("-").isdigit():
        try:
            return int(text)
        except ValueError:
            raise tree.error(f"{member}: a .cls file holds an integer, not {text[:40]!r}"
                             ) from None
    if not text:
        raise tree.error(f"{member} is empty")
    return text


def read(path: Path, options: PackOptions) -> Found:
    tree = TarTree(path)
    samples, notes = _samples(tree, options)
    return Found(NAME, path, {"train": Stream(str(path), _scanner(tree, samples))},
                 labelled=not options.unlabelled, notes=notes)


def _scanner(tree: TarTree, samples: list[tuple[str, str, str | None]]
             ) -> Callable[[], Iterator[Record]]:
    role: dict[str, tuple[str, bool]] = {}  # member: (its sample's key, whether the image)
    for key, image, label in samples:
        role[image] = (key, True)
        if label is not None:
            role[label] = (key, False)

    def scan() -> Iterator[Record]:
        # A sample's files are adjacent in the tar: it is complete when the next key starts.
        key, image, label = None, b"", None
        for rel, data in tree.read(set(role)):
            owner, is_image = role[rel]
            if owner != key:
                if key is not None:
                    yield Record(key, label, image)
                key, image, label = owner, b"", None
            if is_image:
                image = data
            else:
                label = parse_label(tree, rel, data)
        if key is not None:
            yield Record(key, label, image)

    return scan
