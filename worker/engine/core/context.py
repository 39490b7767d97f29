"""What the parts of one running job share: the spec, the prepared models and data, the banks
of fixed tensors, the IRI cache and progress. Protocols, objectives and controls receive it
instead of long argument lists.

It sits in the bottom layer (core) because every layer above it reads it; the models and the
prepared job it holds are made above it and named here for their types only."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from stitchsim.models import Direction, Spec
from stitchsim_worker.engine.core.bank import Bank, BankBuilder
from stitchsim_worker.engine.core.costs import passes
from stitchsim_worker.engine.core.device import bf16_enabled
from stitchsim_worker.engine.core.errors import JobCancelled
from stitchsim_worker.engine.core.iri_cache import IRICache
from stitchsim_worker.engine.core.progress import Tracker
from stitchsim_worker.engine.core.refcache import ReferenceCache, salt
from stitchsim_worker.engine.core.resources import Resources

if TYPE_CHECKING:  # by name only: the context holds what the layers above it made
    from stitchsim_worker.engine.job.prepare import Prepared
    from stitchsim_worker.engine.models.network import Network

EVAL_BATCH = 256


def test_inputs(digest: str) -> str:
    """The identity of a dataset's test split as inputs (the dataset digest names its sizes)."""
    return f"{digest}|test-split"


def points_of(direction: Direction, pair: tuple[str, str]) -> tuple[str, str]:
    """(i, j): the pair's points in the front and back part of a stitch in this direction."""
    return pair if direction == "front_to_back" else (pair[1], pair[0])


def cut_label(direction: Direction, pair: tuple[str, str]) -> str:
    i, j = points_of(direction, pair)
    return f"{direction} {i}->{j}"


def front_point(direction: Direction, pair: tuple[str, str]) -> tuple[str, str]:
    """(model, point) of a cut's front part in this direction: where its IRIs are made."""
    return ("front", pair[0]) if direction == "front_to_back" else ("back", pair[1])


def self_point(direction: Direction, pair: tuple[str, str]) -> tuple[str, str]:
    """(model, point) of the back model's point a control stitches into itself."""
    return ("back", pair[1]) if direction == "front_to_back" else ("front", pair[0])


@dataclass(frozen=True)
class Cut:
    """One stitch f<=i -> T -> g>j in one direction; `pair` is the (front model point, back
    model point) the report names it by."""

    direction: Direction
    pair: tuple[str, str]
    f: Network
    i: str
    g: Network
    j: str

    @property
    def label(self) -> str:
        # Its own points, not the pair's: a control's self-cut stitches j into j.
        return f"{self.direction} {self.i}->{self.j}"


@dataclass
class JobContext:
    spec: Spec
    prep: Prepared
    device: torch.device
    tracker: Tracker
    banks: BankBuilder
    refcache: ReferenceCache
    iri_cache: IRICache = field(init=False)
    train_pixels: Bank = field(init=False)
    test_pixels: Bank = field(init=False)
    test_logits: dict[str, Bank] = field(init=False)  # each model on the test split
    # Each model's own task (they differ only in cross-task pairing): its train and test
    # pixels, and its logits on its own test split (its accuracy).
    own_pixels: dict[str, tuple[Bank, Bank]] = field(init=False)
    own_test_logits: dict[str, Bank] = field(init=False)
    probe_logits: list[dict[str, Bank]] = field(init=False)  # each model on each probe set
    warnings: list[str] = field(default_factory=list)

    @classmethod
    def new(
        cls, spec: Spec, prep: Prepared, resources: Resources, tracker: Tracker,
        device: torch.device,
    ) -> JobContext:
        """The context before any work: open() computes what every later step reads."""
        refcache = ReferenceCache(resources.entry_store(), resources.cache_dir / "refcache-tmp",
                                  salt(device, bf16_enabled(device, spec.iri.precision == "bf16")),
                                  resources.reference_cache_max_entry_bytes)
        ctx = cls(spec, prep, device, tracker,
                  BankBuilder(resources.memory_budget_bytes, resources.cache_dir), refcache)
        ctx.iri_cache = IRICache(refcache)
        # The dataset's pixels are banks already (in memory, or mapped from its file).
        ctx.train_pixels = prep.data.train.pixels
        ctx.test_pixels = prep.data.test.pixels
        return ctx

    def open(self) -> None:
        """Each model's logits on its test split (and the front model's on its own task's)."""
        prep = self.prep
        test = test_inputs(prep.data.digest)
        self.test_logits = {net.where: self._logits(net, self.test_pixels, test)
                            for net in (prep.front, prep.back)}
        # The reference's logits on a probe are kept across jobs, as on the dataset.
        self.probe_logits = [{net.where: self._logits(net, p.test.pixels, test_inputs(p.digest))
                              for net in (prep.front, prep.back)} for p in prep.probes]
        self.own_pixels = {w: (self.train_pixels, self.test_pixels) for w in ("front", "back")}
        self.own_test_logits = dict(self.test_logits)
        if prep.front_data is not None:
            own = prep.front_data
            self.own_pixels["front"] = (own.train.pixels, own.test.pixels)
            self.own_test_logits["front"] = self._logits(prep.front, self.own_pixels["front"][1],
                                                         test_inputs(own.digest))

    def _logits(self, net: Network, pixels: Bank, inputs: str) -> Bank:
        return self.model_compute(net, "logits", inputs, pixels, lambda x: (net.logits(x),),
                                  self.spec.train.batch_size)[0]

    def close(self) -> None:
        self.banks.close()

    # ---- banks

    def bank(self, tensor: torch.Tensor) -> Bank:
        bank = self.banks.new(len(tensor), tuple(tensor.shape[1:]))
        bank.write(0, tensor)
        return bank

    def compute(
        self, pixels: Bank, fn: Callable[[torch.Tensor], tuple[torch.Tensor, ...]],
        batch_size: int = EVAL_BATCH,
    ) -> list[Bank]:
        """fn over every sample of `pixels`, batch by batch, each output into its own bank."""

        def batch(sl: slice) -> tuple[torch.Tensor, ...]:
            self.check_cancel()
            return fn(pixels[sl].to(self.device))

        return self.banks.compute(pixels.n, batch_size, batch, self.tracker.step)

    def model_compute(
        self, net: Network, what: str, inputs: str | None, pixels: Bank,
        fn: Callable[[torch.Tensor], tuple[torch.Tensor, ...]], batch_size: int = EVAL_BATCH,
    ) -> list[Bank]:
        """compute() of work that reads one model alone: `what` it computes (the part and
        point), on the inputs whose identity is `inputs` (None: not identified, not kept).
        The reference's (the front model's: a check's reference is always the front) is kept
        in the reference cache and read back by every later job against it; a candidate's is
        not kept, since no later job asks for it."""
        if inputs is None or net.where != "front":
            return self.compute(pixels, fn, batch_size)
        key = self.refcache.key("act", {"model": self.identity(net), "what": what,
                                        "inputs": inputs, "n": pixels.n, "batch": batch_size})
        entry = self.refcache.load("act", key)
        if entry is not None:
            out = [entry.bank(f"out{k}", self.banks) for k in range(len(entry.arrays))]
            self.tracker.step(passes(pixels.n, batch_size))  # the batches, done already
            return out
        out = self.compute(pixels, fn, batch_size)
        self.refcache.put("act", key, {f"out{k}": b for k, b in enumerate(out)})
        return out

    # ---- the stitches

    def networks(self, direction: Direction) -> tuple[Network, Network]:
        """(front part's model, back part's model) in this direction."""
        if direction == "front_to_back":
            return self.prep.front, self.prep.back
        return self.prep.back, self.prep.front

    def cut(self, direction: Direction, pair: tuple[str, str]) -> Cut:
        f, g = self.networks(direction)
        i, j = points_of(direction, pair)
        return Cut(direction, pair, f, i, g, j)

    def self_cut(self, direction: Direction, pair: tuple[str, str]) -> Cut:
        """The back model stitched into itself at one of its points (controls)."""
        _, g = self.networks(direction)
        j = self_point(direction, pair)[1]
        return Cut(direction, pair, g, j, g, j)

    def identity(self, net: Network) -> dict[str, object]:
        return self.prep.ids[net.where]

    def check_cancel(self) -> None:
        if self.tracker.should_cancel():
            raise JobCancelled()
