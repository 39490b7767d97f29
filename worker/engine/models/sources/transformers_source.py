"""transformers: a model class the library ships, found in its own auto registries, built with
random weights from the checkpoint's config.json (save_pretrained's folder) or from arch_kwargs
as config fields. Never remote code (auto_map is refused before this runs), never a hub
download: the config comes from the upload, the weights from the checkpoint.

The library is imported on first use only: it takes seconds, and most jobs are timm's. A
long-lived worker process imports it at start (`preload`), so the first spec check of a
transformers folder does not spend its time limit on imports."""

from __future__ import annotations

import difflib
import functools
import os
import tempfile
from pathlib import Path
from typing import Any

from stitchsim.failure import Failure
from stitchsim.files.model_config import CONFIG_FILE
from stitchsim_worker.engine.models.sources import (
    IMAGENET,
    Build,
    Shapes,
    SourceEntry,
    SourceInfo,
    check_kwargs,
    own_layout,
    register_source,
)
from torch import nn

# Belt and braces: every call below reads local files only, and the hub client is told so.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@functools.cache
def _classes() -> dict[str, tuple[str, ...]]:
    """Class name -> the model types it serves, from every MODEL_*_MAPPING_NAMES registry."""
    from transformers.models.auto import modeling_auto

    out: dict[str, list[str]] = {}
    for attr in dir(modeling_auto):
        if not (attr.startswith("MODEL") and attr.endswith("_MAPPING_NAMES")):
            continue
        for model_type, names in getattr(modeling_auto, attr).items():
            for name in (names,) if isinstance(names, str) else names:
                out.setdefault(name, [])
                if model_type not in out[name]:
                    out[name].append(model_type)
    return {k: tuple(v) for k, v in out.items()}


def _config(b: Build, types: tuple[str, ...]) -> Any:
    from transformers import CONFIG_MAPPING

    fields: dict[str, Any] = dict(b.config.config) if b.config is not None else {}
    fields.update(b.kwargs)
    model_type = fields.setdefault("model_type", types[0])
    origin = CONFIG_FILE if b.config is not None else "arch_kwargs"
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        close = difflib.get_close_matches(str(model_type), list(CONFIG_MAPPING.keys()), n=5)
        raise Failure("invalid_model_config",
                      f"{b.where}: {origin}: field 'model_type' is {model_type!r}, which "
                      f"transformers does not know (similar: {', '.join(close) or 'none'}); "
                      "save the model with a released transformers version",
                      {"file": origin, "field": "model_type"})
    if model_type not in types:
        raise Failure("invalid_model_config",
                      f"{b.where}: {origin}: field 'model_type' is {model_type!r}, but "
                      f"{b.name} serves {', '.join(types)}; fix 'architectures' or "
                      "'model_type' (or --arch transformers:CLASS)",
                      {"file": origin, "field": "model_type"})
    fields = {k: v for k, v in fields.items() if k not in ("architectures", "transformers_version")}
    # A value the config class refuses is the config's fault: models.guard names the field.
    return CONFIG_MAPPING[model_type].from_dict(fields)


def _defaults(b: Build) -> dict[str, Any] | None:
    """The config class's defaults for the model type the build names (a field the user
    leaves out takes them)."""
    from transformers import CONFIG_MAPPING

    types = _classes().get(b.name)
    given = b.config.config.get("model_type") if b.config is not None else None
    model_type = b.kwargs.get("model_type", given) or (types[0] if types else None)
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        return None
    try:
        return CONFIG_MAPPING[model_type]().to_dict()
    except Exception:  # noqa: BLE001 - a class without usable defaults: sizes by name only
        return None


def _tensor_output(out: Any) -> Any:
    """The one tensor a model's output stands for: class logits, else the pooled vector, else
    the last hidden state."""
    for key in ("logits", "pooler_output", "image_embeds", "last_hidden_state"):
        value = getattr(out, key, None)
        if value is not None:
            return value
    return out[0] if isinstance(out, (tuple, list)) else out


def _returning_tensor(net: nn.Module) -> nn.Module:
    # The same module (names, state dict and all) whose forward returns a tensor, as every
    # other source's does: the class is swapped for a subclass, nothing is wrapped.
    base = type(net)

    def forward(self: nn.Module, pixel_values: Any) -> Any:
        return _tensor_output(base.forward(self, pixel_values))

    net.__class__ = type(base.__name__, (base,), {"forward": forward,
                                                 "__module__": base.__module__})
    return net


def _build(b: Build) -> nn.Module:
    check_kwargs(b.kwargs, b.where)
    import transformers

    config = _config(b, _classes()[b.name])
    return _returning_tensor(getattr(transformers, b.name)(config))


# The block lists of HF vision models: vit.layers, encoder.layer, encoder.stages ...
def _layouts(net: nn.Module) -> list[Shapes]:
    """The model's own keys, and the keys save_pretrained writes (transformers renames and
    fuses some weights on load: it reverts that on save, so older layouts load too)."""
    own = own_layout(net)
    try:  # transformers 5: older releases save the model's own keys
        from transformers.core_model_loading import revert_weight_conversion

        saved = revert_weight_conversion(net, dict(net.state_dict()))
    except Exception:  # noqa: BLE001 - no conversion known: the own layout is the one
        return [own]
    return [own, {k: tuple(v.shape) for k, v in saved.items()}]


def _load(net: nn.Module, path: Path, layout: int) -> None:
    """A save_pretrained layout, converted by the library's own loader: the file is offered
    as a local folder with the config already built (local files only: nothing downloads)."""
    base = type(net).__mro__[1]  # the library's class (ours only returns a tensor)
    with tempfile.TemporaryDirectory(prefix="stitchsim-hf-") as tmp:
        os.symlink(path.resolve(), Path(tmp) / "model.safetensors")
        loaded = base.from_pretrained(tmp, config=net.config, local_files_only=True)
    net.load_state_dict(loaded.state_dict(), strict=True)


_STAGE_LISTS = ("layer", "layers", "stages", "block", "blocks")


def _stages(net: nn.Module) -> list[str] | None:
    best: list[str] = []
    for name, module in net.named_modules():
        if (isinstance(module, nn.ModuleList) and name.rsplit(".", 1)[-1] in _STAGE_LISTS
                and len(module) > len(best)):
            best = [f"{name}.{k}" for k in range(len(module))]
    return best or None


def _describe(net: nn.Module, b: Build) -> SourceInfo:
    config = getattr(net, "config", None)
    image = getattr(config, "image_size", None)
    patch = getattr(config, "patch_size", None)
    positions = any(hasattr(m, "position_embeddings") or hasattr(m, "position_embedding")
                    for m in net.modules())
    fixed = int(image) if positions and isinstance(image, int) else None
    tokens = sum(1 for n, _ in net.named_parameters() if n.endswith(("cls_token",
                                                                      "class_embedding")))
    tokens += int(getattr(config, "num_register_tokens", 0) or 0)
    grid = (fixed // patch, fixed // patch) if fixed and isinstance(patch, int) else None
    own = b.config.preprocess if b.config is not None else None
    meta = b.config.summary() if b.config is not None else {"class": b.name}
    return SourceInfo(
        stages=_stages(net),
        fixed_size=fixed,
        convention=IMAGENET,
        own=own if own is not None and own.mean is not None and own.std is not None else None,
        num_prefix_tokens=tokens,
        patch_grid=grid,
        output_fmt="NCHW",
        metadata=meta,
    )


def _preload() -> None:
    # The library, its model registries and the modelling base every class imports: what
    # the first build of any class otherwise imports (a class's own module is a fraction).
    import importlib

    import transformers.modeling_utils  # noqa: F401
    from transformers import CONFIG_MAPPING  # noqa: F401

    _classes()
    # What every class's module and the save_pretrained layouts (_layouts) import besides;
    # named by release, so a module another release lacks is skipped.
    for module in ("modeling_layers", "core_model_loading", "conversion_mapping",
                   "processing_utils"):
        try:
            importlib.import_module(f"transformers.{module}")
        except ImportError:
            continue


register_source(SourceEntry(
    name="transformers", build=_build, knows=lambda n: n in _classes(),
    similar=lambda n: difflib.get_close_matches(n, list(_classes()), n=8, cutoff=0.5),
    describe=_describe, listing=lambda: sorted(_classes()), layouts=_layouts, load=_load,
    preload=_preload, defaults=_defaults))
