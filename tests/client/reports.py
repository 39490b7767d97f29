"""Reports built by hand with chosen agreements, for testing the client without the engine."""

from __future__ import annotations

from typing import Any

from stitchsim.models import (
    ModelSummary,
    Report,
    ResultRow,
    Spec,
    Summary,
    SummaryRow,
)


def make_report(
    spec: Spec | dict[str, Any],
    agreement: dict[tuple[str, str], float] | None = None,
    *,
    job_id: str = "job-1",
    layer_spread: float = 0.02,
    objective_spread: float = 0.0,
) -> Report:
    """A report for `spec`; `agreement[(protocol, direction)]` is the mean over stitch points
    and objectives, which is how the engine pools them for the verdict.

    Stitch points deviate from it by ±layer_spread/2 and objectives by ±objective_spread/2,
    symmetrically, so the pooled mean stays exact. Missing entries default to 0.95.
    """
    spec = spec if isinstance(spec, Spec) else Spec.model_validate(spec)
    agreement = agreement or {}
    layers = (
        [("layer1", "layer1"), ("layer2", "layer2")]
        if spec.layers == "auto"
        else [(p.front, p.back) for p in spec.layers]
    )
    results: list[ResultRow] = []
    summary_rows: list[SummaryRow] = []
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
                        )
                    )
                summary_rows.append(
                    SummaryRow(
                        protocol=protocol,
                        direction=direction,
                        objective=objective,
                        mean_agreement=mean,
                    )
                )
    by_protocol = {
        p: min(
            sum(r.agreement for r in results if (r.protocol, r.direction) == (p, d))
            / sum(1 for r in results if (r.protocol, r.direction) == (p, d))
            for d in spec.direction_list()
        )
        for p in spec.protocols
    }
    sim_protocol = "invariance_aware" if "invariance_aware" in spec.protocols else "standard"
    similarity = by_protocol[sim_protocol]
    verdict = None
    if spec.threshold is not None:
        verdict = "similar" if similarity >= spec.threshold else "dissimilar"
    model = {
        "arch": "test_resnet",
        "accuracy": 0.9,
        "accuracy_ci": (0.88, 0.92),
        "input_size": 32,
    }
    front_ck = spec.front.checkpoint if isinstance(spec.front.checkpoint, str) else "local"
    back_ck = spec.back.checkpoint if isinstance(spec.back.checkpoint, str) else "local"
    return Report(
        job_id=job_id,
        spec=spec,
        front=ModelSummary(checkpoint=front_ck, **model),
        back=ModelSummary(checkpoint=back_ck, **model),
        dataset={"name": "digits"},
        results=results,
        summary=Summary(
            rows=summary_rows,
            by_protocol=by_protocol,
            similarity=similarity,
            similarity_protocol=sim_protocol,
            threshold=spec.threshold,
        ),
        verdict=verdict,
    )
