"""The report page's probe section (issue 47)."""

from __future__ import annotations

from tests.client.test_calibration import benign
from tests.client.test_probe_views import with_probe


def test_the_report_page_has_a_probe_section_with_each_probes_rows() -> None:
    from stitchsim_service.gateway.pages import render_report_page
    from stitchsim_service.gateway.pages.sections import probes_section

    report = with_probe(benign()[0])
    assert probes_section(benign()[0]) == ""
    section = probes_section(report)
    assert 'id="probes-table"' in section and 'id="probe-0-results"' in section
    assert "<td>digits_marker_conflict</td>" in section and ">0.040<" in section
    # One row per stitch on the probe, as in the clean results.
    assert section.count("<tr>") == 1 + 1 + 1 + len(report.results)  # heads, probe line
    assert '<section id="probes">' in render_report_page(report)
