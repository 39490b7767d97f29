"""What the suite needs from the machine (PostgreSQL, Redis, Chromium), and what happens when
one of them is missing.

Under CI (`CI` set to anything but "", 0, false or no; `.ci/run` sets CI=true) a missing
service fails the test that needs it, with what is missing and why: a CI run that is green
has used all three. Elsewhere the test is skipped with the same words, except that Redis-mode
services without PostgreSQL keep their job table in SQLite and say so (a warning, and the
line `pytest_report_header` prints at the top of the run).
"""

from __future__ import annotations

import functools
import os
from typing import NoReturn

import pytest

POSTGRES_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
"""Where test databases are created: the maintenance database every cluster has, as the
superuser, with trust authentication on loopback (the CI machine's pg_hba.conf)."""
REDIS_URL = "redis://127.0.0.1:6379/0"

_FALSE = {"", "0", "false", "no"}


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in _FALSE


def missing(what: str, why: str) -> NoReturn:
    """Fail under CI, skip elsewhere: `what` is missing because `why`."""
    message = f"{what} is missing: {why}"
    if in_ci():
        pytest.fail(f"{message} (CI={os.environ.get('CI')}: the CI setup, .ci/run, must provide "
                    "it; a CI run never skips or falls back)", pytrace=False)
    pytest.skip(message)


@functools.cache
def postgres_problem(admin_url: str = POSTGRES_ADMIN_URL) -> str | None:
    """None when PostgreSQL answers at admin_url; else why not."""
    try:
        import psycopg
    except ImportError as exc:
        return f"psycopg is not installed ({exc})"
    try:
        with psycopg.connect(admin_url, autocommit=True, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:  # any reason at all: it is reported, never swallowed
        return f"PostgreSQL does not answer at {admin_url}: {type(exc).__name__}: {exc}"
    return None


@functools.cache
def redis_problem(url: str = REDIS_URL) -> str | None:
    """None when Redis answers a PING at url; else why not."""
    try:
        import redis
    except ImportError as exc:
        return f"the redis package is not installed ({exc})"
    try:
        redis.Redis.from_url(url, socket_timeout=3, socket_connect_timeout=3).ping()
    except Exception as exc:
        return f"Redis does not answer at {url}: {type(exc).__name__}: {exc}"
    return None


def require_redis(url: str = REDIS_URL) -> None:
    problem = redis_problem(url)
    if problem is not None:
        missing("Redis", f"{problem} (start one: redis-server --port 6379, or .ci/run)")


def chromium_problem(binary: str | None) -> str | None:
    if binary is None:
        return "no chromium binary on PATH (Debian: apt-get install -y chromium; or set " \
               "STITCHSIM_CHROMIUM)"
    if not os.access(binary, os.X_OK):
        return f"{binary} is not an executable file"
    return None


def report_lines() -> list[str]:
    """What this run has and lacks, for the top of pytest's output."""
    from tests.report.chromium import find_chromium

    pg = postgres_problem()
    rd = redis_problem()
    browser = find_chromium()
    br = chromium_problem(browser)
    ci = in_ci()
    mode = "CI (a missing service fails)" if ci else "not CI (a missing service skips)"
    missing_then = "fail" if ci else "skip"
    return [
        f"stitchsim environment: {mode}",
        "  PostgreSQL: " + ("yes, Redis-mode services keep their job table there" if pg is None
                            else f"NO, Redis-mode tests fail: {pg}" if ci
                            else f"NO, Redis-mode services use SQLite: {pg}"),
        "  Redis: " + ("yes" if rd is None else f"NO, Redis-mode tests {missing_then}: {rd}"),
        "  Chromium: " + (f"yes, {browser}" if br is None
                          else f"NO, browser tests {missing_then}: {br}"),
    ]
