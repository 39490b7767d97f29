"""The settings that move a report's figures, and how two reports' settings differ.

A CI gate compares a new similarity with a baseline's; the two compare only when both were
made the same way. The engine records its method version and these settings in every report
(`Report.method`); the client reads the same function to refuse, before running anything, a
baseline made under other settings, naming the setting that differs.

Sections are read generically (every field of `iri` and `train`), so a field added to the spec
is part of the method from the release that adds it.
"""

from __future__ import annotations

from typing import Any

from stitchsim import catalogue
from stitchsim.models import MethodRecord, Spec

ABSENT = "(not recorded)"
RESOLVED_AT_RUN = ("iri.step_size", "adversarial.epsilon", "adversarial.step_size",
                   "train.max_train_samples")
"""Settings a spec may leave null, to the input resolution (Spec.at) or to its budget (the ci
budget's training samples, set at the job's stitch points): the engine records the value that
ran, which the client knows only once the job has read its data and built its models."""


def method_settings(spec: Spec) -> dict[str, Any]:
    """Dotted path -> value of every spec setting that moves the similarity figure."""
    protocols = catalogue.PROTOCOLS.ordered(spec.protocols)
    out: dict[str, Any] = {
        "objectives": catalogue.OBJECTIVES.ordered(spec.objectives),
        "protocols": protocols,
        "directions": spec.directions,
        "layers": spec.layers if spec.layers == "auto"
        else [f"{p.front}:{p.back}" for p in spec.layers],
    }
    if spec.budget != catalogue.BUDGETS.one(default=True):
        # Recorded only off the default, so baselines of before budgets still compare.
        out["budget"] = spec.budget
    out.update(_flat("train", spec.train.model_dump(mode="json")))
    # IRI settings move the figure only of protocols that train on IRIs; a check without
    # them keeps its baseline when the IRI defaults change.
    if catalogue.PROTOCOLS.any_of(protocols, uses_iris=True):
        # accept_unconverged decides whether a verdict is given, not the figure.
        out.update(_flat("iri", spec.iri.model_dump(mode="json",
                                                    exclude={"accept_unconverged"})))
    if catalogue.PROTOCOLS.any_of(protocols, attacks=True) or spec.adversarial.evaluate:
        out.update(_flat("adversarial", spec.adversarial.model_dump(mode="json")))
    return out


def planned_differences(baseline: dict[str, Any], planned: dict[str, Any]) -> list[str]:
    """The settings of a spec not yet run that differ from a baseline's: a setting left to
    the input resolution is compared once the job has run (differences)."""
    return [f"{k}: baseline {baseline.get(k, ABSENT)}, this check {planned.get(k)}"
            for k in dict.fromkeys([*planned, *baseline])
            if baseline.get(k) != planned.get(k)
            and not (planned.get(k) is None and k in RESOLVED_AT_RUN)]


def differences(baseline: MethodRecord, current: MethodRecord) -> list[str]:
    """"iri.steps: baseline 100, this check 200" for each setting that differs, engine first."""
    found = []
    if baseline.engine != current.engine:
        found.append(f"engine method version: baseline {baseline.engine}, this check "
                     f"{current.engine}")
    keys = list(dict.fromkeys([*current.settings, *baseline.settings]))
    for key in keys:
        was = baseline.settings.get(key, ABSENT)
        now = current.settings.get(key, ABSENT)
        if was != now:
            found.append(f"{key}: baseline {_show(was)}, this check {_show(now)}")
    return found


def _flat(prefix: str, values: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(_flat(f"{prefix}.{key}", value))
        else:
            out[f"{prefix}.{key}"] = value
    return out


def _show(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)
