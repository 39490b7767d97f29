"""Step sizes left to the input resolution (issue 36) in the spec and the report: null means
"from the input size", a stored spec or report of before reads back as it ran, and a CI
baseline of before still compares at 32 px."""

from __future__ import annotations

import json
from typing import Any

from stitchsim.method import method_settings, planned_differences
from stitchsim.models import Report, Spec
from stitchsim.view import iri_method

from tests.report.sample import make_sample_report

MODELS = {"front": {"checkpoint": "sha256:" + "a" * 64},
          "back": {"checkpoint": "sha256:" + "b" * 64}}
# How the releases before presets by resolution stored a default spec's sections: every
# field explicit, the 32 px steps at every size.
OLD_IRI = json.loads(
    '{"method": "paper", "steps": 200, "step_size": 0.00392156862745098, "momentum": 0.0, '
    '"schedule": "constant", "cycle_steps": 200, "extra_rounds": 10, "extra_round_steps": 100, '
    '"extra_round_growth": 1, "stop_below": null, "iterate": "last", "linf": null, '
    '"extra_rounds_stop_at_aim": false, "fast_kernels": true, "seed": 0, "batch_size": 256, '
    '"converged_below": 0.25, "accept_unconverged": false, "precision": "fp32"}')
OLD_ADVERSARIAL = json.loads(
    '{"epsilon": 0.03137254901960784, "step_size": 0.00784313725490196, "steps": 10, '
    '"random_start": false, "alpha": 1.0, "alphas": null, "evaluate": true, '
    '"attack": "autoattack_paper", "eval_steps": null, "eval_epsilon": null, '
    '"eval_step_size": null, "seed": 0}')


def _spec(**fields: Any) -> Spec:
    return Spec.model_validate({**MODELS, "protocols": ["invariance_aware", "adversarial"],
                                **fields})


def test_unset_steps_stay_null_through_json_and_resolve_per_preset() -> None:
    s = _spec(adversarial={"evaluate": True})
    assert (s.iri.step_size, s.adversarial.epsilon, s.adversarial.step_size) == (
        None, None, None)
    # The gateway stores the spec as JSON and the worker reads it back: still "from the size".
    assert Spec.model_validate_json(s.model_dump_json()) == s
    low, high = s.at("low"), s.at("high")
    assert (low.iri.step_size, low.adversarial.epsilon, low.adversarial.step_size) == (
        1 / 255, 8 / 255, 2 / 255)
    assert [round(v * 255, 2) for v in (high.iri.step_size, high.adversarial.epsilon,
                                        high.adversarial.step_size)] == [5.38, 4.30, 1.08]
    # The robust evaluation follows the training's values unless the spec sets its own.
    assert (high.adversarial.attack_epsilon(), high.adversarial.attack_step_size()) == (
        high.adversarial.epsilon, high.adversarial.step_size)
    # fast keeps its own step at every size.
    fast = _spec(iri={"method": "fast"})
    assert fast.iri.step_size == fast.at("high").iri.step_size == 32 / 255


def test_a_stored_spec_of_before_keeps_the_steps_it_ran_with() -> None:
    old = _spec(iri=OLD_IRI, adversarial=OLD_ADVERSARIAL)
    assert old.at("high") == old  # explicit values win at every size
    # At 32 px a new spec runs what the old one did: a baseline of before still compares.
    new = _spec(adversarial={"evaluate": True})
    assert method_settings(new.at("low")) == method_settings(old)
    assert planned_differences(method_settings(old), method_settings(new)) == []
    moved = method_settings(_spec(adversarial={"evaluate": True}, iri={"steps": 300}))
    assert planned_differences(method_settings(old), moved) == [
        "iri.steps: baseline 200, this check 300"]
    # A step the spec sets is compared before the run: null is the only "not yet known".
    pinned = method_settings(_spec(adversarial={"evaluate": True}, iri={"step_size": 2 / 255}))
    assert planned_differences(method_settings(old), pinned) == [
        f"iri.step_size: baseline {1 / 255}, this check {2 / 255}"]


def test_a_stored_report_of_before_reads_as_it_ran() -> None:
    report = make_sample_report()
    data = json.loads(report.model_dump_json())
    data.pop("resolution")
    data.pop("adversarial_settings")
    data["spec"]["iri"] = OLD_IRI
    data["spec"]["adversarial"] = OLD_ADVERSARIAL
    data["iri_settings"] = OLD_IRI
    old = Report.model_validate(data)
    # Every job before presets by resolution ran the 32 px values.
    assert old.resolution == "low" and old.adversarial_settings is None
    assert old.iri_settings is not None and old.iri_settings.step_size == 1 / 255
    assert iri_method(old) == "paper (the paper's code)"
    # And a report of now round-trips with what ran.
    new = report.model_copy(update={"resolution": "high",
                                    "iri_settings": report.spec.iri.at("high"),
                                    "adversarial_settings": report.spec.adversarial.at("high")})
    back = Report.model_validate_json(new.model_dump_json())
    assert back == new and iri_method(back) == "paper (the paper's code)"
