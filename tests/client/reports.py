"""Reports built by hand with chosen agreements, for testing the client without running jobs;
the summary (similarity, drops, verdict) is the engine's own, from its summary module."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stitchsim import catalogue
from stitchsim.models import IRIStats, ModelSummary, PreprocessInfo, Report, ResultRow, Spec
from stitchsim_worker.engine.measures.summary import (
    summarise,
    verdict as engine_verdict,
    verdict_caveats,
    withheld,
)


def make_report(
    spec: Spec | dict[str, Any],
    agreement: dict[tuple[str, str], float] | None = None,
    *,
    job_id: str = "job-1",
    layer_spread: float = 0.02,
    objective_spread: float = 0.0,
    near_chance: str | None = None,
    caveats: Sequence[str] = (),
    undetermined: str | None = None,
    iri_median: float | None = None,
) -> Report:
    """A report for `spec`; `agreement[(protocol, direction)]` is the mean over stitch points
    and objectives, which is how the engine pools them for the verdict.

    Stitch points deviate from it by ±layer_spread/2 and objectives by ±objective_spread/2,
    symmetrically, so the pooled mean stays exact. Missing entries default to 0.95.
    `near_chance` ("front" or "back") puts that model at chance: no verdict, and why;
    `caveats` become the verdict's caveats; `undetermined` ("front" or "back") gives that
    model a preprocessing no measurement decided. `iri_median` gives the rows of protocols
    that use IRIs IRIs of that median distance (converged below the spec's line or not),
    made in 200 steps of the spec's cap.
    """
    spec = spec if isinstance(spec, Spec) else Spec.model_validate(spec)
    agreement = agreement or {}
    layers = (
        [("layer1", "layer1"), ("layer2", "layer2")]
        if spec.layers == "auto"
        else [(p.front, p.back) for p in spec.layers]
    )
    results: list[ResultRow] = []
    for protocol in spec.protocols:
        for direction in spec.direction_list():
            k = len(spec.objectives)
            for j, objective in enumerate(spec.objectives):
                mean = agreement.get((protocol, direction), 0.95)
                mean += objective_spread * (j - (k - 1) / 2) / max(k - 1, 1)
                n = len(layers)
                offsets = [layer_spread * (i - (n - 1) / 2) for i in range(n)]
                for (front, back), off in zip(layers, offsets, strict=True):
                    a = mean + off
                    results.append(
                        ResultRow(
                            direction=direction,
                            front_layer=front if direction == "front_to_back" else back,
                            back_layer=back if direction == "front_to_back" else front,
                            objective=objective,
                            protocol=protocol,
                            agreement=a,
                            agreement_ci=(a - 0.01, a + 0.01),
                            hard_agreement=a,
                            hard_agreement_ci=(a - 0.02, a + 0.02),
                            accuracy=0.9,
                            accuracy_ci=(0.88, 0.92),
                            stitching_penalty=0.01,
                            error_consistency=0.8,
                            error_consistency_ci=(0.7, 0.9),
                            train_loss=0.1,
                            seconds=1.5,
                            iri=_iris(spec, iri_median, protocol),
                        )
                    )
    summary = summarise(spec, results)
    models = {side: _model(ref.checkpoint if isinstance(ref.checkpoint, str) else "local",
                           at_chance=near_chance == side, undetermined=undetermined == side)
              for side, ref in (("front", spec.front), ("back", spec.back))}
    reason = withheld(spec, models["front"], models["back"], summary, results)
    return Report(job_id=job_id, spec=spec, **models, dataset={"name": "digits"},
                  results=results, summary=summary, verdict_reason=reason,
                  verdict=None if reason else engine_verdict(summary),
                  verdict_caveats=[*verdict_caveats(summary, results), *caveats])


def _iris(spec: Spec, median: float | None, protocol: str) -> IRIStats | None:
    if median is None or not catalogue.PROTOCOLS[protocol].uses_iris:
        return None
    return IRIStats(method=spec.iri.method, start_median=1.0, median=median, p90=median,
                    max=median, converged=median < spec.iri.converged_below, cache_hit=False,
                    n=128, seconds=1.0, converged_below=spec.iri.converged_below,
                    steps=spec.iri.max_steps, steps_used=200.0)


def _model(checkpoint: str, *, at_chance: bool, undetermined: bool = False) -> ModelSummary:
    accuracy = 0.1 if at_chance else 0.9
    preprocess = PreprocessInfo(name="none", input_size=32, mean=(0.0, 0.0, 0.0),
                                std=(1.0, 1.0, 1.0), source="metadata",
                                note="mean and std from the checkpoint's metadata")
    if undetermined:
        preprocess = preprocess.model_copy(update={
            "source": "undetermined", "note": "UNDETERMINED: nothing told the candidates apart"})
    return ModelSummary(
        checkpoint=checkpoint, arch="test_resnet", accuracy=accuracy,
        accuracy_ci=(accuracy - 0.02, accuracy + 0.02), input_size=32,
        preprocess=preprocess,
        chance_accuracy=0.1, near_chance=at_chance,
    )
