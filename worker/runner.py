"""Running one job in a worker: claim it in the job table, run the engine with a heartbeat,
progress and cancel flag, store the report, record the outcome. Plain functions: the Celery
tasks in tasks.py only call these."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import threading
import time
import traceback
from collections.abc import Iterator
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from stitchsim.failure import Failure
from stitchsim.models import Progress, Spec
from stitchsim_service.core import jobs
from stitchsim_service.core.context import Context
from stitchsim_service.core.quotas import free_check_slot
from stitchsim_service.core.store import StoreError, object_key, report_key
from stitchsim_worker import soft_limit

log = logging.getLogger("stitchsim.worker")


def make_resources(ctx: Context, *, calibrated: bool = False) -> Any:
    """The engine's Resources for this service; `calibrated`: with the job workers' device
    calibration (the spec check prices the job with it)."""
    from stitchsim_worker.engine import Resources

    cache = ctx.settings.resolved_cache_dir
    cache.mkdir(parents=True, exist_ok=True)

    def resolve(kind: str) -> Any:
        def path(ref: str) -> Any:
            try:
                return ctx.store.local_path(object_key(kind, ref), cache)
            except (FileNotFoundError, ValueError):
                raise Failure("not_found", f"{kind[:-1]} {ref} is not in the store") from None
        return path

    from stitchsim_worker.reference_store import StoreEntries

    # Service jobs name stored objects only: a path in a spec must never reach the disk.
    # The reference's work lives in the store, so the next job against it on any worker
    # reads it (engine/core/refcache.py).
    max_bytes = ctx.settings.reference_cache_max_bytes
    return Resources(cache_dir=cache, checkpoint_path=resolve("checkpoints"),
                     reference_store=StoreEntries(ctx.store, cache, max_bytes),
                     reference_cache_max_bytes=max_bytes,
                     dataset_path=resolve("datasets"), allow_local_paths=False,
                     max_model_params=ctx.settings.max_model_params,
                     max_model_modules=ctx.settings.max_model_modules,
                     max_job_units=ctx.settings.max_job_units,
                     calibration=job_workers_calibration(ctx) if calibrated else None,
                     max_activation_bytes=ctx.settings.max_activation_bytes)


def job_workers_calibration(ctx: Context) -> Any:
    """The slowest calibration live job workers announced: a job may land on any of them.
    None when calibration is off or none announced one yet (the flat settings apply)."""
    if ctx.settings.calibration == "off":
        return None
    from stitchsim_service.core.queue import GPU_QUEUE
    from stitchsim_service.core.workers import calibrations
    from stitchsim_worker.calibration import Calibration, slowest

    found = []
    for doc in calibrations(ctx, GPU_QUEUE):
        try:
            found.append(Calibration.from_dict(doc))
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("a job worker's calibration is unreadable (%s): %.200s", exc, doc)
    return slowest(found)


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)


def _carried(failure: Failure) -> Failure:
    """The failure as JSON can carry it (the check task's result, the job table's columns)."""
    return Failure(failure.code, failure.message, _jsonable(failure.details))


def estimate_of(ctx: Context, units: int, expected: int,
                seconds_per_unit: float | None = None) -> dict[str, Any]:
    """A job's estimate as the contract's Estimate: its units (the budget, IRIs at their cap),
    and the seconds its expected units take at the calibrated rate (else the settings')."""
    spu = seconds_per_unit or ctx.settings.seconds_per_unit
    return {"units": units, "seconds": round(expected * spu, 1)}


@contextlib.contextmanager
def check_slot_held(ctx: Context, slot: str | None) -> Iterator[None]:
    """Frees the key's pending-check slot when the check task ends, however it ends: the
    gateway may have stopped waiting long before (service/core/submit.py pending_check)."""
    try:
        yield
    finally:
        if slot:
            try:
                with ctx.db.write() as session:
                    free_check_slot(session, slot)
            except Exception as exc:  # noqa: BLE001 - the slot's expiry frees it then
                log.warning("could not free pending-check slot %s: %s", slot, exc)


def _celery_interrupts() -> None:
    """Tell the engine that Celery's soft time limit stops a check or a job from outside: a
    build it interrupts is not the config's fault (models.guard)."""
    from stitchsim_worker.engine.core import errors

    if SoftTimeLimitExceeded not in errors.INTERRUPTS:
        errors.INTERRUPTS.append(SoftTimeLimitExceeded)


def _timed_out(ctx: Context, what: str) -> dict[str, Any]:
    """The check ran out of its own time: the spec's models are too slow to build (the queue's
    wait does not count: a task that waited too long expires unstarted). Not retried."""
    limit = ctx.settings.check_timeout_s
    return {"failure": Failure(
        "spec_check_timeout",
        f"{what} took longer than the spec check's {limit:g} s (STITCHSIM_CHECK_TIMEOUT_S): the "
        "models the spec's arch, arch_kwargs or config.json describe are too large or too slow "
        "to build; make them smaller (layer counts, widths, image_size). Sending it again "
        "takes as long", {"check_timeout_s": limit}).as_dict()}


def _in_time(ctx: Context, what: str, answer: dict[str, Any], fired: soft_limit.Fired,
             ) -> dict[str, Any]:
    """A check that failed after its soft limit fired ran out of time, whatever it raised."""
    return _timed_out(ctx, what) if fired.is_set and "failure" in answer else answer


def check_spec_doc(ctx: Context, spec_doc: dict[str, Any]) -> dict[str, Any]:
    """{"estimate": Estimate} when the spec can run; else {"failure": the engine's Failure as
    a dict}, which the gateway raises again as it is (service/core/queue.py CheckOutcome)."""
    with soft_limit.watched() as fired:
        answer = _check_spec_answer(ctx, spec_doc)
    return _in_time(ctx, "checking this spec", answer, fired)


def _check_spec_answer(ctx: Context, spec_doc: dict[str, Any]) -> dict[str, Any]:
    from stitchsim_worker.engine import check_spec

    _celery_interrupts()
    spec = Spec.model_validate(spec_doc)
    try:
        checked = check_spec(spec, resources=make_resources(ctx, calibrated=True))
    except Failure as failure:
        failure = _with_points_route(_with_estimate(ctx, failure), spec)
        return {"failure": _carried(failure).as_dict()}
    except SoftTimeLimitExceeded:
        return _timed_out(ctx, "checking this spec")
    except MemoryError:
        # The check's own address-space limit (STITCHSIM_CHECK_MEMORY_BYTES) stopped it: the
        # spec asks for more than the estimates caught, and far more than a job may use.
        limit = ctx.settings.check_memory_bytes
        return {"failure": Failure(
            "job_too_large", "checking this spec ran out of the spec check's memory limit "
            f"({limit:,} bytes, STITCHSIM_CHECK_MEMORY_BYTES); use smaller models, inputs or "
            "datasets", {"check_memory_bytes": limit}).as_dict()}
    except Exception as exc:  # a bug of ours, answered as one rather than as a busy checker
        log.exception("checking a spec failed")
        return {"failure": Failure("internal", "checking the spec failed unexpectedly "
                                   f"({type(exc).__name__}); it has been logged").as_dict()}
    return {"estimate": estimate_of(ctx, checked.units, checked.expected_units,
                                    checked.seconds_per_unit)}


POINT_CODES = ("unknown_layer", "unstitchable_point")


def _with_points_route(failure: Failure, spec: Spec) -> Failure:
    """A point the model does not have, with the route that lists the model's points (the
    engine knows no HTTP: it names the CLI, the service names its own route)."""
    details = failure.details
    if failure.code not in POINT_CODES or not isinstance(details, dict):
        return failure
    side = details.get("side")
    ref = getattr(spec, side).checkpoint if side in ("front", "back") else None
    if not isinstance(ref, str):
        return failure
    route = f"/checkpoints/{ref}/points"
    return Failure(failure.code, f"{failure.message}; GET {route} lists every stitch point "
                   f"of the {side} model with its shape", {**details, "points_route": route})


def stitch_points_doc(ctx: Context, checkpoint_id: str, ref: dict[str, Any]) -> dict[str, Any]:
    """GET /checkpoints/{id}/points, on a check worker: {"points": StitchPoints as a dict}, or
    {"failure": ...} as check_spec_doc answers. `ref` holds the ModelRef fields the caller set
    (arch, arch_kwargs, input_size)."""
    with soft_limit.watched() as fired:
        answer = _stitch_points_answer(ctx, checkpoint_id, ref)
    return _in_time(ctx, "listing this model's stitch points", answer, fired)


def _stitch_points_answer(ctx: Context, checkpoint_id: str, ref: dict[str, Any],
                          ) -> dict[str, Any]:
    from stitchsim.models import ModelRef
    from stitchsim_worker.engine.models.points import checkpoint_points

    _celery_interrupts()
    try:
        model_ref = ModelRef.model_validate({**ref, "checkpoint": checkpoint_id})
        path, _ = make_resources(ctx).checkpoint(checkpoint_id)
        listing = checkpoint_points(model_ref, path, limits=make_resources(ctx).build_limits)
    except Failure as failure:
        return {"failure": _carried(failure).as_dict()}
    except SoftTimeLimitExceeded:
        return _timed_out(ctx, "listing this model's stitch points")
    except MemoryError:
        return {"failure": Failure(
            "job_too_large", "listing this model's stitch points ran out of the spec check's "
            "memory limit (STITCHSIM_CHECK_MEMORY_BYTES); use a smaller model or input_size",
            {"check_memory_bytes": ctx.settings.check_memory_bytes}).as_dict()}
    except Exception as exc:  # a bug of ours, answered as one rather than as a busy checker
        log.exception("listing the stitch points of %s failed", checkpoint_id)
        return {"failure": Failure("internal", "listing the stitch points failed: "
                                   f"{type(exc).__name__}: {exc}").as_dict()}
    return {"points": {"checkpoint": checkpoint_id, **listing}}


def _with_estimate(ctx: Context, failure: Failure) -> Failure:
    """A job over the budget, with the seconds its units would take at this service's rate."""
    details = failure.details
    if failure.code != "job_too_large" or not isinstance(details, dict) or "units" not in details:
        return failure
    spu = details.get("seconds_per_unit") or ctx.settings.seconds_per_unit
    est = estimate_of(ctx, int(details["units"]),
                      int(details.get("expected_units", details["units"])), spu)
    return Failure(failure.code,
                   f"{failure.message} (estimate: about {est['seconds']:,.0f} s of worker time, "
                   f"at {spu:.3g} s a unit)",
                   {**details, "estimate": est})


class _Tracker:
    """Heartbeat thread + progress + cancel flag for one attempt."""

    def __init__(self, ctx: Context, claim: jobs.Claim):
        self.ctx = ctx
        self.claim = claim
        self.period = min(ctx.settings.heartbeat_s, 1.0)
        self._lock = threading.Lock()
        self._progress = Progress(stage="starting")
        self._dirty = True
        self._cancel = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stitchsim-heartbeat",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def progress(self, stage: str, done: int, total: int, eta_s: float | None) -> None:
        with self._lock:
            changed = stage != self._progress.stage
            self._progress = Progress(stage=stage, done=done, total=total, eta_s=eta_s)
            self._dirty = True
        if changed:
            self._flush()

    def should_cancel(self) -> bool:
        return self._cancel.is_set()

    def _flush(self) -> None:
        with self._lock:
            progress = self._progress if self._dirty else None
            self._dirty = False
        try:
            if jobs.heartbeat(self.ctx, self.claim, progress):
                self._cancel.set()
        except Exception as exc:  # a busy table must not kill the job; the next beat retries
            log.warning("heartbeat of job %s failed: %s", self.claim.job_id, exc)
            with self._lock:
                self._dirty = True

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self._flush()


def _claim(ctx: Context, job_id: str, worker: str) -> jobs.Claim | None:
    # A job that shows a fresh heartbeat is either run by a live duplicate, or its previous
    # attempt died a moment ago (a killed pool child is requeued at once). Waiting a few
    # heartbeat periods tells the two apart.
    deadline = time.monotonic() + 3 * ctx.settings.heartbeat_s + 2
    while True:
        try:
            return jobs.claim(ctx, job_id, worker)
        except jobs.Busy:
            if time.monotonic() > deadline:
                log.info("job %s is running elsewhere; dropping this delivery", job_id)
                return None
            time.sleep(min(ctx.settings.heartbeat_s / 2, 1.0))


def execute_job(ctx: Context, job_id: str, worker: str) -> str:
    """Run one job to an outcome; returns the state recorded (or why nothing ran)."""
    claim = _claim(ctx, job_id, worker)
    if claim is None:
        return "skipped"
    log.info("job %s: attempt %d on %s", job_id, claim.attempt, worker)
    tracker = _Tracker(ctx, claim)
    tracker.start()
    try:
        outcome = _run_engine(ctx, claim, tracker)
    finally:
        tracker.stop()
    if outcome.state == "failed" and tracker.should_cancel():
        # The user asked to stop and it stopped: whatever the interrupted stage raised on its
        # way out, the job ends as the user meant it to.
        code = outcome.failure.code if outcome.failure else None
        log.info("job %s: cancelled (stopped with %s)", job_id, code)
        outcome = jobs.CANCELLED
    if not jobs.finish(ctx, claim, outcome):
        log.warning("job %s: attempt %d was superseded; outcome %s dropped", job_id,
                    claim.attempt, outcome.state)
        return "superseded"
    log.info("job %s: %s", job_id, outcome.state)
    return outcome.state


def _run_engine(ctx: Context, claim: jobs.Claim, tracker: _Tracker) -> jobs.Outcome:
    with soft_limit.watched() as fired:
        outcome = _engine_outcome(ctx, claim, tracker)
    if fired.is_set and outcome.state == "failed":
        # Told to stop, it failed: whatever the interrupted code raised on its way out (a
        # library may swallow the interrupt and fail with an error of its own).
        return jobs.Outcome.failed(_time_limit_failure(ctx))
    return outcome


def _engine_outcome(ctx: Context, claim: jobs.Claim, tracker: _Tracker) -> jobs.Outcome:
    try:
        from stitchsim_worker.engine import JobCancelled, run_job
    except Exception as exc:
        # A time limit can run out while the engine (torch) is still being imported.
        known = _host_failure(ctx, exc)
        if known is not None:
            return jobs.Outcome.failed(known)
        log.exception("the engine cannot be imported")
        return jobs.Outcome.failed(Failure(
            "worker_broken", f"the worker cannot load its compute engine: {exc}"))
    _celery_interrupts()  # a job's build that runs out of time is not the config's fault
    try:
        spec = Spec.model_validate_json(claim.spec_json)
        if tracker.should_cancel():
            raise JobCancelled()
        report = run_job(spec, resources=make_resources(ctx), progress=tracker.progress,
                         should_cancel=tracker.should_cancel, job_id=claim.job_id)
        key = report_key(claim.job_id)
        ctx.store.put_bytes(key, report.model_dump_json().encode("utf-8"))
        return jobs.Outcome.succeeded(key)
    except JobCancelled:
        return jobs.CANCELLED
    except StoreError as exc:
        # Not succeeded without a report; not requeued either, since a full or read-only store
        # needs an operator, and every attempt would burn a GPU for nothing until then.
        return jobs.Outcome.failed(Failure(
            "store_unavailable", f"the job could not use the blob store: {exc.message}; "
            "resubmit the job once the store is fixed"))
    except Failure as failure:  # the engine's, as it raised it
        # An engine_error wraps what the engine did not expect; a time limit or memory that
        # ran out on the way is the host's doing, not a bug (its cause says which).
        known = _host_failure(ctx, failure.__cause__) if failure.__cause__ else None
        return jobs.Outcome.failed(known or _carried(failure))
    except Exception as exc:
        known = _host_failure(ctx, exc)
        if known is not None:
            return jobs.Outcome.failed(known)
        log.error("job %s failed:\n%s", claim.job_id, traceback.format_exc())
        return jobs.Outcome.failed(Failure(
            "engine_error", f"the engine failed unexpectedly: {type(exc).__name__}: {exc}"))


# torch's CPU allocator raises a plain RuntimeError when malloc fails (its CUDA one raises
# torch.OutOfMemoryError), and a process short of address space fails elsewhere too: C++'s
# bad_alloc, a lazily imported shared object that cannot be mapped (ImportError with ENOMEM's
# "Cannot allocate memory", or dlopen's "failed to map segment"). These phrases name memory
# and nothing else.
_OUT_OF_MEMORY_PHRASES = ("allocate memory", "bad_alloc", "not enough memory", "out of memory",
                          "failed to map segment")


def _says_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError) or getattr(exc, "errno", None) == errno.ENOMEM:
        return True
    text = str(exc).lower()
    return any(phrase in text for phrase in _OUT_OF_MEMORY_PHRASES)


def _time_limit_failure(ctx: Context) -> Failure:
    # The soft limit is what fired (the hard one, STITCHSIM_JOB_TIME_LIMIT_S, kills the
    # process without a word): name the time the job actually had.
    from stitchsim_service.core.queue import soft_time_limit_s

    limit = soft_time_limit_s(ctx.settings)
    return Failure("time_limit", f"the job ran past its time limit of {limit} s "
                   "(STITCHSIM_JOB_TIME_LIMIT_S less a 30 s margin to stop cleanly); "
                   "ask for fewer stitch points, epochs or IRI steps")


def _host_failure(ctx: Context, exc: BaseException) -> Failure | None:
    """The failure of a job stopped by its host, not by a bug: the time limit ran out, or
    memory did. The whole chain of causes is read (the engine keeps what it wrapped as the
    cause). None: something else."""
    seen: BaseException | None = exc
    for _ in range(16):  # a chain of causes, bounded
        if seen is None:
            break
        if isinstance(seen, SoftTimeLimitExceeded):
            return _time_limit_failure(ctx)
        if type(seen).__name__ == "OutOfMemoryError":  # torch's, without importing torch here
            return Failure("out_of_memory", "the GPU ran out of memory; use a smaller batch "
                           "size or fewer stitch points")
        if _says_out_of_memory(seen):
            return Failure("out_of_memory", "the worker ran out of memory; use a smaller "
                           "batch size, fewer samples or fewer stitch points")
        seen = seen.__cause__
    return None
