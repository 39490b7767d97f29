"""One client error family: every exception the SDK raises is a Failure with a code of the
registry, reads `MESSAGE (CODE)`, and pydantic's errors have one formatter."""

from __future__ import annotations

import inspect

import pytest
import stitchsim
from pydantic import ValidationError
from stitchsim import codes, errors, gates
from stitchsim.failure import Failure
from stitchsim.models import ErrorInfo, Spec
from stitchsim.validation import field_errors, summary, validation_failure

BASE = {"front": {"checkpoint": "sha256:" + "a" * 64},
        "back": {"checkpoint": "sha256:" + "b" * 64}}


def _sdk_exception_classes() -> set[type[BaseException]]:
    """Every exception class the client's error module defines or the package exports, and
    the gates' refusal."""
    found = {obj for _, obj in inspect.getmembers(errors, inspect.isclass)
             if issubclass(obj, BaseException) and obj.__module__ == errors.__name__}
    found |= {getattr(stitchsim, name) for name in stitchsim.__all__
              if inspect.isclass(getattr(stitchsim, name))
              and issubclass(getattr(stitchsim, name), BaseException)}
    return found | {gates.BaselineRefused}


def test_every_sdk_exception_class_is_a_failure_with_a_registered_code() -> None:
    classes = _sdk_exception_classes()
    assert len(classes) == 21  # 19 in stitchsim.errors, BaselineRefused, and Failure itself
    for cls in classes - {Failure}:
        assert issubclass(cls, errors.StitchsimError) and issubclass(cls, Failure), cls
        assert cls.code in codes.CODES, (cls, cls.code)


# One instance of each, as the SDK raises it: (exception, its code, CLI exit by the registry).
RAISED = [
    (errors.UsageError("--url: not a URL"), "invalid_usage", True),
    (errors.InvalidSpec("invalid spec: x: y"), "invalid_spec", True),
    (errors.InvalidFile("a.pt: a pickle", code="unsupported_format"), "unsupported_format", True),
    (errors.DatasetSourceError("d/: no images"), "invalid_dataset_source", True),
    (errors.MissingExtra("pip install 'stitchsim[data]'"), "missing_extra", True),
    (gates.BaselineRefused("baseline b.json was edited"), "baseline_refused", True),
    (errors.ConnectionFailed("cannot reach", "http://x"), "connection_failed", False),
    (errors.JobCancelled("job j was cancelled", "j"), "cancelled", False),
    (errors.WaitTimeout("job j still running", "j"), "wait_timeout", False),
    (errors.JobFailed("j", ErrorInfo(code="weights_mismatch", message="fc does not fit")),
     "weights_mismatch", True),
    (errors.NotFound("no job j", status_code=404, code="not_found"), "not_found", True),
    (errors.StitchsimError("stored under another id", code="upload_mismatch"),
     "upload_mismatch", False),
]


@pytest.mark.parametrize(("exc", "code", "user_fault"), RAISED,
                         ids=[type(e).__name__ for e, _, _ in RAISED])
def test_each_raised_error_carries_its_registered_code_and_reads_message_then_code(
        exc: errors.StitchsimError, code: str, user_fault: bool) -> None:
    assert isinstance(exc, Failure) and exc.code == code and exc.entry is not None
    assert exc.is_user_error is user_fault is exc.entry.user_fault
    assert str(exc) == exc.line() == f"{exc.message} ({code})"
    assert exc.as_dict() == {"code": code, "message": exc.message, "details": None}


def test_job_failed_is_the_jobs_failure_not_a_wrapper() -> None:
    details = {"missing": ["fc.weight"]}
    failed = errors.JobFailed("j1", ErrorInfo(code="weights_mismatch",
                                              message="front: fc does not fit", details=details))
    assert isinstance(failed, Failure)
    assert (failed.code, failed.details, failed.reason) == (
        "weights_mismatch", details, "front: fc does not fit")
    assert failed.message == "job j1 failed: front: fc does not fit"
    assert str(failed) == "job j1 failed: front: fc does not fit (weights_mismatch)"
    assert failed.failure.as_dict() == {"code": "weights_mismatch",
                                        "message": "front: fc does not fit", "details": details}
    # A code this version does not know: the service's fault, and a rerun may cure it.
    unknown = errors.JobFailed("j2", ErrorInfo(code="from_the_future", message="?"))
    assert unknown.is_user_error is False and unknown.retryable is True
    assert errors.JobFailed("j3", None).code == "internal"


def test_a_nested_spec_error_has_one_shape_and_every_field_in_details() -> None:
    bad = {**BASE, "train": {"epochs": 0}, "iri": {"steps": -1}, "threshold": 2,
           "adversarial": {"alphas": [-0.5, 1]}, "objectives": ["nope"],
           "layers": [{"front": "layer1", "back": 3}]}
    with pytest.raises(ValidationError) as refused:
        Spec.model_validate(bad)
    failure = validation_failure("invalid_spec", "invalid spec", refused.value.errors())
    fields = {d["field"]: d for d in failure.details}
    assert len(failure.details) == 7
    assert fields["train.epochs"] == {"field": "train.epochs", "type": "greater_than_equal",
                                      "message": "Input should be greater than or equal to 1"}
    assert fields["adversarial.alphas.0"]["type"] == "greater_than_equal"
    assert fields["layers.list[LayerPair].0.back"]["message"] == "Input should be a valid string"
    assert failure.message == (
        "invalid spec: layers.list[LayerPair].0.back: Input should be a valid string; "
        "layers.literal['auto']: Input should be 'auto'; objectives.0: Input should be 'hlm', "
        "'slm', 'dm' or 'fula'; train.epochs: Input should be greater than or equal to 1; "
        "iri.steps: Input should be greater than or equal to 1 (and 2 more)")
    # The client's InvalidSpec for the same errors: the same words, the same details.
    local = errors.InvalidSpec.from_validation("invalid spec", refused.value.errors())
    assert (local.code, local.message, local.details) == (
        failure.code, failure.message, failure.details)


def test_the_formatter_names_whole_object_errors_and_drops_fastapis_body() -> None:
    fields = field_errors([{"loc": ("body", "train", "epochs"), "msg": "too few", "type": "t"},
                           {"loc": (), "msg": "front and back differ", "type": "value_error"}])
    assert [f["field"] for f in fields] == ["train.epochs", ""]
    assert summary(fields) == "train.epochs: too few; front and back differ"
