"""Probe sets (issue 47): every stitch evaluated on each probe beside the clean set, and a
probe that cannot run refused before any work, naming it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from stitchsim.failure import Failure
from stitchsim_worker.engine import Resources
from stitchsim_worker.engine.data.datasets import add_marker, builtin
from stitchsim_worker.engine.data.probes import builtin_probe
from stitchsim_worker.engine.job.check import check_spec

from tests.engine.jobs import TINY, run, spec
from tests.engine.probe_models import reader_model
from tests.fixtures_models import Untrained

PROBE_SPEC = {"dataset": "digits_marker", "layers": [{"front": "layer2", "back": "layer2"}],
              "objectives": ["slm"], "protocols": ["standard"],
              "train": {"epochs": 2, "max_train_samples": 400, "max_test_samples": 300}}


def test_the_builtin_probes_mark_the_clean_test_digits_with_another_class() -> None:
    clean, conflict = builtin("digits"), builtin_probe("digits_marker_conflict")
    swapped = builtin_probe("digits_marker_swapped")
    assert torch.equal(conflict.test.labels, clean.test.labels)  # the digits' own labels
    # Outside the marker's corner, the very pixels of the clean digits.
    assert torch.equal(conflict.test.images[:, :, 4:, :], clean.test.images[:, :, 4:, :])
    marked = builtin("digits_marker").test.images
    corner = conflict.test.images[:, :, :4, :4]
    # No image carries its own class's marker; swapped carries the next class's.
    assert not (corner == marked[:, :, :4, :4]).flatten(1).all(1).any()
    expect = add_marker(clean.test.images, (clean.test.labels + 1) % 10)
    assert torch.equal(swapped.test.images, expect)


def test_a_marker_reader_and_a_digit_reader_are_told_apart_on_the_conflict_probe_only(
    tmp_path: Path,
) -> None:
    """The science: on digits_marker (marker and digit agree) the two readers agree; on the
    conflict probe they part, in the endpoint and in the candidate's accuracy."""
    digit = reader_model("digit", tmp_path / "digit.safetensors")
    marker = reader_model("marker", tmp_path / "marker.safetensors")
    report = run(spec(digit, marker, probes=["digits_marker_conflict"], **PROBE_SPEC),
                 tmp_path / "cache")
    (probe,) = report.probes
    assert probe.name == "digits_marker_conflict" and probe.dataset["n_test"] == 300
    clean_end = report.unstitched_agreement[0].agreement
    probe_end = probe.unstitched_agreement[0].agreement
    # Measured: 0.965 on the clean set, 0.003 on the probe.
    assert clean_end > 0.9 and probe_end < 0.1
    # Both right on the clean set; on the probe the digit reader stays right and the marker
    # reader follows the marker (measured 0.98 and 0.00).
    assert report.front.accuracy > 0.9 and report.back.accuracy > 0.9
    assert probe.front_accuracy > 0.9 and probe.back_accuracy < 0.1
    # Every stitch has its probe row, labelled as the clean one.
    assert [(r.direction, r.front_layer, r.protocol) for r in probe.results] == [
        (r.direction, r.front_layer, r.protocol) for r in report.results]


def test_the_references_probe_activations_are_reused_by_the_next_check(
    untrained: Untrained, tmp_path: Path,
) -> None:
    fields = {**PROBE_SPEC, "dataset": "digits", "train": TINY,
              "probes": ["digits_marker_conflict"]}
    first = run(spec(untrained.front, untrained.back, **fields), tmp_path)
    again = run(spec(untrained.front, untrained.back, **fields), tmp_path)
    # The reference's logits and front part on the dataset, the training split and the probe.
    assert first.environment["reference_cache"]["hits"] == 0
    assert again.environment["reference_cache"]["hits"] == first.environment[
        "reference_cache"]["written"]
    assert again.probes[0].results[0].agreement == first.probes[0].results[0].agreement


def _probe_file(path: Path, images: torch.Tensor, labels: torch.Tensor | None) -> Path:
    tensors = {"train_images": images.clone(), "test_images": images}
    if labels is not None:
        tensors |= {"train_labels": labels.clone(), "test_labels": labels}
    save_file(tensors, str(path))
    return path


BAD_PROBES = {
    "unknown": ("digits_marker_nope", "unknown_dataset"),
    "size": ("small", "invalid_dataset"),
    "channels": ("rgba", "invalid_dataset"),
    "empty": ("empty", "invalid_dataset"),
    "unlabelled": ("unlabelled", "labels_needed"),
}


@pytest.mark.parametrize("case", list(BAD_PROBES))
def test_a_probe_that_cannot_run_is_refused_at_the_check_naming_it(
    untrained: Untrained, tmp_path: Path, case: str,
) -> None:
    n, ref_code = 20, BAD_PROBES[case]
    files = {
        "small": (torch.zeros(n, 3, 16, 16, dtype=torch.uint8), torch.zeros(n, dtype=torch.int64)),
        "rgba": (torch.zeros(n, 4, 32, 32, dtype=torch.uint8), torch.zeros(n, dtype=torch.int64)),
        "empty": (torch.zeros(0, 3, 32, 32, dtype=torch.uint8), torch.zeros(0, dtype=torch.int64)),
        "unlabelled": (torch.zeros(n, 3, 32, 32, dtype=torch.uint8), None),
    }
    ref, code = ref_code
    probe: object = ref
    if ref in files:
        probe = {"path": str(_probe_file(tmp_path / f"{ref}.safetensors", *files[ref]))}
    s = spec(untrained.front, untrained.back, **{**PROBE_SPEC, "dataset": "digits",
                                                 "probes": [probe]})
    with pytest.raises(Failure) as err:
        check_spec(s, resources=Resources(cache_dir=tmp_path))
    name = ref if ref not in files else f"{ref}.safetensors"
    assert err.value.code == code and f"probe {name}" in err.value.message
    assert err.value.details["probe"] == name


def test_a_job_whose_probe_fails_to_load_fails_whole_naming_it(
    untrained: Untrained, tmp_path: Path,
) -> None:
    """At run time (the file gone since the check): the job fails as it prepares, before any
    work, with the probe's name; no report exists to be half-stored."""
    gone = tmp_path / "gone.safetensors"
    s = spec(untrained.front, untrained.back,
             **{**PROBE_SPEC, "dataset": "digits", "probes": [{"path": str(gone)}]})
    with pytest.raises(Failure) as err:
        run(s, tmp_path / "cache")
    assert "probe gone.safetensors" in err.value.message
    # Nothing of the job was kept: no activations, no IRIs, no reference cache entry.
    kept = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert kept == []
