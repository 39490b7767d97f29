"""The spec a command line asks for: config file < --spec file < flags < --set."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from stitchsim.config import Settings, deep_merge, load_settings
from stitchsim.errors import (
    UsageError,
)
from stitchsim.jsondepth import JSONInputError, parse_json
from stitchsim.sdk import Client

log = logging.getLogger("stitchsim")


def parse_layers(text: str) -> list[dict[str, str]] | str:
    text = text.strip()
    if text == "auto":
        return "auto"
    pairs = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        front, sep, back = item.partition(":")
        if not front or (sep and not back):
            raise UsageError(f"--layers: {item!r} is not FRONT:BACK or NAME")
        pairs.append({"front": front, "back": back if sep else front})
    if not pairs:
        raise UsageError("--layers: no stitch pairs given")
    return pairs


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _json_value(text: str, flag: str = "--set") -> Any:
    try:
        json.loads(text, parse_constant=float)
    except ValueError:
        return text  # bare words such as `auto` or `resnet18`
    except RecursionError:
        pass  # parse_json says how deep
    try:
        return parse_json(text, flag)
    except JSONInputError as exc:
        raise UsageError(str(exc)) from None


def _set_path(target: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    if not all(keys):
        raise UsageError(f"--set: bad key {dotted!r}")
    node = target
    for key in keys[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    node[keys[-1]] = value


_FLAG_OF = {"budget": "--budget", "dataset": "--dataset", "directions": "--directions",
            "objectives": "--objectives", "protocols": "--protocols", "controls": "--controls",
            "layers": "--layers"}
"""Spec fields a dedicated flag sets, which a --set of the same key replaces."""


def _say_overridden(fields: dict[str, Any], key: str, value: Any) -> None:
    """--set is applied after the dedicated flags: where both give a field, --set's value is
    the one the job runs with, and the user is told rather than left to find out."""
    flag = _FLAG_OF.get(key)
    if flag is not None and key in fields and fields[key] != value:
        log.warning("--set %s=%s replaces %s %s (--set is applied after the flags)", key,
                    json.dumps(value), flag, json.dumps(fields[key]))


def spec_fields(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    """Spec fields from config [spec] < --spec file < dedicated flags < --set < threshold."""
    fields: dict[str, Any] = deep_merge({}, settings.spec)
    if args.spec:
        try:
            loaded = parse_json(Path(args.spec).read_bytes(), f"--spec {args.spec}")
        except OSError as exc:
            raise UsageError(f"--spec: cannot read {args.spec}: {exc.strerror}") from None
        except JSONInputError as exc:
            raise UsageError(str(exc)) from None
        if not isinstance(loaded, dict):
            raise UsageError(f"--spec: {args.spec} must hold a JSON object")
        fields = deep_merge(fields, loaded)
    if args.dataset:
        fields["dataset"] = args.dataset
    if getattr(args, "probe", None):
        fields["probes"] = list(args.probe)
    if args.layers:
        fields["layers"] = parse_layers(args.layers)
    for name in ("objectives", "protocols", "controls"):
        if getattr(args, name):
            fields[name] = _csv(getattr(args, name))
    if args.directions:
        fields["directions"] = args.directions
    if getattr(args, "budget", None):
        fields["budget"] = args.budget
    if args.arch or args.arch_kwargs:
        kwargs = None
        if args.arch_kwargs:
            kwargs = _json_value(args.arch_kwargs, "--arch-kwargs")
            if not isinstance(kwargs, dict):
                raise UsageError("--arch-kwargs must be a JSON object")
        for side in ("front", "back"):
            ref = fields.setdefault(side, {})
            if not isinstance(ref, dict):
                raise UsageError(f"spec field {side!r} must be an object")
            if args.arch:
                ref["arch"] = args.arch
            if kwargs is not None:
                ref["arch_kwargs"] = kwargs
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--set: expected KEY=VALUE, got {item!r}")
        value = _json_value(value, f"--set {key.strip()}")
        _say_overridden(fields, key.strip(), value)
        _set_path(fields, key.strip(), value)
    if settings.threshold is not None:
        fields["threshold"] = settings.threshold
    return fields


def settings_from(args: argparse.Namespace) -> Settings:
    flags = {
        key: getattr(args, key, None)
        for key in ("url", "api_key", "retries", "threshold", "timeout")
    }
    return load_settings(flags, config_file=getattr(args, "config", None))


def client_for(settings: Settings) -> Client:
    return Client(settings.url, settings.api_key, retries=settings.retries)
