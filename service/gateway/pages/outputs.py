"""What the stitched models' outputs are when they are not class scores: how the figures read
for an embedding or an image (the catalogue's words), and, for an image model, grids of the
inputs, the back model's outputs and the stitched model's (the autoencoder experiment of
"Functional Alignment Can Mislead": shapes drawn as digits)."""

from __future__ import annotations

from stitchsim import catalogue, view
from stitchsim.models import Report, ResultRow
from stitchsim.view import DIRECTION_LABEL, fmt
from stitchsim_service.gateway.pages.html import esc, stitch_cell

_TILE_SCALE = 2  # 32 px samples are drawn twice their size, pixels kept sharp


def _grid(row: ResultRow, k: int) -> str:
    grid = row.grid
    assert grid is not None
    psnr = row.value("psnr")
    caption = (f"{esc(DIRECTION_LABEL[row.direction])}, {stitch_cell(row)}, "
               f"{esc(catalogue.PROTOCOLS.label(row.protocol))}, {esc(row.objective)}: "
               f"agreement {fmt(row.agreement)}"
               + (f", PSNR {fmt(psnr, 1)} dB" if psnr is not None else ""))
    rows = "".join(f"<li>{esc(label)}</li>" for label in grid.labels)
    return (
        f'<figure class="grid" id="grid-{k}">'
        f'<img alt="{esc(" / ".join(grid.labels))}" src="data:image/png;base64,{grid.png}" '
        f'width="{grid.width * _TILE_SCALE}" height="{grid.height * _TILE_SCALE}" '
        'style="image-rendering: pixelated">'
        f"<figcaption>{caption}. Rows, top to bottom:<ol>{rows}</ol></figcaption></figure>"
    )


def outputs_section(report: Report) -> str:
    """Empty for a report whose back models all output class scores."""
    readings = view.output_readings(report)
    if not readings:
        return ""
    grids = [r for r in report.results if r.grid is not None]
    body = "<ul>" + "".join(f"<li>{esc(t)}</li>" for t in readings) + "</ul>"
    if grids:
        body += ("<p>Samples of the test split: the inputs, what the back model makes of "
                 "them, and what the stitched model makes of them. An agreement near the "
                 "identity ceiling says the stitched model draws what the back model draws; "
                 "in cross-task pairing it draws the back model's task from the front "
                 "model's inputs.</p>")
        body += "".join(_grid(r, k) for k, r in enumerate(grids))
    return f'<section id="outputs"><h2>What the outputs are</h2>{body}</section>'
