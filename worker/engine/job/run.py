"""One comparison job, from spec to report: prepare, stitch in each direction, run the controls,
summarise. The parts live in their own modules; this one reads top to bottom."""

from __future__ import annotations

import logging
import platform
import time
from dataclasses import dataclass

import timm
import torch
from stitchsim.caveats import find_caveats
from stitchsim.models import (
    Direction,
    ModelSummary,
    Protocol,
    Report,
    ResultRow,
    Spec,
    Summary,
)
from stitchsim_worker.engine.device import pick_device
from stitchsim_worker.engine.errors import engine_failure, passes_through
from stitchsim_worker.engine.job.context import JobContext
from stitchsim_worker.engine.job.plan import plan_units
from stitchsim_worker.engine.job.prepare import Prepared, prepare
from stitchsim_worker.engine.job.progress import Tracker
from stitchsim_worker.engine.measures.in_job import MeasureRun
from stitchsim_worker.engine.measures.metrics import accuracy_with_ci, near_chance
from stitchsim_worker.engine.measures.summary import (
    chance_warning,
    summarise,
    verdict,
    verdict_caveats,
    withheld,
)
from stitchsim_worker.engine.method import method_record
from stitchsim_worker.engine.models.network import Network
from stitchsim_worker.engine.protocols.controls import CONTROLS, controls_to_run
from stitchsim_worker.engine.resources import CancelFn, ProgressFn, Resources
from stitchsim_worker.engine.stitching.activations import Split, test_split
from stitchsim_worker.engine.stitching.fitting import protocol_rows, training_inputs

log = logging.getLogger("stitchsim.engine")


def compare(ctx: JobContext, direction: Direction, measured: MeasureRun) -> list[ResultRow]:
    """Every stitch pair, protocol and objective in one direction; the measures of each pair
    on the activations the stitching computed."""
    rows = []
    for cut in ctx.cuts(direction):
        ctx.tracker.enter(f"stitch {cut.label}")
        test, made = test_split(ctx, cut), dict[Protocol, Split]()
        (found,) = protocol_rows(ctx, cut, training_inputs(ctx), [test], made=made)
        rows += found
        measured.add(ctx, cut, test, made)
    return rows


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
    try:
        tracker.enter("prepare")
        torch.manual_seed(spec.train.seed)
        device = pick_device(spec.device)
        if device.type == "cuda":
            # A worker runs many jobs: the peak in the report must be this job's own.
            torch.cuda.reset_peak_memory_stats(device)
        prep = prepare(spec, resources, device, tracker.should_cancel)
        tracker.plan(plan_units(spec, prep))
        ctx = JobContext.open(spec, prep, resources, tracker, device)
        try:
            directions = spec.direction_list()
            measured = MeasureRun()
            results = [row for d in directions for row in compare(ctx, d, measured)]
            controls = [row for c in controls_to_run(spec) for d in directions
                        for row in CONTROLS[c].run(ctx, d)]
        finally:
            ctx.close()
        tracker.finish()
        return _report(Ran(ctx, results, controls, measured, device, tracker,
                           time.perf_counter() - t0, job_id))
    except Exception as exc:
        if passes_through(exc):
            raise
        # A bug of ours or a model we cannot handle: the user gets where it happened, the
        # worker log gets the traceback.
        failure = engine_failure(tracker.where(), exc)
        log.error("%s", failure.message, exc_info=exc)
        raise failure from exc


# ---------------------------------------------------------------- the report


def _model_summary(
    ctx: JobContext, net: Network, points: list[str]
) -> ModelSummary:
    data, seed = ctx.prep.data_of(net), ctx.spec.train.seed
    acc, ci = accuracy_with_ci(ctx.own_test_logits[net.where].all(), data.test.labels, seed)
    chance = 1.0 / data.n_classes
    summary = ModelSummary(
        checkpoint=str(ctx.identity(net)["checkpoint"]),
        arch=net.model.arch,
        arch_kwargs=net.model.arch_kwargs,
        accuracy=acc,
        accuracy_ci=ci,
        input_size=net.preprocess.input_size,
        layers=points,
        preprocess=net.model.choice.info,
        chance_accuracy=chance,
        near_chance=near_chance(acc, ci, chance),
    )
    warning = chance_warning(summary, net.where, str(data.describe()["id"]))
    return summary.model_copy(update={"chance_warning": warning})


@dataclass(frozen=True)
class Ran:
    """What a job's run leaves for its report."""

    ctx: JobContext
    results: list[ResultRow]
    controls: list[ResultRow]
    measured: MeasureRun
    device: torch.device
    tracker: Tracker
    seconds: float
    job_id: str | None


def _report(ran: Ran) -> Report:
    ctx, spec, results, measured = ran.ctx, ran.ctx.spec, ran.results, ran.measured
    prep: Prepared = ctx.prep
    front = _model_summary(ctx, prep.front, [p[0] for p in prep.pairs])
    back = _model_summary(ctx, prep.back, [p[1] for p in prep.pairs])
    dataset = prep.data.describe()
    summary: Summary = summarise(spec, results, ran.controls, measured.rows)
    reason = withheld(spec, front, back)
    report = Report(
        job_id=ran.job_id,
        spec=spec,
        front=front,
        back=back,
        dataset=dataset,
        results=results,
        controls=ran.controls,
        measures=measured.rows,
        measure_controls=measured.controls,
        summary=summary,
        verdict=None if reason else verdict(summary),
        verdict_reason=reason,
        verdict_caveats=verdict_caveats(summary, results),
        warnings=ctx.warnings,
        notes=_notes(spec, prep),
        environment=_environment(ran.device, ran.tracker, spec.train.seed, ran.seconds),
        method=method_record(spec),
    )
    return report.model_copy(update={"caveats": find_caveats(report)})


def _notes(spec: Spec, prep: Prepared) -> list[str]:
    if prep.front_data is None:
        return []
    pairing = "by index" if spec.class_pairing is None else f"as given ({spec.class_pairing})"
    return [
        f"cross-task pairing: the front model's task is {prep.front_data.name}, the back "
        f"model's {prep.data.name}; classes are paired {pairing}. A high cross_task accuracy "
        "says the representations are compatible (a linear map makes one serve the other's "
        "head), not that they mean the same: read it against the clustered-noise floor, the "
        "accuracy that mere class clusters reach (Functional Alignment Can Mislead)."
    ]


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
        "unit_seconds": tracker.unit_seconds(),
        **_peak_memory(device),
    }


def _peak_memory(device: torch.device) -> dict[str, float]:
    if device.type != "cuda":
        return {}
    return {"peak_memory_mib": round(torch.cuda.max_memory_allocated(device) / 2**20, 1)}
