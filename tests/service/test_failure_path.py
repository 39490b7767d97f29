"""One failure type (issue 27): the contract's Failure goes through the check task's answer, the
job table and the gateway's answer, and the client raises it again, code, message and details
as they were; an attempt ends with a typed outcome. In process: a job table on SQLite, the
gateway's error mapping on its own, no servers."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from stitchsim.errors import APIError, InvalidRequest, JobFailed
from stitchsim.failure import Failure
from stitchsim_service.core import jobs
from stitchsim_service.core.context import Context
from stitchsim_service.core.queue import CheckOutcome
from stitchsim_service.core.settings import Settings
from stitchsim_service.gateway.errors import answer

FAILURE = Failure("weights_mismatch", "front: checkpoint does not fit test_resnet {}: missing "
                  "keys fc.weight", {"missing": ["fc.weight"], "unexpected": []})
SPEC = json.dumps({"front": {"checkpoint": "sha256:" + "a" * 64},
                   "back": {"checkpoint": "sha256:" + "b" * 64}})


@pytest.fixture
def ctx(tmp_path: Path) -> Context:
    return Context.open(Settings(data_dir=tmp_path))


def _claimed(ctx: Context) -> jobs.Claim:
    row, _ = jobs.insert_job(ctx, "owner", SPEC, idempotency_key=None, request_hash="h",
                             grants=[])
    claim = jobs.claim(ctx, row.id, "worker-1")
    assert claim is not None
    return claim


def test_a_failed_attempt_is_stored_and_raised_by_the_client_as_it_was(ctx: Context) -> None:
    claim = _claimed(ctx)
    assert jobs.finish(ctx, claim, jobs.Outcome.failed(FAILURE))
    status = jobs.to_status(jobs.get_job(ctx, "owner", claim.job_id))
    assert status.state == "failed" and status.progress.stage == "failed"
    raised = JobFailed(claim.job_id, status.error, status)
    assert raised.failure.as_dict() == FAILURE.as_dict()
    assert raised.code == "weights_mismatch" and raised.is_user_error


def test_a_succeeded_attempt_keeps_its_report_and_no_failure(ctx: Context) -> None:
    claim = _claimed(ctx)
    assert jobs.finish(ctx, claim, jobs.Outcome.succeeded("reports/x.json"))
    row = jobs.get_job(ctx, "owner", claim.job_id)
    assert (row.state, row.stage, row.report_key, row.error_code) == (
        "succeeded", "done", "reports/x.json", None)
    assert not jobs.finish(ctx, claim, jobs.CANCELLED)  # the attempt is over: nothing to do


def test_the_check_tasks_answer_is_the_failure_the_gateway_answers_and_the_client_raises(
) -> None:
    checked = CheckOutcome.answered({"failure": FAILURE.as_dict()})
    assert checked.checked and checked.failure is not None and checked.estimate is None
    response = answer(checked.failure)
    assert response.status_code == 422
    client_side = APIError.from_response(httpx.Response(422, content=response.body))
    assert isinstance(client_side, InvalidRequest) and isinstance(client_side, Failure)
    assert client_side.as_dict() == FAILURE.as_dict()
    estimate = CheckOutcome.answered({"estimate": {"units": 10, "seconds": 1.5}}).estimate
    assert estimate is not None and estimate.units == 10


def test_a_failure_without_an_http_status_is_a_logged_500_not_a_leak() -> None:
    response = answer(Failure("engine_error", "the engine failed during train: KeyError"))
    body = json.loads(response.body)
    assert response.status_code == 500 and body["error"]["code"] == "internal"
    assert "KeyError" not in body["error"]["message"]


def test_a_spec_error_reads_the_same_from_the_client_and_from_the_service() -> None:
    """One formatter (stitchsim.validation): the SDK's check before sending and the gateway's
    422 for the same spec give the same message, details and CLI line."""
    from stitchsim import Client
    from stitchsim.cli.exits import exit_code_for
    from stitchsim.errors import InvalidSpec
    from stitchsim_service.core.submit import assemble_spec

    spec = {**json.loads(SPEC), "train": {"epochs": 0}, "protocols": ["telepathy"]}
    with Client("http://127.0.0.1:9", retries=0) as client, pytest.raises(InvalidSpec) as local:
        client.submit(spec)  # refused before any request: nothing listens on port 9
    with pytest.raises(Failure) as refused:
        assemble_spec(spec, {})
    response = answer(refused.value)
    remote = APIError.from_response(httpx.Response(response.status_code, content=response.body))
    assert response.status_code == 422 and isinstance(remote, InvalidRequest)
    assert str(local.value) == str(remote) == (
        "invalid spec: protocols.0: Input should be 'standard', 'invariance_aware', "
        "'adversarial', 'iri_adversarial' or 'cross_task'; train.epochs: Input should be "
        "greater than or equal to 1 (invalid_spec)")
    assert local.value.details == remote.details and len(remote.details) == 2
    assert exit_code_for(local.value) == exit_code_for(remote) == 2
