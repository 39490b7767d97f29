"""`stitchsim points FILE|ID`: where a checkpoint can be stitched, as the service sees it
(a check worker lists the points: the client needs no torch). A file is uploaded unless the
service holds its bytes already."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from stitchsim.cli.exits import EXIT_PASS
from stitchsim.cli.spec_args import client_for, settings_from
from stitchsim.errors import UsageError
from stitchsim.jsondepth import JSONInputError, parse_json
from stitchsim.models import StitchPoints


def cmd_points(args: argparse.Namespace, out: TextIO) -> int:
    kwargs = None
    if args.arch_kwargs is not None:
        try:
            kwargs = parse_json(args.arch_kwargs, "--arch-kwargs")
        except JSONInputError as exc:
            raise UsageError(str(exc)) from None
        if not isinstance(kwargs, dict):
            raise UsageError("--arch-kwargs: expected a JSON object, e.g. '{\"num_classes\": 10}'")
    with client_for(settings_from(args)) as client:
        points = client.points(args.checkpoint, arch=args.arch, arch_kwargs=kwargs,
                               input_size=args.input_size)
    if args.as_json:
        print(points.model_dump_json(indent=2), file=out)
    else:
        print(points_text(points, every=args.all), file=out)
    return EXIT_PASS


def points_text(points: StitchPoints, *, every: bool = False) -> str:
    """A table of the points (stage outputs only, unless every), marked S for a stage output
    and A for a point `layers: "auto"` picks, then the `--layers` value auto stands for."""
    shown = [p for p in points.points if every or p.stage]
    rows = [("POINT", "SHAPE", "STAGE", "AUTO")] + [
        (p.name, "x".join(str(d) for d in p.shape), "S" if p.stage else "",
         "A" if p.auto else "") for p in shown]
    width = [max(len(r[k]) for r in rows) for k in range(4)]
    lines = [f"{points.arch} at {points.input_size} px: {len(points.points)} stitch points, "
             f"{len(points.stages)} stage outputs"
             + ("" if every else " shown (--all lists every point)")]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, width, strict=True)).rstrip()
              for r in rows]
    lines.append(f"auto: --layers {','.join(points.auto)}")
    return "\n".join(lines)


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "points", parents=[common], help="where a checkpoint can be stitched",
        description="List a checkpoint's stitch points as the service builds the model: each "
        "module output with its shape, the stage outputs (S) and the points `--layers auto` "
        "picks (A). FILE is uploaded unless the service holds it already.")
    p.add_argument("checkpoint", help="safetensors file or sha256: id")
    p.add_argument("--all", action="store_true",
                   help="every stitchable module output, not only the stage outputs")
    p.add_argument("--arch", help="timm architecture (else from the file)")
    p.add_argument("--arch-kwargs", metavar="JSON", help="e.g. '{\"num_classes\": 10}'")
    p.add_argument("--input-size", type=int, help="square input side the shapes are for")
    p.add_argument("--json", dest="as_json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_points)
