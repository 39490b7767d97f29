"""A loaded model as the engine sees it: stitch points, their shapes, and its cut parts.

All parts take [0,1] pixel images and apply the model's own preprocessing first.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence

import torch
from stitchsim_worker.engine.errors import SpecError
from stitchsim_worker.engine.models import LoadedModel
from stitchsim_worker.engine.split import BackPart, ModelSplitter, module_order
from stitchsim_worker.engine.stitch import Rep, rep_of

AUTO_POINTS = 4


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
        example = torch.zeros(2, 3, image_size, image_size, device=device)
        try:
            self.order, self.shapes = module_order(self.net, self._input(example))
        except Exception as e:  # noqa: BLE001 - any failure here is a model/input mismatch
            raise SpecError(
                f"{where}: {model.arch} does not run on {self.preprocess.input_size}px "
                f"inputs ({e}); set {where}.input_size or arch_kwargs such as img_size",
                code="invalid_input_size",
            ) from e
        self._index = {name: k for k, name in enumerate(self.order)}
        self._splitter = ModelSplitter(self.net)

    # ------------------------------------------------------------------ points

    @property
    def points(self) -> list[str]:
        return list(self.order)

    def check_point(self, name: str) -> None:
        if name in self._index:
            return
        close = difflib.get_close_matches(name, self.order, n=5, cutoff=0.5)
        stages = ", ".join(self.stage_points())
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise SpecError(
            f"{self.where}: {self.model.arch} has no stitch point {name!r}; {hint}"
            f"stage outputs are {stages} (GET the full list with list_stitch_points)",
            code="unknown_layer",
            details={"valid_stage_points": self.stage_points()},
        )

    def stage_points(self) -> list[str]:
        """Stage outputs from timm's feature_info, else evenly spaced module outputs."""
        info = getattr(self.net, "feature_info", None)
        names: list[str] = []
        if info is not None:
            modules = (
                info.module_name() if hasattr(info, "module_name") else [f["module"] for f in info]
            )
            names = [m for m in modules if m in self._index]
        if len(names) < 2:
            body = self.order[: max(1, int(len(self.order) * 0.9))]
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

    def later_stages(self, point: str) -> list[str]:
        """Stage outputs after `point`: the FuLA alignment points beyond the stitch."""
        k = self._index[point]
        return [p for p in self.stage_points() if self._index[p] > k]

    def rep(self, point: str) -> Rep:
        return rep_of(
            self.shapes[point],
            prefix_tokens=self.model.num_prefix_tokens,
            output_fmt=self.model.output_fmt,
        )

    # ------------------------------------------------------------------ parts

    def _input(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.preprocess(pixels)
        return x.contiguous(memory_format=torch.channels_last) if x.is_cuda else x

    def logits(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.net(self._input(pixels))

    def front(self, point: str) -> Callable[[torch.Tensor], torch.Tensor]:
        part = self._splitter.front(point)
        return lambda pixels: part(self._input(pixels))

    def probe(self, points: Sequence[str]) -> Callable[[torch.Tensor], tuple]:
        part = self._splitter.probe(points)
        return lambda pixels: part(self._input(pixels))

    def back(self, point: str, outputs: Sequence[str] = ()) -> BackPart:
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
