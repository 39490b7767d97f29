"""The report page in headless Chromium: no console errors, the plots and their series, the
verdict as in the JSON report; first on a hand-made report, then on a real finished job."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from stitchsim.models import JobStatus, Progress
from stitchsim_service.gateway.pages import render_progress_page, render_report_page

from tests.report.chromium import Chromium, Page
from tests.report.pagecheck import check_loaded_page, save_screenshot
from tests.report.sample import make_sample_report


@pytest.fixture
def page(chromium: Chromium) -> Iterator[Page]:
    tab = chromium.new_page(width=1200, height=900)
    yield tab
    tab.close()


def _open(page: Page, html: str, folder: Path) -> str:
    path = folder / "page.html"
    path.write_text(html, encoding="utf-8")
    url = path.as_uri()
    page.navigate(url)
    return url


def test_the_console_check_catches_errors(page: Page) -> None:
    # Guards the guard: a page that does log errors must be caught.
    page.navigate("data:text/html,<script>console.error('boom')</script>"
                  "<svg><path d='M 0 0 L x'/></svg>")
    errors = page.console_errors()
    assert any("boom" in e for e in errors), errors


@pytest.mark.parametrize("threshold", [0.75, 0.7, None], ids=["dissimilar", "similar", "none"])
def test_sample_report_in_chromium(page: Page, tmp_path: Path, threshold: float | None) -> None:
    report = make_sample_report(threshold=threshold,
                                front_layers=("layer1", '<img src=x onerror="alert(1)">',
                                              "layer3"),
                                warnings=["IRIs at layer3 did not converge"])
    url = _open(page, render_report_page(report), tmp_path)
    check_loaded_page(page, report.model_dump(mode="json"), url)
    # The hostile layer name is shown as text, in the tables and on the plot axes.
    assert page.evaluate("document.body.innerText.includes('<img src=x onerror=\"alert(1)\">')")
    save_screenshot(page, f"sample-{threshold}.png")


def test_progress_page_in_chromium(page: Page, tmp_path: Path) -> None:
    job = JobStatus(id="job_1", state="running", created_at=datetime.now(timezone.utc),
                    progress=Progress(stage="train", done=3, total=12, eta_s=95))
    _open(page, render_progress_page(job), tmp_path)
    assert page.console_errors() == []
    assert page.evaluate("document.getElementById('progress').value") == 3
    refresh = page.evaluate(
        "document.querySelector('meta[http-equiv=refresh]').getAttribute('content')")
    assert int(refresh) > 0


def test_real_job_report_in_chromium(page: Page, live_service: Any,
                                     real_job: tuple[str, dict[str, Any]]) -> None:
    """A tiny real job through the service, its page fetched from the service itself."""
    service = live_service
    job_id, report = real_job
    if service.api_key:
        # The browser sends the key as a user's proxy would; the page needs nothing else.
        page.call("Network.setExtraHTTPHeaders",
                  {"headers": {"Authorization": f"Bearer {service.api_key}"}})
    url = f"{service.url.rstrip('/')}/jobs/{job_id}/report.html"
    page.navigate(url)
    assert page.evaluate("document.contentType") == "text/html"
    check_loaded_page(page, report, url)
    save_screenshot(page, "real-job.png", report)
    body = page.evaluate("document.body.innerText")
    assert report["front"]["arch"] in body and report["back"]["arch"] in body
    assert report["verdict"] in ("similar", "dissimilar")  # the spec set a threshold
