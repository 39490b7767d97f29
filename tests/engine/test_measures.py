"""The similarity measures against their definitions (issue 14): linear CKA with the unbiased
HSIC against a direct full-batch formula and against the U-statistic it estimates, its
invariances, and mutual k-NN alignment against a brute-force reference."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from stitchsim.failure import Failure
from stitchsim.models import MeasureSettings
from stitchsim_worker.engine.core.bank import BankBuilder
from stitchsim_worker.engine.measures.knn import knn_overlap
from stitchsim_worker.engine.measures.similarity import (
    MEASURE_IMPLS as REGISTRY,
    Estimate,
    batching,
    estimate,
    measure,
    prepare,
)

SETTINGS = MeasureSettings()
CPU = torch.device("cpu")


def _on_batches(name: str, xs: list[torch.Tensor], ys: list[torch.Tensor],
                settings: MeasureSettings, seed: int) -> Estimate:
    """The measure on given mini-batches (each its own resampling weights, seeded)."""
    gen = torch.Generator().manual_seed(seed)
    weights = []
    for x in xs:
        idx = torch.randint(0, len(x), (1000, len(x)), generator=gen)
        w = torch.zeros(1000, len(x), dtype=torch.float32)
        weights.append(w.scatter_add_(1, idx, torch.ones_like(w)))
    entry = REGISTRY[name]
    px = [entry.prepare(x, w, settings) for x, w in zip(xs, weights, strict=True)]
    py = [entry.prepare(y, w, settings) for y, w in zip(ys, weights, strict=True)]
    return estimate(entry, px, py, settings)


def linear_cka(xs: list[torch.Tensor], ys: list[torch.Tensor], settings: MeasureSettings,
               seed: int) -> Estimate:
    return _on_batches("cka", xs, ys, settings, seed)


def mutual_knn(xs: list[torch.Tensor], ys: list[torch.Tensor], settings: MeasureSettings,
               seed: int) -> Estimate:
    return _on_batches("mutual_knn", xs, ys, settings, seed)


def _data(n: int, dx: int, dy: int, noise: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dx)) + 0.7  # not centred: the estimator must not need it
    y = x @ rng.normal(size=(dx, dy)) + noise * rng.normal(size=(n, dy))
    return x, np.tanh(y)  # a nonlinear relation: CKA strictly between 0 and 1


def _hsic_direct(x: np.ndarray, y: np.ndarray) -> float:
    """Song et al. (2012) eq. 5, written out on uncentred linear kernels."""
    n = len(x)
    k, lk = x @ x.T, y @ y.T
    np.fill_diagonal(k, 0.0)
    np.fill_diagonal(lk, 0.0)
    one = np.ones(n)
    return float((np.trace(k @ lk) + (one @ k @ one) * (one @ lk @ one) / ((n - 1) * (n - 2))
                  - 2.0 / (n - 2) * (one @ k @ lk @ one)) / (n * (n - 3)))


def _hsic_u_statistic(x: np.ndarray, y: np.ndarray) -> float:
    """The U-statistic the unbiased HSIC is: the mean over ordered quadruples of distinct
    samples of k_st l_st + k_st l_uv - 2 k_st l_su (for small n only)."""
    k, lk = x @ x.T, y @ y.T
    total, count = 0.0, 0
    for s, t, u, v in itertools.permutations(range(len(x)), 4):
        total += k[s, t] * lk[s, t] + k[s, t] * lk[u, v] - 2 * k[s, t] * lk[s, u]
        count += 1
    return total / count


def _cka_direct(xs: list[np.ndarray], ys: list[np.ndarray]) -> float:
    xy = sum(_hsic_direct(x, y) for x, y in zip(xs, ys, strict=True))
    xx = sum(_hsic_direct(x, x) for x in xs)
    yy = sum(_hsic_direct(y, y) for y in ys)
    return xy / np.sqrt(xx * yy)


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(a).double()


def test_cka_matches_the_direct_full_batch_formula() -> None:
    x, y = _data(300, 40, 25, noise=1.5, seed=0)
    value = linear_cka([_t(x)], [_t(y)], SETTINGS, seed=0).value
    assert abs(value - _cka_direct([x], [y])) < 1e-5
    assert 0.2 < value < 0.95


def test_unbiased_hsic_is_the_u_statistic_it_estimates() -> None:
    x, y = _data(9, 4, 3, noise=0.5, seed=1)
    from stitchsim_worker.engine.measures.cka import gram, hsic1

    fast = float(hsic1(gram(_t(x)), gram(_t(y))))
    assert abs(fast - _hsic_u_statistic(x, y)) < 1e-9 * max(1.0, abs(fast))


def test_bootstrap_weights_are_the_resampled_batch_without_self_pairs() -> None:
    from stitchsim_worker.engine.measures.cka import gram, hsic1, weighted_hsic1

    x, y = _data(40, 6, 5, noise=1.0, seed=15)
    kx, ky = gram(_t(x)), gram(_t(y))
    idx = torch.randint(0, 40, (3, 40), generator=torch.Generator().manual_seed(0))
    w = torch.zeros(3, 40, dtype=torch.float64).scatter_add_(1, idx, torch.ones(3, 40).double())
    for r in range(3):
        rows, cols = idx[r][:, None], idx[r][None, :]
        explicit = hsic1(kx[rows, cols] * (rows != cols), ky[rows, cols] * (rows != cols))
        # float32 resamples: they only place the interval
        got = float(weighted_hsic1(kx, ky, w[r : r + 1])[0])
        assert abs(got - float(explicit)) < 1e-4 * abs(float(explicit))
    got = float(weighted_hsic1(kx, ky, torch.ones(1, 40))[0])
    assert abs(got - float(hsic1(kx, ky))) < 1e-4 * abs(float(hsic1(kx, ky)))


def test_mini_batches_accumulate_hsic_over_batches() -> None:
    x, y = _data(500, 30, 20, noise=1.0, seed=2)
    batches = batching(500, 128, 3, CPU).batches
    assert [len(b) for b in batches] == [125] * 4
    assert torch.equal(torch.cat(batches).sort().values, torch.arange(500))
    value = linear_cka([_t(x[b.numpy()]) for b in batches], [_t(y[b.numpy()]) for b in batches],
                       SETTINGS, seed=0).value
    direct = _cka_direct([x[b.numpy()] for b in batches], [y[b.numpy()] for b in batches])
    assert abs(value - direct) < 1e-5
    # The mini-batch figure estimates the same quantity as the full-batch one.
    assert abs(value - _cka_direct([x], [y])) < 0.03


def test_cka_is_invariant_to_orthogonal_maps_isotropic_scale_and_shifts() -> None:
    x, y = _data(256, 32, 32, noise=1.0, seed=4)
    q, _ = np.linalg.qr(np.random.default_rng(5).normal(size=(32, 32)))
    base = linear_cka([_t(x)], [_t(y)], SETTINGS, seed=0)
    for moved in (y @ q, 3.7 * y, 0.01 * y @ q + 5.0):
        other = linear_cka([_t(x)], [_t(moved)], SETTINGS, seed=0)
        assert abs(other.value - base.value) < 1e-9
        assert np.allclose(other.ci, base.ci, atol=1e-9)
    # Not invariant to a non-isotropic scaling: the definition, not an accident, is tested.
    stretched = y * np.linspace(0.1, 10, 32)
    assert abs(linear_cka([_t(x)], [_t(stretched)], SETTINGS, 0).value - base.value) > 1e-3


def test_identical_inputs_score_one_and_unrelated_ones_near_zero() -> None:
    x, _ = _data(300, 50, 1, noise=0, seed=6)
    same = linear_cka([_t(x)], [_t(x)], SETTINGS, seed=0)
    assert abs(same.value - 1) < 1e-12 and same.ci == pytest.approx((1.0, 1.0))
    z = np.random.default_rng(7).normal(size=(300, 50))
    unrelated = linear_cka([_t(x)], [_t(z)], SETTINGS, seed=0)
    assert abs(unrelated.value) < 0.05  # unbiased: no positive floor from high dimension
    assert unrelated.ci[0] < 0 < unrelated.ci[1]


def test_cka_interval_brackets_the_value_and_is_deterministic() -> None:
    x, y = _data(400, 30, 30, noise=2.0, seed=8)
    a = linear_cka([_t(x[:200]), _t(x[200:])], [_t(y[:200]), _t(y[200:])], SETTINGS, seed=0)
    b = linear_cka([_t(x[:200]), _t(x[200:])], [_t(y[:200]), _t(y[200:])], SETTINGS, seed=0)
    c = linear_cka([_t(x[:200]), _t(x[200:])], [_t(y[:200]), _t(y[200:])], SETTINGS, seed=1)
    assert a == b and a.ci != c.ci
    assert a.ci[0] < a.value < a.ci[1]
    assert 0.005 < a.ci[1] - a.ci[0] < 0.3


def _knn_brute(x: np.ndarray, y: np.ndarray, k: int) -> np.ndarray:
    def neighbours(z: np.ndarray, i: int) -> set[int]:
        zn = z / np.linalg.norm(z, axis=1, keepdims=True)
        sims = [(float(zn[i] @ zn[j]), j) for j in range(len(z)) if j != i]
        return {j for _, j in sorted(sims, reverse=True)[:k]}

    return np.array([len(neighbours(x, i) & neighbours(y, i)) / k for i in range(len(x))])


def test_mutual_knn_matches_brute_force() -> None:
    x, y = _data(120, 12, 9, noise=1.0, seed=9)
    for k in (1, 5, 10):
        fast = knn_overlap(_t(x), _t(y), k).numpy()
        assert np.array_equal(fast, _knn_brute(x, y, k)), k
    settings = MeasureSettings(knn_k=5)
    est = mutual_knn([_t(x)], [_t(y)], settings, seed=0)
    assert est.value == pytest.approx(_knn_brute(x, y, 5).mean(), abs=1e-12)
    assert est.ci[0] <= est.value <= est.ci[1]


def test_mutual_knn_of_identical_rotated_and_unrelated_inputs() -> None:
    x, _ = _data(200, 16, 1, noise=0, seed=10)
    q, _ = np.linalg.qr(np.random.default_rng(11).normal(size=(16, 16)))
    assert mutual_knn([_t(x)], [_t(2.5 * x @ q)], SETTINGS, 0).value == pytest.approx(1.0)
    z = np.random.default_rng(12).normal(size=(200, 16))
    chance = SETTINGS.knn_k / 199  # random neighbourhoods overlap by k / (n - 1)
    assert abs(mutual_knn([_t(x)], [_t(z)], SETTINGS, 0).value - chance) < 0.03


def test_mutual_knn_asks_for_more_samples_than_neighbours() -> None:
    x, y = _data(8, 4, 4, noise=1.0, seed=13)
    with pytest.raises(Failure, match="knn_k"):
        mutual_knn([_t(x)], [_t(y)], SETTINGS, 0)


def test_banks_of_feature_maps_are_flattened_and_batched(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(14)
    maps = rng.normal(size=(300, 4, 3, 3)).astype(np.float32)
    q, _ = np.linalg.qr(rng.normal(size=(36, 36)))
    tokens = (2.0 * maps.reshape(300, -1) @ q).reshape(300, 6, 6)  # rotated and scaled
    banks = BankBuilder(1 << 30, tmp_path)
    x, y = banks.new(300, (4, 3, 3)), banks.new(300, (6, 6))
    x.write(0, torch.from_numpy(maps))
    y.write(0, torch.from_numpy(tokens.astype(np.float32)))
    steps = []
    settings = MeasureSettings(batch_size=100)
    plan = batching(300, 100, 0, CPU)
    entry = REGISTRY["cka"]
    est = estimate(entry, prepare(entry, x, plan, settings, CPU, lambda: steps.append(1)),
                   prepare(entry, y, plan, settings, CPU), settings)
    assert len(steps) == 3
    parts = plan.batches
    flat_x, flat_y = maps.reshape(300, -1).astype(np.float64), tokens.reshape(300, -1)
    direct = _cka_direct([flat_x[p.numpy()] for p in parts],
                         [flat_y[p.numpy()].astype(np.float32).astype(np.float64)
                          for p in parts])
    assert abs(est.value - direct) < 1e-5
    assert est.value > 0.999  # the same features, rotated: CKA does not see the change
    assert measure("cka", x, y, settings, 0) == est  # the one-call form
    banks.close()
