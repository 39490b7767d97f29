"""The stitch layer across representation kinds, and its closed-form fit."""

from __future__ import annotations

import pytest
import torch
from stitchsim_worker.engine.measures.metrics import relative_distance
from stitchsim_worker.engine.models.rep import rep_of
from stitchsim_worker.engine.stitching.layer import LeastSquares, StitchLayer


def test_kinds_are_read_from_shapes() -> None:
    assert rep_of((32, 8, 8), prefix_tokens=0, output_fmt="NCHW").describe() == "map 32x8x8"
    assert rep_of((8, 8, 96), prefix_tokens=0, output_fmt="NHWC").channels == 96
    tokens = rep_of((17, 64), prefix_tokens=1, output_fmt="NCHW")
    assert (tokens.kind, tokens.prefix, tokens.grid) == ("tokens", 1, (4, 4))
    assert rep_of((10,), prefix_tokens=0, output_fmt="NCHW").kind == "vector"


def test_every_kind_pair_maps_to_the_target_shape() -> None:
    shapes = {"map": (32, 8, 8), "tokens": (17, 24), "vector": (40,)}
    for src_kind, src_shape in shapes.items():
        for dst_kind, dst_shape in shapes.items():
            src = rep_of(src_shape, prefix_tokens=1, output_fmt="NCHW")
            dst = rep_of(dst_shape, prefix_tokens=1, output_fmt="NCHW")
            out = StitchLayer(src, dst)(torch.randn(3, *src_shape))
            assert tuple(out.shape[1:]) == dst_shape, (src_kind, dst_kind)


def test_least_squares_recovers_a_linear_map_with_resize() -> None:
    torch.manual_seed(0)
    src = rep_of((6, 8, 8), prefix_tokens=0, output_fmt="NCHW")
    dst = rep_of((4, 4, 4), prefix_tokens=0, output_fmt="NCHW")
    truth = StitchLayer(src, dst)
    torch.nn.init.normal_(truth.weight)
    torch.nn.init.normal_(truth.bias)
    x = torch.randn(50, 6, 8, 8)
    with torch.no_grad():
        y = truth(x)
    fitted = StitchLayer(src, dst)
    ls = LeastSquares(fitted)
    for part in x.split(16):
        ls.add(part, truth(part).detach())
    ls.solve()
    torch.testing.assert_close(fitted.weight, truth.weight, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        assert float(relative_distance(fitted(x), y)) < 1e-5


def test_closed_form_direct_matching_equals_a_long_gradient_descent() -> None:
    # Targets that no affine map reaches exactly: the optimum is the least-squares solution.
    torch.manual_seed(1)
    src = rep_of((12, 4, 4), prefix_tokens=0, output_fmt="NCHW")
    dst = rep_of((5, 4, 4), prefix_tokens=0, output_fmt="NCHW")
    x = torch.randn(64, 12, 4, 4)
    y = torch.tanh(torch.randn(5, 12) @ x.flatten(2)).view(64, 5, 4, 4) + 0.1 * torch.randn(
        64, 5, 4, 4
    )
    closed = StitchLayer(src, dst)
    ls = LeastSquares(closed)
    ls.add(x, y)
    ls.solve()
    gd = StitchLayer(src, dst)
    opt = torch.optim.Adam(gd.parameters(), lr=0.02)
    for step in range(1500):
        if step == 1000:
            opt.param_groups[0]["lr"] = 0.002
        loss = relative_distance(gd(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    d_closed = float(relative_distance(closed(x), y))
    d_gd = float(relative_distance(gd(x), y))
    assert d_closed <= d_gd + 1e-6
    assert abs(d_closed - d_gd) < 1e-3
    torch.testing.assert_close(gd.weight, closed.weight, rtol=0, atol=2e-2)


def test_each_point_is_read_by_its_own_layout_not_the_models() -> None:
    # Square inputs: the equal pair of sizes is the grid. Swin's patch-embedding convolution
    # is NCHW in an NHWC model; MaxViT's attention blocks are NHWC in an NCHW one.
    conv = rep_of((24, 8, 8), prefix_tokens=0, output_fmt="NHWC")
    assert (conv.channels, conv.grid, conv.channels_last) == (24, (8, 8), False)
    block = rep_of((40, 40, 32), prefix_tokens=0, output_fmt="NCHW")
    assert (block.channels, block.grid, block.channels_last) == (32, (40, 40), True)
    # Only C = H = W leaves it to the model.
    assert rep_of((8, 8, 8), prefix_tokens=0, output_fmt="NHWC").channels_last
    assert not rep_of((8, 8, 8), prefix_tokens=0, output_fmt="NCHW").channels_last


def test_prefix_tokens_are_counted_only_where_they_have_joined() -> None:
    # The patch embedding's 16 tokens come before the class token is prepended.
    patches = rep_of((16, 64), prefix_tokens=1, output_fmt="NCHW", patch_grid=(4, 4))
    assert (patches.prefix, patches.grid) == (0, (4, 4))
    registers = rep_of((20, 64), prefix_tokens=4, output_fmt="NCHW", patch_grid=(4, 4))
    assert (registers.prefix, registers.grid) == (4, (4, 4))
    # Without a known patch grid, a square count means no prefix yet.
    assert rep_of((16, 64), prefix_tokens=1, output_fmt="NCHW").prefix == 0
    assert rep_of((18, 64), prefix_tokens=2, output_fmt="NCHW").prefix == 2


def test_shapes_without_a_reading_say_so() -> None:
    for shape in [(4, 17, 16), (2, 3, 4, 4), ()]:
        with pytest.raises(ValueError, match="no map/token/vector reading"):
            rep_of(shape, prefix_tokens=1, output_fmt="NCHW")
