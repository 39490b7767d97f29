"""Adversarial stitching's science (issue 51): what the protocols change, asserted on real small
pairs. Under alpha 1 the stitch trains on batches moved off the clean ones, inside the attack's
epsilon, against the stitched model; the stitch so trained holds its agreement with the back
model under attack better than the clean (alpha 0) stitch of the same pair and seed; and the
IRI x adversarial arm attacks IRIs, not the training images, so it shows the invariance-aware
protocol's drop where the arm on real inputs does not.

The attack is lighter than the paper's (epsilon 4/255, PGD-5 in training and in the
evaluation): at 8/255 the front model, which no stitch makes robust, is fooled on nine
inputs in ten whatever T does (measured into the second seed at layer4, PGD-10: robust
agreement 0.14 at alpha 0 and 0.20 at alpha 1), so the arms differ by little; at 4/255 they
stand apart. T trains with batches
of 32 at lr 0.01: from its least-squares start it needs some Adam steps for the attack to
change it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from stitchsim.models import Report
from stitchsim_worker.engine.core.context import Cut, JobContext
from stitchsim_worker.engine.models.cutting import BackPart
from stitchsim_worker.engine.protocols import PROTOCOL_IMPLS, stitched
from stitchsim_worker.engine.stitching.layer import StitchLayer
from stitchsim_worker.engine.stitching.train import Augment, Batch

from tests.engine.jobs import FAST_IA, FAST_IRI, layers, rows, run, shared_cache, spec

EPSILON = 4 / 255
ATTACK = {"evaluate": True, "alphas": [0, 1], "epsilon": EPSILON, "step_size": 1 / 255,
          "steps": 5, "attack": "pgd", "eval_steps": 5}
TRAIN = {"epochs": 3, "max_train_samples": 192, "max_test_samples": 150, "batch_size": 32,
         "lr": 0.01}
# Two architectures behind the same front: a second seed, and a ViT (a map-to-tokens stitch).
PAIRS = {"resnet_seed": ("digits_resnet_b", "layer4"), "resnet_to_vit": ("digits_vit", "blocks.5")}


@dataclass(frozen=True)
class Attacked:
    """One training batch as the augment got it and as it gave it back to the stitch."""

    alpha: float
    linf: torch.Tensor  # per sample: max |x_adv - x| in [0,1] pixels
    view_error: float  # d(the batch's front view, f<=i(its pixels)): recomputed on x_adv?
    back_moved: float  # max |g(x_adv) - g(x)|: the back model's targets recomputed
    loss_clean: float  # the stitched model's cross-entropy on the clean batch
    loss_attacked: float  # ... and on the batch it trains on


def _distance(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


AugmentFactory = Callable[[JobContext, Cut, list[str], float], Augment]


def _recording(make: AugmentFactory, seen: list[Attacked]) -> AugmentFactory:
    """The protocol's augment factory, with every batch it rewrites measured against the
    batch it was given."""

    def factory(ctx: JobContext, cut: Cut, points: list[str], alpha: float) -> Augment:
        augment = make(ctx, cut, points, alpha)
        front = cut.f.front(cut.i)

        def recorded(stitch: StitchLayer, back: BackPart, b: Batch) -> Batch:
            out = augment(stitch, back, b)
            assert b.pixels is not None and out.pixels is not None
            h = stitched(cut, stitch, back)
            with torch.no_grad():
                seen.append(Attacked(
                    alpha=alpha,
                    linf=(out.pixels - b.pixels).flatten(1).abs().amax(1).cpu(),
                    view_error=_distance(out.inputs, front(out.pixels)),
                    back_moved=float((out.back_logits - b.back_logits).abs().max()),
                    loss_clean=float(F.cross_entropy(h(b.pixels), b.labels)),
                    loss_attacked=float(F.cross_entropy(h(out.pixels), out.labels)),
                ))
            return out

        return recorded

    return factory


@dataclass
class Arms:
    report: Report
    seen: list[Attacked]


@pytest.fixture(scope="module")
def arms(ckpts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Arms]]:
    """Each pair stitched at alpha 0 and 1 in one job (one seed, the same for both arms),
    evaluated under attack, with the batches the adversarial stitch trained on measured."""
    impl = PROTOCOL_IMPLS["adversarial"]
    assert impl.augment is not None
    found = {}
    for name, (back, back_point) in PAIRS.items():
        seen: list[Attacked] = []
        with pytest.MonkeyPatch.context() as mp:
            mp.setitem(PROTOCOL_IMPLS, "adversarial",
                       dataclasses.replace(impl, augment=_recording(impl.augment, seen)))
            s = spec(ckpts.digits_resnet, getattr(ckpts, back), objectives=["slm"],
                     protocols=["adversarial"], layers=[{"front": "layer4", "back": back_point}],
                     train=TRAIN, adversarial=ATTACK)
            found[name] = Arms(run(s, tmp_path_factory.mktemp(name)), seen)
    yield found


@pytest.mark.parametrize("pair", list(PAIRS))
def test_the_adversarial_stitch_trains_on_batches_attacked_inside_epsilon(
    arms: dict[str, Arms], pair: str
) -> None:
    seen = arms[pair].seen
    # Every training batch of the alpha 1 arm went through the attack (3 epochs of 6
    # batches); the alpha 0 arm, the clean one, has no augment at all.
    assert len(seen) == TRAIN["epochs"] * TRAIN["max_train_samples"] // TRAIN["batch_size"]
    assert {a.alpha for a in seen} == {1.0}
    for n, a in enumerate(seen):
        # Every sample moved (alpha 1: the whole batch), none beyond epsilon in [0,1] pixels;
        # signed steps of 1/255 from the clean pixels reach the ball's edge (measured: on
        # every sample).
        assert float(a.linf.min()) > 0, (
            f"batch {n}: {int((a.linf == 0).sum())} of {len(a.linf)} samples left clean")
        assert float(a.linf.max()) <= EPSILON + 1e-6, (
            f"batch {n}: moved {float(a.linf.max()) * 255:.2f}/255, past epsilon 4/255")
        assert float(a.linf.median()) >= EPSILON * 0.99, (n, a.linf.tolist())
        # The stitch sees the front model's view of the attacked pixels, and is held to the
        # back model's answers on them, not on the clean ones.
        assert a.view_error < 1e-2, (n, a.view_error)
        assert a.back_moved > 0, n
        # Crafted against the stitched model: its loss rises on the batch it trains on
        # (measured: by 0.23 or more on every batch, from a clean loss of 0.6 at most).
        assert a.loss_attacked > a.loss_clean + 0.1, (n, a.loss_clean, a.loss_attacked)


@pytest.mark.parametrize("pair", list(PAIRS))
def test_the_adversarial_stitch_holds_its_agreement_under_attack_better_than_the_clean_one(
    arms: dict[str, Arms], pair: str
) -> None:
    report = arms[pair].report
    (clean,), (attacked,) = (rows(report, alpha=0.0), rows(report, alpha=1.0))
    assert clean.robust is not None and attacked.robust is not None
    assert clean.robust.epsilon == attacked.robust.epsilon == EPSILON
    # Measured (AVX-512): robust agreement 0.62 -> 0.78 into the second seed, 0.38 -> 0.55
    # into the ViT; the attack fools the stitched model on 34 % -> 20 %, 55 % -> 37 % of the
    # inputs it gets right.
    gain = attacked.robust.agreement - clean.robust.agreement
    figures = (f"robust agreement {clean.robust.agreement:.3f} at alpha 0, "
               f"{attacked.robust.agreement:.3f} at alpha 1; attack success "
               f"{clean.robust.success_rate:.3f}, {attacked.robust.success_rate:.3f}")
    assert gain >= 0.07, figures
    assert attacked.robust.success_rate <= clean.robust.success_rate - 0.05, figures
    # Not bought with its clean agreement (measured 0.965 -> 0.974, 0.849 -> 0.868).
    assert attacked.agreement >= clean.agreement - 0.03, (clean.agreement, attacked.agreement)


def test_the_iri_arm_attacks_iris_and_loses_what_the_real_input_arm_keeps(ckpts) -> None:
    # The shortcut pair (test_invariance.py): the marker model's IRIs carry the marker and no
    # digit, so a stitch trained on them, attacked or not, cannot follow the digit model; the
    # arm on real inputs can. Measured: 0.958 on real inputs, 0.130 on IRIs (IRIs on real
    # inputs instead: 0.958 and 0.958). PGD-3 of 3/255 keeps the attack's training cheap.
    seen: list[Attacked] = []
    impl = PROTOCOL_IMPLS["iri_adversarial"]
    assert impl.augment is not None
    s = spec(ckpts.marker_resnet, ckpts.digits_resnet, dataset="digits_marker",
             objectives=["slm"], protocols=["adversarial", "iri_adversarial"],
             layers=layers("layer4"), train={**FAST_IA, "epochs": 3}, iri=FAST_IRI,
             adversarial={"steps": 3, "step_size": 3 / 255})
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(PROTOCOL_IMPLS, "iri_adversarial",
                   dataclasses.replace(impl, augment=_recording(impl.augment, seen)))
        report = run(s, shared_cache())  # its IRIs are test_invariance.py's shortcut test's
    (real,) = rows(report, protocol="adversarial")
    (iris,) = rows(report, protocol="iri_adversarial")
    assert real.agreement >= 0.9, real.agreement
    assert real.agreement - iris.agreement >= 0.5, (real.agreement, iris.agreement)
    assert real.iri is None and iris.iri is not None and iris.iri.n == FAST_IA["max_train_samples"]
    # The IRI arm's batches were attacked too, inside the default epsilon (8/255 at 32 px).
    assert len(seen) == 3 * 2  # 3 epochs of 200 inputs in batches of 128
    for a in seen:
        assert float(a.linf.min()) > 0 and float(a.linf.max()) <= 8 / 255 + 1e-6, a.linf
        assert a.loss_attacked > a.loss_clean, (a.loss_clean, a.loss_attacked)
