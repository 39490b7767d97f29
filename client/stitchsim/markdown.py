"""A check's outcome in Markdown: for $GITHUB_STEP_SUMMARY, a pull-request comment or a
GitLab note. GitHub-flavoured tables; the one HTML element is the collapsible block of
per-point figures (<details>, which GitHub and GitLab render)."""

from __future__ import annotations

from stitchsim import catalogue, view
from stitchsim.gates import Outcome, point_agreements, point_name
from stitchsim.models import Report

_WORDS = {"pass": "✅ PASS", "warn": "⚠️ WARN", "fail": "❌ FAIL"}
MARKER = "<!-- stitchsim-check -->"
"""Opens every summary, so a bot can find and update its own pull-request comment."""


def outcome_markdown(report: Report, outcome: Outcome, *, title: str = "stitchsim check",
                     report_url: str | None = None) -> str:
    s = report.summary
    lines = [MARKER, f"### {title}: {_WORDS[outcome.status]}", ""]
    protocol = catalogue.PROTOCOLS.label(s.similarity_protocol)
    headline = f"Similarity **{s.similarity:.4f}** ({protocol} protocol, weaker direction)"
    if outcome.baseline_similarity is not None:
        headline += (f"; baseline {outcome.baseline_similarity:.4f} ({outcome.baseline_source})"
                     f", change {-(outcome.drop or 0.0):+.4f}")
    elif outcome.baseline_source:
        headline += f"; calibrated {outcome.baseline_source}"
    lines += [headline + ".", ""]
    lines += ["| gate | status | detail |", "| --- | --- | --- |"]
    lines += [f"| {_cell(g.name)} | {_WORDS[g.status]} | {_cell(g.message)} |"
              for g in outcome.gates] or ["| (none) | | no gate was asked for |"]
    lines += ["", *_points(report), *_probes(report), *_bands(outcome), ""]
    dataset = report.dataset.get("id", report.spec.dataset)
    lines += [f"Models: reference `{_short(report.front.checkpoint)}` ({report.front.arch}, "
              f"accuracy {report.front.accuracy:.3f}), candidate "
              f"`{_short(report.back.checkpoint)}` ({report.back.arch}, accuracy "
              f"{report.back.accuracy:.3f}); dataset {dataset}."]
    if outcome.caveats:
        lines += ["", "**Caveats**", ""]
        lines += [f"- `{c.code}`{' at ' + c.where if c.where else ''}: {_cell(c.message)}"
                  for c in outcome.caveats]
    if report.method is not None:
        lines += ["", f"Method {report.method.engine}."]
    if report_url:
        lines += ["", f"[Full report]({report_url})"]
    return "\n".join(lines) + "\n"


def error_markdown(message: str, *, title: str = "stitchsim check") -> str:
    return f"{MARKER}\n### {title}: ❌ ERROR\n\n{_cell(message)}\n"


def _points(report: Report) -> list[str]:
    points = point_agreements(report)
    if not points:
        return []
    lines = ["<details><summary>Agreement per stitch point</summary>", "",
             "| stitch point | agreement |", "| --- | --- |"]
    lines += [f"| {_cell(point_name(k))} | {v:.4f} |" for k, v in points.items()]
    return [*lines, "", "</details>"]


def _probes(report: Report) -> list[str]:
    """Each probe set in a row: where a latent shortcut would show."""
    lines = view.probe_lines(report)
    if not lines:
        return []
    out = ["<details open><summary>Probe sets</summary>", "",
           "| probe | images | reference accuracy | candidate accuracy | endpoint agreement "
           "| stitched agreement |", "| --- | --- | --- | --- | --- | --- |"]
    out += [f"| {_cell(p.name)} | {p.samples} | {view.fmt(p.reference_accuracy)} | "
            f"{view.fmt(p.candidate_accuracy)} | {view.fmt(p.endpoint)} | "
            + _cell(", ".join(f"{k} {v:.3f}" for k, v in p.by_protocol.items())) + " |"
            for p in lines]
    return [*out, "", "</details>"]


def _bands(outcome: Outcome) -> list[str]:
    """Each calibrated figure under its benign band: where the check's value sits against
    the retrains the gate was calibrated on."""
    banded = [g for g in outcome.gates if g.band is not None and g.figure is not None]
    if not banded:
        return []
    lines = ["", "<details><summary>Calibrated figures against the benign band</summary>", "",
             "| figure | this check | benign min – max | benign mean ± sd (n) | limit | |",
             "| --- | --- | --- | --- | --- | --- |"]
    for g in banded:
        b = g.band
        assert b is not None and g.figure is not None and g.limit is not None
        lines.append(f"| {_cell(g.name.removeprefix('calibrated '))} | {g.figure:.4f} | "
                     f"{b.low:.4f} – {b.high:.4f} | {b.mean:.4f} ± {b.sd:.4f} ({b.n}) | "
                     f"{g.limit:.4f} | {_WORDS[g.status]} |")
    return [*lines, "", "</details>"]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _short(checkpoint: str) -> str:
    return checkpoint[:19] + "…" if len(checkpoint) > 20 else checkpoint
