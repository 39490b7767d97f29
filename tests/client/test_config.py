"""Settings come from flags, then environment variables, then config files, then defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
from stitchsim.config import DEFAULT_URL, load_settings
from stitchsim.errors import UsageError


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    """An environment whose user config dir is empty and private to the test."""
    (tmp_path / "xdg").mkdir()
    return {"XDG_CONFIG_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path)}


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_defaults_without_any_source(tmp_path: Path, home: dict[str, str]) -> None:
    s = load_settings(env=home, cwd=tmp_path)
    assert (s.url, s.api_key, s.timeout, s.threshold, s.retries) == (
        DEFAULT_URL,
        None,
        3600.0,
        None,
        5,
    )
    assert set(s.sources.values()) == {"default"}
    assert s.spec == {}


def test_flag_beats_env_beats_project_file_beats_user_file(
    tmp_path: Path, home: dict[str, str]
) -> None:
    user = write(
        Path(home["XDG_CONFIG_HOME"]) / "stitchsim" / "config.toml",
        'url = "http://user:1"\ntimeout = 10\nthreshold = 0.1\nretries = 1\n'
        '[spec]\ndataset = "digits"\ntrain = {epochs = 3, seed = 7}\n',
    )
    project = write(
        tmp_path / "stitchsim.toml",
        'url = "http://project:2"\ntimeout = 20\nthreshold = 0.2\n[spec.train]\nepochs = 5\n',
    )
    env = {**home, "STITCHSIM_URL": "http://env:3/", "STITCHSIM_TIMEOUT": "30"}
    s = load_settings({"url": "http://flag:4", "retries": None}, env=env, cwd=tmp_path)

    assert s.url == "http://flag:4"  # flag over env over both files
    assert s.timeout == 30.0  # env over both files
    assert s.threshold == 0.2  # project file over user file
    assert s.retries == 1  # only the user file sets it; a None flag is "not given"
    assert s.spec == {"dataset": "digits", "train": {"epochs": 5, "seed": 7}}  # deep merge
    assert s.sources == {
        "url": "flag",
        "timeout": "env STITCHSIM_TIMEOUT",
        "threshold": str(project),
        "retries": str(user),
        "api_key": "default",
    }


def test_explicit_config_file_replaces_the_default_files(
    tmp_path: Path, home: dict[str, str]
) -> None:
    write(tmp_path / "stitchsim.toml", 'url = "http://project:2"\nretries = 9\n')
    other = write(tmp_path / "ci" / "other.toml", 'url = "http://other:5"\n')
    s = load_settings(env=home, config_file=other, cwd=tmp_path)
    assert (s.url, s.retries) == ("http://other:5", 5)
    s = load_settings(env={**home, "STITCHSIM_CONFIG": str(other)}, cwd=tmp_path)
    assert s.url == "http://other:5"


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"STITCHSIM_THRESHOLD": "1.5"}, "$STITCHSIM_THRESHOLD: invalid threshold"),
        ({"STITCHSIM_URL": "ftp://x"}, "$STITCHSIM_URL: invalid url"),
        ({"STITCHSIM_RETRIES": "two"}, "$STITCHSIM_RETRIES: invalid retries"),
        ({"STITCHSIM_CONFIG": "/nonexistent.toml"}, "does not exist"),
    ],
)
def test_bad_values_name_their_source(
    tmp_path: Path, home: dict[str, str], source: dict[str, str], message: str
) -> None:
    with pytest.raises(UsageError, match=message.replace("$", r"\$")):
        load_settings(env={**home, **source}, cwd=tmp_path)


def test_config_file_errors_say_where(tmp_path: Path, home: dict[str, str]) -> None:
    bad = write(tmp_path / "stitchsim.toml", 'urll = "http://x"\n')
    with pytest.raises(UsageError, match=r"stitchsim.toml: unknown setting 'urll'"):
        load_settings(env=home, cwd=tmp_path)
    bad.write_text("url = \n")
    with pytest.raises(UsageError, match="not valid TOML"):
        load_settings(env=home, cwd=tmp_path)


def test_timeout_zero_means_no_limit(tmp_path: Path, home: dict[str, str]) -> None:
    assert load_settings({"timeout": "0"}, env=home, cwd=tmp_path).timeout is None
    assert load_settings({"timeout": "90"}, env=home, cwd=tmp_path).timeout == 90.0


def test_cli_spec_fields_layer_on_config_spec(tmp_path: Path, home: dict[str, str]) -> None:
    from stitchsim.cli import build_parser, spec_fields

    write(tmp_path / "stitchsim.toml", '[spec]\nobjectives = ["slm"]\ntrain = {epochs = 3}\n')
    spec_file = write(tmp_path / "spec.json", '{"train": {"seed": 4}, "iri": {"steps": 9}}')
    settings = load_settings({"threshold": 0.8}, env=home, cwd=tmp_path)
    args = build_parser().parse_args(
        [
            "check",
            "a",
            "b",
            "--spec",
            str(spec_file),
            "--layers",
            "layer1,layer2.0:layer2.1",
            "--objectives",
            "slm,fula",
            "--arch",
            "resnet18",
            "--arch-kwargs",
            '{"num_classes": 10}',
            "--set",
            "train.epochs=2",
            "--set",
            "iri.steps=20",
        ]
    )
    assert spec_fields(args, settings) == {
        "objectives": ["slm", "fula"],
        "train": {"epochs": 2, "seed": 4},
        "iri": {"steps": 20},
        "layers": [
            {"front": "layer1", "back": "layer1"},
            {"front": "layer2.0", "back": "layer2.1"},
        ],
        "front": {"arch": "resnet18", "arch_kwargs": {"num_classes": 10}},
        "back": {"arch": "resnet18", "arch_kwargs": {"num_classes": 10}},
        "threshold": 0.8,
    }
