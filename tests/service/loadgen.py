"""A bounded load on a live gateway: many submissions from several keys at once, with
concurrent status pollers. Used by tests/service/test_load.py (which asserts) and
bench/load_test.py (which prints).

Every request is answered, counted and timed; nothing is retried, so an error shows.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class LoadFigures:
    submissions: int = 0
    accepted: dict[str, list[str]] = field(default_factory=dict)  # key name -> job ids
    throttled: int = 0
    throttled_without_retry_after: int = 0
    other: Counter[str] = field(default_factory=Counter)  # "status code" -> count
    submit_ms: list[float] = field(default_factory=list)
    submit_retries: Counter[str] = field(default_factory=Counter)  # see poll_retries
    poll_ms: list[float] = field(default_factory=list)
    poll_errors: Counter[str] = field(default_factory=Counter)
    # Polls sent again once after the connection they were sent on dropped before any answer
    # (a keep-alive connection the server closed as the client reused it): GET is idempotent,
    # the retry is counted here, and a retry that fails too is a poll error.
    poll_retries: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def n_accepted(self) -> int:
        return sum(len(v) for v in self.accepted.values())

    def lines(self) -> list[str]:
        return [
            f"submissions        {self.submissions} in {self.seconds:.1f} s "
            f"({self.submissions / max(self.seconds, 1e-9):.0f}/s)",
            f"  accepted (202)   {self.n_accepted}  "
            + " ".join(f"{k}={len(v)}" for k, v in sorted(self.accepted.items())),
            f"  throttled (429)  {self.throttled}  (without Retry-After: "
            f"{self.throttled_without_retry_after})",
            f"  anything else    {sum(self.other.values())}  {dict(self.other)}  "
            f"sent again {dict(self.submit_retries)}",
            f"  submit latency   p50 {pct(self.submit_ms, 50):.0f} ms  "
            f"p99 {pct(self.submit_ms, 99):.0f} ms",
            f"status polls       {len(self.poll_ms)}  errors {sum(self.poll_errors.values())} "
            f"{dict(self.poll_errors)}  sent again {dict(self.poll_retries)}",
            f"  poll latency     p50 {pct(self.poll_ms, 50):.0f} ms  "
            f"p99 {pct(self.poll_ms, 99):.0f} ms  max {max(self.poll_ms, default=0):.0f} ms",
        ]


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


async def _submit_all(url: str, keys: dict[str, str], specs: dict[str, dict[str, Any]],
                      per_key: int, concurrency: int, out: LoadFigures) -> None:
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:

        async def one(name: str, seed: int) -> None:
            spec = {**specs[name], "train": {**specs[name].get("train", {}), "seed": seed}}
            # An Idempotency-Key, as the SDK sends: a submission whose connection dropped
            # before the answer is sent again once and names the same job if it made one, so
            # the counts stay exact (the retry is counted; one that fails too is an error).
            headers = {"Authorization": f"Bearer {keys[name]}",
                       "Idempotency-Key": f"load-{name}-{seed}"}
            async with gate:
                t0 = time.perf_counter()
                try:
                    try:
                        r = await client.post("/similarity", json=spec, headers=headers)
                    except (httpx.ReadError, httpx.RemoteProtocolError) as exc:
                        out.submit_retries[type(exc).__name__] += 1
                        r = await client.post("/similarity", json=spec, headers=headers)
                except httpx.HTTPError as exc:
                    out.other[type(exc).__name__] += 1
                    return
                out.submit_ms.append((time.perf_counter() - t0) * 1000)
            out.submissions += 1
            if r.status_code == 202:
                out.accepted.setdefault(name, []).append(r.json()["job_id"])
            elif r.status_code == 429:
                out.throttled += 1
                if not r.headers.get("retry-after", "").isdigit():
                    out.throttled_without_retry_after += 1
            else:
                out.other[f"{r.status_code} {r.text[:120]}"] += 1

        # Interleave the keys, as independent clients would arrive.
        order = [(name, i) for i in range(per_key) for name in keys]
        await asyncio.gather(*(one(name, i) for name, i in order))


async def _poll_until(url: str, keys: dict[str, str], out: LoadFigures, pollers: int,
                      stop: asyncio.Event) -> None:
    limits = httpx.Limits(max_connections=pollers, max_keepalive_connections=pollers)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:

        async def poller(n: int) -> None:
            names = itertools.cycle(sorted(keys))
            while not stop.is_set():
                name = next(names)
                ids = out.accepted.get(name)
                if not ids:
                    await asyncio.sleep(0.01)
                    continue
                job = ids[(n * 7 + len(out.poll_ms)) % len(ids)]
                t0 = time.perf_counter()
                headers = {"Authorization": f"Bearer {keys[name]}"}
                try:
                    try:
                        r = await client.get(f"/jobs/{job}", headers=headers)
                    except (httpx.ReadError, httpx.RemoteProtocolError) as exc:
                        out.poll_retries[type(exc).__name__] += 1
                        r = await client.get(f"/jobs/{job}", headers=headers)
                except httpx.HTTPError as exc:
                    out.poll_errors[type(exc).__name__] += 1
                    continue
                out.poll_ms.append((time.perf_counter() - t0) * 1000)
                if r.status_code != 200:
                    out.poll_errors[str(r.status_code)] += 1

        await asyncio.gather(*(poller(n) for n in range(pollers)))


async def _run(url: str, keys: dict[str, str], specs: dict[str, dict[str, Any]], per_key: int,
               pollers: int, concurrency: int, settle_s: float) -> LoadFigures:
    out = LoadFigures()
    stop = asyncio.Event()
    t0 = time.perf_counter()
    polling = asyncio.create_task(_poll_until(url, keys, out, pollers, stop))
    await _submit_all(url, keys, specs, per_key, concurrency, out)
    out.seconds = time.perf_counter() - t0
    await asyncio.sleep(settle_s)  # pollers alone for a moment: the steady state
    stop.set()
    await polling
    return out


def run_load(url: str, keys: dict[str, str], specs: dict[str, dict[str, Any]], *,
             per_key: int, pollers: int = 50, concurrency: int = 32,
             settle_s: float = 3.0) -> LoadFigures:
    """per_key submissions for each key (name -> API key; specs: name -> JSON spec, checkpoint
    ids of that key), with `pollers` status pollers running throughout."""
    return asyncio.run(_run(url, keys, specs, per_key, pollers, concurrency, settle_s))
