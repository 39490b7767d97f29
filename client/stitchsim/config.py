"""Where the client's settings come from: flags, then environment variables, then config files.

Config files are TOML with top-level settings and an optional `[spec]` table of spec defaults
(what a team wants every `check` to use):

    url = "https://stitchsim.example.org"
    timeout = 1800
    threshold = 0.9

    [spec]
    layers = "auto"
    train = {epochs = 5}

They are read from `--config PATH` or `$STITCHSIM_CONFIG` when given; otherwise from
`$XDG_CONFIG_HOME/stitchsim/config.toml` (default `~/.config/...`) and then `./stitchsim.toml`,
the project file overriding the user file. Keep the API key in the environment, not in a file
that is committed.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stitchsim.errors import UsageError
from stitchsim.jsondepth import JSONInputError, parse_toml

DEFAULT_URL = "http://127.0.0.1:8000"
PROJECT_FILE = "stitchsim.toml"

ENV_VARS: dict[str, str] = {
    "url": "STITCHSIM_URL",
    "api_key": "STITCHSIM_API_KEY",
    "timeout": "STITCHSIM_TIMEOUT",
    "threshold": "STITCHSIM_THRESHOLD",
    "retries": "STITCHSIM_RETRIES",
}
CONFIG_ENV = "STITCHSIM_CONFIG"


def _url(v: Any) -> str:
    s = str(v).strip().rstrip("/")
    if not s.startswith(("http://", "https://")):
        raise ValueError(f"must start with http:// or https://, got {v!r}")
    return s


def _key(v: Any) -> str | None:
    s = str(v).strip()
    return s or None


def _timeout(v: Any) -> float | None:
    if isinstance(v, str) and v.strip().lower() in ("", "none", "never", "inf"):
        return None
    t = float(v)
    if math.isnan(t):
        raise ValueError("must be a number of seconds")
    # 0 or less means no limit, which is what "no timeout" means to most CI tools too.
    return None if t <= 0 or math.isinf(t) else t


def _threshold(v: Any) -> float | None:
    if isinstance(v, str) and v.strip().lower() in ("", "none"):
        return None
    t = float(v)
    if not 0.0 <= t <= 1.0:
        raise ValueError(f"must lie in [0, 1], got {v!r}")
    return t


def _retries(v: Any) -> int:
    if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
        raise ValueError(f"must be a whole number, got {v!r}")
    n = int(v)
    if not 0 <= n <= 100:
        raise ValueError(f"must lie in 0..100, got {v!r}")
    return n


_PARSERS: dict[str, Callable[[Any], Any]] = {
    "url": _url,
    "api_key": _key,
    "timeout": _timeout,
    "threshold": _threshold,
    "retries": _retries,
}


@dataclass(frozen=True)
class Settings:
    url: str = DEFAULT_URL
    api_key: str | None = None
    timeout: float | None = 3600.0
    """How long to wait for a job, in seconds; None waits for ever."""
    threshold: float | None = None
    retries: int = 5
    """Retries per request on connection errors, 429 and 5xx-unavailable."""
    spec: dict[str, Any] = field(default_factory=dict)
    """Spec defaults from the config files' `[spec]` table."""
    sources: dict[str, str] = field(default_factory=dict)
    """Where each setting came from ("flag", "env STITCHSIM_URL", a file path, "default")."""


def load_settings(
    flags: Mapping[str, Any] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    config_file: str | Path | None = None,
    cwd: Path | None = None,
    read_files: bool = True,
) -> Settings:
    """Merge the sources; a flag given as None counts as not given."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    spec: dict[str, Any] = {}

    files = _config_files(config_file, env, cwd or Path.cwd()) if read_files else []
    for path in files:
        data = _read_toml(path)
        file_spec = data.pop("spec", {})
        if not isinstance(file_spec, dict):
            raise UsageError(f"{path}: [spec] must be a table")
        spec = deep_merge(spec, file_spec)
        for key, raw in data.items():
            if key not in _PARSERS:
                known = ", ".join([*_PARSERS, "spec"])
                raise UsageError(f"{path}: unknown setting {key!r} (known: {known})")
            values[key] = _parse(key, raw, str(path))
            sources[key] = str(path)

    for key, var in ENV_VARS.items():
        raw = env.get(var)
        if raw is not None and raw.strip() != "":
            values[key] = _parse(key, raw, f"${var}")
            sources[key] = f"env {var}"

    for key, raw in (flags or {}).items():
        if key not in _PARSERS:
            raise UsageError(f"unknown setting {key!r}")
        if raw is not None:
            values[key] = _parse(key, raw, f"--{key.replace('_', '-')}")
            sources[key] = "flag"

    for key in _PARSERS:
        sources.setdefault(key, "default")
    return Settings(**values, spec=spec, sources=sources)


def _parse(key: str, raw: Any, origin: str) -> Any:
    try:
        return _PARSERS[key](raw)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{origin}: invalid {key}: {exc}") from None


def _config_files(explicit: str | Path | None, env: Mapping[str, str], cwd: Path) -> list[Path]:
    chosen = explicit or env.get(CONFIG_ENV) or None
    if chosen:
        path = Path(chosen).expanduser()
        if not path.is_file():
            origin = "--config" if explicit else f"${CONFIG_ENV}"
            raise UsageError(f"{origin}: config file {str(path)!r} does not exist")
        return [path]
    xdg = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".config")
    candidates = [Path(xdg) / "stitchsim" / "config.toml", cwd / PROJECT_FILE]
    return [p for p in candidates if p.is_file()]


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise UsageError(
                f"{path}: reading config files needs Python 3.11+ or the tomli package; "
                "use flags or STITCHSIM_* variables instead"
            ) from None
    del tomllib  # parse_toml reads it with the depth and finite-number bounds
    try:
        text = path.read_bytes().decode("utf-8", "replace")
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc}") from None
    try:
        return parse_toml(text, str(path))
    except JSONInputError as exc:
        raise UsageError(str(exc)) from None


def deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out
