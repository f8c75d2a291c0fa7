"""Slope One (Park & Acharya Eqs. (3)-(6)), Theorem 3.1's Delta f, and mechanism=laplace_output."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from dprec_torch.data.ratings import Ratings, RatingScale
from dprec_torch.errors import ConfigError, DataError
from dprec_torch.evaluation.metrics import rmse
from dprec_torch.mechanisms.output_perturbation import LaplaceOutput
from dprec_torch.predictors.slope_one import SlopeOne, slope_one_sensitivity, slope_one_substitution_sensitivity

SCALE = RatingScale(1.0, 5.0)


def toy() -> Ratings:
    """u0: i0=5 i1=3 i2=2 | u1: i0=3 i1=4 | u2: i1=2 i2=5 i3=4 (4 items, 3 users)."""
    u = [0, 0, 0, 1, 1, 2, 2, 2]
    i = [0, 1, 2, 0, 1, 1, 2, 3]
    r = [5, 3, 2, 3, 4, 2, 5, 4]
    return Ratings(torch.tensor(u), torch.tensor(i), torch.tensor(r, dtype=torch.float32), 3, 4, SCALE)


def test_deviations_by_hand() -> None:
    # Eq. (3): s01 = ((5-3) + (3-4))/2 = 0.5, s02 = 3, s12 = ((3-2) + (2-5))/2 = -1, s13 = -2, s23 = 1, s03 = 0
    s = SlopeOne(T=1, phi_m=0).fit(toy()).dev_
    want = torch.tensor(
        [[0.0, 0.5, 3.0, 0.0], [-0.5, 0.0, -1.0, -2.0], [-3.0, 1.0, 0.0, 1.0], [0.0, 2.0, -1.0, 0.0]], dtype=torch.float64
    )
    torch.testing.assert_close(s, want)


def test_predictions_by_hand() -> None:
    m = SlopeOne(T=1, phi_m=0).fit(toy())
    users, items = torch.tensor([1, 1, 0, 2]), torch.tensor([2, 3, 3, 0])
    # Eq. (6): u1 (mean 3.5, 2 ratings): i2 -> 3.5 + (-3 + 1)/2 = 2.5; i3 -> 3.5 + (0 + 2)/2 = 4.5
    # u0 (mean 10/3): i3 -> 10/3 + (0 + 2 - 1)/3 = 11/3; u2 (mean 11/3): i0 -> 11/3 + (0.5 + 3 + 0)/3
    want = torch.tensor([2.5, 4.5, 11 / 3, 14.5 / 3], dtype=torch.float64)
    torch.testing.assert_close(m.raw_predict(users, items), want)
    torch.testing.assert_close(m.predict(users, items), want.clamp(1, 5).float())  # 4.83 stays, nothing above 5


def test_phi_m_is_strict() -> None:
    # Eq. (4) keeps pairs with MORE than phi_m co-raters: with phi_m = 1 only (0,1) and (1,2) survive
    m = SlopeOne(T=1, phi_m=1).fit(toy())
    got = m.raw_predict(torch.tensor([1, 1, 2]), torch.tensor([2, 3, 0]))
    torch.testing.assert_close(got, torch.tensor([3.5 + 1 / 2, 3.5, 11 / 3 + 0.5 / 3], dtype=torch.float64))


def test_users_below_T_get_global_mean() -> None:
    m = SlopeOne(T=3, phi_m=0).fit(toy())  # u1 has only 2 ratings; global mean = 28/8
    got = m.raw_predict(torch.tensor([1, 0, 7]), torch.tensor([2, 3, 0]))  # user 7 is out of range: unknown
    torch.testing.assert_close(got, torch.tensor([3.5, 11 / 3, 3.5], dtype=torch.float64))


def test_recommend_excludes_rated_and_pads() -> None:
    m = SlopeOne(T=1, phi_m=0).fit(toy())
    rec = m.recommend(torch.tensor([1, 2]), 3)
    # u1 unrated: i2 (2.5), i3 (4.5) -> [3, 2, -1]; u2 unrated: only i0
    assert rec.tolist() == [[3, 2, -1], [0, -1, -1]]


def test_delta_f_formula() -> None:
    assert slope_one_sensitivity(20, 10, 5.0) == pytest.approx(0.5)  # the paper's (T, phi_m, dr) = (20, 10, 5)
    assert slope_one_sensitivity(20, 10, 4.0) == pytest.approx(0.4)
    assert slope_one_sensitivity(5, 4, 4.0) == pytest.approx(max(4 / 5 * 1.5, 1.0))  # first branch wins: 1.2
    assert math.isinf(slope_one_sensitivity(20, 0, 4.0))
    assert SlopeOne(T=20, phi_m=10, delta_r=5).output_sensitivity() == pytest.approx(0.5)
    assert slope_one_substitution_sensitivity(20, 10, 4.0) == pytest.approx(4 / 11)


def _random_ratings(gen: torch.Generator, n_users: int = 12, n_items: int = 6, density: float = 0.7) -> Ratings:
    mask = torch.rand(n_users, n_items, generator=gen) < density
    u, i = mask.nonzero(as_tuple=True)
    r = torch.randint(1, 6, (u.numel(),), generator=gen).float()
    return Ratings(u, i, r, n_users, n_items, SCALE)


def test_eq11_holds_under_substitution() -> None:
    """Change one rating's value (positions fixed): every served, unrated prediction moves by <= Eq. (11)."""
    gen = torch.Generator().manual_seed(3)
    T, phi_m = 3, 2
    worst = 0.0
    for _ in range(25):
        train = _random_ratings(gen)
        k = int(torch.randint(len(train), (1,), generator=gen))
        values = train.values.clone()
        values[k] = 6.0 - values[k] if values[k] != 3 else 1.0  # move it far
        other = Ratings(train.users, train.items, values, train.n_users, train.n_items, SCALE)
        a, b = SlopeOne(T=T, phi_m=phi_m).fit(train), SlopeOne(T=T, phi_m=phi_m).fit(other)
        users = torch.arange(train.n_users)
        diff = (a.score(users) - b.score(users)).abs().masked_fill(a.rated_mask(users), 0.0)
        worst = max(worst, float(diff.max()))
    assert worst > 0.0
    assert worst <= slope_one_substitution_sensitivity(T, phi_m, 4.0) + 1e-9
    assert slope_one_substitution_sensitivity(T, phi_m, 4.0) <= slope_one_sensitivity(T, phi_m, 4.0)


def test_eq11_fails_under_add_remove() -> None:
    """One added rating lifts every (j, k) pair over phi_m at once: the output moves by delta_r = 10 x Eq. (11)."""
    T, phi_m, n_k = 20, 10, 20
    j, ks = 0, list(range(1, n_k + 1))
    u, i, r = [], [], []
    for v in range(phi_m):  # phi_m co-raters of (j, k): r_vj = 5, r_vk = 1 -> deviation 4, but not > phi_m yet
        u += [v] * (n_k + 1); i += [j] + ks; r += [5] + [1] * n_k
    attacked, newcomer = phi_m, phi_m + 1
    u += [attacked] * n_k; i += ks; r += [1] * n_k  # the user whose prediction for item j we watch
    u += [newcomer] * n_k; i += ks; r += [1] * n_k  # rated every k, not j (yet)
    n_users = phi_m + 2
    base = Ratings(torch.tensor(u), torch.tensor(i), torch.tensor(r, dtype=torch.float32), n_users, n_k + 1, SCALE)
    plus = Ratings(
        torch.tensor(u + [newcomer]), torch.tensor(i + [j]), torch.tensor(r + [5], dtype=torch.float32), n_users, n_k + 1, SCALE
    )
    q = (torch.tensor([attacked]), torch.tensor([j]))
    before, after = SlopeOne(T=T, phi_m=phi_m).fit(base).predict(*q), SlopeOne(T=T, phi_m=phi_m).fit(plus).predict(*q)
    assert float(before) == pytest.approx(1.0) and float(after) == pytest.approx(5.0)
    assert float(after - before) > 9.9 * slope_one_sensitivity(T, phi_m, 4.0)


def test_laplace_output_noise_scale_and_seed() -> None:
    train = toy()
    wrapped = LaplaceOutput(epsilon=0.5, seed=11).wrap(SlopeOne(T=1, phi_m=1, delta_r=4)).fit(train)
    b = max(4 / 1 * (1 + 2 / 1), 4 / 1) / 0.5  # Eq. (11) / eps = 24
    assert wrapped.noise_scale == pytest.approx(b)
    users, items = torch.zeros(20000, dtype=torch.long) + 1, torch.zeros(20000, dtype=torch.long) + 2
    noise = wrapped.release(users, items) - wrapped.predictor.raw_predict(users, items)
    assert float(noise.abs().mean()) == pytest.approx(b, rel=0.03)  # E|Lap(b)| = b (scale, not std)
    again = LaplaceOutput(epsilon=0.5, seed=11).wrap(SlopeOne(T=1, phi_m=1, delta_r=4)).fit(train)
    torch.testing.assert_close(again.release(users, items), wrapped.predictor.raw_predict(users, items) + noise)
    report = wrapped.privacy_report()
    assert report["epsilon_per_query"] == 0.5 and report["sensitivity"] == pytest.approx(12.0)
    assert report["released_values"] == 20000 and report["epsilon"] == pytest.approx(10000.0)  # headline: the composed total


def test_laplace_output_inf_is_exact_and_predict_clips() -> None:
    wrapped = LaplaceOutput(epsilon=float("inf")).wrap(SlopeOne(T=1, phi_m=0)).fit(toy())
    users, items = torch.tensor([1, 2]), torch.tensor([3, 0])
    torch.testing.assert_close(wrapped.release(users, items), torch.tensor([4.5, 14.5 / 3], dtype=torch.float64))


def test_bad_config_is_one_line() -> None:
    with pytest.raises(ConfigError, match="phi_m"):
        SlopeOne(phi_m=-1)
    with pytest.raises(ConfigError, match="epsilon"):
        LaplaceOutput(epsilon=0)
    with pytest.raises(ConfigError, match="phi_m >= 1"):
        LaplaceOutput(epsilon=1).wrap(SlopeOne(T=1, phi_m=0)).fit(toy())
    with pytest.raises(DataError, match="empty"):
        SlopeOne().fit(toy().select(torch.zeros(8, dtype=torch.bool)))


def test_yaml_instantiates() -> None:
    from dprec_torch.training.run import instantiate_node
    from tests.helpers import tiny_cfg

    cfg = tiny_cfg("model=slope_one", "mechanism=laplace_output", "epsilon=2", "seed=5", "noise_seed=5")
    model, mech = instantiate_node(cfg.model), instantiate_node(cfg.mechanism)
    assert isinstance(model, SlopeOne) and (model.T, model.phi_m) == (20, 10)
    assert mech.epsilon == 2.0 and mech.seed == 5


def _u1() -> tuple[Ratings, Ratings] | None:
    root = os.environ.get("DPREC_DATA")
    if not root or not (Path(root) / "ml-100k" / "u1.base").exists():
        return None
    from dprec_torch.data.movielens import load_movielens

    fold = load_movielens("ml-100k", fold=1, data_dir=root).folds[0]
    return fold.train, fold.test


def test_rmse_beats_item_mean() -> None:
    """Classic Slope One (T=1, phi_m=0): RMSE <= 0.97 on ML-100K u1; on synthetic data, below the item mean."""
    data = _u1()
    if data is not None:
        train, test = data
        got = rmse(SlopeOne(T=1, phi_m=0).fit(train).predict(test.users, test.items), test.values)
        assert got <= 0.97
    else:
        from dprec_torch.data.synthetic import load_synthetic

        fold = load_synthetic("tiny", seed=0).folds[0]
        train, test = fold.train, fold.test
        got = rmse(SlopeOne(T=1, phi_m=0).fit(train).predict(test.users, test.items), test.values)
        assert got < rmse(train.item_means()[test.items], test.values)
