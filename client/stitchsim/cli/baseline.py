"""`stitchsim check --baseline`: find the baseline report, check it compares, redo it if asked.

A baseline is a stored report JSON, a job id, or `self`: the reference checkpoint compared
with itself under this check's settings (the ceiling a candidate is measured against), reused
from an earlier job of this key by the hash of the checkpoint and the spec, or run once.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from stitchsim.cli.exits import log
from stitchsim.cli.output import wait_for
from stitchsim.config import Settings
from stitchsim.errors import NotFound, UsageError
from stitchsim.gates import (
    BaselineRefused,
    baseline_from_file,
    method_of,
    method_refusal,
    refuse_unless_comparable,
    subject_differences,
)
from stitchsim.method import method_settings, planned_differences
from stitchsim.models import Report, Spec
from stitchsim.sdk import Client, file_sha256
from stitchsim.sdk.client import ID_RE

SELF = "self"
_PLACEHOLDER = "sha256:" + "0" * 64


@dataclass
class Baseline:
    report: Report
    source: str
    """How messages name it: "file base.json", "job 1234", "self (job 1234)"."""


def reference_id(reference: str) -> str:
    """The checkpoint id a reference is stored under, without uploading it."""
    if ID_RE.match(reference):
        return reference
    path = Path(reference)
    if not path.is_file():
        raise UsageError(f"reference: {reference!r} is neither a file nor a sha256:<64 hex> id")
    return file_sha256(path)


def planned_settings(fields: dict[str, Any]) -> dict[str, Any]:
    """The method settings the check's job will run with (its spec, checkpoints aside)."""
    trial = {k: v for k, v in fields.items() if k not in ("dataset", "front_dataset")}
    for side in ("front", "back"):
        ref = fields.get(side)
        trial[side] = {**(ref if isinstance(ref, dict) else {}), "checkpoint": _PLACEHOLDER}
    try:
        return method_settings(Spec.model_validate(trial))
    except ValidationError:
        return {}  # the submission reports the spec's errors in full


def load(client: Client, name: str, reference: str, fields: dict[str, Any],
         args: argparse.Namespace, settings: Settings) -> Baseline:
    """The baseline report: a file, a job's report, or the reference's own (self)."""
    if name == SELF:
        return self_baseline(client, reference, fields, args, settings)
    path = Path(name)
    if path.is_file():
        try:
            report, vouched = baseline_from_file(path.read_text(encoding="utf-8"), f"file {name}")
        except BaselineRefused:
            raise
        except ValidationError as exc:
            raise UsageError.from_validation(f"--baseline: {name} is not a stitchsim report "
                                             "JSON", exc.errors()) from None
        except ValueError as exc:  # not JSON at all
            raise UsageError(f"--baseline: {name} is not a stitchsim report JSON "
                             f"({str(exc).splitlines()[0]})") from None
        if not vouched:
            log.warning("--baseline: %s carries no digest (a report of an older service): "
                        "an edit by hand cannot be told", name)
        return Baseline(report, f"file {name}")
    if path.suffix == ".json" or "/" in name:
        raise UsageError(f"--baseline: no such file {name}")
    try:
        return Baseline(client.job(name).report(), f"job {name}")
    except NotFound:
        raise UsageError(f"--baseline: {name!r} is neither a report file nor a job of this "
                         "key (nor 'self')") from None


def precheck(baseline: Baseline, reference: str, fields: dict[str, Any]) -> list[str]:
    """Refuse, before anything runs, a baseline of another reference or dataset; return the
    method settings that differ (empty: the baseline compares as far as the client knows)."""
    dataset = fields.get("dataset")
    known = dataset if isinstance(dataset, str) and (ID_RE.match(dataset) or not
                                                      Path(dataset).exists()) else None
    subject = subject_differences(baseline.report, reference, known)
    if subject:
        raise BaselineRefused(f"baseline {baseline.source} compares another model or dataset: "
                              + "; ".join(subject) + ". Use a baseline of this reference on "
                              "this dataset")
    current = planned_settings(fields)
    if not current:
        return []
    return planned_differences(method_of(baseline.report).settings, current)


def recompute(client: Client, baseline: Baseline, fields: dict[str, Any],
              args: argparse.Namespace, settings: Settings) -> Baseline:
    """The baseline's two models compared again under this check's settings."""
    old = baseline.report
    log.info("recomputing baseline %s under this check's settings", baseline.source)
    # The reference from its file where it is the same: uploaded again if it was deleted.
    front = args.reference if reference_id(args.reference) == old.front.checkpoint else (
        old.front.checkpoint)
    job = client.compare(front, old.back.checkpoint, spec=fields)
    report = wait_for(job, args, settings, cancel=not args.keep_running)
    log.info("recomputed baseline: job %s (pass --baseline %s to reuse it)", job.id, job.id)
    return Baseline(report, f"job {job.id} (recomputed from {baseline.source})")


def self_baseline(client: Client, reference: str, fields: dict[str, Any],
                  args: argparse.Namespace, settings: Settings) -> Baseline:
    """The reference compared with itself under this check's spec, reused by hash: the
    submission's Idempotency-Key is the hash of the reference and the spec, so the service
    answers a repeat with the job it already ran (keys are kept per API key)."""
    key = "stitchsim-self-" + hashlib.sha256(json.dumps(
        {"reference": reference, "spec": fields}, sort_keys=True, default=str
    ).encode()).hexdigest()[:48]
    # From its file where given: uploaded first if the service does not hold it yet.
    job = client.compare(args.reference, args.reference, spec=fields, idempotency_key=key)
    state = job.status().state
    if state in ("failed", "cancelled"):  # a run that did not finish is not reused
        log.info("baseline self: job %s was %s; comparing again", job.id, state)
        job = client.compare(args.reference, args.reference, spec=fields)
    elif state == "succeeded":
        log.info("baseline self: reusing job %s (the reference compared with itself)", job.id)
    else:
        log.info("baseline self: comparing the reference with itself (job %s)", job.id)
    report = wait_for(job, args, settings, cancel=not args.keep_running)
    return Baseline(report, f"self (job {job.id})")


def settle(client: Client, baseline: Baseline, report: Report, fields: dict[str, Any],
           args: argparse.Namespace, settings: Settings) -> Baseline:
    """The baseline the new report is gated against: refused unless it compares; redone
    under the report's settings with --recompute-baseline (always for self, which means the
    reference under this check's method)."""
    try:
        refuse_unless_comparable(baseline.report, report, baseline.source)
        return baseline
    except BaselineRefused as exc:
        differs_in_method = method_of(baseline.report) != method_of(report)
        if not differs_in_method or not (args.recompute_baseline or args.baseline == SELF):
            raise
        log.info("%s", exc)
    again = recompute(client, baseline, fields, args, settings)
    refuse_unless_comparable(again.report, report, again.source)
    return again


def refuse_early(baseline: Baseline, differing: list[str]) -> None:
    raise BaselineRefused(method_refusal(baseline.source, differing))
