"""How [0,1] pixels reach a model, and how that choice is made when nobody says.

The spec wins (explicit mean/std, or a named `preprocess`), then the checkpoint's metadata.
Otherwise the plausible candidates are measured: each is scored on a few hundred labelled
samples and the best-predicting one is used. A model trained elsewhere on plain [0,1] pixels,
uploaded with only its architecture, then gets its true accuracy instead of chance.

Accuracy decides only when it can: the best candidate must be off chance (the report's own
near-chance line) and beat every other one by an exact McNemar test on the same samples. A
model at chance on the dataset (trained on a shortcut it lacks) scores 0.148 / 0.111 / 0.086
by noise alone; then the normalisation statistics decide, or the choice says UNDETERMINED.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import timm
import torch
import torch.nn.functional as F
from stitchsim.failure import Failure
from stitchsim.models import ModelRef, PreprocessCandidate, PreprocessInfo, PreprocessSource
from stitchsim_worker.engine.measures.metrics import near_chance
from stitchsim_worker.engine.models.normstats import decisive, first_norm, stats_distance
from stitchsim_worker.engine.models.sources import SourceInfo
from torch import nn

Triple = tuple[float, float, float]
MEASURE_SAMPLES = 512
# Below this a convolutional stem leaves no spatial extent worth stitching (and ModelRef's
# own input_size field starts here).
MIN_INPUT_SIZE = 8
_MEASURE_BATCH = 128
ALPHA = 0.01
"""The McNemar test's level for "the best candidate predicts better than that one", split
over the comparisons (Bonferroni): a wrong pick by noise once in a hundred jobs at most."""


@dataclass(frozen=True)
class Preprocess:
    """Maps [0,1] RGB pixels to what the network expects (resize, then mean/std)."""

    input_size: int
    mean: Triple
    std: Triple

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.input_size or x.shape[-2] != self.input_size:
            x = F.interpolate(
                x, size=(self.input_size, self.input_size), mode="bilinear", align_corners=False
            )
        mean = x.new_tensor(self.mean).view(1, -1, 1, 1)
        std = x.new_tensor(self.std).view(1, -1, 1, 1)
        return (x - mean) / std


@dataclass(frozen=True)
class Choice:
    """A preprocessing and the record of how it was chosen; `pending` means: measure it."""

    preprocess: Preprocess
    info: PreprocessInfo
    pending: tuple[tuple[str, Triple, Triple], ...] = ()


def candidates(source: SourceInfo | nn.Module) -> list[tuple[str, Triple, Triple]]:
    """The architecture's convention first (timm's pretrained config, torchvision's weights'
    transforms ...), then plain pixels, then 0.5/0.5. A bare module is a timm model."""
    if isinstance(source, nn.Module):
        cfg = timm.data.resolve_data_config({}, model=source)
        convention: tuple[str, Triple, Triple] | None = (
            "timm", _triple(cfg["mean"]), _triple(cfg["std"]))
    else:
        convention = source.convention
    named = [
        *([convention] if convention is not None else []),
        ("none", (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),
        ("inception", (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    ]
    seen: set[tuple[Triple, Triple]] = set()
    out = []
    for name, mean, std in named:
        if (mean, std) not in seen:
            seen.add((mean, std))
            out.append((name, mean, std))
    return out


def _triple(values: Any) -> Triple:
    return (float(values[0]), float(values[1]), float(values[2]))


def metadata_json(meta: dict[str, str], key: str, where: str) -> Any:
    if key not in meta:
        return None
    try:
        return json.loads(meta[key])
    except json.JSONDecodeError as e:
        raise Failure("invalid_spec",
                      f"{where}: __metadata__[{key!r}] is not valid JSON ({e})") from e


def _check_triple(values: Any, what: str, where: str) -> Triple:
    if not isinstance(values, (list, tuple)) or len(values) != 3:
        raise Failure("invalid_spec", f"{where}: {what} needs 3 values (RGB), got {values!r}")
    try:
        out = _triple(values)
    except (TypeError, ValueError):
        raise Failure("invalid_spec", f"{where}: {what} must be numbers, got {values!r}") from None
    if what == "std" and min(out) <= 0:
        raise Failure("invalid_spec", f"{where}: std values must be positive, got {values!r}")
    return out


def _by_name(name: str, info: SourceInfo, where: str, origin: str) -> tuple[Triple, Triple]:
    options = candidates(info)
    if name == "timm" and info.convention is not None:  # "the architecture's own config"
        return options[0][1], options[0][2]
    for n, mean, std in options:
        if n == name:
            return mean, std
    if name == "inception":  # deduplicated away: the architecture's config is 0.5/0.5 already
        return (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
    raise Failure(
        "invalid_spec",
        f"{where}: {origin} preprocess {name!r} is not one of auto, timm, none, inception",
    )


def _name_of(mean: Triple, std: Triple, info: SourceInfo) -> str:
    return next((n for n, m, s in candidates(info) if (m, s) == (mean, std)), "custom")


def input_size(
    ref: ModelRef, meta: dict[str, str], fixed: int | None, native: int, where: str
) -> int:
    size = ref.input_size or metadata_json(meta, "input_size", where) or fixed or native
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise Failure("invalid_spec",
                      f"{where}: input_size must be a positive integer, got {size!r}")
    if fixed and size != fixed:
        raise Failure("invalid_spec",
                      f"{where}: {where}.input_size={size} but the model only takes {fixed}px")
    if size < MIN_INPUT_SIZE:
        raise Failure(
            "images_too_small",
            f"{where}: the dataset's images are {native}x{native} px, too small for a model to "
            f"see anything; set {where}.input_size (at least {MIN_INPUT_SIZE}) to upsample them, "
            "or upload larger images",
        )
    return size


def choose(
    ref: ModelRef, meta: dict[str, str], net: SourceInfo, size: int, where: str
) -> Choice:
    """What the spec, the metadata or the model's own config say; else a provisional choice
    marked for measurement."""

    def done(mean: Triple, std: Triple, source: PreprocessSource, note: str) -> Choice:
        info = PreprocessInfo(name=_name_of(mean, std, net), input_size=size, mean=mean,
                              std=std, source=source, note=note)
        return Choice(Preprocess(size, mean, std), info)

    if ref.mean is not None or ref.std is not None:
        base = ref.preprocess if ref.preprocess != "auto" else "none"
        mean0, std0 = _by_name(base, net, where, "spec")
        mean = _triple(ref.mean) if ref.mean is not None else mean0
        std = _triple(ref.std) if ref.std is not None else std0
        return done(mean, std, "spec", "mean/std given in the spec")
    if ref.preprocess != "auto":
        mean, std = _by_name(ref.preprocess, net, where, "spec")
        return done(mean, std, "spec", f"preprocess {ref.preprocess!r} given in the spec")
    meta_mean = metadata_json(meta, "mean", where)
    meta_std = metadata_json(meta, "std", where)
    meta_name = meta.get("preprocess")
    if meta_mean is not None or meta_std is not None or meta_name:
        mean0, std0 = _by_name(meta_name or "none", net, where, "metadata")
        mean = _check_triple(meta_mean, "mean", where) if meta_mean is not None else mean0
        std = _check_triple(meta_std, "std", where) if meta_std is not None else std0
        keys = [k for k in ("preprocess", "mean", "std") if k in meta]
        return done(mean, std, "metadata", f"from the checkpoint's metadata ({', '.join(keys)})")
    own = net.own
    if own is not None and own.mean is not None and own.std is not None:
        # The source's own config (an HF image processor, a timm hub pretrained_cfg) says
        # what the model was trained with: no measurement can know better.
        return done(own.mean, own.std, "config", f"from the checkpoint's own {own.origin}")
    options = tuple(candidates(net))
    name, mean, std = options[0]
    info = PreprocessInfo(name=name, input_size=size, mean=mean, std=std, source="default",
                          note="not measured: no labelled samples were available")
    return Choice(Preprocess(size, mean, std), info, pending=options)


@torch.no_grad()
def _correct(
    net: nn.Module, pre: Preprocess, images: torch.Tensor, labels: torch.Tensor,
    device: torch.device,
) -> torch.Tensor:
    """Per sample: whether the model predicts its label under this preprocessing."""
    right = []
    for s in range(0, len(labels), _MEASURE_BATCH):
        x = pre(images[s : s + _MEASURE_BATCH].to(device))
        right.append(net(x).argmax(-1).cpu() == labels[s : s + _MEASURE_BATCH])
    return torch.cat(right) if right else torch.zeros(0, dtype=torch.bool)


def mcnemar_p(better: int, worse: int) -> float:
    """Exact two-sided McNemar p-value for paired right/wrong outcomes: `better` samples only
    the first candidate gets right, `worse` only the second; under "equally accurate" each
    such sample is a fair coin."""
    n = better + worse
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(better, worse) + 1)) / 2**n
    return min(1.0, 2 * tail)


def _wilson(right: int, n: int, z: float = 1.96) -> tuple[float, float]:
    p = right / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def _separated(scored: list[PreprocessCandidate], correct: list[torch.Tensor],
               chance: float) -> PreprocessCandidate | None:
    """The best-predicting candidate when accuracy tells it apart: off chance (near_chance,
    the line the report draws), and better than every other candidate by McNemar's test on
    the same samples. None: accuracy decides nothing."""
    order = sorted(range(len(scored)), key=lambda k: -float(correct[k].float().mean()))
    best = order[0]
    right, n = int(correct[best].sum()), len(correct[best])
    if n == 0 or near_chance(right / n, _wilson(right, n), chance):
        return None
    level = ALPHA / max(1, len(scored) - 1)
    for k in order[1:]:
        better = int((correct[best] & ~correct[k]).sum())
        worse = int((~correct[best] & correct[k]).sum())
        if better <= worse or mcnemar_p(better, worse) >= level:
            return None
    return scored[best]


def _by_stats(
    scored: list[PreprocessCandidate], net: nn.Module, images: torch.Tensor, size: int,
    device: torch.device,
) -> tuple[list[PreprocessCandidate], PreprocessCandidate | None]:
    """Each candidate's distance to the first normalisation layer's running statistics, and
    the clearly closest one (None: no such layer, or none stands out)."""
    norm = first_norm(net)
    if norm is None:
        return scored, None
    batch = images[:_MEASURE_BATCH].to(device)
    distances = [stats_distance(net, norm, Preprocess(size, c.mean, c.std)(batch))
                 for c in scored]
    scored = [c.model_copy(update={"stats_distance": d}) for c, d in zip(scored, distances,
                                                                           strict=True)]
    k = decisive(distances)
    return scored, (scored[k] if k is not None else None)


def measure(
    choice: Choice, net: nn.Module, images: torch.Tensor, labels: torch.Tensor | None,
    device: torch.device, classes: int | None = None,
) -> Choice:
    """Score every pending candidate: by accuracy on labelled samples where that tells them
    apart (off chance, and apart by McNemar's test); else by how well each matches the first
    normalisation layer's running statistics; else the choice is undetermined, and says so.
    `classes`: the dataset's, for chance (else told from the labels)."""
    if not choice.pending:
        return choice
    n = min(MEASURE_SAMPLES, len(images))
    images = images[:n]
    labelled = labels is not None and bool((labels[:n] >= 0).all()) and n > 0
    size = choice.preprocess.input_size
    correct = [_correct(net, Preprocess(size, mean, std), images, labels[:n], device)
               for _, mean, std in choice.pending] if labelled and labels is not None else []
    scored = [
        PreprocessCandidate(name=name, mean=mean, std=std,
                            accuracy=float(correct[k].float().mean()) if correct else None)
        for k, (name, mean, std) in enumerate(choice.pending)
    ]
    best = None
    if correct and labels is not None:
        chance = 1.0 / (classes or int(labels[:n].max()) + 1)
        best = _separated(scored, correct, chance)
    how = "predicts best"
    if best is None:
        scored, best = _by_stats(scored, net, images, size, device)
        how = "matches the first normalisation layer's running statistics best"
    ranking = ", ".join(_ranked(c) for c in scored)
    samples = f"{n} {'labelled ' if labelled else ''}training samples"
    if best is None:
        first = scored[0]
        note = (f"UNDETERMINED: no preprocessing in the spec, the checkpoint's metadata or its "
                f"config, and measuring on {samples} did not tell the candidates apart "
                f"({ranking}); {first.name} was used, the architecture's convention, and every "
                "figure rests on that guess: set preprocess or mean/std in the spec")
        info = choice.info.model_copy(update={"source": "undetermined", "note": note,
                                              "candidates": scored, "samples": n})
        return Choice(Preprocess(size, first.mean, first.std), info)
    note = (f"measured: no preprocessing in the spec, the checkpoint's metadata or its "
            f"config, so each candidate was scored on {samples} ({ranking}); {best.name} "
            f"{how}")
    info = choice.info.model_copy(update={
        "name": best.name, "mean": best.mean, "std": best.std, "source": "measured",
        "note": note, "candidates": scored, "samples": n,
    })
    return Choice(Preprocess(size, best.mean, best.std), info)


def _ranked(c: PreprocessCandidate) -> str:
    parts = [f"accuracy {c.accuracy:.3f}"] if c.accuracy is not None else []
    if c.stats_distance is not None:
        parts.append(f"stats distance {c.stats_distance:.3g}")
    return f"{c.name} {', '.join(parts) or 'not scored'}"
