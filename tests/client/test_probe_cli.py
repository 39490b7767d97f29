"""`--probe` on the command line (issue 47): repeatable, into the spec's probes; a spec that
names a probe twice exits 2 before any upload."""

from __future__ import annotations

import pytest

from tests.client.fake_service import FakeService
from tests.client.test_cli import check, files  # noqa: F401  (the fixture)


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
