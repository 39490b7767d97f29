"""A baseline report file the service did not write as it is (issue 38, item 7): a
similarity of 5.0, or a spec or figure edited by hand, is refused before anything is uploaded
(exit 2, naming the file and why). The engine seals every report with a digest of its content
(`sealed`, the function the engine's run_job ends with); the CLI runs as a subprocess, as in CI.
A report without a digest (an older service's) is still read, with a warning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from stitchsim.models.report import report_digest, sealed
from stitchsim.sdk import file_sha256

from tests.client.test_e2e import stitchsim
from tests.report.sample import make_sample_report

DEAD_URL = "http://127.0.0.1:9"  # nothing listens: a refusal must come before any request


def _baseline(tmp_path: Path, edit: object = None) -> tuple[Path, Path]:
    ref = tmp_path / "ref.safetensors"
    ref.write_bytes(b"the reference: hashed, never uploaded (nothing listens)")
    sample = make_sample_report(threshold=0.75)
    front = sample.front.model_copy(update={"checkpoint": file_sha256(ref)})
    report = sealed(sample.model_copy(update={"front": front}))
    data = json.loads(report.model_dump_json())
    assert data["digest"] == report_digest(data)
    if callable(edit):
        edit(data)
    path = tmp_path / "base.json"
    path.write_text(json.dumps(data, indent=2))
    return path, ref


def _check(path: Path, ref: Path) -> object:
    return stitchsim("check", str(ref), str(ref), "--url", DEAD_URL, "--baseline", str(path),
                     "--max-drop", "0.05", "--progress", "none", "--retries", "0", timeout=60)


def _similarity(d: dict) -> None:  # type: ignore[type-arg]
    d["summary"]["similarity"] = 5.0


def _spec(d: dict) -> None:  # type: ignore[type-arg]
    d["spec"]["train"] = {**d["spec"].get("train", {}), "epochs": 1}


def _figure(d: dict) -> None:  # type: ignore[type-arg]
    d["summary"]["similarity"] = round(d["summary"]["similarity"] - 0.1, 4)


@pytest.mark.parametrize("edit, words", [
    (_similarity, "holds figures no report can have (summary.similarity: Input should be "
                  "less than or equal to 1"),
    (_spec, "was changed after the service wrote it"),
    (_figure, "was changed after the service wrote it"),
])
def test_a_baseline_edited_by_hand_is_refused_before_anything_runs(
        tmp_path: Path, edit: object, words: str) -> None:
    path, ref = _baseline(tmp_path, edit)
    run = _check(path, ref)
    assert run.code == 2, (run.code, run.err)  # type: ignore[attr-defined]
    assert f"baseline file {path} {words}" in run.err  # type: ignore[attr-defined]
    assert "Traceback" not in run.err  # type: ignore[attr-defined]


def test_reformatting_a_baseline_is_not_an_edit_and_an_old_one_is_read_with_a_warning(
        tmp_path: Path) -> None:
    # Indentation and key order do not matter: the digest is over the content.
    path, ref = _baseline(tmp_path, lambda d: d.update(dict(reversed(list(d.items())))))
    run = _check(path, ref)
    # Accepted: the check goes on to compare the baseline's method with its own (the sample
    # was made with other objectives), a later refusal that only a read baseline reaches.
    assert "changed after the service wrote it" not in run.err  # type: ignore[attr-defined]
    assert "was made under other settings" in run.err, run.err  # type: ignore[attr-defined]
    path, ref = _baseline(tmp_path, lambda d: d.pop("digest"))
    run = _check(path, ref)
    assert "carries no digest (a report of an older service)" in run.err  # type: ignore[attr-defined]
    assert "was made under other settings" in run.err, run.err  # type: ignore[attr-defined]
