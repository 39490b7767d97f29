"""Cutting models at stitch points: the parts compose back to the unsplit model."""

from __future__ import annotations

import pytest
import timm
import torch
from stitchsim_worker.engine.models.cutting import ModelSplitter, module_order

ARCHS = [
    ("test_resnet", {}),
    ("test_vit", {"img_size": 32}),
    ("test_convnext", {}),
    ("test_efficientnet", {}),
]


def _model(arch: str, kwargs: dict) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(arch, pretrained=False, num_classes=10, **kwargs).eval()


def _stages(net: torch.nn.Module) -> list[str]:
    return [f["module"] for f in net.feature_info]


@pytest.mark.parametrize(("arch", "kwargs"), ARCHS)
def test_graph_path_front_and_back_give_the_full_logits(arch: str, kwargs: dict) -> None:
    net = _model(arch, kwargs)
    x = torch.randn(3, 3, 32, 32)
    splitter = ModelSplitter(net)
    assert splitter.traced
    with torch.no_grad():
        full = net(x)
        for point in _stages(net):
            back = splitter.back(point)
            assert not back.needs_input, f"{arch} {point} should be a graph cut"
            logits, _ = back(splitter.front(point)(x))
            torch.testing.assert_close(logits, full, rtol=1e-5, atol=1e-5)


def test_hook_path_gives_the_full_logits_where_the_cut_is_not_a_separator() -> None:
    # Inside a dense block later layers read earlier features: no graph cut exists there.
    net = _model("densenet121", {})
    x = torch.randn(2, 3, 32, 32)
    splitter = ModelSplitter(net)
    point = "features.denseblock1.denselayer2"
    with torch.no_grad():
        back = splitter.back(point)
        assert back.needs_input
        logits, _ = back(splitter.front(point)(x), x)
        torch.testing.assert_close(logits, net(x), rtol=1e-5, atol=1e-5)


def test_hook_path_when_tracing_is_unavailable() -> None:
    net = _model("test_resnet", {})
    splitter = ModelSplitter(net)
    splitter._graph = None  # as for a model torch.fx cannot trace
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        z = splitter.front("layer2")
        logits, feats = splitter.back("layer2", ["layer3"])(z(x), x)
        torch.testing.assert_close(logits, net(x), rtol=1e-5, atol=1e-5)
        assert feats[0].shape[1] == 192


def test_back_part_swaps_in_the_stitch_tensor() -> None:
    net = _model("test_resnet", {})
    splitter = ModelSplitter(net)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        z = splitter.front("layer3")(x)
        changed, _ = splitter.back("layer3")(z * 0)
        unchanged, _ = splitter.back("layer3")(z)
    assert not torch.allclose(changed, unchanged)


def test_front_part_computes_nothing_past_the_stitch_point() -> None:
    net = _model("test_resnet", {})
    called: list[str] = []
    for name, module in net.named_modules():
        if name:
            module.register_forward_pre_hook(lambda m, i, name=name: called.append(name))
    front = ModelSplitter(net).front("layer2")
    # fx inlines modules it traces through, so count the leaf modules of later stages.
    called.clear()
    with torch.no_grad():
        front(torch.randn(1, 3, 32, 32))
    assert not [c for c in called if c.startswith(("layer3", "layer4", "fc", "global_pool"))]


def test_probe_returns_cloned_features_untouched_by_later_inplace_ops() -> None:
    net = _model("test_resnet", {})
    x = torch.randn(2, 3, 32, 32)
    probe = ModelSplitter(net).probe(["layer1.0.bn1"])
    with torch.no_grad():
        _, feat = probe(x)
    # bn1's output is rectified in place by act1 later; the captured copy keeps negatives.
    assert (feat < 0).any()


def test_module_order_lists_points_in_execution_order_with_shapes() -> None:
    net = _model("test_resnet", {})
    traces = module_order(net, torch.zeros(1, 3, 32, 32))
    order = list(traces)
    assert order.index("layer1") < order.index("layer2") < order.index("layer4")
    assert traces["layer2"].shape == (48, 4, 4)


def test_module_order_names_a_tensor_by_its_first_module_until_it_changes_in_place() -> None:
    traces = module_order(_model("test_resnet", {}), torch.zeros(2, 3, 32, 32))
    # A block and its stage return their last module's tensor: one tensor, three names.
    assert traces["layer1.0"].alias_of == traces["layer1"].alias_of == "layer1.0.act2"
    # Identity hands bn1's tensor on; act1 (ReLU(inplace=True)) then rewrites it: a new value.
    assert traces["layer1.0.drop_block"].alias_of == "layer1.0.bn1"
    assert traces["layer1.0.act1"].alias_of is None
    assert traces["layer2"].calls == 1 and traces["layer2"].batch == 2


def test_a_stage_ending_in_the_cut_block_is_read_from_the_stitch_tensor() -> None:
    # fula at layer3.1 of resnet18 asked the back part for layer3 too: the very tensor cut
    # there. Read from the network input, it made the cut "not a separator" (issue 12).
    net = _model("resnet18", {"channels": (8, 16, 32, 64)})
    splitter = ModelSplitter(net)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        z = splitter.front("layer3.1")(x)
        back = splitter.back("layer3.1", ["layer3", "layer4"])
        assert not back.needs_input
        logits, (stage, later) = back(z * 2)
    torch.testing.assert_close(stage, z * 2)
    assert not torch.allclose(logits, net(x))


def test_the_logits_module_is_a_graph_cut_whose_back_part_is_the_identity() -> None:
    net = _model("test_resnet", {})
    splitter = ModelSplitter(net)
    z = torch.randn(3, 10)
    back = splitter.back("fc")
    assert not back.needs_input
    logits, _ = back(z)
    torch.testing.assert_close(logits, z)


def test_hook_path_leaves_the_stitch_tensor_untouched_by_later_inplace_ops() -> None:
    # layer1.0.bn1 feeds act1 = ReLU(inplace=True); the residual makes it a hook-path cut.
    net = _model("test_resnet", {})
    splitter = ModelSplitter(net)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        z = splitter.front("layer1.0.bn1")(x)
        back = splitter.back("layer1.0.bn1", ["layer2"])
        assert back.needs_input
        kept = z.clone()
        logits, _ = back(z, x)
    assert (z < 0).any()
    torch.testing.assert_close(z, kept)
    torch.testing.assert_close(logits, net(x), rtol=1e-5, atol=1e-5)


def test_reaches_logits_follows_the_graph() -> None:
    splitter = ModelSplitter(_model("test_resnet", {}))
    assert splitter.reaches_logits("layer2.0.bn1") is True
    splitter._graph = None
    assert splitter.reaches_logits("layer2.0.bn1") is None
