"""One comparison job, from spec to report: prepare, run the job's steps (plan.py: stitch in each
direction, the measures, the controls), summarise. The parts live in their own modules; this
one reads top to bottom."""

from __future__ import annotations

import logging
import platform
import time
from dataclasses import dataclass

import numpy as np
import timm
import torch
from stitchsim import catalogue
from stitchsim.catalogue import OUTPUT_KINDS
from stitchsim.caveats import find_caveats
from stitchsim.models import (
    MeasureRow,
    ModelSummary,
    ProbeResult,
    Report,
    ResultRow,
    Spec,
    Summary,
    UnstitchedRow,
)
from stitchsim.models.report import sealed
from stitchsim_worker.engine.core.context import JobContext
from stitchsim_worker.engine.core.device import pick_device
from stitchsim_worker.engine.core.errors import engine_failure, passes_through
from stitchsim_worker.engine.core.method import method_record
from stitchsim_worker.engine.core.progress import Tracker
from stitchsim_worker.engine.core.resources import CancelFn, ProgressFn, Resources
from stitchsim_worker.engine.core.step import JobRun, run_steps
from stitchsim_worker.engine.data.datasets import Dataset
from stitchsim_worker.engine.job.check import with_budget_samples
from stitchsim_worker.engine.job.measuring import MeasureRun
from stitchsim_worker.engine.job.plan import job_plan, prepared_steps
from stitchsim_worker.engine.job.prepare import Prepared, budget_floor, prepare
from stitchsim_worker.engine.job.unstitched import endpoint_rows, unstitched_rows
from stitchsim_worker.engine.measures.metrics import accuracy_with_ci, near_chance
from stitchsim_worker.engine.measures.summary import (
    chance_warning,
    summarise,
    verdict,
    verdict_caveats,
    withheld,
)
from stitchsim_worker.engine.models.network import Network
from stitchsim_worker.engine.stitching.layer import MIN_VECTORS_PER_UNKNOWN

log = logging.getLogger("stitchsim.engine")


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
        # What runs: the training samples the spec's budget stands for at its points, ...
        budgeted = with_budget_samples(spec, resources)
        prep = prepare(budgeted, resources, device, tracker.should_cancel)
        # ... and the step sizes the spec leaves unset, from its inputs' resolution. The
        # report keeps the spec as submitted and records these beside it.
        ran_spec = budgeted.at(prep.resolution)
        steps = prepared_steps(ran_spec, prep)
        tracker.plan(job_plan(ran_spec, steps))
        job = JobRun(JobContext.new(ran_spec, prep, resources, tracker, device), MeasureRun())
        try:
            for step in run_steps(steps, job, tracker):
                if (mismatch := step.mismatch()) is not None:
                    # Only the ETA suffers, so the job goes on; the count is a bug of ours.
                    log.warning("work counted wrong, %s", mismatch)
            unstitched = unstitched_rows(job.ctx)  # from what the steps computed: no work
            probes = _probe_results(job.ctx, job.probe_results)
        finally:
            job.ctx.close()
        tracker.finish()
        return _report(Ran(spec, job.ctx, job.results, job.controls, unstitched, job.measured,
                           device, tracker, time.perf_counter() - t0, job_id, probes))
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
    # A model without classes, or data without labels, has no accuracy to state.
    scored = OUTPUT_KINDS[net.output].classes and data.labelled
    acc, ci = (accuracy_with_ci(ctx.own_test_logits[net.where].all(), data.test.labels, seed)
               if scored else (None, None))
    chance = 1.0 / data.n_classes if scored else None
    summary = ModelSummary(
        checkpoint=str(ctx.identity(net)["checkpoint"]),
        arch=net.model.arch,
        arch_kwargs=net.model.arch_kwargs,
        accuracy=acc,
        accuracy_ci=ci,
        output=net.output,
        output_source=net.model.output_source,  # type: ignore[arg-type]
        input_size=net.preprocess.input_size,
        layers=points,
        preprocess=net.model.choice.info,
        source=net.model.source,
        source_metadata=net.model.info.metadata,
        chance_accuracy=chance,
        near_chance=(acc is not None and ci is not None and chance is not None
                     and near_chance(acc, ci, chance)),
    )
    warning = chance_warning(summary, net.where, str(data.describe()["id"]))
    return summary.model_copy(update={"chance_warning": warning})


def _probe_results(ctx: JobContext, rows: dict[int, list[ResultRow]]) -> list[ProbeResult]:
    """Each probe set's rows, with the two models alone and against each other on it."""
    out = []
    for k, probe in enumerate(ctx.prep.probes):
        logits, labels = ctx.probe_logits[k], probe.test.labels
        accuracy = {where: _probe_accuracy(ctx, net, logits[where].all(), labels, probe.data)
                    for where, net in (("front", ctx.prep.front), ("back", ctx.prep.back))}
        out.append(ProbeResult(
            name=probe.name, dataset=probe.data.describe(), front_accuracy=accuracy["front"],
            back_accuracy=accuracy["back"], unstitched_agreement=endpoint_rows(ctx, logits, labels),
            results=rows.get(k, [])))
    return out


def _probe_accuracy(ctx: JobContext, net: Network, logits: torch.Tensor, labels: torch.Tensor,
                    data: Dataset) -> float | None:
    if not (OUTPUT_KINDS[net.output].classes and data.labelled):
        return None
    return accuracy_with_ci(logits, labels, ctx.spec.train.seed)[0]


@dataclass(frozen=True)
class Ran:
    """What a job's run leaves for its report."""

    submitted: Spec  # ctx.spec is what ran: the unset step sizes resolved
    ctx: JobContext
    results: list[ResultRow]
    controls: list[ResultRow]
    unstitched: list[UnstitchedRow]
    measured: MeasureRun
    device: torch.device
    tracker: Tracker
    seconds: float
    job_id: str | None
    probes: list[ProbeResult]


def _report(ran: Ran) -> Report:
    ctx, spec, results, measured = ran.ctx, ran.ctx.spec, ran.results, ran.measured
    prep: Prepared = ctx.prep
    front = _model_summary(ctx, prep.front, [p[0] for p in prep.pairs])
    back = _model_summary(ctx, prep.back, [p[1] for p in prep.pairs])
    dataset = prep.data.describe()
    summary: Summary = summarise(spec, results, ran.controls, measured.rows)
    reason = withheld(spec, front, back, summary, results)
    report = Report(
        job_id=ran.job_id,
        spec=ran.submitted,
        resolution=prep.resolution,
        front=front,
        back=back,
        dataset=dataset,
        results=results,
        controls=ran.controls,
        unstitched_agreement=ran.unstitched,
        probes=ran.probes,
        measures=measured.rows,
        measure_controls=measured.controls,
        summary=summary,
        verdict=None if reason else verdict(summary),
        verdict_reason=reason,
        verdict_caveats=verdict_caveats(summary, results, spec.iri, prep.resolution),
        iri_settings=spec.iri if _made_iris(results + ran.controls, measured.rows) else None,
        adversarial_settings=spec.adversarial if _attacked(spec) else None,
        warnings=[*_undetermined(front, back), *ctx.warnings],
        notes=_notes(spec, prep, ran),
        environment={**_environment(ran.device, ran.tracker, spec.train.seed, ran.seconds),
                     "reference_cache": ctx.refcache.stats.as_dict()},
        method=method_record(spec),
    )
    # Sealed last: the digest covers every figure, so a report file edited by hand is told.
    return sealed(report.model_copy(update={"caveats": find_caveats(report)}))


def _undetermined(front: ModelSummary, back: ModelSummary) -> list[str]:
    """Loud, first among the job's warnings: a preprocessing no measurement could decide."""
    return [
        f"THE {role.upper()} MODEL'S PREPROCESSING IS UNDETERMINED: neither accuracy nor the "
        f"statistics of its first normalisation layer told the candidates apart, so "
        f"{m.preprocess.name} (mean {list(m.preprocess.mean)}, std {list(m.preprocess.std)}) "
        f"is a guess and every figure rests on it; set {role}.preprocess or {role}.mean/std "
        "in the spec"
        for role, m in (("front", front), ("back", back))
        if m.preprocess is not None and m.preprocess.source == "undetermined"
    ]


def _made_iris(rows: list[ResultRow], measures: list[MeasureRow]) -> bool:
    """Whether any figure of the job was computed on IRIs (a protocol's or a measure's)."""
    return any(r.iri is not None for r in rows) or any(m.input == "iri" for m in measures)


def _attacked(spec: Spec) -> bool:
    """Whether the job crafted attacked inputs (an adversarial protocol's or the robust
    evaluation's)."""
    return (catalogue.PROTOCOLS.any_of(spec.protocols, attacks=True)
            or spec.adversarial.evaluate)


def _notes(spec: Spec, prep: Prepared, ran: Ran) -> list[str]:
    return [*_budget_note(spec, ran.submitted), *_cross_task_notes(spec, prep, ran)]


def _budget_note(spec: Spec, submitted: Spec) -> list[str]:
    """The training samples a budget resolved at the job's points (check.with_budget_samples)."""
    n, floor = spec.train.max_train_samples, budget_floor(submitted)
    if floor is None or n is None:
        return []
    why = ("" if n == floor else f", more than its {floor} so that every stitch fits its "
           f"unknowns from at least {MIN_VECTORS_PER_UNKNOWN} activation vectors each, as far "
           "as the training split allows")
    return [f"budget {spec.budget}: {n} training samples for the stitch and its IRIs{why}"]


def _cross_task_notes(spec: Spec, prep: Prepared, ran: Ran) -> list[str]:
    if prep.front_data is None:
        return []
    pairing = "by index" if spec.class_pairing is None else f"as given ({spec.class_pairing})"
    notes = [
        f"cross-task pairing: the front model's task is {prep.front_data.name}, the back "
        f"model's {prep.data.name}; classes are paired {pairing}. A high cross_task accuracy "
        "says the representations are compatible (a linear map makes one serve the other's "
        "head), not that they mean the same: read it against the clustered-noise floor, the "
        "accuracy that mere class clusters reach (Functional Alignment Can Mislead)."
    ]
    return notes + [n for d in spec.direction_list()
                    if (n := _classless_cross_task_note(ran, d)) is not None]


def _classless_cross_task_note(ran: Ran, direction: str) -> str | None:
    """Cross-task pairing into a model without classes (an autoencoder's decoder): its figure
    beside the clustered-noise floor, in words."""
    cross = catalogue.PROTOCOLS.where(needs_front_dataset=True)
    rows = [r for r in ran.results if r.protocol in cross and r.direction == direction
            and not OUTPUT_KINDS[r.output].classes]
    if not rows:
        return None
    kind = OUTPUT_KINDS[rows[0].output]
    floor = [c.agreement for c in ran.controls
             if c.control == "clustered_noise" and c.direction == direction]
    beside = (f"; the clustered-noise floor (class-clustered noise through the same stitch) "
              f"reaches {float(np.mean(floor)):.3f}" if floor else "")
    return (
        f"{direction}: cross-task stitching into a model whose output is an {kind.label}: "
        f"the stitch was trained to make the back model's output on an image of the paired "
        f"class from the front model's own inputs, and reaches a mean {kind.agreement} of "
        f"{float(np.mean([r.agreement for r in rows])):.3f}{beside}. This measures "
        "compatibility (the front model's code can drive the back model's decoder, which "
        "then draws its own task from the other task's inputs, as the grid shows), not "
        "shared meaning: a figure near the floor needs no more than class clusters."
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
        "unit_seconds": tracker.unit_seconds(),
        **_peak_memory(device),
    }


def _peak_memory(device: torch.device) -> dict[str, float]:
    if device.type != "cuda":
        return {}
    return {"peak_memory_mib": round(torch.cuda.max_memory_allocated(device) / 2**20, 1)}
