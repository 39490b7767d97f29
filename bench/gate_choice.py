"""Which figures a calibrated gate should test by default (issue 46 item 3), read from the
drift series bench/drift_power.py stored (no model is trained or checked here).

Per family file: the benign band is the baseline's retrain and its benign siblings (the byte
copy left out: it is the reference); the harmful models are every dose. For each candidate
gate (a set of figure kinds), the limits are stitchsim.calibration's, the same Student t
prediction bound at a 1 % family-wise rate split over the gate's figures, and:

- caught: the harmful models some gated figure of which crosses its limit (limits set on all
  benign models);
- leave-one-out false alarms: each benign model tested on the limits of the others (n - 1),
  an estimate on models the limits did not see, from few models (the series holds 8 per
  family), pending bench/drift_power.py --held-out on independent trainings.

    python bench/gate_choice.py bench/results/drift_power.2026-12-07.*.json \
        --out bench/results/gate_choice.2026-12-07.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stitchsim.calibration import band, prediction_factor
from stitchsim.figures import NamedFigure, named

GATES: dict[str, tuple[str, ...]] = {
    "standard per point": ("standard",),
    "invariance-aware per point": ("invariance_aware",),
    "similarity (invariance-aware mean)": ("similarity",),
    "accuracy": ("accuracy",),
    "cka": ("cka",),
    "standard per point + accuracy (default)": ("standard", "accuracy"),
    "accuracy + cka": ("accuracy", "cka"),
}
RATE = 0.01


def figures_of(model: dict[str, Any]) -> dict[str, NamedFigure]:
    """The figures a check's series entry holds (its first rerun), named as a report's are."""
    check = model["checks"][0]
    out = [named("similarity", check["similarity"]), named("accuracy", model["accuracy"])]
    if check.get("cka") is not None:
        out.append(named("cka", check["cka"], input="real"))
    for point, values in check.get("points", {}).items():
        for protocol in ("standard", "invariance_aware"):
            if values.get(protocol) is not None:
                out.append(named("agreement", values[protocol], protocol=protocol,
                                 point=point))
    return {f.name: f for f in out}


def gated(figure: NamedFigure, kinds: Sequence[str]) -> bool:
    labels = dict(figure.labels)
    return figure.kind in kinds or labels.get("protocol") in kinds


def fails(limits: dict[str, Any], figures: dict[str, NamedFigure]) -> list[str]:
    return [name for name, b in limits.items() if figures[name].value < b.limit]


def limits_of(benign: list[dict[str, NamedFigure]], kinds: Sequence[str]) -> dict[str, Any]:
    names = [n for n, f in benign[0].items() if gated(f, kinds)]
    if not names:
        return {}
    _, factor = prediction_factor(len(benign), RATE / len(names))
    return {n: band([b[n] for b in benign], factor, True) for n in names}


def family_table(checks: dict[str, Any]) -> dict[str, Any]:
    benign_names = [n for n, m in checks.items() if m["kind"] in ("baseline", "benign")
                    and n != "resaved"]
    harmful_names = [n for n, m in checks.items() if m["kind"] not in (
        "baseline", "benign", "reference")]
    benign = [figures_of(checks[n]) for n in benign_names]
    out: dict[str, Any] = {"benign": benign_names, "harmful": harmful_names, "gates": {}}
    for label, kinds in GATES.items():
        limits = limits_of(benign, kinds)
        if not limits:
            continue
        caught = [n for n in harmful_names if fails(limits, figures_of(checks[n]))]
        loo = [n for i, n in enumerate(benign_names)
               if fails(limits_of(benign[:i] + benign[i + 1:], kinds), benign[i])]
        out["gates"][label] = {"figures": len(limits), "caught": caught,
                               "loo_false_alarms": loo}
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"rate": RATE, "files": {}}
    for path in args.files:
        data = json.loads(path.read_text())
        for family, body in data["families"].items():
            table = family_table(body["checks"])
            result["files"][f"{path.name}:{family}"] = table
            print(f"\n{path.name} ({family}): {len(table['benign'])} benign, "
                  f"{len(table['harmful'])} harmful")
            for label, row in table["gates"].items():
                print(f"  {label:<42} figures {row['figures']:>2}  caught "
                      f"{len(row['caught']):>2}/{len(table['harmful'])}  leave-one-out "
                      f"false alarms {len(row['loo_false_alarms'])}/{len(table['benign'])}"
                      f"  {' '.join(row['caught'])}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
