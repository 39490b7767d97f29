"""The robust evaluation's attacks (issue 26): our compact APGD (Croce & Hein 2020) against
torchattacks' APGD, a well-kept implementation of the same algorithm, on a tiny model."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from stitchsim import catalogue
from stitchsim.models import AdversarialSettings
from stitchsim_worker.engine.data.datasets import builtin
from stitchsim_worker.engine.protocols.attacks import ATTACKS, apgd

torchattacks = pytest.importorskip("torchattacks", reason="the test extra installs torchattacks")

EPS = 8 / 255


@pytest.fixture(scope="module")
def tiny() -> tuple[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor]:
    """An MLP on the digits (a few seconds): at 8/255 the attacks fool it on part of the test
    inputs only, so a weaker attack shows."""
    torch.manual_seed(0)
    ds = builtin("digits_digit_only")
    net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.Adam(net.parameters(), 1e-3)
    for _ in range(60):
        loss = F.cross_entropy(net(ds.train.images), ds.train.labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    x, y = ds.test.images[:200], ds.test.labels[:200]
    with torch.no_grad():
        right = net(x).argmax(1) == y
    assert right.float().mean() > 0.9
    return net, x, y, right


def success(net: nn.Module, x_adv: torch.Tensor, y: torch.Tensor, right: torch.Tensor) -> float:
    """The share of the inputs the model got right that the attack makes it get wrong."""
    with torch.no_grad():
        wrong = net(x_adv).argmax(1) != y
    return float((wrong & right).sum() / right.sum())


@pytest.mark.parametrize("loss", ["ce", "dlr"])
def test_our_apgd_fools_as_often_as_torchattacks_and_far_more_than_noise(tiny, loss: str) -> None:
    net, x, y, right = tiny
    theirs = torchattacks.APGD(net, eps=EPS, steps=10, loss=loss, seed=0)(x, y)
    ours, fooled = apgd(net, x, y, eps=EPS, steps=10, loss=loss,
                        generator=torch.Generator().manual_seed(0))
    ours_rate, theirs_rate = success(net, ours, y, right), success(net, theirs, y, right)
    # A broken attack: a random corner of the same ball (no gradient).
    noise = (x + EPS * torch.randn(x.shape, generator=torch.Generator().manual_seed(0)).sign())
    noise_rate = success(net, noise.clamp(0, 1), y, right)
    assert abs(ours_rate - theirs_rate) <= 0.05, (ours_rate, theirs_rate)
    assert ours_rate >= noise_rate + 0.3, (ours_rate, noise_rate)
    assert (ours - x).abs().max() <= EPS + 1e-6 and ours.min() >= 0 and ours.max() <= 1
    with torch.no_grad():
        assert torch.equal(fooled, net(ours).argmax(1) != y)


def test_the_registered_attacks_are_the_catalogues_and_apgd_is_the_default() -> None:
    assert list(ATTACKS) == list(catalogue.ATTACKS.names)
    assert catalogue.ATTACKS.one(default=True) == "apgd"


def test_apgd_ce_then_dlr_fools_at_least_as_often_as_either_and_as_pgd(tiny) -> None:
    net, x, y, right = tiny
    settings = AdversarialSettings(epsilon=EPS, eval_steps=10)
    both = success(net, ATTACKS["apgd"].run(net, x, y, settings, torch.Generator()), y, right)
    ce = success(net, apgd(net, x, y, eps=EPS, steps=10, loss="ce",
                           generator=torch.Generator())[0], y, right)
    pgd = success(net, ATTACKS["pgd"].run(net, x, y, settings, torch.Generator()), y, right)
    assert both >= ce - 1e-9 and both >= pgd - 0.02, (both, ce, pgd)


@pytest.mark.parametrize(("adversarial", "words"), [
    ({"alpha": 1.5}, "adversarial.alpha: Input should be less than or equal to 1"),
    ({"alphas": [0, 2]}, "adversarial.alphas.1: Input should be less than or equal to 1"),
    ({"alphas": [1, 1]}, "adversarial.alphas: Value error, values must not repeat"),
    ({"attack": "fgsm"}, "adversarial.attack: Input should be " + " or ".join(
        repr(n) for n in catalogue.ATTACKS.names)),
])
def test_bad_alphas_and_attacks_are_refused_naming_the_field(adversarial, words: str) -> None:
    # What the service answers with a 422 (tests/service/test_bad_inputs.py holds the status).
    from pydantic import ValidationError
    from stitchsim.models import Spec
    from stitchsim_service.core.errors import validation_error

    body = {"front": {"checkpoint": {"path": "a"}}, "back": {"checkpoint": {"path": "b"}},
            "adversarial": adversarial}
    with pytest.raises(ValidationError) as info:
        Spec.model_validate(body)
    failure = validation_error("invalid_spec", "invalid spec", list(info.value.errors()))
    assert failure.code == "invalid_spec" and words in failure.message, failure.message


def test_alpha_defaults_to_the_papers_stitching_value_and_alphas_run_in_order() -> None:
    settings = AdversarialSettings()
    assert settings.alpha == 1.0 and settings.alpha_list() == [1.0]
    assert settings.attack == "apgd" and settings.attack_steps() == 20
    assert AdversarialSettings(alphas=[1, 0]).alpha_list() == [0, 1]  # the last one headlines
    assert AdversarialSettings(attack="pgd").attack_steps() == 10
