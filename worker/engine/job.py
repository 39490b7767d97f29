"""One comparison job, from spec to report."""

from __future__ import annotations

import math
import platform
import time
from dataclasses import dataclass
from itertools import product
from typing import Any

import numpy as np
import timm
import torch
from stitchsim.models import (
    Control,
    Direction,
    ModelSummary,
    Objective,
    Protocol,
    Report,
    ResultRow,
    Spec,
)
from stitchsim_worker.engine import iri as iri_mod
from stitchsim_worker.engine.bank import Bank, BankBuilder
from stitchsim_worker.engine.data import (
    Dataset,
    add_marker,
    clustered_noise,
    file_sha256,
    load_dataset,
)
from stitchsim_worker.engine.device import pick_device
from stitchsim_worker.engine.errors import JobCancelled, SpecError
from stitchsim_worker.engine.metrics import accuracy_with_ci, evaluate, seed_interval
from stitchsim_worker.engine.models import build_model
from stitchsim_worker.engine.network import Network, pair_points
from stitchsim_worker.engine.progress import Tracker
from stitchsim_worker.engine.resources import CancelFn, ProgressFn, Resources
from stitchsim_worker.engine.stitch import StitchLayer
from stitchsim_worker.engine.summary import summarise, verdict
from stitchsim_worker.engine.train import (
    Split,
    direct_matching_loss,
    init_least_squares,
    stitched_logits,
    train_stitch,
)

EVAL_BATCH = 256


@dataclass
class Prepared:
    data: Dataset
    front: Network
    back: Network
    pairs: list[tuple[str, str]]  # (front model point, back model point)
    front_id: dict[str, object]
    back_id: dict[str, object]

    @property
    def ids(self) -> dict[str, dict[str, object]]:
        return {"front": self.front_id, "back": self.back_id}


def _network(
    spec: Spec, which: str, resources: Resources, data: Dataset, device: torch.device
) -> tuple[Network, dict]:
    ref = getattr(spec, which)
    path, ckpt_id = resources.checkpoint(ref.checkpoint)
    model = build_model(ref, path, ckpt_id, where=which, native_size=data.image_size)
    if model.num_classes < data.n_classes:
        raise SpecError(
            f"{which}: the model has {model.num_classes} outputs but the dataset has "
            f"{data.n_classes} classes",
            code="class_mismatch",
        )
    identity = {
        "checkpoint": ckpt_id or f"sha256:{file_sha256(path)}",
        "arch": model.arch,
        "arch_kwargs": model.arch_kwargs,
        "preprocess": [model.preprocess.input_size, model.preprocess.mean, model.preprocess.std],
    }
    return Network(model, data.image_size, device, which), identity


def _pairs(spec: Spec, front: Network, back: Network) -> list[tuple[str, str]]:
    if spec.layers == "auto":
        return pair_points(front.auto_points(), back.auto_points())
    for pair in spec.layers:
        front.check_point(pair.front)
        back.check_point(pair.back)
    return [(p.front, p.back) for p in spec.layers]


def prepare(spec: Spec, resources: Resources, device: torch.device) -> Prepared:
    data = load_dataset(spec.dataset, resources, spec.train)
    front, front_id = _network(spec, "front", resources, data, device)
    back, back_id = _network(spec, "back", resources, data, device)
    return Prepared(data, front, back, _pairs(spec, front, back), front_id, back_id)


def check_spec(spec: Spec, *, resources: Resources) -> None:
    """Everything that can fail before training: files, architectures, weights, points, data."""
    prepare(spec, resources, torch.device("cpu"))


# ---------------------------------------------------------------- the job


class _Job:
    def __init__(
        self,
        spec: Spec,
        prep: Prepared,
        resources: Resources,
        tracker: Tracker,
        device: torch.device,
    ):
        self.spec, self.prep, self.device, self.tracker = spec, prep, device, tracker
        self.banks = BankBuilder(resources.memory_budget_bytes, resources.cache_dir)
        self.cache = iri_mod.IRICache(resources.cache_dir)
        self.warnings: list[str] = []
        self.data = prep.data
        bs = spec.train.batch_size
        self.train_pixels = self._bank(self.data.train.images)
        self.test_pixels = self._bank(self.data.test.images)
        self.test_logits = {
            name: self._compute(self.test_pixels, lambda x, net=net: (net.logits(x),), bs)[0]
            for name, net in (("front", prep.front), ("back", prep.back))
        }

    # ---- helpers

    def _bank(self, tensor: torch.Tensor) -> Bank:
        bank = self.banks.new(len(tensor), tuple(tensor.shape[1:]))
        bank.write(0, tensor)
        return bank

    def _compute(self, pixels: Bank, fn, batch_size: int = EVAL_BATCH) -> list[Bank]:  # type: ignore[no-untyped-def]
        return self.banks.compute(
            pixels.n, batch_size, lambda sl: fn(pixels[sl].to(self.device)), self.tracker.step
        )

    def _nets(self, direction: Direction) -> tuple[Network, Network, str, str]:
        if direction == "front_to_back":
            return self.prep.front, self.prep.back, "front", "back"
        return self.prep.back, self.prep.front, "back", "front"

    def _split(
        self, f: Network, i: str, g: Network, j: str, pixels: Bank, labels: torch.Tensor, fula: bool
    ) -> Split:
        """Stitch inputs f<=i(x) and the back model's own processing of x."""
        points = [j, *g.later_stages(j)] if fula else [j]
        probe, front = g.probe(points), f.front(i)
        logits, *feats = self._compute(pixels, lambda x: (*probe(x),))
        (inputs,) = self._compute(pixels, lambda x: (front(x),))
        needs_pixels = g.back(j).needs_input
        return Split(inputs, labels, logits, feats, pixels if needs_pixels else None)

    def _test_split(self, f: Network, i: str, g: Network, j: str, g_name: str) -> Split:
        front = f.front(i)
        (inputs,) = self._compute(self.test_pixels, lambda x: (front(x),))
        needs_pixels = g.back(j).needs_input
        return Split(
            inputs,
            self.data.test.labels,
            self.test_logits[g_name],
            [],
            self.test_pixels if needs_pixels else None,
        )

    def _iris(self, f: Network, f_id: dict, i: str, pixels: Bank, digest: str) -> iri_mod.IRIResult:
        key = iri_mod.cache_key(f_id, i, digest, self.spec.iri)
        steps = _iri_units(self.spec, pixels.n)
        result = iri_mod.get_iris(
            key=key,
            cache=self.cache,
            front=f.front(i),
            pixels=pixels,
            settings=self.spec.iri,
            banks=self.banks,
            device=self.device,
            on_batch=self._iri_step,
        )
        if result.stats.cache_hit:
            self.tracker.step(steps)
        if not result.stats.converged:
            self.warnings.append(
                f"IRIs of {f.where} at {i} did not converge: median relative distance "
                f"{result.stats.median:.3f} (from {result.stats.start_median:.3f}); "
                "raise iri.steps or iri.step_size"
            )
        return result

    def _iri_step(self) -> None:
        if self.tracker.should_cancel():
            raise JobCancelled()
        self.tracker.step()

    # ---- one stitch

    def fit(
        self,
        f: Network,
        i: str,
        g: Network,
        j: str,
        objective: Objective,
        train: Split,
        tests: list[Split],
    ) -> tuple[list[list[torch.Tensor]], float, str, float]:
        """Train T for each seed; returns test logits per seed per test split, loss, description."""
        t0 = time.perf_counter()
        settings, device = self.spec.train, self.device
        later = g.later_stages(j) if objective == "fula" else []
        back = g.back(j, later)
        logits: list[list[torch.Tensor]] = []
        losses = []
        description = ""
        for s in range(settings.seeds):
            stitch = StitchLayer(f.rep(i), g.rep(j)).to(device)
            description = stitch.describe()
            if objective == "dm":
                init_least_squares(stitch, train, len(train), EVAL_BATCH, device)
                losses.append(direct_matching_loss(stitch, train, EVAL_BATCH, device))
                self.tracker.step(math.ceil(len(train) / EVAL_BATCH))
            else:
                init_least_squares(stitch, train, settings.init_samples, EVAL_BATCH, device)
                losses.append(
                    train_stitch(
                        stitch,
                        back,
                        objective,
                        train,
                        settings,
                        settings.seed + s,
                        device,
                        self.tracker.step,
                        self.tracker.should_cancel,
                    )
                )
            logits.append([stitched_logits(stitch, back, t, EVAL_BATCH, device) for t in tests])
        return logits, float(np.mean(losses)), description, time.perf_counter() - t0

    def row(
        self,
        direction: Direction,
        pair: tuple[str, str],
        objective: Objective,
        protocol: Protocol,
        h_logits: list[torch.Tensor],
        test: Split,
        loss: float,
        stitch: str,
        seconds: float,
        **extra,
    ) -> ResultRow:  # type: ignore[no-untyped-def]
        g_logits = test.back_logits.all()
        labels = test.labels
        evals = [evaluate(h, g_logits, labels, seed=self.spec.train.seed) for h in h_logits]
        if len(evals) == 1:
            e = evals[0]
            fig, ci = e.figures, e.ci
            values = {
                k: getattr(fig, k)
                for k in ("agreement", "hard_agreement", "accuracy", "error_consistency")
            }
        else:
            values, ci = {}, {}
            for k in ("agreement", "hard_agreement", "accuracy", "error_consistency"):
                values[k], ci[k] = seed_interval([getattr(e.figures, k) for e in evals])
        return ResultRow(
            direction=direction,
            front_layer=pair[0],
            back_layer=pair[1],
            objective=objective,
            protocol=protocol,
            agreement=values["agreement"],
            agreement_ci=ci["agreement"],
            hard_agreement=values["hard_agreement"],
            hard_agreement_ci=ci["hard_agreement"],
            accuracy=values["accuracy"],
            accuracy_ci=ci["accuracy"],
            stitching_penalty=evals[0].back_accuracy - values["accuracy"],
            error_consistency=values["error_consistency"],
            error_consistency_ci=ci["error_consistency"],
            train_loss=loss,
            seconds=seconds,
            stitch=stitch,
            **extra,
        )

    # ---- the protocols

    def train_split(
        self,
        protocol: Protocol,
        f: Network,
        f_id: dict,
        i: str,
        g: Network,
        j: str,
        pixels: Bank,
        digest: str,
    ) -> tuple[Split, object]:
        fula = "fula" in self.spec.objectives
        labels = self.data.train.labels
        if protocol == "standard":
            return self._split(f, i, g, j, pixels, labels, fula), None
        iris = self._iris(f, f_id, i, pixels, digest)
        return self._split(f, i, g, j, iris.images, labels, fula), iris.stats

    def _protocol_rows(
        self,
        direction: Direction,
        pair: tuple[str, str],
        f: Network,
        f_id: dict,
        i: str,
        g: Network,
        j: str,
        test: Split,
        **extra: Any,
    ) -> list[ResultRow]:
        """Every protocol and objective for one stitch f<=i -> g>j, evaluated on `test`."""
        rows = []
        for protocol in self.spec.protocols:
            if protocol == "invariance_aware":
                self.tracker.enter(f"iri {f.where} {i}")
            train, stats = self.train_split(
                protocol, f, f_id, i, g, j, self.train_pixels, self.data.digest
            )
            self.tracker.enter(f"train {direction} {i}->{j} {protocol}")
            for objective in self.spec.objectives:
                logits, loss, stitch, secs = self.fit(f, i, g, j, objective, train, [test])
                h_logits = [lg[0] for lg in logits]
                rows.append(
                    self.row(direction, pair, objective, protocol, h_logits, test, loss, stitch,
                             secs, iri=stats, **extra)
                )  # fmt: skip
        return rows

    def compare(self, direction: Direction) -> list[ResultRow]:
        f, g, f_name, g_name = self._nets(direction)
        rows = []
        for pair in self.prep.pairs:
            i, j = pair if direction == "front_to_back" else (pair[1], pair[0])
            self.tracker.enter(f"stitch {direction} {i}->{j}")
            test = self._test_split(f, i, g, j, g_name)
            rows += self._protocol_rows(direction, pair, f, self.prep.ids[f_name], i, g, j, test)
        return rows

    # ---- controls

    def identity(self, direction: Direction) -> list[ResultRow]:
        _, g, _, g_name = self._nets(direction)
        rows = []
        for pair in self.prep.pairs:
            j = pair[1] if direction == "front_to_back" else pair[0]
            self.tracker.enter(f"control identity {g.where} {j}")
            test = self._test_split(g, j, g, j, g_name)
            rows += self._protocol_rows(
                direction, pair, g, self.prep.ids[g_name], j, g, j, test, control="identity"
            )
        return rows

    def _noise_split(
        self, g: Network, j: str, base: Split, labels: torch.Tensor, sigma: float, noise_seed: int
    ) -> Split:
        shape = g.shapes[j]
        noise = self._bank(
            clustered_noise(labels, shape, sigma, self.spec.train.seed + 7, noise_seed)
        )
        return Split(noise, labels, base.back_logits, base.back_feats, base.pixels)

    def clustered_noise(self, direction: Direction) -> list[ResultRow]:
        _, g, _, g_name = self._nets(direction)
        rows = []
        for pair in self.prep.pairs:
            j = pair[1] if direction == "front_to_back" else pair[0]
            self.tracker.enter(f"control clustered_noise {g.where} {j}")
            real_train = self._split(
                g,
                j,
                g,
                j,
                self.train_pixels,
                self.data.train.labels,
                "fula" in self.spec.objectives,
            )
            real_test = self._test_split(g, j, g, j, g_name)
            for sigma in self.spec.control_settings.noise_sigmas:
                train = self._noise_split(g, j, real_train, self.data.train.labels, sigma, 11)
                test = self._noise_split(g, j, real_test, self.data.test.labels, sigma, 12)
                for objective in self.spec.objectives:
                    logits, loss, stitch, secs = self.fit(g, j, g, j, objective, train, [test])
                    rows.append(
                        self.row(
                            direction,
                            pair,
                            objective,
                            "standard",
                            [lg[0] for lg in logits],
                            test,
                            loss,
                            "clustered noise -> " + stitch,
                            secs,
                            control="clustered_noise",
                            sigma=sigma,
                        )
                    )
        return rows

    def shortcut(self, direction: Direction) -> list[ResultRow]:
        f, g, f_name, _ = self._nets(direction)
        f_id = self.prep.ids[f_name]
        side = self.spec.control_settings.shortcut_marker
        k = self.data.n_classes
        train_x = self._bank(add_marker(self.data.train.images, self.data.train.labels, side))
        right_x = add_marker(self.data.test.images, self.data.test.labels, side)
        rolled_x = add_marker(self.data.test.images, (self.data.test.labels + 1) % k, side)
        digest = f"{self.data.digest}|marker{side}"
        rows = []
        for pair in self.prep.pairs:
            i, j = pair if direction == "front_to_back" else (pair[1], pair[0])
            self.tracker.enter(f"control shortcut {direction} {i}->{j}")
            tests = [self._marked_test(f, i, g, j, x) for x in (right_x, rolled_x)]
            for protocol in self.spec.protocols:
                train, stats = self.train_split(protocol, f, f_id, i, g, j, train_x, digest)
                for objective in self.spec.objectives:
                    logits, loss, stitch, secs = self.fit(f, i, g, j, objective, train, tests)
                    right = self.row(
                        direction,
                        pair,
                        objective,
                        protocol,
                        [lg[0] for lg in logits],
                        tests[0],
                        loss,
                        stitch,
                        secs,
                    )
                    rolled = self.row(
                        direction,
                        pair,
                        objective,
                        protocol,
                        [lg[1] for lg in logits],
                        tests[1],
                        loss,
                        stitch,
                        secs,
                    )
                    rows.append(
                        right.model_copy(
                            update={
                                "control": "shortcut",
                                "iri": stats,
                                "rolled_agreement": rolled.agreement,
                                "excessive_agreement": right.agreement - rolled.agreement,
                            }
                        )
                    )
        return rows

    def _marked_test(self, f: Network, i: str, g: Network, j: str, images: torch.Tensor) -> Split:
        pixels = self._bank(images)
        front = f.front(i)
        (inputs,) = self._compute(pixels, lambda x: (front(x),))
        (g_logits,) = self._compute(pixels, lambda x: (g.logits(x),))
        return Split(
            inputs, self.data.test.labels, g_logits, [], pixels if g.back(j).needs_input else None
        )

    def controls(self, directions: list[Direction]) -> list[ResultRow]:
        runners: dict[Control, object] = {
            "identity": self.identity,
            "clustered_noise": self.clustered_noise,
            "shortcut": self.shortcut,
        }
        rows: list[ResultRow] = []
        for control, direction in product(self.spec.controls, directions):
            rows += runners[control](direction)  # type: ignore[operator]
        return rows


# ---------------------------------------------------------------- planning and summary


def _iri_units(spec: Spec, n_train: int) -> int:
    return spec.iri.steps * math.ceil(n_train / spec.iri.batch_size)


def _plan_units(spec: Spec, prep: Prepared) -> int:
    """A rough count of batches through a network part, for progress and ETA."""
    n_tr, n_te = len(prep.data.train), len(prep.data.test)
    bs = spec.train.batch_size
    per_fit = spec.train.seeds * sum(
        math.ceil(n_tr / EVAL_BATCH) if o == "dm" else spec.train.epochs * math.ceil(n_tr / bs)
        for o in spec.objectives
    )
    iri = _iri_units(spec, n_tr) if "invariance_aware" in spec.protocols else 0
    per_run = (
        3 * math.ceil(n_te / EVAL_BATCH)
        + len(spec.protocols) * (2 * math.ceil(n_tr / EVAL_BATCH) + per_fit)
        + iri
    )
    runs = 1 + sum(
        len(spec.control_settings.noise_sigmas) if c == "clustered_noise" else 1
        for c in spec.controls
    )
    n_dir = len(spec.direction_list())
    return 2 * math.ceil(n_te / EVAL_BATCH) + n_dir * len(prep.pairs) * per_run * runs


def _model_summary(
    net: Network, identity: dict, logits: Bank, labels: torch.Tensor, points: list[str], seed: int
) -> ModelSummary:
    acc, ci = accuracy_with_ci(logits.all(), labels, seed)
    return ModelSummary(
        checkpoint=str(identity["checkpoint"]),
        arch=net.model.arch,
        arch_kwargs=net.model.arch_kwargs,
        accuracy=acc,
        accuracy_ci=ci,
        input_size=net.preprocess.input_size,
        layers=points,
    )


def _environment(device: torch.device, tracker: Tracker, seed: int, seconds: float) -> dict:
    from stitchsim import __version__

    return {
        "stitchsim": __version__,
        "torch": torch.__version__,
        "timm": timm.__version__,
        "python": platform.python_version(),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "threads": torch.get_num_threads(),
        "seed": seed,
        "seconds": round(seconds, 3),
        "stage_seconds": {k: round(v, 3) for k, v in tracker.timings.items()},
    }


def run_job(
    spec: Spec,
    *,
    resources: Resources,
    progress: ProgressFn | None = None,
    should_cancel: CancelFn | None = None,
    job_id: str | None = None,
) -> Report:
    t0 = time.perf_counter()
    tracker = Tracker(progress, should_cancel)
    tracker.enter("prepare")
    torch.manual_seed(spec.train.seed)
    device = pick_device(spec.device)
    prep = prepare(spec, resources, device)
    tracker.plan(_plan_units(spec, prep))
    job = _Job(spec, prep, resources, tracker, device)
    try:
        directions = spec.direction_list()
        results = [row for d in directions for row in job.compare(d)]
        controls = job.controls(directions)
    finally:
        job.banks.close()
    tracker.finish()
    summary = summarise(spec, results)
    labels = prep.data.test.labels
    return Report(
        job_id=job_id,
        spec=spec,
        front=_model_summary(
            prep.front,
            prep.front_id,
            job.test_logits["front"],
            labels,
            [p[0] for p in prep.pairs],
            spec.train.seed,
        ),
        back=_model_summary(
            prep.back,
            prep.back_id,
            job.test_logits["back"],
            labels,
            [p[1] for p in prep.pairs],
            spec.train.seed,
        ),
        dataset=prep.data.describe(),
        results=results,
        controls=controls,
        summary=summary,
        verdict=verdict(summary),
        warnings=job.warnings,
        environment=_environment(device, tracker, spec.train.seed, time.perf_counter() - t0),
    )
