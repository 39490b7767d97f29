"""The terminal table: aligned, one line per stitch point and protocol, verdict last."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from stitchsim.table import format_table

from tests.report.sample import make_sample_report

TABLE_SOURCE = Path(__file__).resolve().parents[2] / "client" / "stitchsim" / "table.py"


def _results_block(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("direction"))
    end = lines.index("", start)
    return lines[start:end]


def test_one_aligned_line_per_stitch_point_objective_and_protocol() -> None:
    report = make_sample_report()
    block = _results_block(format_table(report))
    header, rule, *rows = block
    assert len(rows) == len(report.results) == 24
    # Every line of the block has the same width: columns line up (numbers right-aligned).
    assert len({len(line) for line in block}) == 1
    assert set(rule) <= {"-", " "}
    assert header.split() == ["direction", "stitch:", "from", "->", "into", "objective",
                              "protocol", "agreement", "[CI]", "hard", "agr", "both", "r/w",
                              "accuracy", "kappa", "soft", "kappa", "penalty"]
    # The two protocols of one stitch point and objective sit next to each other.
    assert "standard" in rows[0] and "invariance_aware" in rows[1]
    assert rows[0].split()[1:4] == ["layer1", "->", "layer1"]
    assert "0.978 [0.966, 0.990]" in rows[0]
    # Cohen's kappa and soft kappa (the catalogue's order of figures), then the penalty
    assert rows[0].split()[-3:] == ["0.710", "0.640", "+0.013"]


def test_depth_order_follows_the_report_not_the_alphabet() -> None:
    layers = ("stem", "blocks.10", "blocks.2")
    report = make_sample_report(front_layers=layers, back_layers=layers)
    rows = _results_block(format_table(report))[2:]
    firsts = [row.split()[1] for row in rows if row.startswith("front->back")]
    assert firsts == [name for name in layers for _ in range(4)]


def test_layers_read_in_stitch_order_in_both_directions() -> None:
    # Rows name layers by model; back->front reads from the back model's layer.
    report = make_sample_report(front_layers=("f1", "f2", "f3"), back_layers=("b1", "b2", "b3"))
    rows = _results_block(format_table(report))[2:]
    assert [r.split()[1:4] for r in rows if r.startswith("front->back")][0] == ["f1", "->", "b1"]
    assert [r.split()[1:4] for r in rows if r.startswith("back->front")][0] == ["b1", "->", "f1"]


def test_controls_then_summary_then_verdict_last() -> None:
    report = make_sample_report(warnings=["IRIs at layer3 did not converge"])
    text = format_table(report)
    lines = text.splitlines()
    assert lines.index("controls") < lines.index("mean agreement over stitch points")
    assert lines.index("mean agreement over stitch points") < lines.index("warnings")
    assert lines[-1] == (
        "VERDICT: DISSIMILAR  similarity 0.745 (invariance_aware, weaker direction) "
        "< threshold 0.750"
    )
    assert report.verdict == "dissimilar"
    control_rows = [line for line in lines if line.startswith(("identity", "clustered_noise"))]
    assert len(control_rows) == len(report.controls)
    assert any(line.startswith("front->back  slm") and line.endswith("0.195") for line in lines)


def test_similar_and_no_threshold_verdicts() -> None:
    similar = make_sample_report(threshold=0.7)
    assert similar.verdict == "similar"
    assert format_table(similar).splitlines()[-1].startswith("VERDICT: SIMILAR  similarity")
    assert ">= threshold 0.700" in format_table(similar).splitlines()[-1]
    none = make_sample_report(threshold=None)
    assert format_table(none).splitlines()[-1] == (
        "VERDICT: none (no threshold set); similarity 0.745 (invariance_aware, weaker direction)"
    )


def test_hostile_names_cannot_drive_the_terminal() -> None:
    evil = ("stem\x1b[2J\x1b[31m", "layer2\nVERDICT: SIMILAR", "layer3\u202e")
    report = make_sample_report(front_layers=evil)
    text = format_table(report)
    text.encode("ascii")  # plain ASCII: no control sequence, no bidi override, any console
    assert "\x1b" not in text
    assert "\\x1b[2J" in text
    assert sum(line.startswith("VERDICT") for line in text.splitlines()) == 1


def test_long_layer_names_are_shortened_in_the_middle() -> None:
    long = "stages.3.blocks.11.attention.very_long_projection_module.fc2"
    report = make_sample_report(front_layers=(long, "b", "c"))
    row = _results_block(format_table(report))[2]
    name = row.split()[1]
    assert len(name) == 40 and name.startswith("stages.3.") and name.endswith(".fc2")


def test_table_module_uses_only_the_standard_library_and_the_contract() -> None:
    tree = ast.parse(TABLE_SOURCE.read_text())
    modules = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        node.module.split(".")[0] for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    }
    allowed = set(sys.stdlib_module_names) | {"stitchsim"}
    assert modules <= allowed, modules - allowed


def test_each_model_says_how_its_input_was_prepared() -> None:
    lines = format_table(make_sample_report()).splitlines()
    front = lines.index(next(line for line in lines if line.startswith("front: resnet18")))
    assert lines[front + 1] == (
        "  input: timm at 32px, mean (0.485, 0.456, 0.406), std (0.229, 0.224, 0.225), measured "
        "on samples (accuracy, else normalisation statistics) (accuracy on 256 samples: timm "
        "0.961, none 0.734, inception 0.902); the best-predicting candidate on labelled test "
        "samples"
    )
    back = lines.index(next(line for line in lines if line.startswith("back: resnet26")))
    assert lines[back + 1].startswith("  input: inception at 32px, mean (0.5, 0.5, 0.5)")


def test_no_verdict_at_chance_says_why_and_caveats_are_listed() -> None:
    caveat = "the invariance-aware figure rests on unconverged IRIs"
    lines = format_table(make_sample_report(near_chance=True, caveats=[caveat])).splitlines()
    assert next(line for line in lines if line.startswith("back: ")).endswith("AT CHANCE")
    assert lines[lines.index("warnings") + 1].startswith("  - THE BACK MODEL IS AT CHANCE")
    why = lines.index("no verdict, because")
    assert lines[why + 1].startswith("  - the back model (resnet26) scores at chance on this")
    assert lines[lines.index("verdict caveats") + 1] == f"  - {caveat}"
    assert lines[-1].startswith("VERDICT: none (see why above); similarity")


def test_the_drop_is_the_reports() -> None:
    report = make_sample_report()
    report.summary.drops = [d.model_copy(update={"drop": 0.5}) for d in report.summary.drops]
    lines = format_table(report).splitlines()
    start = lines.index("mean agreement over stitch points") + 3
    assert all(line.endswith("0.500") for line in lines[start:start + 4])
