"""Request plans: the SDK's logic once, for a sync and an async client.

A plan is a generator that yields the steps it needs, a `Call` (one HTTP request, retried by
the transport) or a `Sleep`, and gets back the response (None after a sleep); an error of a
call is thrown into it at the yield, so it catches NotFound as ordinary code would. What it
returns is the result. `drive` runs a plan on a Transport, `drive_async` on an AsyncTransport:
Client and AsyncClient are thin surfaces over the same plans (stitchsim.sdk.core).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from stitchsim.sdk.transport import Body

T = TypeVar("T")


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    """params, json, headers, timeout: as httpx takes them."""
    body: Body | None = None
    retries: int | None = None


@dataclass(frozen=True)
class Sleep:
    seconds: float


Step = Call | Sleep
Plan = Generator[Step, Any, T]


def drive(plan: Plan[T], request: Callable[..., httpx.Response],
          sleep: Callable[[float], None]) -> T:
    """Run a plan with blocking requests and sleeps."""
    try:
        step = next(plan)
        while True:
            try:
                if isinstance(step, Sleep):
                    sleep(step.seconds)
                    result = None
                else:
                    result = request(step.method, step.path, body=step.body,
                                     retries=step.retries, **step.kwargs)
            except BaseException as exc:  # the plan's own handlers and finally blocks run
                step = plan.throw(exc)
            else:
                step = plan.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def drive_async(plan: Plan[T], request: Callable[..., Awaitable[httpx.Response]],
                      sleep: Callable[[float], Awaitable[None]]) -> T:
    """Run a plan with awaited requests and sleeps (an event loop is never blocked by one)."""
    try:
        step = next(plan)
        while True:
            try:
                if isinstance(step, Sleep):
                    await sleep(step.seconds)
                    result = None
                else:
                    result = await request(step.method, step.path, body=step.body,
                                           retries=step.retries, **step.kwargs)
            except BaseException as exc:
                step = plan.throw(exc)
            else:
                step = plan.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
