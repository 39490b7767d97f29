"""Summary definitions (docs/method.md): the one place where the similarity figure, the verdict and
the drop are computed. Clients only read them from the report."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from stitchsim import catalogue
from stitchsim.models import (
    Cue,
    Direction,
    DropRow,
    ExcessRow,
    IRISettings,
    Measure,
    MeasureRow,
    MeasureSummaryRow,
    ModelSummary,
    Objective,
    Protocol,
    ResultRow,
    Spec,
    Summary,
    SummaryRow,
    Verdict,
)


def _mean(values: Iterable[float]) -> float:
    return float(np.mean(list(values)))


def _drops(rows: list[ResultRow]) -> list[DropRow]:
    """The baseline's minus the IRI protocol's agreement (catalogue.drop_protocols), per point
    and as the mean over points."""
    baseline, iri = catalogue.drop_protocols()
    by_point: dict[tuple[Direction, Objective, str, str], dict[Protocol, float]] = {}
    for r in rows:
        key = (r.direction, r.objective, r.front_layer, r.back_layer)
        by_point.setdefault(key, {})[r.protocol] = r.agreement
    points = [
        (key, v[baseline], v[iri]) for key, v in by_point.items() if baseline in v and iri in v
    ]
    means: dict[tuple[Direction, Objective], list[tuple[float, float]]] = {}
    for (d, o, _, _), std, inv in points:
        means.setdefault((d, o), []).append((std, inv))
    out = []
    for (d, o), pairs in means.items():
        std, inv = _mean(p[0] for p in pairs), _mean(p[1] for p in pairs)
        out.append(DropRow(direction=d, objective=o, standard=std, invariance_aware=inv,
                           drop=std - inv))
    for (d, o, fl, bl), std, inv in points:
        out.append(DropRow(direction=d, objective=o, front_layer=fl, back_layer=bl,
                           standard=std, invariance_aware=inv, drop=std - inv))
    return out


def similarity_protocol(ran: Iterable[Protocol]) -> Protocol:
    """The protocol whose figure the verdict reads: the highest catalogue rank among those that
    ran, the first in catalogue order among equals (the invariance-aware one sees what the
    standard one hides; cross-task pairing measures compatibility, not similarity)."""
    protocols = catalogue.PROTOCOLS
    return max(protocols.ordered(ran),
               key=lambda p: (protocols[p].rank, -protocols.position(p)))


def _excess(controls: list[ResultRow]) -> list[ExcessRow]:
    """The unseen-cue control's excessive agreement (its rows carry a cue), maximised over
    stitch points."""
    best: dict[tuple[Direction, Cue, Protocol, Objective], ResultRow] = {}
    for r in controls:
        if r.cue is None or r.excessive_agreement is None:
            continue
        key = (r.direction, r.cue, r.protocol, r.objective)
        if key not in best or r.excessive_agreement > best[key].excessive_agreement:  # type: ignore[operator]
            best[key] = r
    return [
        ExcessRow(direction=d, cue=c, protocol=p, objective=o,
                  max_excessive_agreement=float(r.excessive_agreement or 0.0),
                  front_layer=r.front_layer, back_layer=r.back_layer)
        for (d, c, p, o), r in best.items()
    ]


def _measure_means(measures: list[MeasureRow]) -> list[MeasureSummaryRow]:
    """Per direction and measure: the mean over stitch points on real inputs and on IRIs."""
    groups: dict[tuple[Direction, Measure], dict[str, list[float]]] = {}
    for m in measures:
        groups.setdefault((m.direction, m.measure), {}).setdefault(m.input, []).append(m.value)
    out = []
    for (d, name), by_input in groups.items():
        real = _mean(by_input["real"]) if "real" in by_input else None
        iri = _mean(by_input["iri"]) if "iri" in by_input else None
        gap = real - iri if real is not None and iri is not None else None
        out.append(MeasureSummaryRow(direction=d, measure=name, real=real, iri=iri, gap=gap))
    return out


def _measure_weaker(means: list[MeasureSummaryRow]) -> dict[str, Direction]:
    """Per measure with both directions: the direction whose IRI figure is lower. IRIs are the
    front model's, so each direction is one conditional (the end model given the front
    model's invariances), like STIR's score of one model given the other."""
    by_measure: dict[str, dict[Direction, float]] = {}
    for m in means:
        if m.iri is not None:
            by_measure.setdefault(m.measure, {})[m.direction] = m.iri
    return {name: min(v, key=v.__getitem__) for name, v in by_measure.items() if len(v) > 1}


def summarise(spec: Spec, rows: list[ResultRow], controls: list[ResultRow] | None = None,
              measures: list[MeasureRow] | None = None) -> Summary:
    """Mean agreement over stitch points (rAuA) per protocol, direction and objective; the
    similarity is the figure of the highest-ranked protocol that ran (similarity_protocol),
    taken in the weaker direction."""
    # An adversarial protocol run at several alphas is summarised at its most attacked arm
    # (the others, alpha 0 the clean one, stay in the results).
    headline = spec.adversarial.alpha_list()[-1]
    rows = [r for r in rows if r.alpha is None or r.alpha == headline]
    groups: dict[tuple[Protocol, Direction, Objective], list[float]] = {}
    for r in rows:
        groups.setdefault((r.protocol, r.direction, r.objective), []).append(r.agreement)
    summary_rows = [
        SummaryRow(protocol=p, direction=d, objective=o, mean_agreement=_mean(v))
        for (p, d, o), v in groups.items()
    ]
    by_direction = {
        protocol: {
            d: _mean(r.agreement for r in rows if r.protocol == protocol and r.direction == d)
            for d in spec.direction_list()
        }
        for protocol in spec.protocols
    }
    by_protocol = {protocol: min(means.values()) for protocol, means in by_direction.items()}
    used = similarity_protocol(by_protocol)
    weaker = min(by_direction[used], key=by_direction[used].__getitem__)
    measure_means = _measure_means(measures or [])
    return Summary(
        rows=summary_rows,
        by_direction=by_direction,
        by_protocol=by_protocol,
        similarity=by_protocol[used],
        similarity_protocol=used,
        weaker_direction=weaker,  # type: ignore[arg-type]
        threshold=spec.threshold,
        drops=_drops(rows),
        excessive_agreement=_excess(controls or []),
        measures=measure_means,
        measure_weaker_direction=_measure_weaker(measure_means),
    )


def verdict(summary: Summary) -> Verdict | None:
    if summary.threshold is None:
        return None
    return "similar" if summary.similarity >= summary.threshold else "dissimilar"


def chance_warning(m: ModelSummary, where: str, dataset: str) -> str | None:
    """The warning a model at chance gets (in its summary, the one place it is written)."""
    if not m.near_chance:
        return None
    pre = m.preprocess
    tried = ""
    if pre is not None and pre.candidates:
        tried = " under every preprocessing tried (" + ", ".join(
            f"{c.name} {c.accuracy:.2f}" for c in pre.candidates) + ")"
    chance = f" (chance {m.chance_accuracy:.3f})" if m.chance_accuracy is not None else ""
    return (
        f"THE {where.upper()} MODEL IS AT CHANCE: {m.arch} scores {m.accuracy:.3f} on "
        f"{dataset}{chance}{tried}, so every figure of this job is computed on a model that "
        f"does not solve the task. Check that the dataset is the one it was trained on, that "
        f"arch_kwargs match its training code, and its preprocessing ({where}.mean/std or "
        f"{where}.preprocess)."
    )


def withheld(spec: Spec, front: ModelSummary, back: ModelSummary,
             summary: Summary | None = None, rows: Iterable[ResultRow] = ()) -> str | None:
    """Why no verdict may be given although a threshold was asked for (a clause: renderings
    lead in with "no verdict" in their own words); None when it may. Two things void the
    figure: a model at chance, and (unless iri.accept_unconverged) IRIs that did not converge
    under the protocol the verdict reads."""
    if spec.threshold is None:
        return None
    at_chance = [w for w, m in (("front", front), ("back", back)) if m.near_chance]
    if at_chance:
        models = {"front": front, "back": back}
        which = " and ".join(f"the {w} model ({models[w].arch})" for w in at_chance)
        return (
            f"{which} scores at chance on this dataset, so agreement with it means "
            "nothing; check the dataset, the arch_kwargs and the preprocessing (mean/std or "
            "preprocess) of that model"
        )
    if summary is None or spec.iri.accept_unconverged:
        return None
    loose = unconverged(summary, rows)
    if loose:
        label = catalogue.PROTOCOLS.label(summary.similarity_protocol)
        return (
            f"the {label} figure rests on IRIs that did not converge at " + ", ".join(loose)
            + f" (median at or above iri.converged_below {spec.iri.converged_below:g} after "
            f"{spec.iri.max_steps} steps at most): the stitch was trained on inputs the front "
            "model can still tell from real ones. " + _UNCONVERGED_FIX
        )
    return None


_UNCONVERGED_FIX = (
    "Give the IRIs more steps (iri.extra_rounds for more rounds, or iri.steps / "
    "iri.extra_round_steps), or set iri.accept_unconverged true to take the verdict anyway"
)


def unconverged(summary: Summary, rows: Iterable[ResultRow]) -> list[str]:
    """The stitch points whose IRIs stayed above the convergence line under the protocol the
    verdict reads, as "direction front->back (median m, s steps)"."""
    used = summary.similarity_protocol
    if not catalogue.PROTOCOLS[used].uses_iris:
        return []
    return sorted({
        f"{r.direction} {r.front_layer}->{r.back_layer} (median {r.iri.median:.2f}"
        + (f", {r.iri.steps_used:.0f} steps" if r.iri.steps_used is not None else "") + ")"
        for r in rows
        if r.protocol == used and r.iri is not None and not r.iri.converged
    })


def verdict_caveats(summary: Summary, rows: list[ResultRow],
                    iri: IRISettings | None = None, resolution: str | None = None) -> list[str]:
    """What the similarity figure rests on that weakens it. A figure of IRIs depends on how
    they were made, so it always names the IRI method (the settings that ran, resolved at
    `resolution`, else the rows')."""
    used = summary.similarity_protocol
    if not catalogue.PROTOCOLS[used].uses_iris:
        return []
    label = catalogue.PROTOCOLS.label(used)
    made = [r.iri for r in rows if r.protocol == used and r.iri is not None]
    if not made:
        return []
    name = made[0].method
    method = iri.described(resolution) if iri is not None else name
    named = f"iri.method {method}" if method else "an unnamed IRI method"
    what = f" ({catalogue.IRI_METHODS.label(name)})" if name else ""
    caveats = [
        f"the {label} figure rests on IRIs made by {named}{what}; another IRI method can move "
        "it (bench/iri_methods.py)"
    ]
    loose = unconverged(summary, rows)
    if loose:
        caveats.append(
            f"the {label} figure rests on IRIs ({named}) that did not converge at "
            + ", ".join(loose)
            + ": the front model can still tell them from the real inputs, so the stitch was "
            "trained on inputs that are not indistinguishable. " + _UNCONVERGED_FIX
        )
    return caveats
