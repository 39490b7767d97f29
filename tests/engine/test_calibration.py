"""Budgets that follow the worker's device: the calibration probe (measured once, then read
from the cache keyed by device and torch version), stand-in figures, the rate between probe
sizes, and the spec check of a default resnet50 job at 224 px: accepted under the default
unit limit on a GPU-class calibration, refused on a CPU-class one with the figures that
priced it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from stitchsim.failure import Failure
from stitchsim.models import Spec

GPU_CLASS = "32:0.002,224:0.0002"
"""A GPU's figures as a stand-in: 20x the reference's speed on 32 px batches, 200x at 224 px
(not measured: this machine has no GPU; `stitchsim-server calibrate` on one prints its own)."""
CPU_CLASS = "0.04"
"""The reference device's figure (2 CPU cores), at every size."""
DEFAULT_LIMIT = 1_000_000  # STITCHSIM_MAX_JOB_UNITS's default


def test_the_probe_is_measured_once_then_read_from_the_cache(tmp_path: Path) -> None:
    from stitchsim_worker.calibration import CACHE_FILE, calibrate

    t0 = time.perf_counter()
    first = calibrate(tmp_path, sizes=(32,))
    probe_s = time.perf_counter() - t0
    assert first.source == "probe" and first.rates[32] > 0, first
    assert first.device.startswith("cpu: ") and first.torch
    t0 = time.perf_counter()
    again = calibrate(tmp_path, sizes=(32,))
    assert again.source == "cache" and again.rates == first.rates, again
    assert time.perf_counter() - t0 < probe_s / 2
    entries = json.loads((tmp_path / CACHE_FILE).read_text())
    (key,) = entries
    assert first.device in key and f"torch {first.torch}" in key, key
    # Another torch (or device) is another entry: its figures are not taken for these.
    entries[key.replace(first.torch, "0.0.0")] = entries.pop(key)
    (tmp_path / CACHE_FILE).write_text(json.dumps(entries))
    assert calibrate(tmp_path, sizes=(32,)).source == "probe"
    assert len(json.loads((tmp_path / CACHE_FILE).read_text())) == 2


def test_stand_in_figures_and_the_rate_between_probe_sizes() -> None:
    from stitchsim_worker.calibration import parse_stand_in, slowest

    gpu = parse_stand_in(GPU_CLASS)
    assert gpu.seconds_per_unit(32) == 0.002 and gpu.seconds_per_unit(224) == 0.0002
    assert gpu.seconds_per_unit(16) == 0.002 and gpu.seconds_per_unit(512) == 0.0002
    # log-log between: the geometric mean at the geometric mean of the sizes
    mid = (32 * 224) ** 0.5
    assert gpu.seconds_per_unit(round(mid)) == pytest.approx((0.002 * 0.0002) ** 0.5, rel=0.01)
    assert gpu.job_limit(DEFAULT_LIMIT, 224) == 200_000_000
    cpu = parse_stand_in(CPU_CLASS)
    assert cpu.job_limit(DEFAULT_LIMIT, 32) == cpu.job_limit(DEFAULT_LIMIT, 224) == DEFAULT_LIMIT
    both = slowest([gpu, cpu])
    assert both is not None and both.rates == {32: 0.04, 224: 0.04}
    for bad in ("fast", "0", "224:-1", "32:"):
        with pytest.raises(ValueError, match="STITCHSIM_CALIBRATION"):
            parse_stand_in(bad)


@pytest.fixture(scope="module")
def resnet50(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A resnet50 (10 classes) from its random init: the spec check reads its header only."""
    import timm
    from safetensors.torch import save_file

    kwargs = {"num_classes": 10}
    net = timm.create_model("resnet50", pretrained=False, **kwargs)
    path = tmp_path_factory.mktemp("resnet50") / "resnet50.safetensors"
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(path),
              metadata={"arch": "resnet50", "arch_kwargs": json.dumps(kwargs)})
    return path


def resnet50_spec(path: Path) -> Spec:
    """A default job (every setting at its default, the built-in digits) of two resnet50s
    fed 224 px inputs."""
    ref = {"checkpoint": {"path": str(path)}, "input_size": 224}
    return Spec.model_validate({"front": ref, "back": ref})


def test_a_resnet50_at_224_px_fits_a_gpu_class_budget_not_a_cpu_one(resnet50: Path,
                                                                   tmp_path: Path) -> None:
    from stitchsim_worker.calibration import parse_stand_in
    from stitchsim_worker.engine import Resources, check_spec

    spec = resnet50_spec(resnet50)

    def check(figures: str | None):  # type: ignore[no-untyped-def]
        cal = parse_stand_in(figures) if figures else None
        return check_spec(spec, resources=Resources(cache_dir=tmp_path, calibration=cal,
                                                    max_job_units=DEFAULT_LIMIT))

    gpu = check(GPU_CLASS)
    # 3.2 M units under the paper's IRIs (200 steps a set; 10.7 M under fast's 700-step cap):
    # three times the default limit
    assert 3_000_000 < gpu.units < 20_000_000, gpu
    assert gpu.size_factor > 100 and gpu.seconds_per_unit == 0.0002
    # at the GPU's rate the job takes well under the default job time limit (4 h)
    assert gpu.expected_units * gpu.seconds_per_unit < 4 * 3600
    refusals = {}
    for figures in (CPU_CLASS, None):  # a CPU-class calibration, or none (the flat figures)
        with pytest.raises(Failure) as info:
            check(figures)
        err = refusals[figures] = info.value
        assert err.code == "job_too_large", err.message
        assert err.details["units"] == gpu.units > err.details["limit"] == DEFAULT_LIMIT
        assert "the models (x1" in err.message and "input_size" in err.message
    d = refusals[CPU_CLASS].details
    assert d["seconds_per_unit"] == 0.04 and d["input_size"] == 224, d
    assert d["device"] == "stand-in" and d["reference_limit"] == DEFAULT_LIMIT, d
    assert "0.04 s a unit at 224 px" in refusals[CPU_CLASS].message
    assert "seconds_per_unit" not in refusals[None].details
    print(f"resnet50 at 224 px, default job: {gpu.units:,} units ({gpu.expected_units:,} "
          f"expected), x{gpu.size_factor:.0f} the reference; {gpu.expected_units * 0.0002:,.0f} s "
          f"at the GPU stand-in, {gpu.expected_units * 0.04:,.0f} s at the CPU's 0.04")


def test_stitchsim_server_calibrate_prints_the_figures(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from stitchsim_service.core.settings import get_settings
    from stitchsim_worker.cli import main

    def run(figures: str, *argv: str) -> str:
        monkeypatch.setenv("STITCHSIM_DATA_DIR", str(tmp_path))
        monkeypatch.setenv("STITCHSIM_CALIBRATION", figures)
        get_settings.cache_clear()
        try:
            assert main(["calibrate", *argv]) == 0
        finally:
            get_settings.cache_clear()
        return capsys.readouterr().out

    lines = run(GPU_CLASS).splitlines()
    assert lines[0].startswith("stand-in (torch ") and "224 px: 0.0002 s/unit" in lines[0]
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert rows["32"][2:4] == ["0.002", "20,000,000"], rows
    assert rows["224"][2:4] == ["0.0002", "200,000,000"], rows
    assert rows["224"][4:] == ["11.1", "h"]  # the same worker time at every size
    doc = json.loads(run(GPU_CLASS, "--json").splitlines()[-1])
    assert doc["seconds_per_unit"] == {"32": 0.002, "224": 0.0002}
    assert run("off").startswith("calibration off: 0.04 s a unit")
    assert run("off", "--json").strip() == "null"
