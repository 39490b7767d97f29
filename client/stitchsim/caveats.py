"""What weakens a report's figures, as codes (catalogue.CAVEATS) a CI gate can act on.

Read off the report's own figures, so the engine (which records them in `Report.caveats`) and
a client reading an older report (which has none recorded) find the same ones.
"""

from __future__ import annotations

from stitchsim import catalogue
from stitchsim.models import Caveat, Report


def find_caveats(report: Report) -> list[Caveat]:
    """Unconverged IRIs under the similarity figure's protocol, then models at chance."""
    found = []
    used = report.summary.similarity_protocol
    entry = catalogue.PROTOCOLS.get(used)
    if entry is not None and entry.uses_iris:
        for r in report.results:
            if r.protocol == used and r.iri is not None and not r.iri.converged:
                found.append(Caveat(
                    code="iri_unconverged", where=f"{r.direction} {r.front_layer}->{r.back_layer}",
                    message=f"{r.objective} IRIs at {r.front_layer}->{r.back_layer} "
                    f"({r.direction}) ended at median distance {r.iri.median:.3f}, above "
                    f"{r.iri.converged_below:g}"))
    for side, model in (("front", report.front), ("back", report.back)):
        if model.near_chance:
            found.append(Caveat(
                code="near_chance", where=side,
                message=model.chance_warning or f"the {side} model ({model.arch}) scores "
                f"{model.accuracy:.3f}, at chance"))
    return found


def caveats_of(report: Report) -> list[Caveat]:
    """The report's recorded caveats; found from its figures when it recorded none."""
    return report.caveats if report.caveats is not None else find_caveats(report)
