"""Parquet: a table with an image column and a label column, as Hugging Face `datasets`
exports it (`Dataset.to_parquet`, the Hub's parquet files): images as the struct
{bytes, path} of its Image feature, or as plain binary columns of encoded image files; labels
as integers (with class names from the ClassLabel feature the export records) or as strings.

Columns are named with image_column / label_column, or guessed: the image column is the one
column of image bytes (a struct with a `bytes` field, or binary), the label column one named
label, labels, class, target, y or category. Anything else is a clear error listing the
columns found. One file is one split; a second file (`test`) gives the test split. Read in
batches of rows, never whole.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from stitchsim.errors import DatasetSourceError
from stitchsim.packing.options import PackOptions
from stitchsim.packing.records import Found, Record, Stream

NAME = "parquet"
LABEL_NAMES = ("label", "labels", "class", "target", "y", "category")
IMAGE_NAMES = ("image", "img", "picture", "photo")
_BATCH_ROWS = 256


def _open(path: Path) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise DatasetSourceError(f"{path}: not a readable parquet file ({exc})") from None


def _is_image_type(t: pa.DataType) -> bool:
    if pa.types.is_struct(t):
        return any(t.field(i).name == "bytes" and _is_binary(t.field(i).type)
                   for i in range(t.num_fields))
    return _is_binary(t)


def _is_binary(t: pa.DataType) -> bool:
    return pa.types.is_binary(t) or pa.types.is_large_binary(t)


def _is_label_type(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)


def _columns(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name} ({f.type})" for f in schema)


def _image_column(path: Path, schema: pa.Schema, given: str | None) -> str:
    if given is not None:
        if given not in schema.names:
            raise DatasetSourceError(
                f"{path}: no column {given!r} (image_column); its columns: {_columns(schema)}")
        if not _is_image_type(schema.field(given).type):
            raise DatasetSourceError(
                f"{path}: column {given!r} is {schema.field(given).type}, not image bytes (a "
                "binary column, or a struct with a binary `bytes` field)")
        return given
    found = [f.name for f in schema if _is_image_type(f.type)]
    preferred = [n for n in found if n.lower() in IMAGE_NAMES]
    if len(found) == 1 or len(preferred) == 1:
        return found[0] if len(found) == 1 else preferred[0]
    what = "several columns of image bytes" if found else "no column of image bytes"
    raise DatasetSourceError(
        f"{path}: {what} (binary, or a struct with a binary `bytes` field, as Hugging Face's "
        f"Image feature exports); its columns: {_columns(schema)}; name the image column "
        "(image_column=NAME, --image-column NAME)")


def _label_column(path: Path, schema: pa.Schema, given: str | None, image: str) -> str:
    if given is not None:
        if given not in schema.names:
            raise DatasetSourceError(
                f"{path}: no column {given!r} (label_column); its columns: {_columns(schema)}")
        if not _is_label_type(schema.field(given).type):
            raise DatasetSourceError(
                f"{path}: column {given!r} is {schema.field(given).type}; labels are integers "
                "or strings")
        return given
    found = [f.name for f in schema if f.name != image and f.name.lower() in LABEL_NAMES
             and _is_label_type(f.type)]
    if len(found) == 1:
        return found[0]
    what = f"several label columns ({', '.join(found)})" if found else "no label column"
    raise DatasetSourceError(
        f"{path}: {what} (an integer or string column named {', '.join(LABEL_NAMES)}); its "
        f"columns: {_columns(schema)}; name the label column (label_column=NAME, "
        "--label-column NAME), or pack the images without labels (--unlabelled)")


def _class_names(schema: pa.Schema, column: str) -> list[str] | None:
    """The names of a Hugging Face ClassLabel column, from the metadata its export writes."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if raw is None:
        return None
    try:
        feature = json.loads(raw)["info"]["features"][column]
    except (ValueError, KeyError, TypeError):
        return None
    names = feature.get("names") if isinstance(feature, dict) else None
    if feature.get("_type") == "ClassLabel" and isinstance(names, list) and all(
            isinstance(n, str) for n in names):
        return names
    return None


def _image_bytes(value: Any, where: str, path: Path) -> bytes:
    if isinstance(value, dict):
        data = value.get("bytes")
        if data is None:
            raise DatasetSourceError(
                f"{path}: {where} has no image bytes, only a path ({value.get('path')!r}); "
                "export the dataset with its images embedded (Hugging Face datasets does so in "
                "to_parquet and push_to_hub)")
        return bytes(data)
    if value is None:
        raise DatasetSourceError(f"{path}: {where} has no image (null)")
    return bytes(value)


def read(path: Path, options: PackOptions) -> Found:
    pf = _open(path)
    schema = pf.schema_arrow
    image = _image_column(path, schema, options.image_column)
    label = None if options.unlabelled else _label_column(path, schema, options.label_column,
                                                           image)
    columns = [image] + ([label] if label else [])

    def scan() -> Iterator[Record]:
        row = 0
        try:
            for batch in _open(path).iter_batches(batch_size=_BATCH_ROWS, columns=columns):
                images = batch.column(0).to_pylist()
                labels = batch.column(1).to_pylist() if label else [None] * len(images)
                for value, y in zip(images, labels, strict=True):
                    where = f"row {row}"
                    if label and y is None:
                        raise DatasetSourceError(f"{path}: {where} has no label (null in "
                                                 f"column {label!r})")
                    yield Record(where, y, _image_bytes(value, where, path))
                    row += 1
        except pa.ArrowException as exc:
            raise DatasetSourceError(f"{path}: cannot read row {row} on ({exc})") from None

    notes = [f"images from column {image!r}" + (f", labels from {label!r}" if label else "")]
    names = _class_names(schema, label) if label else None
    return Found(NAME, path, {"train": Stream(str(path), scan)}, labelled=label is not None,
                 class_names=names, notes=notes)
