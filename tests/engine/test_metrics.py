"""Metric definitions, checked against hand-computed values."""

from __future__ import annotations

import torch
from stitchsim_worker.engine.measures.metrics import (
    agreement_per_sample,
    cohens_kappa,
    evaluate,
    relative_distance,
    seed_interval,
)


def test_agreement_is_one_for_equal_distributions_and_lower_otherwise() -> None:
    a = torch.tensor([[2.0, 0.0, -1.0]])
    assert float(agreement_per_sample(a, a)) == 1.0
    p = torch.softmax(a, -1)
    q = torch.softmax(torch.tensor([[0.0, 2.0, -1.0]]), -1)
    expected = (p * q).sum() / max((p * p).sum(), (q * q).sum())
    got = agreement_per_sample(a, torch.tensor([[0.0, 2.0, -1.0]]))
    torch.testing.assert_close(got, expected.view(1))


def test_relative_distance_is_over_the_whole_batch() -> None:
    b = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    assert float(relative_distance(b * 0, b)) == 1.0
    assert float(relative_distance(b, b)) == 0.0


def test_kappa_of_known_table() -> None:
    h = torch.tensor([1, 1, 1, 0, 0, 1, 0, 1, 1, 1], dtype=torch.bool)
    g = torch.tensor([1, 1, 0, 0, 1, 1, 0, 1, 1, 1], dtype=torch.bool)
    observed = 0.8
    expected = 0.7 * 0.7 + 0.3 * 0.3
    assert abs(float(cohens_kappa(h, g)) - (observed - expected) / (1 - expected)) < 1e-6
    assert (
        float(cohens_kappa(torch.ones(5, dtype=torch.bool), torch.ones(5, dtype=torch.bool))) == 1.0
    )


def test_evaluate_gives_point_figures_inside_their_bootstrap_intervals() -> None:
    torch.manual_seed(0)
    labels = torch.randint(0, 10, (400,))
    g = torch.nn.functional.one_hot(labels, 10).float() * 4 + torch.randn(400, 10)
    h = g + torch.randn(400, 10)
    ev = evaluate(h, g, labels)
    for name in ("agreement", "hard_agreement", "accuracy", "error_consistency"):
        low, high = ev.ci[name]
        assert low <= getattr(ev.figures, name) <= high, name
        assert high - low < (0.5 if name == "error_consistency" else 0.2)
    assert abs(ev.stitching_penalty - (ev.back_accuracy - ev.figures.accuracy)) < 1e-12


def test_seed_interval_uses_student_t() -> None:
    mean, (low, high) = seed_interval([0.8, 0.9, 1.0])
    assert abs(mean - 0.9) < 1e-12
    assert abs((high - low) / 2 - 4.303 * 0.1 / 3**0.5) < 1e-9
