"""A loaded model as the engine sees it: stitch points, their shapes, and its cut parts.

All parts take [0,1] pixel images and apply the model's own preprocessing first.
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Callable, Sequence

import torch
from stitchsim.failure import Failure
from stitchsim.models import FulaPoints
from stitchsim_worker.engine.core.errors import interrupted
from stitchsim_worker.engine.models.cutting import (
    BackPart,
    ModelSplitter,
    PeakMode,
    PointTrace,
    module_order,
)
from stitchsim_worker.engine.models.guard import library_words
from stitchsim_worker.engine.models.loading import LoadedModel
from stitchsim_worker.engine.models.rep import Rep, rep_of
from torch import nn

AUTO_POINTS = 4
LIST_POINTS = "`stitchsim points FILE` or `stitchsim-server points ARCH`"
"""Where a user finds the full list; the service adds its route with the checkpoint's id."""
EXAMPLE_BATCH = 2


class Network:
    def __init__(self, model: LoadedModel, image_size: int, device: torch.device, where: str):
        self.model = model
        self.where = where
        self.device = device
        self.net = model.net.to(device)
        self.preprocess = model.preprocess
        if device.type == "cuda":
            # Convolutions run faster on NHWC on GPUs; weights follow, inputs in _input.
            self.net = self.net.to(memory_format=torch.channels_last)
        example = torch.zeros(EXAMPLE_BATCH, 3, image_size, image_size, device=device)
        peak = PeakMode(EXAMPLE_BATCH)
        try:
            # The peak is read on the meta device only (the spec check's and the points'
            # forward): on a real device the mode would cost a job's first pass for nothing.
            with peak if device.type == "meta" else contextlib.nullcontext():
                self.traces: dict[str, PointTrace] = module_order(self.net,
                                                                   self._input(example))
        except Exception as e:  # noqa: BLE001 - any failure here is a model/input mismatch
            if interrupted(e):
                raise
            said = library_words(e, None)
            raise Failure(
                "invalid_input_size",
                f"{where}: {model.arch} does not run on {self.preprocess.input_size}px "
                f"inputs{f' ({said})' if said else ''}; set {where}.input_size, or check "
                "arch_kwargs / config.json fields such as img_size, image_size, patch_size "
                "and hidden_size (a width its heads must divide)",
                {"side": where, "input_size": self.preprocess.input_size},
            ) from e
        self.peak_values = peak.values
        """One sample's largest tensor inside the forward (PeakMode; 0 off the meta device)."""
        self.peak_what = peak.what
        self.order = list(self.traces)
        self.shapes = {name: t.shape for name, t in self.traces.items()}
        self.flops = max((t.flops for t in self.traces.values()), default=0.0)
        """Floating-point operations of one sample's forward pass."""
        self._index = {name: k for k, name in enumerate(self.order)}
        self._splitter = ModelSplitter(self.net)
        self._heads = {
            name: int(m.num_heads)
            for name, m in self.net.named_modules()
            if isinstance(getattr(m, "num_heads", None), int)
        }
        self.unstitchable = {
            name: why for name in self.order if (why := self._why_unstitchable(name)) is not None
        }
        # Parts are built once per point: a graph part costs a trace copy and a recompile.
        self._fronts: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}
        self._probes: dict[tuple[str, ...], Callable[[torch.Tensor], tuple]] = {}
        self._backs: dict[str, tuple[BackPart, list[str]]] = {}

    @property
    def output(self) -> str:
        """Its output kind (catalogue OUTPUT_KINDS): how a stitch into it is scored."""
        return self.model.output

    # ------------------------------------------------------------------ points

    @property
    def points(self) -> list[str]:
        """Every module output that can be stitched, in execution order."""
        return [p for p in self.order if p not in self.unstitchable]

    def check_point(self, name: str) -> None:
        if name in self.unstitchable:
            raise Failure(
                "unstitchable_point",
                f"{self.where}: {self.model.arch} cannot be stitched at {name!r}: "
                f"{self.unstitchable[name]}; pick another point ({LIST_POINTS} lists the "
                "stitchable ones)",
                {"point": name, "reason": self.unstitchable[name], "side": self.where},
            )
        if name in self._index:
            return
        close = difflib.get_close_matches(name, self.points, n=5, cutoff=0.5)
        stages = ", ".join(self.stage_points())
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise Failure(
            "unknown_layer",
            f"{self.where}: {self.model.arch} has no stitch point {name!r}; {hint}"
            f"stage outputs are {stages} ({LIST_POINTS} lists them all)",
            {"valid_stage_points": self.stage_points(), "point": name, "side": self.where},
        )

    def _why_unstitchable(self, name: str) -> str | None:
        trace = self.traces[name]
        if trace.calls > 1:
            return (
                f"module {name} runs {trace.calls} times per forward pass, so its output is "
                "not one tensor"
            )
        if not trace.dtype.is_floating_point:
            dtype = str(trace.dtype).removeprefix("torch.")
            return f"the output holds {dtype} values, not floats: there is nothing to fit"
        if trace.batch != EXAMPLE_BATCH:
            return (
                f"its output has {trace.batch} rows for a batch of {EXAMPLE_BATCH} images: it "
                "folds windows or heads into the batch, so it is not one representation per image"
            )
        heads = self._heads_around(name)
        if heads and len(trace.shape) == 3 and trace.shape[0] == heads:
            return (
                f"per-sample shape {trace.shape} splits {heads} attention heads "
                "(heads, tokens, head dim): no map/token/vector reading"
            )
        try:
            self.rep(name)
        except ValueError as e:
            return str(e)
        if self._splitter.reaches_logits(name) is False:
            return "the logits do not depend on its output"
        return None

    def _heads_around(self, name: str) -> int | None:
        """num_heads of the innermost attention module holding `name`, if any."""
        parts = name.split(".")
        for k in range(len(parts) - 1, 0, -1):
            heads = self._heads.get(".".join(parts[:k]))
            if heads:
                return heads
        return None

    def alias(self, name: str) -> str:
        """The first point whose output is the very tensor `name` outputs (itself if none)."""
        return self.traces[name].alias_of or name

    def stage_points(self) -> list[str]:
        """Stage outputs as the model's source lists them (timm's feature_info, torchvision's
        and transformers' stage modules), else evenly spaced module outputs."""
        info = getattr(self.net, "feature_info", None)
        points = self.points
        names: list[str] = []
        listed = self.model.info.stages
        if listed:
            names = [m for m in listed if m in self._index and m not in self.unstitchable]
        elif info is not None:
            modules = (
                info.module_name() if hasattr(info, "module_name") else [f["module"] for f in info]
            )
            names = [m for m in modules if m in self._index and m not in self.unstitchable]
        if len(names) < 2:
            body = points[: max(1, int(len(points) * 0.9))]
            step = max(1, len(body) // 8)
            names = body[step - 1 :: step]
        return sorted(dict.fromkeys(names), key=self._index.__getitem__)

    def auto_points(self) -> list[str]:
        stages = self.stage_points()
        if len(stages) <= AUTO_POINTS:
            return stages
        # Skip the stem-level first stage; spread the rest evenly, always keeping the last.
        last = len(stages) - 1
        picks = [round(1 + k * (last - 1) / (AUTO_POINTS - 1)) for k in range(AUTO_POINTS)]
        return [stages[k] for k in sorted(set(picks))]

    def block_points(self) -> list[str]:
        """Block outputs: each stage's blocks in execution order (the children of a stage
        that is a Sequential or a ModuleList, or of its `blocks` one, as in ResNet's layer1.0,
        layer1.1 or ConvNeXt's stages.0.blocks.0), the stage itself where it has none (a stem,
        a ViT block). ResNet-18: act1 and its 8 basic blocks, the paper's FuLA points."""
        modules = dict(self.net.named_modules())
        names: list[str] = []
        for stage in self.stage_points():
            module = modules.get(stage)
            inner, prefix = module, stage
            if not isinstance(inner, nn.Sequential | nn.ModuleList):
                inner, prefix = getattr(module, "blocks", None), f"{stage}.blocks"
            blocks = []
            if isinstance(inner, nn.Sequential | nn.ModuleList):
                blocks = [f"{prefix}.{child}" for child, _ in inner.named_children()]
                blocks = [b for b in blocks if b in self._index and b not in self.unstitchable]
            names += blocks or [stage]
        return sorted(dict.fromkeys(names), key=self._index.__getitem__)

    def later_points(self, point: str, kind: FulaPoints = "stages") -> list[str]:
        """Block or stage outputs after `point`: the FuLA alignment points beyond the stitch.

        One whose output is the point's own tensor (`layer3` for `layer3.1`, its last block)
        is the l = j term already, so it is no later point; nor is a second name of one.
        """
        k = self._index[point]
        seen = {self.alias(point)}
        later = []
        for p in self.block_points() if kind == "blocks" else self.stage_points():
            if self._index[p] > k and self.alias(p) not in seen:
                seen.add(self.alias(p))
                later.append(p)
        return later

    def rep(self, point: str) -> Rep:
        return rep_of(
            self.shapes[point],
            prefix_tokens=self.model.num_prefix_tokens,
            output_fmt=self.model.output_fmt,
            patch_grid=self._patch_grid(),
        )

    def _patch_grid(self) -> tuple[int, int] | None:
        if self.model.info.patch_grid is not None:
            return self.model.info.patch_grid
        grid = getattr(getattr(self.net, "patch_embed", None), "grid_size", None)
        return (int(grid[0]), int(grid[1])) if grid is not None else None

    # ------------------------------------------------------------------ parts

    def _input(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.preprocess(pixels)
        return x.contiguous(memory_format=torch.channels_last) if x.is_cuda else x

    def logits(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.net(self._input(pixels))

    def front(self, point: str) -> Callable[[torch.Tensor], torch.Tensor]:
        if point not in self._fronts:
            part = self._splitter.front(point)
            self._fronts[point] = lambda pixels: part(self._input(pixels))
        return self._fronts[point]

    def probe(self, points: Sequence[str]) -> Callable[[torch.Tensor], tuple]:
        key = tuple(points)
        if key not in self._probes:
            part = self._splitter.probe(points)
            self._probes[key] = lambda pixels: part(self._input(pixels))
        return self._probes[key]

    def back(self, point: str, outputs: Sequence[str] = ()) -> BackPart:
        """g_{>j}, returning the logits and the features at `outputs`.

        One part per point serves every objective: it always computes every later block
        output (which includes every later stage output, under a name of its own or of a
        block with the same tensor), so whether it needs the network input (the hook path) is
        a property of the point alone, the same for the part that trains FuLA and the one
        that evaluates hlm.
        """
        if point not in self._backs:
            widest = self._widest(point)
            self._backs[point] = (self._back_part(point, widest), widest)
        part, widest = self._backs[point]
        by_tensor = {self.alias(w): k for k, w in enumerate(widest)}
        if any(self.alias(o) not in by_tensor for o in outputs):
            return self._back_part(point, outputs)
        if list(outputs) == widest:
            return part
        pick = [by_tensor[self.alias(o)] for o in outputs]

        def run(z: torch.Tensor, pixels: torch.Tensor | None) -> tuple:
            logits, feats = part(z, pixels)
            return logits, [feats[k] for k in pick]

        return BackPart(run, needs_input=part.needs_input)

    def _widest(self, point: str) -> list[str]:
        """Every later block output, and any later stage output no block shares a tensor with."""
        blocks = self.later_points(point, "blocks")
        covered = {self.alias(b) for b in blocks}
        extra = [p for p in self.later_points(point, "stages") if self.alias(p) not in covered]
        return sorted([*blocks, *extra], key=self._index.__getitem__)

    def _back_part(self, point: str, outputs: Sequence[str]) -> BackPart:
        part = self._splitter.back(point, outputs)
        if not part.needs_input:
            return part
        return BackPart(
            lambda z, pixels: part(z, None if pixels is None else self._input(pixels)),
            needs_input=True,
        )


def pair_points(front: Sequence[str], back: Sequence[str]) -> list[tuple[str, str]]:
    """Pairs stitch points by relative depth (the shorter list sets the count)."""
    if not front or not back:
        return []
    short, long_, flipped = (front, back, False) if len(front) <= len(back) else (back, front, True)
    pairs = []
    for k, p in enumerate(short):
        depth = k / max(1, len(short) - 1)
        q = long_[round(depth * (len(long_) - 1))]
        pairs.append((q, p) if flipped else (p, q))
    return pairs
