"""Rules for docker-compose.yml that the Compose Specification's JSON schema cannot express.

Each rule returns a list of problems (empty = fine), so the tests can feed them broken variants
and see them fail, not only the real file pass.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
SCHEMA_FILE = REPO.parent / "shared/data/compose-spec.schema.json"
SETTINGS_PREFIX = "STITCHSIM_"

Compose = dict[str, Any]

_INTERP = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])([^}]*))?\}")


def load(path: Path = COMPOSE_FILE) -> Compose:
    # PyYAML resolves the `<<: *anchor` merge keys the file uses, as Compose does.
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


def interpolate(value: Any, env: dict[str, str] | None = None) -> Any:
    """Compose's ${VAR}, ${VAR:-default}, ${VAR-default}; $$ is a literal $."""
    env = {} if env is None else env
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3) or ""
        if op in (":-", "-"):
            got = env.get(name)
            return got if got or (op == "-" and got is not None) else arg
        if name not in env:
            raise KeyError(f"${{{name}}} has no default and is not set")
        return env[name]

    return _INTERP.sub(sub, value.replace("$$", "\0")).replace("\0", "$")


def unresolved_variables(raw_text: str) -> list[str]:
    """Variables the file needs that have no default: `compose up` would fail without a .env."""
    return sorted({m.group(1) for m in _INTERP.finditer(raw_text.replace("$$", ""))
                   if m.group(2) not in (":-", "-")})


def env_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|us|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}


def duration_s(text: str | int | float) -> float:
    """Compose durations ("4h5m", "1m30s", "150s"); Compose reads bare numbers as seconds."""
    if isinstance(text, (int, float)):
        return float(text)
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r}")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def command_of(service: dict[str, Any]) -> list[str]:
    cmd = service.get("command") or []
    return cmd.split() if isinstance(cmd, str) else [str(c) for c in cmd]


def _option(cmd: list[str], flag: str) -> str | None:
    return cmd[cmd.index(flag) + 1] if flag in cmd and cmd.index(flag) + 1 < len(cmd) else None


def worker_queues(service: dict[str, Any]) -> set[str]:
    cmd = command_of(service)
    if cmd[:2] != ["stitchsim-server", "worker"]:
        return set()
    return set((_option(cmd, "--queues") or "gpu,checks").split(","))


def long_running(services: dict[str, Any]) -> dict[str, Any]:
    """Services that stay up: not one-shots that dependents wait on to complete."""
    one_shot = {dep for s in services.values()
                for dep, cond in _depends(s).items()
                if cond == "service_completed_successfully"}
    return {n: s for n, s in services.items()
            if not (n in one_shot and str(s.get("restart", "no")) == "no")}


def _depends(service: dict[str, Any]) -> dict[str, str]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return {d: "service_started" for d in deps}
    return {d: (spec or {}).get("condition", "service_started") for d, spec in deps.items()}


# ---------------------------------------------------------------- rules


def rule_gpu_devices(c: Compose) -> list[str]:
    """Compose refuses count together with device_ids only at `up` (config exits 0)."""
    problems = []
    for name, s in c["services"].items():
        devices = (((s.get("deploy") or {}).get("resources") or {}).get("reservations")
                   or {}).get("devices") or []
        for i, d in enumerate(devices):
            where = f"{name}: reservations.devices[{i}]"
            if "count" in d and "device_ids" in d:
                problems.append(f"{where} sets both count and device_ids")
            if d.get("driver") != "nvidia":
                problems.append(f"{where} driver is {d.get('driver')!r}, not nvidia")
            if "gpu" not in (d.get("capabilities") or []):
                problems.append(f"{where} lacks capabilities [gpu]")
        gpus = sum(int(d["count"]) if str(d.get("count", "")).isdigit()
                   else len(d.get("device_ids") or []) for d in devices)
        queues = worker_queues(s)
        if "gpu" in queues and gpus != 1:
            # One job per GPU; more GPUs = more worker services, each with its own.
            problems.append(f"{name}: a gpu worker must reserve exactly one GPU, has {gpus}")
        if devices and "gpu" not in queues:
            problems.append(f"{name}: reserves a GPU but consumes no gpu queue")
    return problems


def rule_healthchecks(c: Compose) -> list[str]:
    problems = []
    services = c["services"]
    for name, s in long_running(services).items():
        hc = s.get("healthcheck")
        if not hc or hc.get("disable") or not hc.get("test") or hc["test"] == ["NONE"]:
            problems.append(f"{name}: no health check")
    for name, s in services.items():
        for dep, cond in _depends(s).items():
            if dep not in services:
                problems.append(f"{name}: depends on unknown service {dep}")
            elif dep in long_running(services) and cond != "service_healthy":
                # Started is not ready: the gateway would crash-loop against a booting database.
                problems.append(f"{name}: waits for {dep} with {cond}, not service_healthy")
    return problems


def known_settings_vars() -> set[str]:
    from stitchsim_service.core.settings import Settings

    return {SETTINGS_PREFIX + field.upper() for field in Settings.model_fields}


def documented_vars(doc: Path = REPO / "docs/service.md") -> set[str]:
    return set(re.findall(r"^\| `(STITCHSIM_[A-Z0-9_]+)` \|", doc.read_text(), re.MULTILINE))


def rule_env_vars(c: Compose) -> list[str]:
    known, documented = known_settings_vars(), documented_vars()
    problems = []
    for name, s in c["services"].items():
        for var in env_of(s):
            if not var.startswith(SETTINGS_PREFIX):
                continue
            if var not in known:
                problems.append(f"{name}: {var} is not a setting (a typo is silently ignored)")
            elif var not in documented:
                problems.append(f"{name}: {var} is not in docs/service.md")
    return problems


def settings_of(service: dict[str, Any]) -> Any:
    """The service's Settings, built from its environment alone, as its process would."""
    from stitchsim_service.core.settings import Settings

    env = {k: v for k, v in interpolate(env_of(service)).items()
           if k.startswith(SETTINGS_PREFIX)}
    saved = {k: v for k, v in os.environ.items() if k.startswith(SETTINGS_PREFIX)}
    # pydantic-settings reads os.environ whatever is passed: swap ours for the service's.
    for k in saved:
        del os.environ[k]
    os.environ.update(env)
    try:
        return Settings()
    finally:
        for k in env:
            os.environ.pop(k, None)
        os.environ.update(saved)


_SHARED = ("STITCHSIM_REDIS_URL", "STITCHSIM_DATABASE_URL", "STITCHSIM_STORE_URL",
           "STITCHSIM_JOB_TIME_LIMIT_S", "STITCHSIM_VISIBILITY_TIMEOUT_S", "AWS_ENDPOINT_URL",
           "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


def rule_stitchsim_services(c: Compose) -> list[str]:
    """Gateway and workers agree on broker, job table, store and limits; no local store."""
    problems = []
    services = c["services"]
    ours = {n: s for n, s in services.items() if command_of(s)[:1] == ["stitchsim-server"]}
    queues = set().union(*(worker_queues(s) for s in ours.values()))
    if not {"gpu", "checks"} <= queues:
        problems.append(f"workers consume {sorted(queues)}, need gpu and checks")
    if not any(command_of(s)[:2] == ["stitchsim-server", "gateway"] for s in ours.values()):
        problems.append("no gateway service")
    for var in _SHARED:
        values = {n: env_of(s)[var] for n, s in services.items() if var in env_of(s)}
        if len(set(values.values())) > 1:
            problems.append(f"{var} differs between services: {values}")
    for name, s in ours.items():
        try:
            st = settings_of(s)
        except Exception as exc:  # the process itself would refuse to start
            problems.append(f"{name}: settings invalid: {exc}")
            continue
        if st.embedded:
            problems.append(f"{name}: no STITCHSIM_REDIS_URL: embedded broker in a deployment")
        if "://" not in st.resolved_store_url:
            problems.append(f"{name}: the store is a local directory; workers need a shared one")
        elif st.resolved_store_url.startswith("s3://") and not {
                "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(env_of(s)):
            problems.append(f"{name}: an s3:// store without AWS_ENDPOINT_URL and credentials")
        if not st.resolved_database_url.startswith("postgresql://"):
            problems.append(f"{name}: the job table is not PostgreSQL")
        if "gpu" in worker_queues(s):
            grace = duration_s(s.get("stop_grace_period", "10s"))
            if grace < st.job_time_limit_s:
                problems.append(f"{name}: stop_grace_period {grace:.0f} s < job time limit "
                                f"{st.job_time_limit_s} s: a stop cuts the running job short")
        if "checks" in worker_queues(s) and duration_s(s.get("stop_grace_period", "10s")) < 120:
            problems.append(f"{name}: stop_grace_period shorter than a spec check's 120 s")
    for name, s in services.items():
        # Every host a URL names must be a service here that this one waits for.
        env = interpolate(env_of(s))
        for var in ("STITCHSIM_REDIS_URL", "STITCHSIM_DATABASE_URL", "AWS_ENDPOINT_URL"):
            host = urlsplit(env.get(var, "")).hostname
            if host and host not in services:
                problems.append(f"{name}: {var} names host {host}, not a service")
            elif host and host not in _all_deps(services, name):
                problems.append(f"{name}: {var} names {host} but does not wait for it")
    return problems


def _all_deps(services: dict[str, Any], name: str) -> set[str]:
    seen: set[str] = set()
    todo = [name]
    while todo:
        for dep in _depends(services[todo.pop()]):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def rule_redis(c: Compose) -> list[str]:
    redis = c["services"].get("redis")
    if redis is None:
        return ["no redis service"]
    cmd = command_of(redis)
    problems = []
    if _option(cmd, "--appendonly") != "yes":
        problems.append("redis: no --appendonly yes (queued tasks lost on a restart)")
    if _option(cmd, "--maxmemory-policy") != "noeviction":
        problems.append("redis: --maxmemory-policy is not noeviction (tasks could be evicted)")
    if not any(str(v).endswith(":/data") for v in redis.get("volumes") or []):
        problems.append("redis: /data is not on a volume (the append-only file would not "
                        "outlive the container)")
    return problems


PROXY_CONFIG = "/etc/nginx/nginx.conf"
_PROXY_UPSTREAM = re.compile(r"^\s*set \$gateway ([\w.-]+):(\d+);", re.MULTILINE)


def rule_proxy(c: Compose) -> list[str]:
    """Clients reach the gateway through the proxy only (its edge limits would not apply to a
    published gateway port), with our config mounted, naming the gateway's service and port."""
    services = c["services"]
    proxy = services.get("proxy")
    if proxy is None:
        return ["no proxy service in front of the gateway"]
    problems = []
    gateways = {n: s for n, s in services.items()
                if command_of(s)[:2] == ["stitchsim-server", "gateway"]}
    for name, s in gateways.items():
        if s.get("ports"):
            problems.append(f"{name}: publishes ports, bypassing the proxy's limits")
    if not proxy.get("ports"):
        problems.append("proxy: publishes no port")
    mounts = [str(v).split(":") for v in proxy.get("volumes") or []]
    sources = [m[0] for m in mounts if len(m) >= 2 and m[1] == PROXY_CONFIG]
    if not sources:
        return [*problems, f"proxy: no config mounted at {PROXY_CONFIG}"]
    conf = (REPO / sources[0]).resolve()
    if not conf.is_file():
        return [*problems, f"proxy: {sources[0]} does not exist"]
    upstream = _PROXY_UPSTREAM.search(conf.read_text())
    if upstream is None:
        return [*problems, f"proxy: {sources[0]} names no gateway (set $gateway host:port;)"]
    host, port = upstream.group(1), upstream.group(2)
    if host not in gateways:
        problems.append(f"proxy: {sources[0]} sends to {host}, not a gateway service")
    elif env_of(gateways[host]).get("STITCHSIM_PORT", "8000") != port:
        problems.append(f"proxy: sends to port {port}, the gateway listens on "
                        f"{env_of(gateways[host]).get('STITCHSIM_PORT', '8000')}")
    return problems


RULES: list[Callable[[Compose], list[str]]] = [
    rule_gpu_devices, rule_healthchecks, rule_env_vars, rule_stitchsim_services, rule_redis,
    rule_proxy,
]


def all_problems(c: Compose) -> list[str]:
    return [p for rule in RULES for p in rule(c)]
