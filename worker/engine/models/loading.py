"""Frozen models built from safetensors checkpoints by their model source (models.sources:
timm, torchvision, transformers, the project's own, plugins), with their input preprocessing."""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from stitchsim.catalogue import OUTPUT_KINDS
from stitchsim.failure import Failure
from stitchsim.files.model_config import CONFIG_FILE, InvalidModelConfig, ModelConfig, from_metadata
from stitchsim.models import ModelRef
from stitchsim_worker.engine.core.errors import interrupted
from stitchsim_worker.engine.core.resources import BuildLimits
from stitchsim_worker.engine.measures.outputs import detect_kind
from stitchsim_worker.engine.models import autoencoder as _autoencoder  # noqa: F401 - registers it
from stitchsim_worker.engine.models.guard import LAYER_FIELD, Given, guarded_build
from stitchsim_worker.engine.models.heads import head_classes
from stitchsim_worker.engine.models.preprocess import (
    Choice,
    Preprocess,
    choose,
    input_size,
    metadata_json,
)
from stitchsim_worker.engine.models.sources import (
    Build,
    SourceEntry,
    SourceInfo,
    own_layout,
    source_of,
)
from torch import nn

log = logging.getLogger("stitchsim.engine")

UNBOUNDED = BuildLimits(max_params=None, max_modules=None)
"""A job's build: its spec check bounded the same build with the operator's limits."""

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
    source: str = "timm"
    info: SourceInfo = field(default_factory=SourceInfo)

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


def folder_config(meta: dict[str, str], where: str) -> ModelConfig | None:
    """The config.json a packed folder carries (checked again: the file may be local)."""
    try:
        return from_metadata(meta)
    except InvalidModelConfig as e:
        raise Failure(e.code, f"{where}: {e.message}", e.details) from None


def resolve_arch(ref: ModelRef, meta: dict[str, str], where: str,
                 config: ModelConfig | None = None) -> tuple[str, dict[str, Any]]:
    """Architecture and kwargs: the spec wins, else the checkpoint's metadata, else its
    folder's config.json."""
    arch = ref.arch or meta.get("arch") or (config.arch if config is not None else None)
    if not arch:
        raise Failure("unknown_arch",
                      f"{where}: no architecture given; set {where}.arch in the spec (a timm "
                      "name or SOURCE:NAME such as torchvision:resnet50), store 'arch' in the "
                      "checkpoint's __metadata__, or upload the model's folder with its "
                      "config.json")
    kwargs = ref.arch_kwargs
    if kwargs is None:
        kwargs = metadata_json(meta, "arch_kwargs", where)
    if kwargs is None:
        kwargs = config.arch_kwargs if config is not None and config.arch == arch else {}
    if not isinstance(kwargs, dict):
        raise Failure("invalid_spec", f"{where}: arch_kwargs must be a JSON object")
    try:
        check_arch_name(arch, where)
    except Failure as e:
        if ref.arch or config is None or arch != config.arch:
            raise
        field = "architecture" if config.layout == "timm" else "architectures"
        raise Failure(e.code, f"{e.message} (from {CONFIG_FILE} field {field!r}); fix it, or "
                      f"name the architecture with {where}.arch (--arch)",
                      {**(e.details or {}), "file": CONFIG_FILE, "field": field}) from None
    return arch, kwargs


def check_arch_name(arch: str, where: str) -> None:
    """unknown_arch unless a registered source knows the name (no hub, no paths)."""
    source_of(arch, where)


def _build_spec(arch: str, kwargs: dict[str, Any], config: ModelConfig | None, where: str
                ) -> tuple[SourceEntry, Build]:
    entry, name = source_of(arch, where)
    # A folder's config builds the model only in its own source's hands (a spec's timm arch
    # over a transformers folder ignores config.json, as it ignores the metadata's arch).
    own = config if config is not None and config.layout == entry.name else None
    return entry, Build(name, kwargs, own, where)


Shapes = dict[str, tuple[int, ...]]  # noqa: F811 - as models.sources spells it


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


def _check_fit(net: nn.Module, ckpt: Shapes, arch: str, kwargs: dict[str, Any], where: str,
               meta: dict[str, str], entry: SourceEntry) -> int:
    """Which of the source's checkpoint layouts the file has; weights_mismatch if none."""
    layouts = entry.layouts(net) if entry.layouts is not None else [own_layout(net)]
    problems = [_fit_report(layout, ckpt) for layout in layouts]
    if None in problems:
        return problems.index(None)
    problem = problems[-1] if len(problems) > 1 else problems[0]
    if CONFIG_FILE in meta:
        raise Failure("weights_mismatch",
                      f"{where}: the weights (model.safetensors) do not fit {arch} as "
                      f"{CONFIG_FILE} describes it: {problem}; the config and the weights come "
                      "from different models: save both with one save_pretrained (or "
                      "save_for_hf) call", {"file": CONFIG_FILE})
    raise Failure("weights_mismatch",
                  f"{where}: checkpoint does not fit {arch} {kwargs}: {problem}")


_INDEX = re.compile(r"\d+")


def _check_depth(given: Given, ckpt: Shapes | None, where: str, label: str) -> None:
    """weights_mismatch, before the model is built, when the config asks for more layers
    than the weights hold: a stack of L layers has keys numbered up to L - 1 (blocks.11,
    encoder.layer.11, encoder_layer_11), so a checkpoint whose numbers stop short of that
    cannot fit, and building the deep config to find out would hold a check worker for
    seconds. One layer field only: where several split the layers, the build decides."""
    if not ckpt:
        return
    fields = {**(given.defaults or {}), **given.fields}
    layer_fields = [(k, v) for k, v in fields.items() if LAYER_FIELD.match(k)
                    and isinstance(v, int) and not isinstance(v, bool)]
    if len(layer_fields) != 1:
        return
    name, layers = layer_fields[0]
    numbers = [int(n) for key in ckpt for n in _INDEX.findall(key)]
    if not numbers or layers <= max(numbers) + 1:
        return
    origin, _ = given.origin_of(name)
    raise Failure("weights_mismatch",
                  f"{where}: the weights do not fit {label} as {origin} describes it: "
                  f"{origin} field {name!r} asks for {layers:,} layers and the checkpoint's "
                  f"keys are numbered up to {max(numbers)}; the config and the weights come "
                  "from different models: save both from the same model",
                  {"field": name, "file": origin, "layers": layers,
                   "checkpoint_max_index": max(numbers)})


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


def _num_classes(net: nn.Module) -> int:
    """Its classes; 0 for a model without a classifier head (an embedder, an autoencoder)."""
    n = getattr(net, "num_classes", None)
    if isinstance(n, int):
        return n
    if type(net).__name__.endswith("ForImageClassification"):
        n = getattr(getattr(net, "config", None), "num_labels", None)
        return int(n) if isinstance(n, int) else 0
    if hasattr(net, "config"):  # a transformers model without a classification head: an embedder
        return 0
    # torchvision and plugins: the last linear layer is the head
    heads = [m.out_features for m in net.modules() if isinstance(m, nn.Linear)]
    return int(heads[-1]) if heads else 0


def _choice(
    ref: ModelRef, meta: dict[str, str], info: SourceInfo, native_size: int, where: str
) -> Choice:
    size = input_size(ref, meta, info.fixed_size, native_size, where)
    return choose(ref, meta, info, size, where)


def _loaded(
    net: nn.Module, arch: str, kwargs: dict[str, Any], checkpoint: str, choice: Choice,
    source: str, info: SourceInfo, given: tuple[str | None, str] = (None, "detected"),
) -> LoadedModel:
    net.eval().requires_grad_(False)
    kind, output_source = given
    if kind is None:
        kind = detect_output(net, choice.preprocess.input_size, arch)
    return LoadedModel(
        net=net,
        arch=arch,
        arch_kwargs=kwargs,
        checkpoint=checkpoint,
        choice=choice,
        num_classes=_num_classes(net),
        num_prefix_tokens=info.num_prefix_tokens,
        output_fmt=info.output_fmt,
        source=source,
        info=info,
        output=kind,
        output_source=output_source,
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
        if interrupted(e):
            raise
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


def _made(ref: ModelRef, meta: dict[str, str], where: str, *, on_meta: bool,
          ckpt: Shapes | None = None, limits: BuildLimits = BuildLimits()
          ) -> tuple[nn.Module, str, dict[str, Any], SourceEntry, SourceInfo]:
    """The architecture the spec, metadata or config.json name, built with random weights;
    with the checkpoint's shapes, its head sized to the checkpoint's classes when no kwargs
    or config say how many (heads.py)."""
    config = folder_config(meta, where)
    arch, kwargs = resolve_arch(ref, meta, where, config)
    entry, build = _build_spec(arch, kwargs, config, where)
    origin = (CONFIG_FILE if config is not None and ref.arch_kwargs is None
              and "arch_kwargs" not in meta else "arch_kwargs")
    net = _built(entry, build, on_meta, origin, limits, ckpt)
    classes = (head_classes(net, ckpt) if ckpt is not None and config is None
               and "num_classes" not in kwargs else None)
    if classes is not None:
        sized = Build(build.name, {**kwargs, "num_classes": classes}, build.config, where)
        try:
            net, kwargs, build = (_built(entry, sized, on_meta, origin, limits), sized.kwargs,
                                  sized)
        except Failure:  # a source without num_classes: _check_fit says why
            log.info("%s: %s takes no num_classes=%d", where, arch, classes)
    return net, arch, kwargs, entry, entry.describe(net, build)


def _built(entry: SourceEntry, build: Build, on_meta: bool, origin: str,
           limits: BuildLimits, ckpt: Shapes | None = None) -> nn.Module:
    """The source's build under models.guard: the user's fields checked, the build bounded,
    any failure of it a 422 naming the field."""
    own = build.config if build.config is not None and build.config.layout == entry.name \
        and entry.name == "transformers" else None
    fields = {**own.config, **build.kwargs} if own is not None else dict(build.kwargs)
    if own is not None:
        origin = CONFIG_FILE
    given = Given(fields, origin,
                  "invalid_model_config" if origin == CONFIG_FILE else "invalid_arch_kwargs",
                  entry.defaults(build) if entry.defaults is not None else None,
                  frozenset(build.kwargs) if own is not None else frozenset())

    def make(chosen: Mapping[str, Any]) -> nn.Module:
        if own is None:
            return entry.build(replace(build, kwargs=dict(chosen)))
        kept = {k: v for k, v in chosen.items() if k not in build.kwargs}
        return entry.build(replace(build, kwargs={k: v for k, v in chosen.items()
                                                  if k in build.kwargs},
                                   config=replace(own, config=kept)))

    label = f"{entry.name} {build.name!r}"
    _check_depth(given, ckpt, build.where, label)
    with torch.device("meta") if on_meta else contextlib.nullcontext():
        return guarded_build(make, given, build.where, label, limits)


def random_model(arch: str | None, kwargs: dict[str, Any] | None, native_size: int = 32, *,
                 meta: dict[str, str] | None = None, on_meta: bool = False,
                 limits: BuildLimits = BuildLimits()) -> LoadedModel:
    """An architecture with random weights (or none: on_meta): enough to list stitch points
    and shapes. `meta`: a checkpoint's metadata as a folder's would carry it (config.json)."""
    ref = ModelRef(checkpoint="-", arch=arch, arch_kwargs=kwargs)
    meta = meta or {}
    net, arch, kwargs, entry, info = _made(ref, meta, "arch", on_meta=on_meta, limits=limits)
    return _loaded(net, arch, kwargs, "", _choice(ref, meta, info, native_size, "arch"),
                   entry.name, info)


def build_model(
    ref: ModelRef, path: Path, checkpoint_id: str, *, where: str, native_size: int
) -> LoadedModel:
    """Build the architecture with its source, load the checkpoint strictly, freeze it."""
    meta = read_metadata(path)
    shapes = _strip_wrapper_prefix(_read(path, where, shapes_only=True))
    # The spec check bounded this build with the operator's limits; a job builds what passed.
    net, arch, kwargs, entry, info = _made(ref, meta, where, on_meta=False, ckpt=shapes,
                                           limits=UNBOUNDED)
    layout = _check_fit(net, shapes, arch, kwargs, where, meta, entry)
    if layout and entry.load is not None:
        entry.load(net, path, layout)
    else:
        net.load_state_dict(_strip_wrapper_prefix(_read(path, where, shapes_only=False)),
                            strict=True)
    choice = _choice(ref, meta, info, native_size, where)
    return _loaded(net, arch, kwargs, checkpoint_id or path.name, choice, entry.name, info,
                   given_output(ref, meta, where))


def meta_model(ref: ModelRef, path: Path, *, where: str, native_size: int,
               limits: BuildLimits = BuildLimits()) -> LoadedModel:
    """The model as build_model would make it, on the meta device: every check that needs no
    weight values (architecture, kwargs, config.json, checkpoint keys and shapes from the
    file's header, preprocessing, input size) at the cost of reading a header. Parameters
    take no memory."""
    meta = read_metadata(path)
    shapes = _strip_wrapper_prefix(_read(path, where, shapes_only=True))
    net, arch, kwargs, entry, info = _made(ref, meta, where, on_meta=True, ckpt=shapes,
                                           limits=limits)
    _check_fit(net, shapes, arch, kwargs, where, meta, entry)
    return _loaded(net, arch, kwargs, path.name, _choice(ref, meta, info, native_size, where),
                   entry.name, info, given_output(ref, meta, where))


def save_checkpoint(net: nn.Module, path: Path, arch: str, arch_kwargs: dict[str, Any],
                    dtype: torch.dtype | None = None, **extra: str) -> None:
    """Write a checkpoint the way a user would: safetensors with arch metadata (and any
    further metadata keys, e.g. preprocess or output); `dtype`: the floating tensors stored
    at that precision (loading casts them back to the model's)."""
    from safetensors.torch import save_file

    sd = {k: v.detach().contiguous().clone() for k, v in net.state_dict().items()}
    if dtype is not None:
        sd = {k: v.to(dtype) if v.is_floating_point() else v for k, v in sd.items()}
    save_file(sd, str(path),
              metadata={"arch": arch, "arch_kwargs": json.dumps(arch_kwargs), **extra})
