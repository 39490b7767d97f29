"""A row figure from outside the project, as a plug-in would add one: exactly two entries, its
catalogue entry (what it is called, how it is written) and its engine entry (how it is
computed), under one name. Nothing else in the project learns of it; every result row and the
no-stitch endpoint carry it, and the table, the page, JUnit and the data frame show it.

The toy: how often the stitched model is right where the model it ends in is wrong (the share
of test samples it gets right and the end model does not), with the rows' bootstrap."""

from __future__ import annotations

from stitchsim import catalogue
from stitchsim_worker.engine.measures.metrics import FigureEntry, Outcomes, register_figure

NAME = "right_where_end_wrong"
CATALOGUE_ENTRY = catalogue.RowFigureEntry(
    NAME, "right where the end model is wrong (toy)", "the share of test samples the stitched "
    "model classifies right and the model it ends in does not: a toy figure registered by a "
    "test package", column="toy right", digits=4, higher_is_better=False)


def statistic(o: Outcomes):  # type: ignore[no-untyped-def]
    return (o.h_right & ~o.g_right).float().mean(-1)


ENGINE_ENTRY = FigureEntry(NAME, statistic)


def register() -> None:
    """What a plug-in does on import: its catalogue entry, then its engine entry."""
    catalogue.ROW_FIGURES.register(CATALOGUE_ENTRY)
    register_figure(ENGINE_ENTRY)
