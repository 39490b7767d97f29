#!/usr/bin/env python3
"""Make docs/report.png, the README's picture of a real report, with headless Chromium.

By default it trains the demo models (`stitchsim-server demo-models`), runs one of the demo's
two checks in-process through the engine with examples/demo-spec.json, renders the report
page and takes a screenshot of its top (verdict, models, summary and the first agreement
plot). Or give it a report a job already produced (scripts/demo.sh leaves two):

    python scripts/screenshot_report.py                       # train, run the seeds check
    python scripts/screenshot_report.py --finding shortcut --out docs/report-shortcut.png
    python scripts/screenshot_report.py --report report.json  # screenshot an existing report
    python scripts/screenshot_report.py --full --html out.html --json out.json

Needs the server side installed (torch, timm) for a fresh run, and Debian's `chromium`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for tests.report.chromium, the shared browser driver

from stitchsim.models import Report, Spec  # noqa: E402
from stitchsim_service.gateway.pages import render_report_page  # noqa: E402

from tests.report.chromium import Chromium, find_chromium  # noqa: E402

# The demo's two checks (scripts/demo.sh): the same models, spec and data.
FINDINGS = {
    "seeds": {"front": "reference", "back": "retrained", "dataset": None},
    "shortcut": {"front": "shortcut", "back": "reference", "dataset": "digits_marker"},
}
DEMO_SPEC = ROOT / "examples" / "demo-spec.json"


def demo_spec(front: Path, back: Path, dataset: str | None) -> Spec:
    fields = json.loads(DEMO_SPEC.read_text())
    if dataset is not None:
        fields["dataset"] = dataset
    return Spec.model_validate({
        **fields,
        "front": {"checkpoint": {"path": str(front)}},
        "back": {"checkpoint": {"path": str(back)}},
        "threshold": 0.8,
        "device": "cpu",
    })


def run_demo_job(workdir: Path, finding: str) -> Report:
    """Train the demo models (unless `workdir` has them) and run one check in this process."""
    from stitchsim_worker.engine import Resources, run_job
    from stitchsim_worker.run_command import train_demo_models

    for line in train_demo_models(workdir):
        print(line, flush=True)
    pair = FINDINGS[finding]
    spec = demo_spec(workdir / f"{pair['front']}.safetensors",
                     workdir / f"{pair['back']}.safetensors", pair["dataset"])
    last = [0.0]

    def progress(stage: str, done: int, total: int, _eta: float | None) -> None:
        if time.monotonic() - last[0] > 5 or done == total:  # a line every few seconds
            last[0] = time.monotonic()
            print(f"{stage}: {done}/{total}", flush=True)

    start = time.perf_counter()
    report = run_job(spec, resources=Resources(cache_dir=workdir / "cache"), progress=progress,
                     job_id=f"demo-{finding}")
    print(f"job finished in {time.perf_counter() - start:.0f} s: verdict {report.verdict}")
    return report


def first_plot_bottom(page: Any) -> int:
    """Pixel row where the first agreement plot ends: a README-sized crop."""
    return int(page.evaluate(
        "(() => { const f = document.querySelector('figure.plot');"
        " return f ? f.getBoundingClientRect().bottom + window.scrollY + 16"
        " : document.body.scrollHeight; })()"
    ))


def screenshot(html: str, out: Path, width: int, full: bool) -> None:
    binary = find_chromium()
    if binary is None:
        raise SystemExit("no chromium found: apt-get install -y chromium")
    with tempfile.TemporaryDirectory() as tmp, Chromium(binary) as browser:
        page_file = Path(tmp) / "report.html"
        page_file.write_text(html, encoding="utf-8")
        page = browser.new_page(width=width, height=900)
        page.navigate(page_file.as_uri())
        errors = page.console_errors()
        if errors:
            raise SystemExit(f"the page logged errors: {errors}")
        height = None if full else first_plot_bottom(page)
        page.call("Emulation.setDeviceMetricsOverride", {
            "width": width, "height": height or 900, "deviceScaleFactor": 1, "mobile": False,
        })
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(out, full_page=full)
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, help="JSON report to show instead of a new run")
    parser.add_argument("--finding", choices=sorted(FINDINGS), default="seeds",
                        help="which of the demo's two checks to run (default: seeds)")
    parser.add_argument("--workdir", type=Path,
                        help="keep the trained models and IRI cache here for the next run")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "report.png")
    parser.add_argument("--html", type=Path, help="also save the page here")
    parser.add_argument("--json", type=Path, help="also save the report JSON here")
    parser.add_argument("--width", type=int, default=1200)
    parser.add_argument("--full", action="store_true", help="the whole page, not just the top")
    args = parser.parse_args(argv)

    if args.report:
        report = Report.model_validate_json(args.report.read_text())
    elif args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
        report = run_demo_job(args.workdir, args.finding)
    else:
        with tempfile.TemporaryDirectory(prefix="stitchsim-demo-") as tmp:
            report = run_demo_job(Path(tmp), args.finding)
    if args.json:
        args.json.write_text(report.model_dump_json(indent=2))
    html = render_report_page(report)
    if args.html:
        args.html.write_text(html, encoding="utf-8")
    screenshot(html, args.out, args.width, args.full)
    return 0


if __name__ == "__main__":
    sys.exit(main())
