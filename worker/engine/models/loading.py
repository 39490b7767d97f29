"""Frozen timm models built from safetensors checkpoints, with their input preprocessing."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import timm
import torch
from safetensors import SafetensorError, safe_open
from stitchsim.catalogue import OUTPUT_KINDS
from stitchsim.failure import Failure
from stitchsim.models import ModelRef
from stitchsim_worker.engine.measures.outputs import detect_kind
from stitchsim_worker.engine.models import autoencoder as _autoencoder  # noqa: F401 - registers it
from stitchsim_worker.engine.models.preprocess import (
    Choice,
    Preprocess,
    choose,
    input_size,
    metadata_json,
)
from torch import nn

# Lists in error messages are cut here; a 500-key diff helps nobody.
_MAX_LISTED = 8


@dataclass
class LoadedModel:
    net: nn.Module
    arch: str
    arch_kwargs: dict[str, Any]
    checkpoint: str
    choice: Choice
    num_classes: int
    num_prefix_tokens: int = 0
    output_fmt: str = "NCHW"
    output: str = "logits"
    """Its output kind (catalogue OUTPUT_KINDS): how its outputs are scored and matched."""
    output_source: str = "detected"

    @property
    def preprocess(self) -> Preprocess:
        return self.choice.preprocess

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.net(self.preprocess(pixels))


def read_metadata(path: Path) -> dict[str, str]:
    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except (SafetensorError, OSError, ValueError) as e:
        raise Failure("invalid_checkpoint",
                      f"{path.name} is not a readable safetensors file ({e}); export it with "
                      "safetensors.torch.save_file") from e


def resolve_arch(ref: ModelRef, meta: dict[str, str], where: str) -> tuple[str, dict[str, Any]]:
    """Architecture and kwargs: the spec wins, else the checkpoint's metadata."""
    arch = ref.arch or meta.get("arch")
    if not arch:
        raise Failure("unknown_arch",
                      f"{where}: no architecture given; set {where}.arch in the spec or store "
                      "'arch' in the checkpoint's __metadata__")
    kwargs = ref.arch_kwargs
    if kwargs is None:
        kwargs = metadata_json(meta, "arch_kwargs", where) or {}
    if not isinstance(kwargs, dict):
        raise Failure("invalid_spec", f"{where}: arch_kwargs must be a JSON object")
    check_arch_name(arch, where)
    return arch, kwargs


def check_arch_name(arch: str, where: str) -> None:
    # Only plain registry names: 'hf-hub:' and 'local-dir:' would download or read paths.
    if ":" in arch or "/" in arch or not timm.is_model(arch):
        close = timm.list_models(f"*{arch.split(':')[-1].split('/')[-1][:12]}*")[:_MAX_LISTED]
        hint = f"; similar names: {', '.join(close)}" if close else ""
        raise Failure("unknown_arch", f"{where}: {arch!r} is not a timm architecture{hint}")


def _create(arch: str, kwargs: dict[str, Any], where: str) -> nn.Module:
    forbidden = {"pretrained", "pretrained_cfg_overlay", "checkpoint_path", "pretrained_cfg"}
    if forbidden & kwargs.keys():
        raise Failure("invalid_spec",
                      f"{where}: arch_kwargs may not set {sorted(forbidden & kwargs.keys())}")
    try:
        return timm.create_model(arch, pretrained=False, **kwargs)
    except (TypeError, ValueError, AssertionError, RuntimeError, KeyError) as e:
        raise Failure(
            "invalid_arch_kwargs",
            f"{where}: timm could not build {arch!r} with arch_kwargs {kwargs}: {e}",
        ) from e


Shapes = dict[str, tuple[int, ...]]


def _fit_report(model: Shapes, ckpt: Shapes) -> str | None:
    missing = [k for k in model if k not in ckpt]
    unexpected = [k for k in ckpt if k not in model]
    mismatched = [
        f"{k}: checkpoint {ckpt[k]} vs model {shape}"
        for k, shape in model.items()
        if k in ckpt and ckpt[k] != shape
    ]
    parts = []
    for label, items in (("missing", missing), ("unexpected", unexpected), ("shape", mismatched)):
        if items:
            more = f" (+{len(items) - _MAX_LISTED} more)" if len(items) > _MAX_LISTED else ""
            parts.append(f"{label} keys: {', '.join(items[:_MAX_LISTED])}{more}")
    return "; ".join(parts) or None


def _check_fit(net: nn.Module, ckpt: Shapes, arch: str, kwargs: dict[str, Any], where: str
               ) -> None:
    problem = _fit_report({k: tuple(v.shape) for k, v in net.state_dict().items()}, ckpt)
    if problem:
        raise Failure("weights_mismatch",
                      f"{where}: checkpoint does not fit {arch} {kwargs}: {problem}")


def _strip_wrapper_prefix(sd: dict[str, Any]) -> dict[str, Any]:
    # DataParallel/DDP checkpoints prefix every key with 'module.'; that is not a mismatch.
    if sd and all(k.startswith("module.") for k in sd):
        return {k[len("module.") :]: v for k, v in sd.items()}
    return sd


def _read(path: Path, where: str, shapes_only: bool) -> dict[str, Any]:
    try:
        with safe_open(str(path), framework="pt") as f:
            if shapes_only:  # the header alone: no tensor is read
                return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
            return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no iter
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise Failure("invalid_checkpoint",
                      f"{where}: cannot read tensors from {path.name}: {e}") from e


def _fixed_input_size(net: nn.Module) -> int | None:
    patch_embed = getattr(net, "patch_embed", None)
    size = getattr(patch_embed, "img_size", None)
    # Position embeddings are sized for img_size, whether or not the patch embed checks it.
    if size is not None and not getattr(patch_embed, "dynamic_img_size", False):
        return int(size[0] if isinstance(size, (tuple, list)) else size)
    cfg = getattr(net, "pretrained_cfg", {}) or {}
    if cfg.get("fixed_input_size"):
        return int(cfg["input_size"][-1])
    return None


def _num_classes(net: nn.Module) -> int:
    """Its classes; 0 for a model without a classifier head (an embedder, an autoencoder)."""
    n = getattr(net, "num_classes", None)
    return int(n) if isinstance(n, int) else 0


def _choice(
    ref: ModelRef, meta: dict[str, str], net: nn.Module, native_size: int, where: str
) -> Choice:
    size = input_size(ref, meta, _fixed_input_size(net), native_size, where)
    return choose(ref, meta, net, size, where)


def _loaded(
    net: nn.Module, arch: str, kwargs: dict[str, Any], checkpoint: str, choice: Choice,
    given: tuple[str | None, str] = (None, "detected"),
) -> LoadedModel:
    net.eval().requires_grad_(False)
    kind, source = given
    if kind is None:
        kind = detect_output(net, choice.preprocess.input_size, arch)
    return LoadedModel(
        net=net,
        arch=arch,
        arch_kwargs=kwargs,
        checkpoint=checkpoint,
        choice=choice,
        num_classes=_num_classes(net),
        num_prefix_tokens=int(getattr(net, "num_prefix_tokens", 0) or 0),
        output_fmt=str(getattr(net, "output_fmt", "NCHW")),
        output=kind,
        output_source=source,
    )


def given_output(ref: ModelRef, meta: dict[str, str], where: str) -> tuple[str | None, str]:
    """The output kind the spec gives, else the checkpoint's metadata 'output'; (None,
    "detected") when neither does."""
    if ref.output is not None:
        return ref.output, "spec"
    kind = meta.get("output")
    if kind is None:
        return None, "detected"
    if kind not in OUTPUT_KINDS:
        raise Failure("invalid_checkpoint",
                      f"{where}: the checkpoint's metadata 'output' is {kind!r}; one of "
                      f"{', '.join(OUTPUT_KINDS.names)}")
    return kind, "metadata"


def detect_output(net: nn.Module, size: int, arch: str) -> str:
    """The output kind of one sample's output (on the meta device for a meta model). A model
    with classes whose forward cannot run here is read as logits, as before output kinds:
    Network reports why it does not run."""
    classes = _num_classes(net)
    device = next(iter(net.parameters()), torch.empty(0)).device
    try:
        with torch.no_grad():
            out = net(torch.zeros(1, 3, size, size, device=device))
    except Exception as e:  # noqa: BLE001 - any failure: the model does not run on this input
        if classes > 0:
            return "logits"
        raise Failure("invalid_input_size",
                      f"{arch} does not run on {size}px inputs ({e}); set input_size") from e
    if not isinstance(out, torch.Tensor):
        raise Failure("invalid_spec",
                      f"{arch} returns {type(out).__name__}, not one tensor: set output or "
                      "pick a model whose forward returns its output tensor")
    try:
        return detect_kind(tuple(out.shape[1:]), classes)
    except ValueError as e:
        raise Failure("invalid_spec",
                      f"{arch}: {e}; set output to one of {', '.join(OUTPUT_KINDS.names)}"
                      ) from e


def random_model(arch: str, kwargs: dict[str, Any], native_size: int = 32) -> LoadedModel:
    """An architecture with random weights: enough to list stitch points and shapes."""
    check_arch_name(arch, "arch")
    net = _create(arch, kwargs, "arch")
    ref = ModelRef(checkpoint="-", arch=arch, arch_kwargs=kwargs)
    return _loaded(net, arch, kwargs, "", _choice(ref, {}, net, native_size, "arch"))


def build_model(
    ref: ModelRef, path: Path, checkpoint_id: str, *, where: str, native_size: int
) -> LoadedModel:
    """Create the timm model, load the checkpoint strictly, freeze it in eval mode."""
    meta = read_metadata(path)
    arch, kwargs = resolve_arch(ref, meta, where)
    net = _create(arch, kwargs, where)
    sd = _strip_wrapper_prefix(_read(path, where, shapes_only=False))
    _check_fit(net, {k: tuple(v.shape) for k, v in sd.items()}, arch, kwargs, where)
    net.load_state_dict(sd, strict=True)
    choice = _choice(ref, meta, net, native_size, where)
    return _loaded(net, arch, kwargs, checkpoint_id or path.name, choice,
                   given_output(ref, meta, where))


def meta_model(ref: ModelRef, path: Path, *, where: str, native_size: int) -> LoadedModel:
    """The model as build_model would make it, on the meta device: every check that needs no
    weight values (architecture, kwargs, checkpoint keys and shapes from the file's header,
    preprocessing, input size) at the cost of reading a header. Parameters take no memory."""
    meta = read_metadata(path)
    arch, kwargs = resolve_arch(ref, meta, where)
    with torch.device("meta"):
        net = _create(arch, kwargs, where)
    _check_fit(net, _strip_wrapper_prefix(_read(path, where, shapes_only=True)), arch, kwargs,
               where)
    return _loaded(net, arch, kwargs, path.name, _choice(ref, meta, net, native_size, where),
                   given_output(ref, meta, where))


def save_checkpoint(net: nn.Module, path: Path, arch: str, arch_kwargs: dict[str, Any],
                    **extra: str) -> None:
    """Write a checkpoint the way a user would: safetensors with arch metadata (and any
    further metadata keys, e.g. preprocess or output)."""
    from safetensors.torch import save_file

    sd = {k: v.detach().contiguous().clone() for k, v in net.state_dict().items()}
    save_file(sd, str(path),
              metadata={"arch": arch, "arch_kwargs": json.dumps(arch_kwargs), **extra})
