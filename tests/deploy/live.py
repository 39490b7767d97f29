"""Parts of the local deployment the fixtures in conftest.py start (see there)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.deploy import compose_rules
from tests.fixtures_service import (
    ServiceHandle,
)

# Two "hosts" for the gpu queue: node names as compose's `gpu@%h` gives them.
GPU_NODES = ("gpu@deploy-a", "gpu@deploy-b")
CHECKS_NODE = "checks@deploy-c"


@dataclass
class S3Server:
    endpoint: str
    proc: subprocess.Popen[bytes]
    env: dict[str, str] = field(default_factory=dict)

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")


@dataclass
class Deployment:
    svc: ServiceHandle
    s3: S3Server
    bucket: str
    prefix: str
    hosts: dict[str, Path]  # node name -> its own data dir
    env: dict[str, dict[str, str]]  # node name -> its environment

    def objects(self) -> dict[str, bytes]:
        """Every object under the store prefix, read with boto3 (not the code under test)."""
        c = self.s3.client()
        found = c.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix + "/")
        return {o["Key"][len(self.prefix) + 1:]:
                c.get_object(Bucket=self.bucket, Key=o["Key"])["Body"].read()
                for o in found.get("Contents", [])}

    def job_rows(self, job_ids: list[str]) -> dict[str, dict[str, Any]]:
        from sqlalchemy import create_engine, text

        engine = create_engine(self.svc._sqlalchemy_url())
        try:
            with engine.connect() as conn:
                rows = conn.execute(text("SELECT id, state, worker, attempts, started_at, "
                                         "finished_at FROM jobs "
                                         "WHERE id = ANY(:ids)"), {"ids": job_ids}).mappings()
                return {r["id"]: dict(r) for r in rows}
        finally:
            engine.dispose()

    def worker_logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")
                         for p in sorted((self.svc.data_dir / "logs").glob("worker*.log")))


def spawn(h: ServiceHandle, name: str, cmd: list[str], env: dict[str, str]) -> None:
    # ServiceHandle._spawn gives every process the handle's env; each "host" needs its own.
    logs = h.data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"{name}.log", "ab") as out:
        h.procs[name] = subprocess.Popen(cmd, env=env, stdout=out, stderr=out,
                                         start_new_session=True)


def with_venv_path(env: dict[str, str]) -> dict[str, str]:
    """The images put their venv's bin first on PATH: `python` and `celery` are the venv's."""
    return {**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"}


def store_init_command() -> list[str]:
    """The compose file's bucket-creating one-shot, to run here as it runs there."""
    return compose_rules.load()["services"]["store-init"]["command"]


def wait_for_gpu_workers(h: ServiceHandle, n: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        for name, proc in h.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{h.logs()}")
        with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
            last = httpx.get(h.url + "/readyz", timeout=5).json()
            if last["checks"]["workers"]["queues"].get("gpu", 0) >= n and \
                    last["checks"]["workers"]["queues"].get("checks", 0) >= 1:
                return
        time.sleep(0.3)
    raise RuntimeError(f"{n} gpu workers not seen after {timeout} s: {last}\n{h.logs()}")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
