"""A model's `config.json` (and HF's `preprocessor_config.json`): validated, size-capped, JSON
only, and read for what it says about the architecture and its preprocessing.

A folder saved by `transformers`' `save_pretrained` or timm's hub layout travels as one
safetensors file whose `__metadata__` holds these files' text under their own names
(stitchsim.files.folder packs it); the client, the gateway and the engine all run these checks.
Standard library only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from stitchsim.files.errors import SafetensorsError, show
from stitchsim.jsondepth import MAX_JSON_DEPTH, nested_deeper_than

CONFIG_FILE = "config.json"
PROCESSOR_FILE = "preprocessor_config.json"
MAX_CONFIG_BYTES = 256 * 1024
"""A real config (1000 ImageNet label names included) is under 100 KB."""
REMOTE_CODE_FIELDS = ("auto_map", "trust_remote_code", "custom_pipelines")
"""Fields that make transformers import the model author's own Python: never run here."""


class InvalidModelConfig(SafetensorsError):
    """A config.json (or preprocessor_config.json) the service refuses; the message names the
    file, the field and what to fix."""

    code = "invalid_model_config"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_config(text: str | bytes, file: str = CONFIG_FILE) -> dict[str, Any]:
    """The file's JSON object, or InvalidModelConfig saying what is wrong with it."""
    size = len(text.encode("utf-8") if isinstance(text, str) else text)
    if size > MAX_CONFIG_BYTES:
        raise InvalidModelConfig(
            f"{file} is {size:,} bytes, more than the {MAX_CONFIG_BYTES:,} accepted; remove "
            "large fields (label lists of other tasks, embedded data) from it",
            details={"file": file, "size": size, "limit": MAX_CONFIG_BYTES})
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:
        raise InvalidModelConfig(f"{file} is not valid JSON ({e}); write it with json.dump "
                                 "(save_pretrained does)", details={"file": file}) from None
    if not isinstance(obj, dict):
        raise InvalidModelConfig(f"{file} must hold a JSON object, not {type(obj).__name__}",
                                 details={"file": file})
    if nested_deeper_than(obj, MAX_JSON_DEPTH):
        raise InvalidModelConfig(f"{file} is nested more than {MAX_JSON_DEPTH} levels deep",
                                 details={"file": file})
    remote = [k for k in REMOTE_CODE_FIELDS if k in obj]
    if remote:
        raise InvalidModelConfig(
            f"{file}: field {remote[0]!r} asks for the model author's own Python code, which "
            "this service never runs; use an architecture class that transformers ships "
            f"(set 'architectures' to it) and remove {', '.join(repr(k) for k in remote)}, or "
            "have the service's operator install the architecture as a plugin",
            details={"file": file, "field": remote[0]})
    return obj


@dataclass(frozen=True)
class ConfigPreprocess:
    """What a config says about the model's input: None where it says nothing."""

    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None
    input_size: int | None = None
    origin: str = ""
    """Which file and field said it, for the report's note."""


@dataclass(frozen=True)
class ModelConfig:
    """A folder's config read: the source layout, the architecture and its kwargs."""

    layout: str
    """"transformers" (save_pretrained) or "timm" (timm's hub layout)."""
    arch: str
    """As a spec spells it: `transformers:ViTForImageClassification`, or a timm name."""
    arch_kwargs: dict[str, Any]
    config: dict[str, Any]
    preprocess: ConfigPreprocess = field(default_factory=ConfigPreprocess)

    def summary(self) -> dict[str, str]:
        """The source metadata a report shows."""
        out = {"layout": self.layout, "config": CONFIG_FILE, "arch": self.arch}
        if self.preprocess.origin:
            out["preprocessing"] = self.preprocess.origin
        if self.layout == "transformers":
            out["model_type"] = str(self.config.get("model_type", ""))
        return out


def _triple(value: Any, file: str, key: str) -> tuple[float, float, float] | None:
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value] * 3
    if (not isinstance(value, list) or len(value) != 3
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
        raise InvalidModelConfig(f"{file}: field {key!r} must be 3 numbers (RGB), got "
                                 f"{show(value)}", details={"file": file, "field": key})
    if key.endswith("std") and min(value) <= 0:
        raise InvalidModelConfig(f"{file}: field {key!r} must be positive, got {show(value)}",
                                 details={"file": file, "field": key})
    return (float(value[0]), float(value[1]), float(value[2]))


def _size(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, list) and value and isinstance(value[-1], int):
        return int(value[-1])
    if isinstance(value, dict):
        for key in ("height", "shortest_edge"):
            if isinstance(value.get(key), int):
                return int(value[key])
    return None


def processor_preprocess(proc: dict[str, Any]) -> ConfigPreprocess:
    """An HF image processor's normalisation and input size (pixels arrive in [0,1], so its
    1/255 rescale is already done)."""
    f = PROCESSOR_FILE
    if proc.get("do_normalize", True) is False:
        mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    else:
        mean = _triple(proc.get("image_mean"), f, "image_mean")
        std = _triple(proc.get("image_std"), f, "image_std")
    size = _size(proc.get("crop_size")) if proc.get("do_center_crop") else None
    size = size or _size(proc.get("size"))
    return ConfigPreprocess(mean, std, size, origin=f"{f} (image_mean, image_std, size)")


def _timm_config(cfg: dict[str, Any]) -> ModelConfig:
    arch = cfg["architecture"]
    if not isinstance(arch, str) or not arch:
        raise InvalidModelConfig(f"{CONFIG_FILE}: field 'architecture' must name a timm "
                                 f"architecture, got {show(arch)}",
                                 details={"file": CONFIG_FILE, "field": "architecture"})
    args = cfg.get("model_args") or {}
    if not isinstance(args, dict):
        raise InvalidModelConfig(f"{CONFIG_FILE}: field 'model_args' must be a JSON object",
                                 details={"file": CONFIG_FILE, "field": "model_args"})
    kwargs: dict[str, Any] = {**args}
    if isinstance(cfg.get("num_classes"), int):
        kwargs["num_classes"] = cfg["num_classes"]
    if isinstance(cfg.get("global_pool"), str) and "global_pool" not in kwargs:
        kwargs["global_pool"] = cfg["global_pool"]
    pcfg = cfg.get("pretrained_cfg") or {}
    if not isinstance(pcfg, dict):
        raise InvalidModelConfig(f"{CONFIG_FILE}: field 'pretrained_cfg' must be a JSON object",
                                 details={"file": CONFIG_FILE, "field": "pretrained_cfg"})
    pre = ConfigPreprocess(
        _triple(pcfg.get("mean"), CONFIG_FILE, "pretrained_cfg.mean"),
        _triple(pcfg.get("std"), CONFIG_FILE, "pretrained_cfg.std"),
        _size(pcfg.get("input_size")),
        origin=f"{CONFIG_FILE} (pretrained_cfg mean, std, input_size)" if pcfg else "")
    return ModelConfig("timm", arch, kwargs, cfg, pre)


def _hf_config(cfg: dict[str, Any], proc: dict[str, Any] | None) -> ModelConfig:
    archs = cfg.get("architectures")
    if not (isinstance(archs, list) and archs and all(isinstance(a, str) for a in archs)):
        raise InvalidModelConfig(
            f"{CONFIG_FILE}: field 'architectures' must list the model class (save_pretrained "
            "writes it, e.g. [\"ViTForImageClassification\"]); add it, or name the class with "
            "--arch transformers:CLASS", details={"file": CONFIG_FILE, "field": "architectures"})
    if not isinstance(cfg.get("model_type"), str):
        raise InvalidModelConfig(f"{CONFIG_FILE}: field 'model_type' must be a string",
                                 details={"file": CONFIG_FILE, "field": "model_type"})
    pre = processor_preprocess(proc) if proc is not None else ConfigPreprocess()
    return ModelConfig("transformers", f"transformers:{archs[0]}", {}, cfg, pre)


def interpret(config: dict[str, Any], processor: dict[str, Any] | None = None) -> ModelConfig:
    """What a validated config says: timm's hub layout names an `architecture`, transformers'
    a `model_type` and its `architectures`."""
    if "architecture" in config:
        return _timm_config(config)
    if "model_type" in config or "architectures" in config:
        return _hf_config(config, processor)
    raise InvalidModelConfig(
        f"{CONFIG_FILE} names no architecture: it needs 'architecture' (timm's hub layout) or "
        "'model_type' and 'architectures' (transformers' save_pretrained)",
        details={"file": CONFIG_FILE, "field": "architecture"})


def from_metadata(meta: dict[str, str]) -> ModelConfig | None:
    """The config a checkpoint carries in its metadata (a packed folder), checked; else None."""
    if CONFIG_FILE not in meta:
        if PROCESSOR_FILE in meta:
            raise InvalidModelConfig(f"{PROCESSOR_FILE} came without {CONFIG_FILE}; upload the "
                                     "whole folder", details={"file": CONFIG_FILE})
        return None
    proc = parse_config(meta[PROCESSOR_FILE], PROCESSOR_FILE) if PROCESSOR_FILE in meta else None
    return interpret(parse_config(meta[CONFIG_FILE], CONFIG_FILE), proc)
