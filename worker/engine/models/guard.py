"""What a user's arch_kwargs or config.json may ask of a model build, checked before and while
the model is built.

A config is the user's input, and building it is the first thing that runs on it: a layer
count of 100,000 costs minutes of Python object creation even on the meta device, a string
where a width goes or a patch size of 0 raises deep inside a library. So:

  before   every size field (a count, a width, a depth) must be a whole number in range, and
           the layer fields together at most MAX_LAYERS: refused with the field's name
  during   the build runs under a budget of modules and parameters, counted as the library
           registers them (torch's global registration hooks): a config whose size the field
           rules do not see (a new field name, a huge position table) stops after at most the
           budget's worth of work
  after    any other exception of the build is the config's fault: the field is found by
           building again without each given field in turn (on the meta device, bounded), and
           named; the library's own words are kept only where they name the field
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from stitchsim.failure import Failure
from stitchsim_worker.engine.core.errors import interrupted
from stitchsim_worker.engine.core.resources import BuildLimits
from torch import nn
from torch.nn.modules import module as torch_module

MAX_LAYERS = 1000
"""Layers one model may ask for across its layer fields (the deepest timm models have ~270)."""
MAX_COUNT = 1 << 20
"""The largest value of any one size field: beyond every real width, vocabulary or image side,
and far from the int64 overflows of a meta forward over its shapes."""
MODULES_PER_LAYER = 3
"""The fewest modules a layer of a real model registers (a transformer block has ~13, a
residual block ~8): the layer fields times this is a floor of the build's module count,
known before anything is built."""
MAX_TRACE_COST = 2_000_000_000
"""Layers x width x tokens a spec check traces at most (vit_gigantic at 518 px is 1.1e8)."""
ISOLATION_BUDGET_S = 5.0
"""Wall time spent finding which field broke a build before naming every given field."""

# A size field by its name: counts (num_*), widths (*_size, *_dim, *_heads, *_channels) and
# depths (depth, depths, *_layers). Names are the libraries' (timm, torchvision, transformers).
_COUNT = re.compile(r"^(num_.+|.+_(size|sizes|dim|dims|depth|depths|layers|heads|channels|chans"
                    r"|ratio_int)|depths?|width|layers|img_size|image_size)$")
# Widths and divisors: 0 is never meaningful (num_classes=0 is: a headless timm model).
_WIDTH = re.compile(r"^(.+_(size|sizes|dim|dims|heads|channels|chans)|width)$")
LAYER_FIELD = re.compile(r"^(depths?|layers|num_(hidden_)?layers|num_.+_layers|.+_depths?)$")
_LAYERS = LAYER_FIELD
# Label names and their indices: data, not a sub-config.
_LABEL_MAPS = frozenset({"id2label", "label2id"})
# Fields whose names match but that are not sizes (transformers' chunking switch, ids).
_NOT_SIZES = frozenset({"chunk_size_feed_forward", "pad_token_id", "bos_token_id",
                        "eos_token_id", "decoder_start_token_id", "sep_token_id"})


@dataclass(frozen=True)
class Given:
    """The fields a user gave a build, and where they wrote them."""

    fields: Mapping[str, Any]
    origin: str
    """"arch_kwargs" or "config.json": what the message tells the user to edit."""
    code: str
    """The registry code of a refused value: invalid_arch_kwargs or invalid_model_config."""
    defaults: Mapping[str, Any] | None = None
    """The values the library builds with when a field is not given (transformers' config
    classes have them; timm and torchvision builders take **kwargs and do not say)."""
    overrides: frozenset[str] = frozenset()
    """Fields the spec's arch_kwargs set over the config.json's (named as arch_kwargs')."""

    def origin_of(self, name: str) -> tuple[str, str]:
        """Where the user wrote the field, and the code refusing it."""
        if name.split(".")[0] in self.overrides:
            return "arch_kwargs", "invalid_arch_kwargs"
        return self.origin, self.code


def _refuse(given: Given, where: str, name: str, why: str, code: str | None = None,
            **details: Any) -> Failure:
    origin, refused = given.origin_of(name)
    return Failure(code or refused, f"{where}: {origin} field {name!r} {why}",
                   {"field": name, "file": origin, **details})


def _ints(value: Any) -> list[int] | None:
    """The whole numbers of a size value (one, or a list of them), None if it is not one."""
    items = value if isinstance(value, (list, tuple)) else [value]
    if all(isinstance(v, int) and not isinstance(v, bool) for v in items):
        return list(items)
    return None


def _is_size(name: str, default: Any) -> bool:
    if name in _NOT_SIZES:
        return False
    if default is not None and (isinstance(default, bool) or _ints(default) is None):
        return False  # the library holds something else there (out_features: stage names)
    # By its name; or a field the library's defaults hold as a whole number, whatever its name.
    return bool(_COUNT.match(name)) or default is not None


def check_fields(given: Given, where: str, prefix: str = "") -> None:
    """Refuse a size field that is not a whole number, is negative, is 0 where 0 means
    nothing, or is beyond MAX_COUNT; and layer fields that ask for more than MAX_LAYERS."""
    defaults = given.defaults or {}
    layers = 0
    for key, value in given.fields.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and key not in _LABEL_MAPS:  # a sub-config (vision_config)
            origin, code = given.origin_of(name)
            check_fields(Given(value, origin, code), where, f"{name}.")
            continue
        default = defaults.get(key)
        if value is None or not _is_size(key, default):
            continue
        numbers = _ints(value)
        if numbers is None:
            if isinstance(value, float) and _ints(default) is None and not _WIDTH.match(key):
                continue  # a ratio (mlp_ratio) spelled like a count
            raise _refuse(given, where, name, f"must be a whole number{_or_list(default)}, not "
                          f"{_show(value)}", value=_show(value))
        if any(n < 0 for n in numbers):
            raise _refuse(given, where, name, f"must not be negative, got {_show(value)}")
        positive = _WIDTH.match(key) or any(n > 0 for n in _ints(default) or [])
        if positive and any(n == 0 for n in numbers):
            raise _refuse(given, where, name, f"must be at least 1, got {_show(value)}")
        if any(n > MAX_COUNT for n in numbers):
            raise _refuse(given, where, name, f"is {_show(value)}, beyond the {MAX_COUNT:,} this "
                          "service builds any size field to", code="model_too_large",
                          limit=MAX_COUNT)
        if _LAYERS.match(key):
            layers += sum(numbers)
            if layers > MAX_LAYERS:
                raise _refuse(given, where, name, f"asks for {layers:,} layers, more than the "
                              f"{MAX_LAYERS:,} this service builds a model with",
                              code="model_too_large", layers=layers, limit=MAX_LAYERS)


def _or_list(default: Any) -> str:
    return " (or a list of them)" if isinstance(default, (list, tuple)) else ""


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Exhausted(Exception):
    """Raised from a registration hook: the build went past its budget."""


@dataclass
class _Count:
    limits: BuildLimits
    modules: int = 0
    params: int = 0
    over: str | None = None

    def module(self, *_: Any) -> None:
        self.modules += 1
        limit = self.limits.max_modules
        if limit is not None and self.modules > limit:
            self._stop(f"more than {limit:,} modules")

    def param(self, _module: nn.Module, _name: str, param: Any) -> None:
        if param is None:
            return
        self.params += param.numel()
        limit = self.limits.max_params
        if limit is not None and self.params > limit:
            self._stop(f"more than {limit:,} parameters")

    def _stop(self, over: str) -> None:
        self.over = over
        raise _Exhausted(over)


@contextmanager
def _counting(count: _Count) -> Iterator[_Count]:
    handles = [torch_module.register_module_module_registration_hook(count.module),
               torch_module.register_module_parameter_registration_hook(count.param)]
    try:
        yield count
    finally:
        for h in handles:
            h.remove()


def _size_fields(given: Given) -> str:
    named = [f"{k}={_show(v)}" for k, v in given.fields.items()
             if not isinstance(v, dict) and _is_size(k, (given.defaults or {}).get(k))
             and _ints(v) is not None]
    return ", ".join(named[:8]) or "its size fields"


def _flat(fields: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, str, Any]]:
    """(dotted name, own name, value) of every field, sub-configs (vision_config) opened."""
    for key, value in fields.items():
        if isinstance(value, dict) and key not in _LABEL_MAPS:
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", key, value


@dataclass(frozen=True)
class Cost:
    """What a config asks a build and a trace for, read from its size fields alone."""

    layers: int
    width: int
    tokens: int
    fields: tuple[str, ...]
    """The fields these figures come from, as the refusal names them."""

    @property
    def trace(self) -> int:
        return self.layers * self.width * self.tokens


def _largest(items: list[tuple[str, int]]) -> tuple[str, int] | None:
    return max(items, key=lambda item: item[1]) if items else None


def config_cost(given: Given) -> Cost:
    """Layers (every layer field summed), width (the widest width field) and tokens (image
    side over patch side, squared; 1 without a patch field) of the fields, the library's
    defaults filling those not given."""
    fields = {**(given.defaults or {}), **given.fields}
    layers: list[tuple[str, int]] = []
    widths: list[tuple[str, int]] = []
    sides: dict[str, tuple[str, int]] = {}
    for name, key, value in _flat(fields):
        numbers = _ints(value) if key not in _NOT_SIZES else None
        if not numbers:
            continue
        if _LAYERS.match(key):
            layers.append((name, sum(numbers)))
        elif _WIDTH.match(key) and not key.startswith(("image_", "img_", "patch_")):
            widths.append((name, max(numbers)))
        if key in ("image_size", "img_size", "patch_size"):
            sides.setdefault(key.split("_")[0], (name, max(numbers)))
    named = [n for n, _ in layers]
    width = _largest(widths)
    tokens = 1
    if "patch" in sides and ("image" in sides or "img" in sides):
        image, patch = sides.get("image") or sides["img"], sides["patch"]
        tokens = (image[1] // max(patch[1], 1)) ** 2 + 1
        named += [image[0], patch[0]]
    return Cost(sum(n for _, n in layers), width[1] if width else 1, tokens,
                tuple(named + ([width[0]] if width else [])))


def check_cost(given: Given, where: str, label: str, limits: BuildLimits) -> None:
    """model_too_large, before anything is built, for a config whose layers alone take more
    modules than the limit allows, or whose trace (layers x width x tokens) is beyond
    MAX_TRACE_COST: a legal but slow config would otherwise hold a check worker until its
    time limit, and other keys' checks behind it."""
    if limits.max_modules is None:  # a job's build of a spec its check passed
        return
    cost = config_cost(given)
    shown = ", ".join(f"{n}={_show(_at(given.fields, n))}" for n in cost.fields
                      if _at(given.fields, n) is not None) or "its layer fields"
    details = {"file": given.origin, "fields": list(cost.fields), "layers": cost.layers,
               "width": cost.width, "tokens": cost.tokens}
    floor = cost.layers * MODULES_PER_LAYER
    if floor > limits.max_modules:
        raise Failure(
            "model_too_large",
            f"{where}: {label} as {given.origin} describes it asks for {cost.layers:,} layers, "
            f"at least {floor:,} modules, more than the {limits.max_modules:,} this service "
            f"builds (STITCHSIM_MAX_MODEL_MODULES); make it smaller: {shown}",
            {**details, "modules_at_least": floor, "limit": limits.max_modules})
    if cost.trace > MAX_TRACE_COST:
        raise Failure(
            "model_too_large",
            f"{where}: {label} as {given.origin} describes it would trace {cost.layers:,} "
            f"layers x {cost.width:,} wide x {cost.tokens:,} tokens = {cost.trace:,}, more "
            f"than the {MAX_TRACE_COST:,} this service checks; make it smaller: {shown}",
            {**details, "trace": cost.trace, "limit": MAX_TRACE_COST})


def _at(fields: Mapping[str, Any], dotted: str) -> Any:
    value: Any = fields
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def guarded_build(build: Callable[[Mapping[str, Any]], nn.Module], given: Given, where: str,
                  label: str, limits: BuildLimits) -> nn.Module:
    """build(fields) under the limits, with given.fields checked first and its cost
    estimated; any failure of the build becomes a Failure naming the field that caused it."""
    check_fields(given, where)
    check_cost(given, where, label, limits)
    count = _Count(limits)
    try:
        with _counting(count):
            net = build(given.fields)
    except Exception as exc:  # noqa: BLE001 - a user's config broke the library: theirs to fix
        if interrupted(exc):
            raise
        if count.over is not None:  # whatever the library made of our stop
            raise _too_large(given, where, label, count) from None
        if isinstance(exc, Failure):
            raise
        raise _blamed(build, given, where, label, limits, exc) from None
    if count.over is not None:  # a library that swallowed the stop and went on
        raise _too_large(given, where, label, count)
    return net


def _too_large(given: Given, where: str, label: str, count: _Count) -> Failure:
    return Failure(
        "model_too_large",
        f"{where}: {label} as {given.origin} describes it has {count.over}, more than this "
        "service builds (STITCHSIM_MAX_MODEL_PARAMS, STITCHSIM_MAX_MODEL_MODULES); make it "
        f"smaller: {_size_fields(given)}",
        {"file": given.origin, "parameters": count.params, "modules": count.modules,
         "limit": count.limits.max_params if count.over.endswith("parameters")
         else count.limits.max_modules,
         "limit_params": count.limits.max_params, "limit_modules": count.limits.max_modules})


def _blamed(build: Callable[[Mapping[str, Any]], nn.Module], given: Given, where: str,
            label: str, limits: BuildLimits, exc: Exception) -> Failure:
    """The Failure naming the field without which the build succeeds (tried one at a time,
    on the meta device, within ISOLATION_BUDGET_S); every given field when none is alone."""
    named = _ARGUMENT.search(str(exc)) if isinstance(exc, TypeError) else None
    if named is not None and named.group(2) in given.fields:
        # Python's own words name the argument: no need to build again to find it.
        why = ("is not an argument {label} takes" if named.group(1) == "unexpected"
               else "is fixed by {label} (its name sets it)").format(label=label)
        return _refuse(given, where, named.group(2), f"{why}; remove it")
    field = _culprit(build, given, limits)
    said = library_words(exc, field)
    if field is not None:
        value = _show(given.fields[field])
        return _refuse(given, where, field, f"= {value} does not build {label}"
                       f"{f' ({said})' if said else ''}; fix or remove it",
                       value=value)
    names = ", ".join(sorted(given.fields)[:12]) or "none"
    return Failure(given.code,
                   f"{where}: {label} cannot be built from these {given.origin} fields "
                   f"({names}){f': {said}' if said else ''}; check their values",
                   {"file": given.origin, "fields": sorted(given.fields)})


_ARGUMENT = re.compile(r"(unexpected|multiple values for) keyword argument '(\w+)'")

# Fields that identify what is built rather than size it: dropping them proves nothing.
_IDENTITY = frozenset({"model_type", "architectures", "architecture", "transformers_version"})


def _culprit(build: Callable[[Mapping[str, Any]], nn.Module], given: Given,
             limits: BuildLimits) -> str | None:
    import torch

    deadline = time.monotonic() + ISOLATION_BUDGET_S
    for name in given.fields:
        if name in _IDENTITY or time.monotonic() > deadline:
            continue
        rest = {k: v for k, v in given.fields.items() if k != name}
        try:
            with torch.device("meta"), _counting(_Count(limits)):
                build(rest)
        except Exception as exc:  # noqa: BLE001 - still broken without it: not this field
            if interrupted(exc):
                raise
            continue
        return name
    return None


_INTERNAL = re.compile(r"\b[A-Z][A-Za-z]+(Error|Exception)\b|Expected cond|0x[0-9a-f]+"
                       r"|__\w+__|Traceback")


def library_words(exc: Exception, field: str | None) -> str:
    """The library's message where it speaks of the field in its own terms (transformers'
    "hidden size (30) is not a multiple of ..."); nothing where it is an internal assertion
    or names internal classes (torch's "Expected cond to be True")."""
    text = " ".join(str(exc).split())
    if not text or _INTERNAL.search(text) or len(text) > 300:
        return ""
    if field is None or field.replace("_", " ") in text or field in text:
        return text
    return ""
