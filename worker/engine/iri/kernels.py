"""How an IRI step runs on the CPU: channels-last images and the native kernel for the input
gradient of the convolution that reads the pixels (IRISettings.fast_kernels)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from stitchsim.models import IRISettings
from torch.overrides import TorchFunctionMode

# oneDNN computes the input gradient of a convolution with this few input channels (the one
# that reads the pixels) 2-15x slower than the native kernel (a ViT's patch embedding: most of
# a step); every other convolution is faster in oneDNN.
FEW_CHANNELS = 4


class _PixelConvGrad(torch.autograd.Function):
    """conv2d whose input gradient comes from the native kernel (the weights are frozen)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        stride: list[int],
        padding: list[int],
        dilation: list[int],
        groups: int,
    ) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.conv = (stride, padding, dilation, groups)  # type: ignore[attr-defined]
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups)

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors  # type: ignore[attr-defined]
        stride, padding, dilation, groups = ctx.conv  # type: ignore[attr-defined]
        with torch.backends.mkldnn.flags(enabled=False):
            gx = torch.ops.aten.convolution_backward(
                grad.contiguous(),
                x.contiguous(),
                weight,
                None,
                stride,
                padding,
                dilation,
                False,
                [0, 0],
                groups,
                [True, False, False],
            )[0]
        return gx, None, None, None, None, None, None


def _pair(v: int | tuple[int, ...] | list[int]) -> list[int]:
    return [v, v] if isinstance(v, int) else list(v)


class _PixelConvMode(TorchFunctionMode):
    """Routes the few-channel convolutions of a front through _PixelConvGrad, without touching
    the model: only while a step runs, and only where the input needs a gradient and the
    weights do not (the only case _PixelConvGrad handles)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is F.conv2d or func is torch.conv2d:
            call = dict(
                zip(
                    ("input", "weight", "bias", "stride", "padding", "dilation", "groups"),
                    args,
                    strict=False,
                ),
                **kwargs,
            )
            x, w, b = call["input"], call["weight"], call.get("bias")
            padding = call.get("padding", 0)
            if (
                x.dim() == 4
                and x.shape[1] <= FEW_CHANNELS
                and x.requires_grad
                and not w.requires_grad
                and (b is None or not b.requires_grad)
                and not isinstance(padding, str)
            ):
                return _PixelConvGrad.apply(
                    x,
                    w,
                    b,
                    _pair(call.get("stride", 1)),
                    _pair(padding),
                    _pair(call.get("dilation", 1)),
                    int(call.get("groups", 1)),
                )
        return func(*args, **kwargs)


@dataclass(frozen=True)
class Kernels:
    """How a step runs (IRISettings.fast_kernels). Channels-last images: oneDNN runs a
    convolutional front up to twice as fast on NHWC on the CPU (a ViT's tokens gain nothing);
    the pixel convolution's gradient from the native kernel (FEW_CHANNELS). Both change only
    float rounding."""

    memory_format: torch.memory_format = torch.contiguous_format
    pixel_conv_grad: bool = False

    @staticmethod
    def pick(settings: IRISettings, device: torch.device, point_dims: int) -> Kernels:
        if not settings.fast_kernels or device.type != "cpu":
            # On GPUs the network takes channels-last inputs itself and bf16 autocast applies.
            return Kernels()
        fmt = torch.channels_last if point_dims == 4 else torch.contiguous_format
        return Kernels(fmt, pixel_conv_grad=True)

    def images(self, x: torch.Tensor) -> torch.Tensor:
        return x.contiguous(memory_format=self.memory_format)

    def mode(self) -> contextlib.AbstractContextManager[object]:
        return _PixelConvMode() if self.pixel_conv_grad else contextlib.nullcontext()


