"""Packing a source: read it twice (sizes and labels first, pixels second) and write the
service's dataset file, with a summary of what was found and done.

The first read decides everything the file's header needs: the classes, the splits (the test
split made from train when the source has none), each image's place, the stored size (given,
or the most common) and the channels (one when every image is grey). Unreadable images are
collected there and reported together, naming them. The second read decodes, resizes and
writes each image to its place; a failure there removes the partial file.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from stitchsim.catalogue import DATASET_FORMATS
from stitchsim.errors import DatasetSourceError
from stitchsim.files.dataset import (
    META_CLASSES,
    META_NOTES,
    META_SOURCE_FORMAT,
    META_TEST_SPLIT,
    TestSplit,
)
from stitchsim.files.limits import MAX_IMAGE_SIDE
from stitchsim.packing import deps
from stitchsim.packing.labels import Classes, check_size, class_ids, make_test_split, shuffled
from stitchsim.packing.options import PackOptions
from stitchsim.packing.records import Found, Label, Stream
from stitchsim.packing.summary import PackSummary, SplitCount

_SHOWN_BAD = 5


@dataclass
class _Scan:
    """The first read of one split."""

    wheres: list[str] = field(default_factory=list)
    labels: list[Label] = field(default_factory=list)
    sizes: list[tuple[int, int]] = field(default_factory=list)
    grey: bool = True


def read_source(path: Path, options: PackOptions, *, given: str | None = None) -> Found:
    from stitchsim.packing.formats import detect, detected_as, reader

    name = detect(path, given)
    deps.require(name)
    try:
        return reader(name)(path, options)
    except DatasetSourceError as exc:
        if given is not None or not (hint := detected_as(path, name)):
            raise
        raise DatasetSourceError(f"{exc.message}{hint}") from None


def _scan(source: Path, stream: Stream) -> _Scan:
    from stitchsim.packing.images import BadImage, probe

    out, bad, n_bad = _Scan(), [], 0
    for record in stream.scan():
        try:
            p = probe(record)
        except BadImage as exc:
            n_bad += 1
            if len(bad) < _SHOWN_BAD:
                bad.append(f"{record.where} ({exc})")
            continue
        out.wheres.append(record.where)
        out.labels.append(record.label)
        out.sizes.append((p.height, p.width))
        out.grey = out.grey and p.grey
    if n_bad:
        more = f" and {n_bad - len(bad)} more" if n_bad > len(bad) else ""
        raise DatasetSourceError(
            f"{source}: {n_bad} unreadable images: {'; '.join(bad)}{more}; remove or replace "
            "them (nothing was written)")
    if not out.wheres:
        raise DatasetSourceError(f"{source}: {stream.name} holds no images")
    return out


def _splits(options: PackOptions, found: Found, test: Found | None) -> dict[str, Stream]:
    if test is None:
        return found.splits
    if "test" in found.splits:
        raise DatasetSourceError(f"{found.source}: already holds a test split; leave out the "
                                 f"test source {test.source}")
    if "test" in test.splits:
        raise DatasetSourceError(f"{test.source}: a test source is one split, but this one "
                                 "holds two")
    if test.labelled != found.labelled:
        raise DatasetSourceError(f"{test.source}: the test source must be labelled as the "
                                 "training source is")
    return {"train": found.splits["train"], "test": test.splits["train"]}


def _target_size(source: Path, sizes: Counter[tuple[int, int]], options: PackOptions
                 ) -> tuple[tuple[int, int], str]:
    if options.size is not None:
        return options.size, "the size given"
    (h, w), _ = sizes.most_common(1)[0]
    if max(h, w) > MAX_IMAGE_SIDE:
        raise DatasetSourceError(
            f"{source}: the most common image size is {h}x{w}, larger than the {MAX_IMAGE_SIDE} "
            "pixels a side the service stores; choose a size (size=224, --size 224)")
    return (h, w), "the most common size" + (" (choose another with size=, --size)"
                                             if len(sizes) > 1 else "")


@dataclass
class _Plan:
    """Everything the file's header needs, decided by the first read."""

    classes: Classes | None
    layout: dict[str, tuple[str, np.ndarray]]
    """Each output split as (the source split its records come from, their indices in the
    file's order)."""
    how: TestSplit
    size: tuple[int, int]
    size_chosen: str
    grey: bool
    resized: int
    notes: list[str]

    @property
    def chw(self) -> tuple[int, int, int]:
        return (1 if self.grey else 3, *self.size)


def _plan(found: Found, test: Found | None, scans: dict[str, _Scan],
          options: PackOptions) -> _Plan:
    source = found.source
    classes = None
    if found.labelled:
        classes = class_ids(source, {s: sc.labels for s, sc in scans.items()},
                            {s: sc.wheres for s, sc in scans.items()},
                            found.class_names or (test.class_names if test else None))
    layout: dict[str, tuple[str, np.ndarray]] = {}
    if "test" in scans:
        how = found.test_split or TestSplit(made=False)
        for split in ("train", "test"):
            check_size(source, split, len(scans[split].wheres))
            layout[split] = (split, np.arange(len(scans[split].wheres)))
    else:
        ids = classes.ids["train"] if classes else None
        train, test_idx, how = make_test_split(source, len(scans["train"].wheres), ids,
                                               options.test_fraction, options.seed)
        layout = {"train": ("train", train), "test": ("train", test_idx)}
    layout = {s: (src, shuffled(idx, options.seed, s)) for s, (src, idx) in layout.items()}
    used = Counter(scans[src].sizes[i] for src, idx in layout.values() for i in idx)
    size, chosen = _target_size(source, used, options)
    notes = list(found.notes) + (list(test.notes) if test else [])
    resized = sum(k for sz, k in used.items() if sz != size)
    if resized:
        notes.append(f"{resized} of {sum(used.values())} images resized to {size[0]}x{size[1]} "
                     f"({chosen.split(' (')[0]}): scaled to cover it and centre-cropped")
    return _Plan(classes, layout, how, size, chosen, all(sc.grey for sc in scans.values()),
                 resized, notes)


def _write(out: Path, found: Found, plan: _Plan, streams: dict[str, Stream],
           sources: dict[str, Path], scans: dict[str, _Scan]) -> int:
    """The second read: every image decoded into its place; the file's size."""
    from stitchsim.packing.images import BadImage, pixels
    from stitchsim.packing.writer import DatasetWriter

    counts = {s: len(idx) for s, (_, idx) in plan.layout.items()}
    writer = DatasetWriter(out, counts, plan.chw, plan.classes is not None,
                           _metadata(found, plan.classes, plan.how, plan.notes))
    try:
        if plan.classes is not None:
            for s, (src, idx) in plan.layout.items():
                writer.labels(s, plan.classes.ids[src][idx])
        for src, stream in streams.items():
            place = {int(i): (s, pos) for s, (from_, idx) in plan.layout.items()
                     if from_ == src for pos, i in enumerate(idx)}
            wheres = scans[src].wheres
            for i, record in enumerate(stream.scan()):
                if i >= len(wheres) or record.where != wheres[i]:
                    raise DatasetSourceError(f"{sources[src]}: changed while it was packed; "
                                             "pack it again")
                try:
                    chw, _ = pixels(record, plan.size, plan.grey)
                except BadImage as exc:
                    raise DatasetSourceError(f"{sources[src]}: {record.where} cannot be "
                                             f"decoded ({exc}); remove or replace it") from None
                writer.image(*place[i], chw)
        return writer.finish()
    except BaseException:
        writer.abort()
        raise


def pack(source: Path, out: Path, options: PackOptions) -> PackSummary:
    found = read_source(source, options, given=options.format)
    test = read_source(options.test, options) if options.test is not None else None
    streams = _splits(options, found, test)
    sources = {s: test.source if test is not None and s == "test" else source for s in streams}
    scans = {split: _scan(sources[split], stream) for split, stream in streams.items()}
    plan = _plan(found, test, scans, options)
    nbytes = _write(out, found, plan, streams, sources, scans)
    return PackSummary(
        source=source, format=found.format, out=out, out_bytes=nbytes,
        classes=plan.classes.names if plan.classes else None,
        train=_count(plan.classes, plan.layout["train"]),
        test=_count(plan.classes, plan.layout["test"]), test_split=plan.how,
        image_shape=plan.chw,
        sizes_found=dict(Counter(sz for sc in scans.values() for sz in sc.sizes).most_common()),
        resized=plan.resized, size_chosen=plan.size_chosen, notes=tuple(plan.notes),
        test_source=options.test)


def _count(classes: Classes | None, split: tuple[str, np.ndarray]) -> SplitCount:
    src, idx = split
    if classes is None:
        return SplitCount(len(idx))
    ids = classes.ids[src][idx]
    per = np.bincount(ids, minlength=len(classes.names))
    return SplitCount(len(idx), {classes.names[c]: int(k) for c, k in enumerate(per) if k})


def _metadata(found: Found, classes: Classes | None, how: TestSplit, notes: list[str]
              ) -> dict[str, str]:
    label = DATASET_FORMATS.label(found.format)
    meta = {META_SOURCE_FORMAT: found.format, META_TEST_SPLIT: how.as_metadata(),
            "description": f"{found.source.name} ({label})"}
    if classes is not None:
        meta[META_CLASSES] = json.dumps(list(classes.names))
    if notes:
        meta[META_NOTES] = json.dumps(notes)
    return meta
