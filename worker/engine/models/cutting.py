"""Cutting a frozen model at a named module output: front part, back part, feature probe.

The graph path (torch.fx) runs only what is needed: the front part stops at the stitch point
and the back part starts from the stitch tensor. Where a model does not trace, or the cut is
not a separator of the graph (a later layer also reads an earlier tensor), the hook path runs
the full network and swaps the stitch tensor in with a forward hook.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from stitchsim_worker.engine.core.errors import interrupted
from timm.models._features_fx import get_notrace_functions, get_notrace_modules
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

log = logging.getLogger(__name__)


class _PointTracer(fx.Tracer):
    """Records, for every module call, the graph node that holds its output."""

    def __init__(self) -> None:
        super().__init__(autowrap_functions=tuple(get_notrace_functions()))
        self._leaf_types = tuple(get_notrace_modules())
        self.module_outputs: dict[str, fx.Node] = {}

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, self._leaf_types) or super().is_leaf_module(m, module_qualified_name)

    def call_module(self, m, forward, args, kwargs):  # type: ignore[no-untyped-def]
        out = super().call_module(m, forward, args, kwargs)
        if isinstance(out, fx.Proxy):
            self.module_outputs[self.path_of_module(m)] = out.node
        return out


class _Stop(Exception):
    def __init__(self, value: torch.Tensor):
        self.value = value


@dataclass
class BackPart:
    """g_{>j}: stitch tensor (and, on the hook path, the input image) -> logits, later features."""

    run: Callable[[torch.Tensor, torch.Tensor | None], tuple[torch.Tensor, list[torch.Tensor]]]
    needs_input: bool

    def __call__(
        self, z: torch.Tensor, pixels: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        return self.run(z, pixels)


class ModelSplitter:
    """Builds front parts, back parts and probes of one frozen network."""

    def __init__(self, net: nn.Module):
        self.net = net
        self._graph: fx.Graph | None = None
        self._outputs: dict[str, fx.Node] = {}
        self._live: set[fx.Node] | None = None
        try:
            tracer = _PointTracer()
            self._graph = tracer.trace(net)
            self._outputs = tracer.module_outputs
        except Exception as e:  # noqa: BLE001 - any tracing failure means: use hooks
            if interrupted(e):  # the host's time limit, not a model fx cannot trace
                raise
            log.info("fx tracing of %s failed (%s); using the hook path", type(net).__name__, e)

    @property
    def traced(self) -> bool:
        return self._graph is not None

    # ------------------------------------------------------------------ graph path

    def _copy(self) -> tuple[fx.Graph, dict[fx.Node, fx.Node], fx.Node]:
        assert self._graph is not None
        graph = fx.Graph()
        val_map: dict[fx.Node, fx.Node] = {}
        logits = graph.graph_copy(self._graph, val_map)
        return graph, val_map, logits  # type: ignore[return-value]

    def _module(self, graph: fx.Graph) -> fx.GraphModule:
        module = fx.GraphModule(self.net, graph)
        module.graph.eliminate_dead_code()
        for node in list(module.graph.nodes):
            if node.op == "placeholder" and not node.users:
                module.graph.erase_node(node)
        module.graph.lint()
        module.recompile()
        return module

    @staticmethod
    def _cloned(graph: fx.Graph, node: fx.Node) -> fx.Node:
        # Later in-place ops (ReLU(inplace=True), x += shortcut) would rewrite a captured
        # tensor, so the copy is taken right where it is made.
        with graph.inserting_after(node):
            return graph.call_method("clone", (node,))

    def _graph_probe(
        self, points: Sequence[str], with_logits: bool = True
    ) -> fx.GraphModule | None:
        if self._graph is None or any(p not in self._outputs for p in points):
            return None
        graph, val_map, logits = self._copy()
        feats = [self._cloned(graph, val_map[self._outputs[p]]) for p in points]
        graph.output((logits, *feats) if with_logits else tuple(feats))
        return self._module(graph)

    def _graph_back(self, point: str, outputs: Sequence[str]) -> fx.GraphModule | None:
        if self._graph is None or point not in self._outputs:
            return None
        if any(p not in self._outputs for p in outputs):
            return None
        graph, val_map, logits = self._copy()
        cut = val_map[self._outputs[point]]
        first = next(iter(graph.nodes))
        with graph.inserting_before(first):
            z = graph.placeholder("stitch_input")
        with graph.inserting_after(z):
            z_own = graph.call_method("clone", (z,))
        later = [self._cloned(graph, val_map[self._outputs[p]]) for p in outputs]
        graph.output((logits, *later))
        # Only now is the cut swapped out: the logits or a later output may be the cut node
        # itself (the logits module, a stage that ends in the block cut here), and those must
        # read the stitch tensor too, not recompute it from the network input.
        cut.replace_all_uses_with(z_own)
        network_input = next(n for n in graph.nodes if n.op == "placeholder" and n is not z)
        _drop_input_asserts(graph, network_input)
        module = self._module(graph)
        inputs = [n.name for n in module.graph.nodes if n.op == "placeholder"]
        if network_input.name in inputs or z.name not in inputs:
            log.info("cut at %s is not a separator; using the hook path", point)
            return None
        return module

    def reaches_logits(self, point: str) -> bool | None:
        """Whether the logits depend on the point's output (None: not known without a graph)."""
        if self._graph is None or point not in self._outputs:
            return None
        if self._live is None:
            # Ancestors of the output node, found once: one walk, not one per point.
            output = next(n for n in reversed(self._graph.nodes) if n.op == "output")
            self._live, frontier = {output}, [output]
            while frontier:
                for node in frontier.pop().all_input_nodes:
                    if node not in self._live:
                        self._live.add(node)
                        frontier.append(node)
        return self._outputs[point] in self._live

    # ------------------------------------------------------------------ public parts

    def front(self, point: str) -> Callable[[torch.Tensor], torch.Tensor]:
        """f_{<=i}: network input -> stitch tensor, computing nothing past the point."""
        probe = self._graph_probe([point], with_logits=False)
        if probe is not None:
            return lambda x: probe(x)[0]
        module = self.net.get_submodule(point)

        def run(x: torch.Tensor) -> torch.Tensor:
            def stop(_m: nn.Module, _i: object, out: torch.Tensor) -> None:
                raise _Stop(out.clone())

            handle = module.register_forward_hook(stop)
            try:
                self.net(x)
            except _Stop as s:
                return s.value
            finally:
                handle.remove()
            raise RuntimeError(f"stitch point {point} was never reached")

        return run

    def probe(self, points: Sequence[str]) -> Callable[[torch.Tensor], tuple]:
        """Full forward returning (logits, *features at points)."""
        graph_probe = self._graph_probe(points)
        if graph_probe is not None:
            return graph_probe

        def run(x: torch.Tensor) -> tuple:
            feats: dict[str, torch.Tensor] = {}
            handles = [
                self.net.get_submodule(p).register_forward_hook(_capture(feats, p)) for p in points
            ]
            try:
                logits = self.net(x)
            finally:
                for h in handles:
                    h.remove()
            return (logits, *[feats[p] for p in points])

        return run

    def back(self, point: str, outputs: Sequence[str] = ()) -> BackPart:
        """g_{>j}, returning logits and the features at `outputs` (points after j)."""
        module = self._graph_back(point, outputs)
        if module is not None:

            def graph_run(z: torch.Tensor, _x: torch.Tensor | None) -> tuple:
                logits, *feats = module(z)
                return logits, feats

            return BackPart(graph_run, needs_input=False)

        target = self.net.get_submodule(point)

        def hook_run(z: torch.Tensor, x: torch.Tensor | None) -> tuple:
            if x is None:
                raise RuntimeError("the hook path needs the network input")
            feats: dict[str, torch.Tensor] = {}
            # A copy goes in: in-place ops after the point (ReLU(inplace=True), x += y) must not
            # rewrite the stitch output that the loss reads as h_j.
            handles = [target.register_forward_hook(lambda _m, _i, _o: z.clone())]
            handles += [
                self.net.get_submodule(p).register_forward_hook(_capture(feats, p)) for p in outputs
            ]
            try:
                logits = self.net(x)
            finally:
                for h in handles:
                    h.remove()
            return logits, [feats[p] for p in outputs]

        return BackPart(hook_run, needs_input=True)


def _drop_input_asserts(graph: fx.Graph, network_input: fx.Node) -> None:
    """Erase shape assertions on the network input: the back part never sees that input."""
    downstream: set[fx.Node] = set()
    frontier = [network_input]
    while frontier:
        node = frontier.pop()
        for user in node.users:
            if user not in downstream:
                downstream.add(user)
                frontier.append(user)
    for node in reversed(list(graph.nodes)):
        name = getattr(node.target, "__name__", "")
        if node in downstream and node.op == "call_function" and name == "_assert":
            graph.erase_node(node)


def _capture(store: dict[str, torch.Tensor], name: str) -> Callable:
    # Cloned (differentiably) where it is made, before any later in-place op rewrites it.
    def hook(_m: nn.Module, _i: object, out: torch.Tensor) -> None:
        store[name] = out.clone()

    return hook


@dataclass(frozen=True)
class PointTrace:
    """What one module output looked like in a forward pass of an example batch."""

    shape: tuple[int, ...]  # per sample (batch dimension dropped), at the first call
    batch: int  # leading dimension (differs from the example batch where windows fold in)
    dtype: torch.dtype
    calls: int  # how many times the module ran in one forward pass
    alias_of: str | None  # the first point whose output is this very tensor, unchanged
    flops: float = 0.0  # floating-point operations a sample took until this output was made


class PeakMode(TorchDispatchMode):
    """The largest tensor one sample holds anywhere in a forward pass, module output or not:
    an attention matrix (tokens² x heads a sample) lives inside one op and never is a module
    output, so counting module outputs alone misses it. Shapes only: it works on the meta
    device. A fused attention (scaled_dot_product_attention) is counted at the matrix its
    math fallback holds, as a CPU job runs it."""

    def __init__(self, batch: int):
        super().__init__()
        self.batch = batch
        self.values = 0
        """Values of the largest such tensor, per sample."""
        self.what = ""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        out = func(*args, **(kwargs or {}))
        name = str(getattr(func, "__name__", func))
        if "scaled_dot_product" in name and len(args) >= 2:
            q, k = args[0], args[1]
            self._saw(math.prod(q.shape[:-1]) * int(k.shape[-2]) // self.batch,
                      f"an attention matrix of shape {(*q.shape[:-1], int(k.shape[-2]))} for "
                      f"a batch of {self.batch}")
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.dim() and (
                    int(t.shape[0]) == self.batch or "softmax" in name):
                # Batch-first tensors are activations; a softmax folds heads into dim 0.
                self._saw(t.numel() // self.batch, f"a tensor of shape {tuple(t.shape)} for a "
                          f"batch of {self.batch}")
        return out

    def _saw(self, values: int, what: str) -> None:
        if values > self.values:
            self.values, self.what = values, what


def module_order(net: nn.Module, x: torch.Tensor) -> dict[str, PointTrace]:
    """Modules with a tensor output, in the order their outputs complete, and their traces."""
    first: dict[str, torch.Tensor] = {}  # kept alive during the pass, so id() stays unique
    calls: dict[str, int] = {}
    alias: dict[str, str | None] = {}
    owner: dict[tuple[int, int], str] = {}
    handles = []
    for name, module in net.named_modules():
        if not name:
            continue

        def hook(_m: nn.Module, _i: object, out: object, name: str = name) -> None:
            if not isinstance(out, torch.Tensor):
                return
            calls[name] = calls.get(name, 0) + 1
            if name in first:
                return
            # A container's output is its last child's tensor; so is an Identity's input. The
            # version counter tells an unchanged tensor from one rewritten in place since.
            key = (id(out), out._version)
            alias[name] = owner.get(key)
            owner.setdefault(key, name)
            first[name] = out
            flops[name] = counter.get_total_flops() / max(1, len(x))

        handles.append(module.register_forward_hook(hook))
    # Counted from the shapes (it works on the meta device): what the job's parts will cost.
    counter, flops = FlopCounterMode(display=False), dict[str, float]()
    try:
        with torch.no_grad(), counter:
            net(x)
    finally:
        for h in handles:
            h.remove()
    return {
        name: PointTrace(
            shape=tuple(out.shape[1:]),
            batch=int(out.shape[0]) if out.dim() else 0,
            dtype=out.dtype,
            calls=calls[name],
            alias_of=alias[name],
            flops=flops[name],
        )
        for name, out in first.items()
    }
