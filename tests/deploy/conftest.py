"""A deployment as docker-compose.yml describes it, made of local processes: a gateway, a checks
worker and two gpu workers on the real Redis, the job table in the real PostgreSQL, the blob
store in an S3 bucket served by moto's server mode. Each worker has its own data and cache dir,
as if on its own host, so everything they share goes through Redis, PostgreSQL and S3.

tests/fixtures_service.py's ServiceFactory always drops STITCHSIM_STORE_URL and starts one gpu
worker, so this builds a ServiceHandle of its own from that file's parts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.deploy.live import (
    CHECKS_NODE,
    GPU_NODES,
    Deployment,
    S3Server,
    spawn,
    store_init_command,
    wait_for_gpu_workers,
    with_venv_path,
)
from tests.environment import missing, postgres_problem
from tests.fixtures_service import (
    FAST_ENV,
    ServiceHandle,
    cli_command,
    free_port,
    postgres_database,
    redis_db,
)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """moto's S3 server on a free loopback port, for as long as the session needs it."""
    port = free_port()
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                             "-p", str(port)], stdout=log, stderr=log, start_new_session=True)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(endpoint + "/", timeout=2)
            break
        except httpx.HTTPError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"moto server did not start: {log.name}") from None
            time.sleep(0.2)
    # What s3fs reads in the containers too (docker-compose.yml's x-store-env).
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    yield S3Server(endpoint, proc, env)
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    log.close()


@pytest.fixture(scope="module")
def deployment(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[Deployment]:
    pg = postgres_database()  # under CI, no PostgreSQL fails here
    if pg is None:
        # The deployment's job table is PostgreSQL: on SQLite these tests would prove nothing.
        missing("PostgreSQL", postgres_problem() or "no database")
    db_url, drop_db = pg
    redis_url, release_redis = redis_db()
    root = tmp_path_factory.mktemp("deploy")
    port = free_port()
    bucket, prefix = f"stitchsim-{uuid.uuid4().hex[:8]}", "store"
    base = {**os.environ, **FAST_ENV, **s3_server.env, "OMP_NUM_THREADS": "1",
            "STITCHSIM_PORT": str(port), "STITCHSIM_REDIS_URL": redis_url,
            "STITCHSIM_DATABASE_URL": db_url, "STITCHSIM_STORE_URL": f"s3://{bucket}/{prefix}",
            "STITCHSIM_REQUIRE_API_KEY": "true"}
    base.pop("STITCHSIM_CACHE_DIR", None)
    hosts = {node: root / node.split("@")[1] for node in ("gateway@deploy-gw", *GPU_NODES,
                                                          CHECKS_NODE)}
    envs = {node: {**base, "STITCHSIM_DATA_DIR": str(d)} for node, d in hosts.items()}
    h = ServiceHandle("redis", f"http://127.0.0.1:{port}", root, envs["gateway@deploy-gw"],
                      database_url=db_url, redis_url=redis_url)
    try:
        # The compose file's store-init, verbatim: the bucket does not exist before it.
        assert bucket not in {b["Name"] for b in s3_server.client().list_buckets()["Buckets"]}
        init = subprocess.run(store_init_command(), env=with_venv_path(envs["gateway@deploy-gw"]),
                              timeout=60, capture_output=True, text=True)
        assert init.returncode == 0, init.stdout + init.stderr
        h.api_key = h.create_key("alice")
        spawn(h, "gateway", cli_command("gateway"), h.env)
        for node in GPU_NODES:
            spawn(h, f"worker_{node}", cli_command("worker", "--queues", "gpu", "--name", node),
                  envs[node])
        spawn(h, "worker_checks",
              cli_command("worker", "--queues", "checks", "--name", CHECKS_NODE),
              envs[CHECKS_NODE])
        wait_for_gpu_workers(h, len(GPU_NODES))
        yield Deployment(h, s3_server, bucket, prefix, hosts, envs)
    finally:
        h.stop()
        release_redis()
        drop_db()
