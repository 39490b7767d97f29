#!/usr/bin/env python3
"""Print the demo's two findings from its reports: agreement by depth under each protocol,
with the IRIs' convergence beside the invariance-aware figure.

    python scripts/demo_findings.py SEEDS.json SHORTCUT.json
"""

from __future__ import annotations

import sys
from pathlib import Path

from stitchsim import view
from stitchsim.models import Report, ResultRow


def _row(report: Report, layer: str, protocol: str) -> ResultRow | None:
    found = [r for r in report.results if r.front_layer == layer and r.protocol == protocol
             and r.direction == "front_to_back"]
    return found[0] if found else None


def describe(title: str, report: Report) -> list[str]:
    lines = [f"{title}: {report.front.arch} -> {report.back.arch} on {report.spec.dataset}, "
             "agreement by depth (front to back)"]
    layers = list(dict.fromkeys(r.front_layer for r in report.results))
    for layer in layers:
        std, aware = _row(report, layer, "standard"), _row(report, layer, "invariance_aware")
        if std is None or aware is None:
            continue
        iri = aware.iri
        conv = "" if iri is None else (
            f"  (IRIs: median distance {iri.median:.2f}, "
            f"{'converged' if iri.converged else 'NOT converged'}, "
            f"{iri.steps_used or 0:.0f} steps/sample)")
        lines.append(f"  {layer:<8} standard {std.agreement:.2f}   invariance-aware "
                     f"{aware.agreement:.2f}{conv}")
    # A probe set shows what the clean data cannot: where the models part on the cue.
    lines += [f"  {view.probe_text(line)}" for line in view.probe_lines(report)]
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    seeds, shortcut = (Report.model_validate_json(Path(p).read_text()) for p in argv)
    print("\n".join(describe("Two seeds of one model", seeds)))
    print("\n".join(describe("A shortcut-trained front", shortcut)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
