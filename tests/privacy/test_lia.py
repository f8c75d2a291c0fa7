"""The Linear Ideal Adversary (Park & Acharya Definition 4, Theorems 3.3-3.4) and Definitions 5-6."""

from __future__ import annotations

import math

import pytest
import torch

from dprec_torch.attacks.lia import epsilon_utility, lia_attack, lia_estimate, lia_hit_probability, topn_difference
from dprec_torch.data.ratings import Ratings, RatingScale
from dprec_torch.errors import DataError
from dprec_torch.mechanisms.output_perturbation import LaplaceOutput
from dprec_torch.predictors.cosine_implicit import CosineImplicit
from dprec_torch.predictors.slope_one import SlopeOne

SCALE = RatingScale(1.0, 5.0)


def dense_random(n_users: int = 30, n_items: int = 15, seed: int = 0) -> Ratings:
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(n_users, n_items, generator=gen) < 0.7
    u, i = mask.nonzero(as_tuple=True)
    return Ratings(u, i, torch.randint(1, 6, (u.numel(),), generator=gen).float(), n_users, n_items, SCALE)


def one_target_per_user(train: Ratings, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Users with a rated and an unrated item; a random rated (target) and unrated (query) item each."""
    gen = torch.Generator().manual_seed(seed)
    rated = torch.zeros(train.n_users, train.n_items, dtype=torch.bool)
    rated[train.users, train.items] = True
    users = torch.nonzero(rated.any(1) & (~rated).any(1)).squeeze(1)
    noise = torch.rand(users.numel(), train.n_items, generator=gen)
    target = torch.where(rated[users], noise, -1.0).argmax(1)
    query = torch.where(~rated[users], noise, -1.0).argmax(1)
    return users, query, target


def test_lia_recovers_exact_rating_at_infinite_epsilon() -> None:
    train = dense_random()
    wrapped = LaplaceOutput(epsilon=math.inf).wrap(SlopeOne(T=3, phi_m=1)).fit(train)
    users, query, target = one_target_per_user(train)
    res = lia_attack(wrapped.predictor, wrapped.release, users, query, target, noise_scale=wrapped.noise_scale)
    assert users.numel() > 20
    torch.testing.assert_close(res.estimate, res.truth, atol=1e-9, rtol=0)  # Eq. (25) with delta = 0
    assert res.accuracy == 1.0 and res.risk == 1.0


def test_lia_error_is_count_times_noise() -> None:
    """Eq. (25): LIA - r_il = |r_i.| * delta for the very noise the mechanism drew."""
    train = dense_random(seed=1)
    wrapped = LaplaceOutput(epsilon=2.0, seed=4).wrap(SlopeOne(T=3, phi_m=1)).fit(train)
    users, query, target = one_target_per_user(train, seed=1)
    released = wrapped.release(users, query)
    delta = released - wrapped.predictor.raw_predict(users, query)
    a, b, truth = wrapped.predictor.lia_side_information(users, query, target)
    torch.testing.assert_close(lia_estimate(released, a, b) - truth, a * delta)
    torch.testing.assert_close(a, train.user_counts()[users].double())


def test_cosine_lia_recovers_similarity_at_infinite_epsilon() -> None:
    """Theorem 3.4: LIA = s_lj when no noise is added."""
    train = dense_random(seed=2)
    wrapped = LaplaceOutput(epsilon=math.inf).wrap(CosineImplicit(T=2, threshold=4.0)).fit(train)
    purchases = wrapped.predictor.binarise(train)
    users, query, target = one_target_per_user(purchases, seed=2)
    # the query must be unpurchased AND the LIA is stated on purchases; keep users served by Eq. (8)
    keep = wrapped.predictor.served_[users]
    users, query, target = users[keep], query[keep], target[keep]
    res = lia_attack(wrapped.predictor, wrapped.release, users, query, target, tolerance=1e-6)
    torch.testing.assert_close(res.estimate, res.truth.double(), atol=1e-9, rtol=0)
    torch.testing.assert_close(res.truth, wrapped.predictor.sim_[target, query])


def test_hit_probability_formula_and_empirical_rate() -> None:
    a = torch.tensor([10.0, 40.0])
    p = lia_hit_probability(a, 0.4, 0.5)  # Pr[|a delta| < 0.5] = 1 - exp(-0.5 / (a b))
    torch.testing.assert_close(p, torch.tensor([1 - math.exp(-0.5 / 4), 1 - math.exp(-0.5 / 16)], dtype=torch.float64))
    assert lia_hit_probability(a, 0.0, 0.5).tolist() == [1.0, 1.0]
    train = dense_random(seed=3)
    wrapped = LaplaceOutput(epsilon=5.0, seed=9).wrap(SlopeOne(T=3, phi_m=1)).fit(train)
    users, query, target = one_target_per_user(train, seed=3)
    reps = 400  # repeat the attack on fresh noise
    res = lia_attack(wrapped.predictor, wrapped.release, users.repeat(reps), query.repeat(reps), target.repeat(reps),
                     noise_scale=wrapped.noise_scale)
    assert 0.02 < res.risk < 0.98
    assert res.accuracy == pytest.approx(res.risk, abs=0.02)


def test_side_information_rejects_bad_queries() -> None:
    train = dense_random(seed=4)
    model = SlopeOne(T=3, phi_m=1).fit(train)
    users, query, target = one_target_per_user(train, seed=4)
    with pytest.raises(DataError, match="did not rate"):
        model.lia_side_information(users, target, target)  # querying a rated item
    few = SlopeOne(T=100, phi_m=1).fit(train)
    with pytest.raises(DataError, match=">= T"):
        few.lia_side_information(users, query, target)


def test_topn_difference_and_utility_by_hand() -> None:
    ref = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    private = torch.tensor([[4, 3, 9, 1], [0, 10, 11, 12]])
    diff = topn_difference(private, ref)
    torch.testing.assert_close(diff, torch.tensor([0.25, 1.0], dtype=torch.float64))
    assert epsilon_utility(diff) == pytest.approx(1 - 0.625)
