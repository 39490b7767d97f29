"""Probe sets through the service (issue 47): a probe that cannot run is answered 422 naming
it, before any job exists; one that can comes back in the report."""

from __future__ import annotations

from typing import Any

import pytest

from tests.service.conftest import job_report, submit, tiny_spec, upload
from tests.service.helpers import dataset_bytes


@pytest.fixture(scope="module")
def models(redis_service: Any, untrained: Any) -> tuple[dict[str, str], dict[str, str]]:
    with redis_service.client() as c:
        return ({"checkpoint": upload(c, untrained.front)},
                {"checkpoint": upload(c, untrained.back)})


def _refused(svc: Any, spec: dict[str, Any]) -> dict[str, Any]:
    jobs = svc.count_rows("jobs")
    with svc.client() as c:
        r = c.post("/similarity", json=spec)
    assert r.status_code == 422, r.text
    assert "Traceback" not in r.text and svc.count_rows("jobs") == jobs
    return dict(r.json()["error"])


def test_an_unknown_probe_is_refused_naming_its_field(redis_service: Any, models: Any) -> None:
    err = _refused(redis_service, tiny_spec(*models, probes=["digits_marker_nope"]))
    assert err["code"] == "unknown_dataset"
    assert "probes[0]: unknown dataset 'digits_marker_nope'" in err["message"]
    assert "digits_marker_conflict" in err["message"]  # the built-in probes are listed


def test_a_probe_of_another_image_size_is_refused_at_the_check(redis_service: Any,
                                                              models: Any) -> None:
    with redis_service.client() as c:
        r = c.post("/datasets", files={"file": ("small.safetensors", dataset_bytes(hw=8))})
        assert r.status_code in (200, 201), r.text
        small = r.json()["id"]
    err = _refused(redis_service, tiny_spec(*models, probes=[small]))
    assert err["details"]["probe"] == small[:19]
    assert err["code"] == "invalid_dataset"
    assert f"probe {small[:19]} has images of shape [3, 8, 8]" in err["message"]
    assert "[3, 32, 32]" in err["message"]


def test_a_job_with_a_probe_reports_its_rows(redis_service: Any, models: Any) -> None:
    job = submit(redis_service, tiny_spec(*models, probes=["digits_marker_conflict"]))
    assert redis_service.wait_job(job)[-1]["state"] == "succeeded"
    report = job_report(redis_service, job)
    (probe,) = report["probes"]
    assert probe["name"] == "digits_marker_conflict" and probe["dataset"]["n_test"] == 100
    assert len(probe["results"]) == len(report["results"]) == 1
    assert len(probe["unstitched_agreement"]) == 1
