"""`stitchsim dataset pack`: the formats people have (ImageFolder folders and archives,
parquet, .npz, WebDataset tars, the service's own file) into the service's dataset file, with
a summary of what was found; and the `--pack KEY=VALUE` options `check` and `compare` pass on
when `--dataset` names such a source."""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from pydantic import ValidationError

from stitchsim.catalogue import DATASET_FORMATS
from stitchsim.cli.exits import EXIT_PASS
from stitchsim.errors import UsageError
from stitchsim.jsondepth import JSONInputError, parse_json
from stitchsim.packing import PackOptions, pack_dataset


def _options(values: dict[str, Any], where: str) -> PackOptions:
    try:
        return PackOptions.model_validate(values)
    except ValidationError as exc:
        raise UsageError.from_validation(where, exc.errors()) from None


def cmd_dataset_pack(args: argparse.Namespace, out: TextIO) -> int:
    values = {k: getattr(args, k) for k in ("format", "test", "size", "test_fraction", "seed",
                                            "image_column", "label_column")
              if getattr(args, k) is not None}
    options = _options({**values, "unlabelled": args.unlabelled}, "dataset pack")
    summary = pack_dataset(args.source, args.out, options)
    print(summary.text(), file=out)
    return EXIT_PASS


def pack_options(args: argparse.Namespace) -> PackOptions | None:
    """--pack KEY=VALUE options (None when none are given: defaults, and a safetensors file is
    uploaded as it is)."""
    items = getattr(args, "pack", None) or []
    if not items:
        return None
    values: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--pack: expected KEY=VALUE, got {item!r}")
        try:
            json.loads(value, parse_constant=float)
        except ValueError:
            values[key.strip()] = value  # bare words: a size such as 48x64, a column name
            continue
        except RecursionError:
            pass  # parse_json says how deep
        try:
            values[key.strip()] = parse_json(value, f"--pack {key.strip()}")
        except JSONInputError as exc:
            raise UsageError(str(exc)) from None
    return _options(values, "--pack")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("dataset", help="pack datasets into the service's file")
    actions = p.add_subparsers(dest="dataset_command", metavar="ACTION", required=True)
    q = actions.add_parser(
        "pack",
        help="read a dataset in the format you have and write the service's file",
        description="Read SOURCE (" + ", ".join(e.label for e in DATASET_FORMATS) + "), show "
        "what was found "
        "(classes, counts per split, image sizes) and write the service's dataset file OUT: "
        "uint8 images of one size, int64 labels, and in its metadata the class names and how "
        "the test split was made. `stitchsim check --dataset SOURCE` does the same before "
        "uploading. Needs the client's data extra: pip install 'stitchsim[data]'.")
    q.add_argument("source", help="a folder, or a .zip, .tar(.gz), .parquet, .npz or "
                   ".safetensors file")
    q.add_argument("out", help="the .safetensors file to write")
    q.add_argument("--format", choices=DATASET_FORMATS.names,
                   help="read SOURCE as this format (default: told from its name and content)")
    q.add_argument("--test", metavar="SOURCE",
                   help="a second source holding the test split (else one is made from train)")
    q.add_argument("--size", help="store every image at this size: N (square) or HxW; "
                   "default: the most common size, others scaled and centre-cropped to it")
    q.add_argument("--test-fraction", type=float,
                   help="share of the training images made the test split (default 0.2)")
    q.add_argument("--seed", type=int, help="seed of the test split and the order (default 0)")
    q.add_argument("--unlabelled", action="store_true",
                   help="store the images without labels (jobs that need labels refuse them)")
    q.add_argument("--image-column", help="parquet: the column of image bytes")
    q.add_argument("--label-column", help="parquet: the column of labels")
    q.add_argument("-q", "--quiet", action="store_true", help="print only the summary and errors")
    q.set_defaults(func=cmd_dataset_pack)
