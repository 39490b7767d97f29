"""The stitch layer across representation kinds, and its closed-form fit."""

from __future__ import annotations

import torch
from stitchsim_worker.engine.metrics import relative_distance
from stitchsim_worker.engine.stitch import LeastSquares, StitchLayer, rep_of


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
