"""Compute budgets per key, and a spec check one key cannot starve.

- The spec check hands its estimate (work units, seconds) back to submission: it is in the
  job status, and the key's queued-plus-running units are a quota (429
  compute_quota_exceeded with Retry-After, saying what is in use and the limit; /usage and
  `stitchsim-server keys limits` show it).
- One key flooding the checks queue with slow specs gets 429 too_many_checks beyond its
  pending-check cap, and another key's broken spec still gets its 422 at once.

The gateway runs with a checks worker only: accepted jobs stay queued, so their units stay
in use for as long as the test needs.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures_service import ServiceFactory, ServiceHandle, _children, cli_command
from tests.service.conftest import tiny_spec, upload

CHECK_MEMORY = 6 * 1024**3
ENV = {"STITCHSIM_REQUIRE_API_KEY": "true", "STITCHSIM_QUOTA_RETRY_AFTER_S": "9",
       "STITCHSIM_SECONDS_PER_UNIT": "0.5", "STITCHSIM_MAX_PENDING_CHECKS_PER_KEY": "2",
       "STITCHSIM_CHECK_RETRY_AFTER_S": "4", "STITCHSIM_CHECK_MEMORY_BYTES": str(CHECK_MEMORY),
       # Two gateway processes on the port: the cap on pending checks is the key's, not each
       # process's (the flood's requests land on both).
       "STITCHSIM_GATEWAY_WORKERS": "2"}


@pytest.fixture(scope="module")
def checks_only(tmp_path_factory: pytest.TempPathFactory) -> Any:
    factory = ServiceFactory(tmp_path_factory)
    svc = factory.redis(keys=False, extra_env=ENV, workers=False)
    svc._spawn("worker_checks", cli_command("worker", "--queues", "checks", "--name",
                                            "checks@quota"))
    deadline = time.monotonic() + 120
    while svc.count_rows("workers") == 0:  # /readyz wants a gpu worker; this one announces
        assert time.monotonic() < deadline, svc.logs()
        time.sleep(0.2)
    yield svc
    factory.close()


def _key(svc: ServiceHandle, name: str, *flags: str) -> str:
    key = svc.create_key(name)
    out = subprocess.run(cli_command("keys", "list"), env=svc.env, capture_output=True,
                         text=True, check=True, timeout=60).stdout
    key_id = next(line.split("\t")[0] for line in out.splitlines() if f"\t{name}\t" in line)
    if flags:
        shown = subprocess.run(cli_command("keys", "limits", key_id, *flags), env=svc.env,
                               capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        assert "work units in flight" in shown.stdout, shown.stdout
    return key


def test_estimate_in_status_and_compute_quota(checks_only: ServiceHandle, ckpts: Any) -> None:
    svc = checks_only
    probe = _key(svc, "probe")
    with svc.client(probe) as c:
        ckpt = upload(c, ckpts.digits_resnet)
        spec = tiny_spec({"checkpoint": ckpt}, {"checkpoint": ckpt})
        r = c.post("/similarity", json=spec)
        assert r.status_code == 202, r.text
        status = c.get(f"/jobs/{r.json()['job_id']}").json()
    est = status["estimate"]
    # One pair, one objective, standard: a few training batches and evaluation passes.
    assert 5 <= est["units"] < 200, est
    assert est["seconds"] == pytest.approx(est["units"] * 0.5, abs=0.1), est

    limit = est["units"] * 2 + est["units"] // 2  # room for two such jobs, not three
    key = _key(svc, "hank", "--max-units", str(limit))
    with svc.client(key) as c:
        ckpt = upload(c, ckpts.digits_resnet)
        spec = tiny_spec({"checkpoint": ckpt}, {"checkpoint": ckpt})
        jobs = [c.post("/similarity", json=spec) for _ in range(2)]
        assert [j.status_code for j in jobs] == [202, 202], [j.text for j in jobs]
        usage = c.get("/usage").json()
        assert usage["active_units"] == 2 * est["units"], usage
        assert usage["max_active_units"] == limit, usage
        over = c.post("/similarity", json=spec)
        assert over.status_code == 429, over.text
        assert over.headers["retry-after"] == "9"
        err = over.json()["error"]
        assert err["code"] == "compute_quota_exceeded", err
        assert f"hold {2 * est['units']:,} work units" in err["message"], err
        assert f"compute quota of {limit:,} units" in err["message"], err
        assert err["details"] == {"active_units": 2 * est["units"], "adding_units": est["units"],
                                  "limit_units": limit, "seconds_per_unit": 0.5}
        # Cancelling gives the units back at once.
        assert c.delete(f"/jobs/{jobs[0].json()['job_id']}").status_code in (200, 202)
        assert c.get("/usage").json()["active_units"] == est["units"]
        assert c.post("/similarity", json=spec).status_code == 202


def test_one_key_flooding_slow_checks_cannot_starve_another(checks_only: ServiceHandle,
                                                            ckpts: Any) -> None:
    svc = checks_only
    flood_key, other_key = _key(svc, "flood"), _key(svc, "victim")
    with svc.client(flood_key) as c:
        ckpt = upload(c, ckpts.digits_resnet)
    # A slow check: a large architecture built (on the meta device) before its weights are
    # found not to fit the small checkpoint.
    slow = tiny_spec({"checkpoint": ckpt, "arch": "resnet152"}, {"checkpoint": ckpt})
    answers: list[tuple[int, float]] = []

    def flood() -> None:
        with httpx.Client(base_url=svc.url, timeout=120,
                          headers={"Authorization": f"Bearer {flood_key}"}) as fc:
            t0 = time.monotonic()
            r = fc.post("/similarity", json=slow)
            answers.append((r.status_code, time.monotonic() - t0))

    threads = [threading.Thread(target=flood) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # the flood's checks are in the queue
    with svc.client(other_key) as c:
        mine = upload(c, ckpts.digits_resnet)
        bad = tiny_spec({"checkpoint": mine, "arch_kwargs": {"no_such_kwarg": 1}},
                        {"checkpoint": mine})
        t0 = time.monotonic()
        r = c.post("/similarity", json=bad)
        took = time.monotonic() - t0
    for t in threads:
        t.join()
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "invalid_arch_kwargs", r.text
    codes = sorted(code for code, _ in answers)
    # Two checks pending at most: the rest of the flood is told to come back later.
    assert codes.count(429) >= 5, answers
    assert set(codes) <= {422, 429}, answers
    slowest = max(s for code, s in answers if code == 422)
    # Behind at most two of the flood's checks, not eight.
    assert took < 3 * slowest + 2, (took, answers)
    print(f"\nflood answers (code, s): {answers}; the other key's 422 took {took:.2f} s")
    # The checks ran in a pool process under the checks' own address-space limit.
    children = [pid for parent in svc.worker_pids("checks") for pid in _children(parent)]
    assert children, "no checks pool process after the checks"
    limits = Path(f"/proc/{children[0]}/limits").read_text()
    line = next(ln for ln in limits.splitlines() if ln.startswith("Max address space"))
    assert line.split()[3] == str(CHECK_MEMORY), line
