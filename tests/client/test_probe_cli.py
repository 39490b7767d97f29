"""`--probe` on the command line (issue 47): repeatable, into the spec's probes; a spec that
names a probe twice exits 2 before any upload."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.client.fake_service import FakeService
from tests.client.test_cli import check, files  # noqa: F401  (the fixture)
from tests.client.test_e2e import stitchsim
from tests.fixtures_models import Untrained
from tests.fixtures_service import ServiceHandle


def test_each_probe_flag_is_one_probe_of_the_spec(
    fake: FakeService, files: tuple[str, str],  # noqa: F811
) -> None:
    stored = "sha256:" + "ab" * 32
    assert check(fake, files, "--threshold", "0.1", "--probe", "digits_marker_conflict",
                 "--probe", stored, "-q") == 0
    [job] = fake.jobs.values()
    assert job.spec["probes"] == ["digits_marker_conflict", stored]


def test_a_probe_named_twice_exits_2_before_any_upload(
    fake: FakeService, files: tuple[str, str], capsys: pytest.CaptureFixture[str],  # noqa: F811
) -> None:
    code = check(fake, files, "--threshold", "0.1", "--probe", "digits_marker_swapped",
                 "--probe", "digits_marker_swapped")
    assert code == 2 and fake.requests == []
    assert "probe 'digits_marker_swapped' is named more than once" in capsys.readouterr().err


def test_a_local_probe_file_is_packed_uploaded_and_named_by_its_id(
    gateway_service: ServiceHandle, untrained: Untrained, tmp_path: Path,
) -> None:
    """The recipe of docs/client.md: an npz of marked test images with their true labels."""
    key = gateway_service.create_key("probe-upload")
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (20, 32, 32, 3), dtype=np.uint8)
    labels = np.arange(20) % 10
    probe = tmp_path / "probe.npz"
    np.savez(probe, train_images=images, train_labels=labels, test_images=images,
             test_labels=labels)
    run = stitchsim("compare", str(untrained.front), str(untrained.back), "--probe",
                    "digits_marker_conflict", "--probe", str(probe), "--url",
                    gateway_service.url, "--api-key", key, "--progress", "none", timeout=120)
    assert run.code == 0, run.err
    job = httpx.get(f"{gateway_service.url}/jobs/{run.out.strip()}",
                    headers={"Authorization": f"Bearer {key}"}, timeout=30).json()
    builtin, uploaded = job["spec"]["probes"]
    assert builtin == "digits_marker_conflict" and uploaded.startswith("sha256:")
    r = httpx.get(f"{gateway_service.url}/datasets", headers={"Authorization": f"Bearer {key}"},
                  timeout=30)
    assert uploaded in r.text
