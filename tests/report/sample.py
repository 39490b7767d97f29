"""A realistic finished report built by hand, for testing the page and the table without
running a job: two directions, three stitch points, slm and fula, both protocols, identity and
clustered-noise controls, IRI statistics, each model's preprocessing and a threshold. The
summary is the engine's own (its summary module), as are the verdict's rules."""

from __future__ import annotations

from typing import Any

from stitchsim import catalogue
from stitchsim.models import (
    DIRECTIONS,
    Direction,
    IRIStats,
    ModelSummary,
    Objective,
    PreprocessCandidate,
    PreprocessInfo,
    Protocol,
    Report,
    ResultRow,
    Spec,
    UnstitchedRow,
)
from stitchsim_worker.engine.measures.summary import (
    chance_warning,
    summarise,
    verdict as engine_verdict,
    verdict_caveats,
    withheld,
)

__all__ = ["make_sample_report", "summarise"]

LAYERS = ("layer1", "layer2", "layer3")
OBJECTIVES: tuple[Objective, ...] = ("slm", "fula")
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))

# Standard agreement stays high with depth; invariance-aware falls off: the typical picture
# of two networks that look alike under the standard protocol but are not. Values at the
# first, middle and last stitch point; points in between are interpolated.
STANDARD = (0.978, 0.962, 0.941)
INVARIANT = (0.902, 0.781, 0.612)


def _level(levels: tuple[float, float, float], k: int, n: int) -> float:
    t = 2 * k / (n - 1) if n > 1 else 0.0
    i = min(int(t), 1)
    return round(levels[i] + (levels[i + 1] - levels[i]) * (t - i), 4)


def _ci(value: float, half: float = 0.012) -> tuple[float, float]:
    return (round(max(0.0, value - half), 4), round(min(1.0, value + half), 4))


def _row(direction: Direction, k: int, n: int, objective: Objective, protocol: Protocol,
         front_layer: str, back_layer: str, shift: float) -> ResultRow:
    base = _level(STANDARD if protocol == "standard" else INVARIANT, k, n)
    agreement = round(base - shift - (0.01 if objective == "fula" else 0.0), 4)
    accuracy = round(0.955 - (1 - agreement) * 0.6, 4)
    iri = None
    if protocol == "invariance_aware":
        iri = IRIStats(start_median=0.93 + 0.01 * k, median=0.04 * (k + 1), p90=0.07 * (k + 1),
                       max=0.12 * (k + 1) + (0.2 if k == n - 1 else 0.0), converged=k < n - 1,
                       cache_hit=objective == "fula", n=200, seconds=3.2 + k,
                       method="paper", pixel_rms=0.30 + 0.01 * k, pixel_median=0.29 + 0.01 * k)
    return ResultRow(
        direction=direction, front_layer=front_layer, back_layer=back_layer,
        objective=objective, protocol=protocol, agreement=agreement,
        agreement_ci=_ci(agreement), hard_agreement=round(agreement + 0.01, 4),
        hard_agreement_ci=_ci(agreement + 0.01), accuracy=accuracy, accuracy_ci=_ci(accuracy),
        stitching_penalty=round(0.955 - accuracy, 4), error_consistency=0.71,
        error_consistency_ci=(0.62, 0.8), correct_agreement=round(agreement + 0.02, 4),
        correct_agreement_ci=_ci(agreement + 0.02), soft_kappa=0.64, soft_kappa_ci=(0.55, 0.73),
        train_loss=0.0312, seconds=4.1, iri=iri, stitch="1x1 conv 64→64",
    )


UNSTITCHED = {"front_to_back": 0.5213, "back_to_front": 0.5187}
"""The whole models against each other: two seeds of different architectures agree on about
half the samples' softmaxes (lower than any stitch, as in the paper's plots)."""


def _unstitched(direction: Direction) -> UnstitchedRow:
    a = UNSTITCHED[direction]
    return UnstitchedRow(
        direction=direction, agreement=a, agreement_ci=_ci(a, 0.02), hard_agreement=0.913,
        hard_agreement_ci=_ci(0.913), correct_agreement=0.921, correct_agreement_ci=_ci(0.921),
        error_consistency=0.58, error_consistency_ci=(0.5, 0.66), soft_kappa=0.41,
        soft_kappa_ci=(0.35, 0.47), accuracy=0.962 if direction == "front_to_back" else 0.955,
        samples=360)


def _controls(direction: Direction, pairs: list[tuple[str, str]]) -> list[ResultRow]:
    """As the engine reports them: per layer pair, identity under each protocol, clustered
    noise per sigma under the standard protocol."""
    rows: list[ResultRow] = []
    for k, (front_layer, back_layer) in enumerate(pairs):
        for objective in OBJECTIVES:
            common: dict[str, Any] = dict(
                direction=direction, front_layer=front_layer, back_layer=back_layer,
                objective=objective, hard_agreement_ci=(0.0, 1.0), accuracy_ci=(0.0, 1.0),
                stitching_penalty=0.0, error_consistency=0.0, error_consistency_ci=(0.0, 0.0),
                train_loss=0.01, seconds=1.0,
            )
            for protocol, dip in (("standard", 0.0), ("invariance_aware", 0.006)):
                a = 0.996 - 0.002 * k - dip
                rows.append(ResultRow(**common, protocol=protocol, control="identity",
                                      agreement=a, agreement_ci=(a - 0.005, min(1.0, a + 0.004)),
                                      hard_agreement=0.998, accuracy=0.955))
            for sigma, level in ((0.1, 0.52), (0.3, 0.38)):
                a = level - 0.05 * k
                rows.append(ResultRow(**common, protocol="standard", control="clustered_noise",
                                      sigma=sigma, agreement=a, agreement_ci=_ci(a, 0.03),
                                      hard_agreement=a + 0.02, accuracy=a - 0.03))
    return rows


def _models(front_arch: str, back_arch: str, front_layers: tuple[str, ...],
            back_layers: tuple[str, ...], spec: Spec, near_chance: bool
            ) -> tuple[ModelSummary, ModelSummary]:
    """The front model's preprocessing was measured, the back model's came from metadata; with
    near_chance the back model predicts at chance."""
    mean, std = IMAGENET
    front = ModelSummary(
        checkpoint=spec.front.checkpoint, arch=front_arch,  # type: ignore[arg-type]
        arch_kwargs={"num_classes": 10}, accuracy=0.962, accuracy_ci=(0.948, 0.975),
        input_size=32, layers=list(front_layers), chance_accuracy=0.1,
        preprocess=PreprocessInfo(
            name="timm", input_size=32, mean=mean, std=std, source="measured",
            note="the best-predicting candidate on labelled test samples", samples=256,
            candidates=[PreprocessCandidate(name="timm", mean=mean, std=std, accuracy=0.961),
                        PreprocessCandidate(name="none", mean=(0, 0, 0), std=(1, 1, 1),
                                            accuracy=0.734),
                        PreprocessCandidate(name="inception", mean=(0.5,) * 3, std=(0.5,) * 3,
                                            accuracy=0.902)]))
    accuracy = 0.098 if near_chance else 0.955
    back = ModelSummary(
        checkpoint=spec.back.checkpoint, arch=back_arch,  # type: ignore[arg-type]
        arch_kwargs={"num_classes": 10}, accuracy=accuracy,
        accuracy_ci=(accuracy - 0.015, accuracy + 0.014), input_size=32,
        layers=list(back_layers), chance_accuracy=0.1, near_chance=near_chance,
        preprocess=PreprocessInfo(name="inception", input_size=32, mean=(0.5,) * 3,
                                  std=(0.5,) * 3, source="metadata",
                                  note="mean and std from the checkpoint's __metadata__"))
    # The engine's warning, as it writes it into a model's summary.
    back.chance_warning = chance_warning(back, "back", "digits")
    return front, back


def make_sample_report(threshold: float | None = 0.75, shift: float = 0.0,
                       front_layers: tuple[str, ...] = LAYERS,
                       back_layers: tuple[str, ...] = LAYERS,
                       front_arch: str = "resnet18", back_arch: str = "resnet26",
                       warnings: list[str] | None = None, caveats: list[str] | None = None,
                       near_chance: bool = False) -> Report:
    """`shift` lowers every agreement, to move the verdict across the threshold; `caveats`
    replace the verdict's (by default the engine's: the IRIs at the deepest point did not
    converge); `near_chance` puts the back model at chance, which withholds the verdict."""
    spec = Spec.model_validate({
        "front": {"checkpoint": "sha256:" + "a" * 64, "arch": front_arch,
                  "arch_kwargs": {"num_classes": 10}},
        "back": {"checkpoint": "sha256:" + "b" * 64, "arch": back_arch,
                 "arch_kwargs": {"num_classes": 10}},
        "dataset": "digits",
        "layers": [{"front": f, "back": b} for f, b in zip(front_layers, back_layers, strict=True)],
        "objectives": list(OBJECTIVES),
        "controls": ["identity", "clustered_noise"],
        "threshold": threshold,
        # The deepest point's IRIs did not converge (the caveat the pages show): accepted, so
        # the sample keeps a verdict to render.
        "iri": {"accept_unconverged": True},
    })
    results: list[ResultRow] = []
    controls: list[ResultRow] = []
    # Rows name layers by model (front_layer is the front model's) in both directions, as
    # the engine does.
    pairs = list(zip(front_layers, back_layers, strict=True))
    for direction in DIRECTIONS:
        extra = 0.0 if direction == "front_to_back" else 0.015
        for k, (fl, bl) in enumerate(pairs):
            for objective in OBJECTIVES:
                for protocol in catalogue.drop_protocols():  # standard, invariance-aware
                    results.append(_row(direction, k, len(pairs), objective, protocol, fl, bl,
                                        shift + extra))
        controls += _controls(direction, pairs)
    summary = summarise(spec, results)
    front, back = _models(front_arch, back_arch, front_layers, back_layers, spec, near_chance)
    reason = withheld(spec, front, back, summary, results)
    return Report(
        job_id="job_0123456789abcdef", spec=spec, front=front, back=back,
        dataset={"name": "digits", "n_train": 1437, "n_test": 360, "n_classes": 10,
                 "image_shape": [3, 32, 32]},
        results=results, controls=controls, summary=summary,
        unstitched_agreement=[_unstitched(d) for d in DIRECTIONS],
        verdict=None if reason else engine_verdict(summary), verdict_reason=reason,
        verdict_caveats=verdict_caveats(summary, results) if caveats is None else caveats,
        warnings=warnings or [],
        environment={"stitchsim": "0.1.0", "torch": "2.14.1", "timm": "1.0.31",
                     "device": "cpu", "seed": 0, "durations_s": {"train": 52.1, "iri": 31.9}},
    )
