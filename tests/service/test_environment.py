"""A green run under CI used PostgreSQL, Redis and Chromium: a missing one fails the tests that
need it, never a fallback or a skip (tests/environment.py); outside CI the skip says what is
missing. And the Redis-mode services really keep their job table in PostgreSQL."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from tests.environment import (
    chromium_problem,
    in_ci,
    missing,
    postgres_problem,
    require_redis,
)
from tests.fixtures_service import ServiceHandle, free_port, postgres_database
from tests.service.helpers import safetensors_bytes


def test_redis_mode_services_keep_their_job_table_in_postgresql(
    redis_service: ServiceHandle,
) -> None:
    problem = postgres_problem()
    if problem is not None:
        missing("PostgreSQL", problem)  # fails under CI
    svc = redis_service
    assert svc.database_url.startswith("postgresql://"), svc.database_url
    import psycopg

    # What the processes wrote is in that database: the keys made through the operator's CLI,
    # the workers' presence, and an object uploaded through the gateway just now.
    data = safetensors_bytes({"w": np.zeros(2, np.float32)}, {"nonce": uuid.uuid4().hex})
    with svc.client() as http:
        r = http.post("/checkpoints", files={"file": ("m.safetensors", data)})
    assert r.status_code == 201, r.text
    with psycopg.connect(svc.database_url, connect_timeout=10) as conn:
        keys = conn.execute("SELECT count(*) FROM api_keys").fetchone()
        queues = {q for (row,) in conn.execute("SELECT queues FROM workers")
                  for q in row.split(",")}
        stored = conn.execute("SELECT count(*) FROM objects WHERE id = %s",
                              (r.json()["id"],)).fetchone()
    assert keys is not None and keys[0] >= 2
    assert {"gpu", "checks"} <= queues
    assert stored == (1,)


def _closed_port_url(scheme: str, path: str) -> str:
    return f"{scheme}://postgres@127.0.0.1:{free_port()}/{path}" if scheme == "postgresql" \
        else f"{scheme}://127.0.0.1:{free_port()}/{path}"


@pytest.mark.parametrize(("value", "ci"), [("true", True), ("1", True), ("yes", True),
                                           ("", False), ("0", False), ("false", False)])
def test_what_counts_as_ci(value: str, ci: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", value)
    assert in_ci() is ci


def test_without_postgresql_ci_fails_and_elsewhere_sqlite_is_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nowhere = _closed_port_url("postgresql", "postgres")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception) as failed:
        postgres_database(nowhere)
    assert "PostgreSQL is missing: PostgreSQL does not answer at " + nowhere in str(failed.value)
    assert "CI=true" in str(failed.value)
    monkeypatch.setenv("CI", "false")
    assert postgres_database(nowhere) is None  # the caller falls back, and says why:
    assert (postgres_problem(nowhere) or "").startswith(f"PostgreSQL does not answer at {nowhere}")


def test_without_redis_ci_fails_and_elsewhere_the_test_is_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nowhere = _closed_port_url("redis", "0")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception) as failed:
        require_redis(nowhere)
    assert f"Redis is missing: Redis does not answer at {nowhere}" in str(failed.value)
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception) as skipped:
        require_redis(nowhere)
    assert f"Redis is missing: Redis does not answer at {nowhere}" in str(skipped.value)


def test_without_chromium_ci_fails_and_elsewhere_the_test_is_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CI", "true")
    for binary, why in [(None, "no chromium binary on PATH"),
                        ("/nonexistent/chromium", "/nonexistent/chromium is not an executable")]:
        problem = chromium_problem(binary)
        assert problem is not None and why in problem
        with pytest.raises(pytest.fail.Exception) as failed:
            missing("Chromium", problem)
        assert f"Chromium is missing: {problem}" in str(failed.value)
    monkeypatch.setenv("CI", "")
    with pytest.raises(pytest.skip.Exception):
        missing("Chromium", "no chromium binary on PATH")
