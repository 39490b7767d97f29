"""Model sources: where an architecture comes from (timm, torchvision, transformers, the
project's own, operator plugins), one registry entry each, named as the catalogue names them
(stitchsim.catalogue.MODEL_SOURCES). An `arch` is `SOURCE:NAME`; a plain name is timm's.

Each entry builds the network with random weights (the checkpoint supplies them; nothing is
ever downloaded) and says what the source knows of it: its stage outputs (the stitch points
`layers: "auto"` picks from), a fixed input size, its token layout, and its preprocessing
convention (the first candidate measured) or its own config's (which wins over measuring).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stitchsim import catalogue
from stitchsim.failure import Failure
from stitchsim.files.model_config import ConfigPreprocess, ModelConfig
from stitchsim_worker.engine.core.registry import Registry, register_package
from torch import nn

Triple = tuple[float, float, float]
Shapes = dict[str, tuple[int, ...]]
Candidate = tuple[str, Triple, Triple]
IMAGENET: Candidate = ("imagenet", (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
MAX_LISTED = 8
OWN = "stitchsim"
# arch_kwargs that would make a source download weights or read a path.
FORBIDDEN_KWARGS = frozenset({"pretrained", "pretrained_cfg_overlay", "checkpoint_path",
                              "pretrained_cfg", "weights", "progress", "trust_remote_code",
                              "pretrained_model_name_or_path", "cache_dir", "auto_map"})


@dataclass(frozen=True)
class SourceInfo:
    """What a source knows of a network it built."""

    stages: list[str] | None = None
    """Stage outputs in order; None: the network's timm feature_info, else evenly spaced."""
    fixed_size: int | None = None
    """The one input size it takes (position embeddings sized for it)."""
    convention: Candidate | None = None
    """The architecture's usual normalisation: the first candidate measured."""
    own: ConfigPreprocess | None = None
    """The checkpoint's own config's preprocessing: wins over any measurement."""
    num_prefix_tokens: int = 0
    patch_grid: tuple[int, int] | None = None
    output_fmt: str = "NCHW"
    metadata: dict[str, str] = field(default_factory=dict)
    """For the report: where the model came from (layout, config file, class)."""


@dataclass(frozen=True)
class Build:
    """What a source is asked to build: the name after `SOURCE:`, kwargs, the folder config."""

    name: str
    kwargs: dict[str, Any]
    config: ModelConfig | None
    where: str


@dataclass(frozen=True)
class SourceEntry:
    name: str
    build: Callable[[Build], nn.Module]
    """A network with random weights (on the current default device: meta for checks)."""
    knows: Callable[[str], bool]
    """Whether NAME is one of the source's architectures (no build)."""
    similar: Callable[[str], list[str]]
    """Names close to an unknown one, for the error message."""
    describe: Callable[[nn.Module, Build], SourceInfo]
    listing: Callable[[], list[str]] = list
    """Every architecture name (for documentation and `list_models`-like answers)."""
    layouts: Callable[[nn.Module], list[Shapes]] | None = None
    """The checkpoint layouts the network loads from (key -> shape), preferred first; None:
    its own state dict's."""
    load: Callable[[nn.Module, Path, int], None] | None = None
    """Loads a checkpoint of layout k (an index into layouts) into the network; None: a
    strict load_state_dict of the file's tensors (layout 0)."""
    preload: Callable[[], object] | None = None
    """Imports what the source imports on first use (a library, its registries), so a
    long-lived worker process pays that before its first check, not during it."""
    defaults: Callable[[Build], dict[str, Any] | None] | None = None
    """The field values the source builds with where the user gives none (a config class's
    defaults); they tell a size field and its range (models.guard). None: not known."""


def own_layout(net: nn.Module) -> Shapes:
    return {k: tuple(v.shape) for k, v in net.state_dict().items()}


SOURCES: Registry[SourceEntry] = Registry("model source")


def register_source(entry: SourceEntry) -> SourceEntry:
    return SOURCES.register(entry)


def build_with(library: str, create: Callable[..., nn.Module], b: Build) -> nn.Module:
    """`create(name, **kwargs)` of a library, with random weights; a library's refusal of the
    kwargs becomes invalid_arch_kwargs naming the field in the one place builds are guarded
    (models.guard, called by loading)."""
    check_kwargs(b.kwargs, b.where)
    return create(b.name, **b.kwargs)


def check_kwargs(kwargs: dict[str, Any], where: str) -> None:
    bad = sorted(FORBIDDEN_KWARGS & kwargs.keys())
    if bad:
        raise Failure("invalid_spec", f"{where}: arch_kwargs may not set {bad}: weights come "
                      "from the checkpoint only")


def source_of(arch: str, where: str) -> tuple[SourceEntry, str]:
    """The source entry and the name within it; unknown_arch saying what to write instead."""
    source, name = catalogue.split_arch(arch)
    if source not in SOURCES or not catalogue.arch_name_ok(arch):
        prefixes = ", ".join(f"{e.prefix}:NAME" for e in catalogue.MODEL_SOURCES)
        raise Failure("unknown_arch",
                      f"{where}: {arch!r} names no model source; write a timm name or one of "
                      f"{prefixes} (no hub downloads, no paths)")
    entry = SOURCES[source]
    if ":" not in arch and not entry.knows(name) and SOURCES[OWN].knows(name):
        # The project's own architectures went by plain names before they had a source
        # (checkpoints say `arch: conv_autoencoder`): a name timm lacks falls to them.
        entry = SOURCES[OWN]
    if not entry.knows(name):
        close = entry.similar(name)[:MAX_LISTED]
        hint = f"; similar names: {', '.join(close)}" if close else ""
        label = catalogue.MODEL_SOURCES.label(source)
        article = "an" if label[:1].lower() in "aeiou" else "a"
        raise Failure("unknown_arch",
                      f"{where}: {name!r} is not {article} {label} architecture{hint}",
                      {"source": source, "similar": close})
    return entry, name


# Each module of this package registers its sources on import; found, then in the catalogue's order.
register_package(__name__, __path__, SOURCES, catalogue.MODEL_SOURCES.names)
