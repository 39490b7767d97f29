"""Calibrating a gate through the service: one check of each benign retrain against the
reference, under one spec, then the gate of their figures (stitchsim.calibration).

The first check runs alone, so the reference's IRIs and activations are made once and the
other checks read them from the store, as a second `stitchsim check` does; the rest are then
submitted together and run side by side on the service's workers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from stitchsim.calibration import (
    DEFAULT_FALSE_ALARM_RATE,
    MIN_MODELS,
    GateFile,
    calibrate,
    check_kinds,
    prediction_factor,
)
from stitchsim.errors import JobError, StitchsimError, UsageError, WaitTimeout
from stitchsim.models import Report, Spec

if TYPE_CHECKING:
    from stitchsim.sdk.aclient import AsyncClient, AsyncJob
    from stitchsim.sdk.client import Client
    from stitchsim.sdk.core import ModelLike
    from stitchsim.sdk.job import Job

Waiter = Callable[["Job"], Report]


class CalibrationFailed(StitchsimError):
    """Some benign checks did not give a report: each is named; no gate was made. Whose
    fault it is follows the first such failure's code."""


def calibrate_gate(client: Client, reference: ModelLike, benign: Sequence[ModelLike], *,
                   spec: Spec | Mapping[str, Any] | None = None,
                   false_alarm_rate: float = DEFAULT_FALSE_ALARM_RATE,
                   gate: Sequence[str] | None = None, wait: Waiter | None = None,
                   **fields: Any) -> GateFile:
    names = _names(benign, false_alarm_rate, gate)
    waiter: Waiter = wait or (lambda job: job.wait())
    failed: dict[str, StitchsimError] = {}
    reports: list[Report] = []
    first = _start(client, reference, benign[0], spec, fields, names[0], failed)
    jobs = [first]
    if first is not None:
        _finish(first, waiter, names[0], failed, reports)
    for model, name in zip(benign[1:], names[1:], strict=True):
        jobs.append(_start(client, reference, model, spec, fields, name, failed))
    for job, name in zip(jobs[1:], names[1:], strict=True):
        if job is not None:
            _finish(job, waiter, name, failed, reports)
    if failed:
        raise _failure(failed)
    return calibrate(reports, false_alarm_rate=false_alarm_rate, gate=gate, given_as=names)


async def acalibrate_gate(client: AsyncClient, reference: ModelLike,
                          benign: Sequence[ModelLike], *,
                          spec: Spec | Mapping[str, Any] | None = None,
                          false_alarm_rate: float = DEFAULT_FALSE_ALARM_RATE,
                          gate: Sequence[str] | None = None, **fields: Any) -> GateFile:
    """calibrate_gate, awaited: the first check alone, the others waited for together."""
    names = _names(benign, false_alarm_rate, gate)
    failed: dict[str, StitchsimError] = {}
    jobs: list[AsyncJob | None] = []
    reports: dict[str, Report] = {}
    for i, (model, name) in enumerate(zip(benign, names, strict=True)):
        try:
            jobs.append(await client.compare(reference, model, spec=spec, **fields))
        except UsageError as exc:
            failed[name] = exc
            jobs.append(None)
        if i == 0 and jobs[0] is not None:
            await _await_one(jobs[0], name, failed, reports)
    waits = [_await_one(job, name, failed, reports)
             for job, name in zip(jobs[1:], names[1:], strict=True) if job is not None]
    await asyncio.gather(*waits)
    if failed:
        raise _failure(failed)
    # In the order given, whichever check finished first.
    return calibrate([reports[n] for n in names], false_alarm_rate=false_alarm_rate,
                     gate=gate, given_as=names)


async def _await_one(job: AsyncJob, name: str, failed: dict[str, StitchsimError],
                     reports: dict[str, Report]) -> None:
    try:
        reports[name] = await job.wait()
    except WaitTimeout:
        raise
    except JobError as exc:
        failed[name] = exc


def _names(benign: Sequence[ModelLike], false_alarm_rate: float,
           gate: Sequence[str] | None) -> list[str]:
    """How each benign model is named, once the request is known to be one that can make a
    gate (checked before any check runs: count, rate, scipy, figure kinds)."""
    if len(benign) < MIN_MODELS:
        raise UsageError(f"calibrate needs at least {MIN_MODELS} benign retrains, got "
                         f"{len(benign)}: train more with other seeds (8 or more advised)")
    if not 0.0 < false_alarm_rate < 0.5:
        raise UsageError(f"false_alarm_rate must be in (0, 0.5), got {false_alarm_rate}")
    prediction_factor(MIN_MODELS, false_alarm_rate)  # scipy is there
    check_kinds(gate)
    return [_name(b) for b in benign]


def _name(model: ModelLike) -> str:
    if isinstance(model, Mapping):
        return str(model.get("checkpoint"))
    return str(getattr(model, "checkpoint", model))


def _start(client: Client, reference: ModelLike, model: ModelLike,
           spec: Spec | Mapping[str, Any] | None, fields: dict[str, Any], name: str,
           failed: dict[str, StitchsimError]) -> Job | None:
    try:
        return client.compare(reference, model, spec=spec, **fields)
    except UsageError as exc:  # a file that does not load: named with the others
        failed[name] = exc
        return None


def _finish(job: Job, waiter: Waiter, name: str, failed: dict[str, StitchsimError],
            reports: list[Report]) -> None:
    try:
        reports.append(waiter(job))
    except WaitTimeout:
        raise
    except JobError as exc:
        failed[name] = exc


def _failure(failed: dict[str, StitchsimError]) -> CalibrationFailed:
    listed = "; ".join(f"{name}: {exc.message}" for name, exc in failed.items())
    worst = next((e for e in failed.values() if not e.is_user_error), None)
    code = (worst or next(iter(failed.values()))).code
    return CalibrationFailed(f"{len(failed)} benign check(s) gave no report, so no gate was "
                             f"written: {listed}", code=code)
