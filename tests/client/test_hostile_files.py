"""Issue 49 items 2-4 on the client: every JSON or TOML file and argument it reads refuses
nesting beyond 32 levels and infinite or NaN numbers with exit 2 naming the file or flag (never
exit 3 and a traceback, which tell CI "service error, retry"); an API key typed before the
command never reaches a message; the quirks of the round."""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from stitchsim.cli.main import main
from stitchsim.errors import UsageError

ID = "sha256:" + "a" * 64
DEAD = "http://127.0.0.1:9"  # nothing listens: a local input must be refused before any call


def _nested(depth: int, kind: str) -> str:
    if kind == "list":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


def _toml_nested(depth: int) -> str:
    return "a = " + "[" * depth + "]" * depth + "\n"


# What each reader is given: its argv, with the text placed in a file (FILE) or in the
# argument itself; the name the message must hold.
READERS: dict[str, tuple[list[str], str, str]] = {
    "--spec": (["check", ID, ID, "--threshold", "0.5", "--spec", "FILE"], "json", "x.json"),
    "--config": (["check", ID, ID, "--threshold", "0.5", "--config", "FILE"], "toml",
                 "x.toml"),
    "--set": (["check", ID, ID, "--threshold", "0.5", "--set", "iri=TEXT"], "json", "--set"),
    "--arch-kwargs": (["points", ID, "--arch-kwargs", "TEXT"], "json", "--arch-kwargs"),
    "--gate": (["check", ID, ID, "--gate", "FILE"], "json", "x.json"),
}


def _run(reader: str, text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
         ) -> tuple[int, str]:
    argv, _, _ = READERS[reader]
    (tmp_path / "x.json").write_text(text)
    (tmp_path / "x.toml").write_text(text)
    args = [a.replace("FILE", str(tmp_path / ("x.toml" if reader == "--config" else
                                               "x.json"))).replace("TEXT", text) for a in argv]
    code = main(args)
    err = capsys.readouterr().err
    return code, err


def _judge(code: int, err: str, reader: str) -> None:
    _, _, named = READERS[reader]
    assert code == 2, (reader, code, err[-600:])
    assert "Traceback" not in err and "internal error" not in err, err[-600:]
    assert named in err, (reader, err[-600:])


@pytest.fixture(autouse=True)
def _dead_service(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STITCHSIM_URL", DEAD)


@pytest.mark.parametrize("reader", list(READERS))
def test_the_issue_inputs_exit_2_naming_the_file_or_flag(
        reader: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kind = READERS[reader][1]
    deep = _toml_nested(5000) if kind == "toml" else _nested(5000, "list")
    _judge(*_run(reader, deep, tmp_path, capsys), reader)
    code, err = _run(reader, "a = inf\n" if kind == "toml" else '{"x": Infinity}', tmp_path,
                     capsys)
    _judge(code, err, reader)
    assert "is inf: only finite numbers" in err, err


@pytest.mark.parametrize("reader", list(READERS))
def test_any_nesting_or_non_finite_number_exits_2(reader: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    kind = READERS[reader][1]
    bad_json = st.one_of(
        st.builds(_nested, st.integers(33, 50_000), st.sampled_from(["list", "dict"])),
        st.builds(lambda word, key: json.dumps({key: {"v": 1}}).replace("1", word),
                  st.sampled_from(["Infinity", "-Infinity", "NaN"]),
                  st.text("abcxyz_", min_size=1, max_size=8)))
    bad_toml = st.one_of(st.builds(_toml_nested, st.integers(33, 50_000)),
                         st.builds(lambda w, k: f"[t]\n{k} = {w}\n",
                                   st.sampled_from(["inf", "-inf", "nan", "+nan"]),
                                   st.text("abcxyz_", min_size=1, max_size=8)))

    @settings(max_examples=8, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(bad_toml if kind == "toml" else bad_json)
    def sweep(text: str) -> None:
        _judge(*_run(reader, text, tmp_path, capsys), reader)

    sweep()


def _baseline(tmp_path: Path, text: str) -> Callable[[], Any]:
    from stitchsim.cli import baseline

    path = tmp_path / "b.json"
    path.write_text(text)
    return lambda: baseline.load(None, str(path), ID, {}, None, None)  # type: ignore[arg-type]


@settings(max_examples=10, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(st.one_of(st.builds(_nested, st.integers(33, 200_000), st.sampled_from(["list", "dict"])),
                 st.sampled_from(['{"summary": {"mean": Infinity}}', '[NaN]',
                                  '{"results": [{"agreement": -Infinity}]}'])))
def test_a_baseline_file_nested_or_non_finite_is_refused(text: str) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp, pytest.raises(UsageError) as info:
        _baseline(Path(tmp), text)()
    message = str(info.value)
    assert "baseline file" in message and "b.json" in message, message
    assert "levels deep" in message or "only finite numbers" in message, message


def test_a_key_before_the_command_is_never_printed(capsys: pytest.CaptureFixture[str]) -> None:
    for key in ("ssk_" + "Q" * 43, "operator-secret-123"):
        assert main(["--api-key", key, "check", ID, ID]) == 2
        err = capsys.readouterr().err
        assert key not in err and "[redacted]" in err, err


def test_baseline_self_with_auto_is_refused_saying_what_to_use(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", ID, ID, "--baseline", "self", "--max-drop", "auto"]) == 2
    err = capsys.readouterr().err
    assert "reference against itself has none" in err and "--max-drop 0.05" not in err, err
    assert "fixed --max-drop" in err and "benign retrain" in err, err


def test_set_over_a_flag_says_which_value_wins(capsys: pytest.CaptureFixture[str]) -> None:
    # The service is not there (exit 3): the note comes before any request.
    main(["check", ID, ID, "--budget", "ci", "--set", "budget=full", "--threshold", "0.5"])
    err = capsys.readouterr().err
    assert '--set budget="full" replaces --budget "ci"' in err, err


def test_an_npz_member_without_the_suffix_gets_the_size_check(tmp_path: Path) -> None:
    from stitchsim.errors import DatasetSourceError
    from stitchsim.packing.formats.npz import check_members

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (3_000_000_000,)})
    path = tmp_path / "big.npz"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("x_train", header.getvalue() + b"\0" * 64)  # 12 GB declared, 64 B held
    with pytest.raises(DatasetSourceError) as info:
        check_members(path)
    assert "12,000,000,000 bytes" in str(info.value), info.value
