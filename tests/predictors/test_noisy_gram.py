"""noisy_gram: sensitivity harness (hypothesis), GDP calibration, estimators, report, config."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dprec_torch.data.ratings import Ratings, RatingScale
from dprec_torch.errors import ConfigError
from dprec_torch.privacy.calibration import analytic_gaussian_sigma
from dprec_torch.predictors.noisy_gram import NoisyGram, gram, gram_sensitivity, restrict_to_support, triangle, unit_vectors
from dprec_torch.privacy.calibration import calibrate_gaussian, gaussian_epsilon, gdp_delta, gdp_epsilon, split_mu
from dprec_torch.privacy.item_means import (
    ITEM_STATS_SENSITIVITY,
    ItemMeansSpec,
    item_stats,
    item_stats_sensitivity,
    pooled_counts,
    popularity_counts,
    release_item_means,
)
from dprec_torch.training.run import instantiate_node
from dprec_torch.seeding import noise_generator
from tests.contract import PredictorContract
from tests.helpers import tiny_cfg, tiny_fold

SCALE = RatingScale(1.0, 5.0)
TOL = 1e-9


# ------------------------------------------------------------------ adversarial datasets
@st.composite
def datasets(draw, max_users: int = 6, max_items: int = 6):
    """Small rating sets with the adversarial cases mixed in: one user, one-rating users, extreme ratings, ties."""
    n_users = draw(st.integers(1, max_users))
    n_items = draw(st.integers(1, max_items))
    mode = draw(st.sampled_from(["random", "extreme", "ties"]))
    u, i, v = [], [], []
    for a in range(n_users):
        k = draw(st.integers(1, n_items))  # every user has >= 1 rating (one-rating users included)
        items = draw(st.permutations(list(range(n_items))))[:k]
        for b in items:
            if mode == "extreme":
                r = draw(st.sampled_from([1.0, 5.0]))
            elif mode == "ties":
                r = 3.0
            else:
                r = float(draw(st.integers(1, 5)))
            u.append(a), i.append(b), v.append(r)
    return Ratings(torch.tensor(u), torch.tensor(i), torch.tensor(v), n_users, n_items, SCALE)


def without_user(r: Ratings, user: int) -> Ratings:
    return r.select(r.users != user)


def without_rating(r: Ratings, pos: int) -> Ratings:
    keep = torch.ones(len(r), dtype=torch.bool)
    keep[pos] = False
    return r.select(keep)


def with_value(r: Ratings, pos: int, value: float) -> Ratings:
    vals = r.values.clone()
    vals[pos] = value
    return Ratings(r.users, r.items, vals, r.n_users, r.n_items, r.scale)


def public_means(draw, n_items: int) -> torch.Tensor:
    """Centring means are an earlier release (public here): any values in the scale."""
    return torch.tensor([draw(st.floats(1.0, 5.0)) for _ in range(n_items)], dtype=torch.float32)


def rating_neighbours(r: Ratings, pos: int, new_value: float) -> list[Ratings]:
    """Rating-level neighbours of r: remove rating ``pos`` or change its value."""
    return [without_rating(r, pos), with_value(r, pos, new_value)]


# ------------------------------------------------------------------ (a) clipped contribution norms
@settings(max_examples=60, deadline=None)
@given(data=st.data(), clip=st.floats(0.1, 5.0), b=st.floats(0.2, 4.0), weighting=st.sampled_from(["clip", "normalize"]))
def test_user_vectors_have_norm_at_most_c(data, clip, b, weighting):
    r = data.draw(datasets())
    x = unit_vectors(r, public_means(data.draw, r.n_items), "user", b, clip, weighting, beta_p=data.draw(st.floats(0, 20)))
    norms = torch.zeros(r.n_users, dtype=torch.float64).index_add_(0, r.users, x * x).sqrt()
    assert float(norms.max()) <= clip * (1 + 1e-12) + TOL
    # the per-user Gram contribution's released triangle then has norm <= ||x||^2 <= c^2
    for u in range(r.n_users):
        sel = r.users == u
        g_u = torch.zeros(r.n_items, r.n_items, dtype=torch.float64)
        xi = torch.zeros(r.n_items, dtype=torch.float64).index_put_((r.items[sel],), x[sel])
        g_u += torch.outer(xi, xi)
        assert float(triangle(g_u).norm()) <= gram_sensitivity("user", b, clip) + TOL


@settings(max_examples=60, deadline=None)
@given(data=st.data(), b=st.floats(0.2, 4.0))
def test_rating_entries_are_clamped_and_weighted(data, b):
    r = data.draw(datasets())
    x = unit_vectors(r, public_means(data.draw, r.n_items), "rating", b, 1.0)
    n = torch.bincount(r.users, minlength=r.n_users).double()[r.users]
    assert float((x.abs() - b * n.pow(-0.25)).max()) <= TOL


# ------------------------------------------------------------------ (b) neighbouring movement <= sensitivity
@settings(max_examples=80, deadline=None)
@given(data=st.data(), clip=st.floats(0.1, 5.0), b=st.floats(0.2, 4.0), weighting=st.sampled_from(["clip", "normalize"]))
def test_gram_moves_at_most_c2_when_a_user_leaves(data, clip, b, weighting):
    r = data.draw(datasets())
    means = public_means(data.draw, r.n_items)
    beta = data.draw(st.floats(0, 20))
    user = data.draw(st.integers(0, r.n_users - 1))
    g0 = gram(r, unit_vectors(r, means, "user", b, clip, weighting, beta))
    r1 = without_user(r, user)
    g1 = gram(r1, unit_vectors(r1, means, "user", b, clip, weighting, beta))
    assert float(triangle(g0 - g1).norm()) <= gram_sensitivity("user", b, clip) * (1 + 1e-9) + TOL


@settings(max_examples=120, deadline=None)
@given(data=st.data(), b=st.floats(0.2, 4.0))
def test_gram_moves_at_most_2b2_when_a_rating_changes(data, b):
    r = data.draw(datasets())
    means = public_means(data.draw, r.n_items)
    pos = data.draw(st.integers(0, len(r) - 1))
    new = float(data.draw(st.sampled_from([1.0, 5.0, 3.0, data.draw(st.floats(1.0, 5.0))])))
    g0 = gram(r, unit_vectors(r, means, "rating", b, 1.0))
    for nb in rating_neighbours(r, pos, new):
        g1 = gram(nb, unit_vectors(nb, means, "rating", b, 1.0))
        assert float(triangle(g0 - g1).norm()) <= gram_sensitivity("rating", b, 1.0) * (1 + 1e-9) + TOL


def test_rating_gram_bound_is_nearly_tight():
    """A long profile of extreme residuals with one rating flipped reaches ~2 B^2: the bound is not loose by 2x."""
    n = 200
    vals = [5.0] * n
    r = Ratings(torch.zeros(n, dtype=torch.long), torch.arange(n), torch.tensor(vals), 1, n, SCALE)
    means = torch.full((n,), 3.0)
    g0 = gram(r, unit_vectors(r, means, "rating", 1.0, 1.0))
    r1 = with_value(r, 0, 1.0)
    g1 = gram(r1, unit_vectors(r1, means, "rating", 1.0, 1.0))
    moved = float(triangle(g0 - g1).norm())
    assert 1.9 < moved <= 2.0 + 1e-9


@settings(max_examples=80, deadline=None)
@given(data=st.data(), noise=st.sampled_from(["gaussian", "laplace"]))
def test_item_stats_move_within_sensitivity(data, noise):
    r = data.draw(datasets())
    norm = 2 if noise == "gaussian" else 1
    s0 = item_stats(r, "user", noise)
    user = data.draw(st.integers(0, r.n_users - 1))
    moved = float(torch.linalg.vector_norm(s0 - item_stats(without_user(r, user), "user", noise), ord=norm))
    assert moved <= ITEM_STATS_SENSITIVITY[("user", noise)] + 1e-9
    pos = data.draw(st.integers(0, len(r) - 1))
    s0 = item_stats(r, "rating", noise)
    for nb in rating_neighbours(r, pos, float(data.draw(st.sampled_from([1.0, 5.0])))):
        moved = float(torch.linalg.vector_norm(s0 - item_stats(nb, "rating", noise), ord=norm))
        assert moved <= ITEM_STATS_SENSITIVITY[("rating", noise)] + 1e-9


@settings(max_examples=80, deadline=None)
@given(data=st.data(), noise=st.sampled_from(["gaussian", "laplace"]), gamma=st.floats(0.05, 4.0))
def test_item_stats_with_a_count_weight_move_within_its_sensitivity(data, noise, gamma):
    r = data.draw(datasets())
    norm = 2 if noise == "gaussian" else 1
    s0 = item_stats(r, "user", noise, gamma)
    user = data.draw(st.integers(0, r.n_users - 1))
    moved = float(torch.linalg.vector_norm(s0 - item_stats(without_user(r, user), "user", noise, gamma), ord=norm))
    assert moved <= item_stats_sensitivity("user", noise, gamma) + 1e-9
    pos = data.draw(st.integers(0, len(r) - 1))
    s0 = item_stats(r, "rating", noise, gamma)
    for nb in rating_neighbours(r, pos, float(data.draw(st.sampled_from([1.0, 5.0])))):
        moved = float(torch.linalg.vector_norm(s0 - item_stats(nb, "rating", noise, gamma), ord=norm))
        assert moved <= item_stats_sensitivity("rating", noise, gamma) + 1e-9


def test_count_weight_bound_is_tight_and_the_default_is_unchanged():
    # a user's (w z, w gamma) has norm exactly 1 at user level whatever gamma is
    r = Ratings(torch.tensor([0, 0, 1]), torch.tensor([0, 1, 1]), torch.tensor([5.0, 2.0, 4.0]), 2, 2, SCALE)
    for gamma in (0.3, 1.0, 3.0):
        moved = float((item_stats(r, "user", "gaussian", gamma) - item_stats(without_user(r, 0), "user", "gaussian", gamma)).norm())
        assert moved == pytest.approx(1.0, abs=1e-12)
    assert item_stats_sensitivity("rating", "gaussian", 3.0) == pytest.approx(math.sqrt(10.0))
    assert torch.equal(item_stats(r, "rating", "gaussian"), item_stats(r, "rating", "gaussian", math.sqrt(3.0)))
    assert torch.equal(item_stats(r, "user", "laplace"), item_stats(r, "user", "laplace", 1.0))
    with pytest.raises(ConfigError):
        item_stats_sensitivity("user", "gaussian", 0.0)


def test_count_weight_reaches_the_release_and_the_report():
    fold = tiny_fold()
    m = NoisyGram(epsilon=1.0, relation="rating", mean_noise="gaussian", count_weight=3.0).fit(fold.train)
    assert m.means_release_.sensitivity == pytest.approx(math.sqrt(10.0))
    assert m.means_release_.details["count_weight"] == 3.0
    assert m.privacy_report()["sensitivity"]["item_stats_l2"] == pytest.approx(math.sqrt(10.0))
    exact = NoisyGram(epsilon=math.inf, relation="user", count_weight=0.5).fit(fold.train)
    assert torch.isfinite(exact.item_avg_).all()


def test_support_restriction_keeps_only_support_items():
    r = Ratings(torch.tensor([0, 0, 1, 1]), torch.tensor([0, 2, 1, 2]), torch.tensor([5.0, 1.0, 3.0, 4.0]), 2, 3, SCALE)
    sub, idx = restrict_to_support(r, torch.tensor([1.0, 0.5, 9.0]), 2)
    assert idx.tolist() == [0, 2] and sub.n_items == 2
    assert sorted(zip(sub.users.tolist(), sub.items.tolist())) == [(0, 0), (0, 1), (1, 1)]


# ------------------------------------------------------------------ calibration
@pytest.mark.parametrize("eps", [0.1, 1.0, 10.0])
def test_gdp_calibration_matches_the_analytic_gaussian(eps):
    mu = calibrate_gaussian(eps, 1e-6, accountant="gdp").mu
    assert gdp_delta(mu, eps) <= 1e-6
    assert 1.0 / mu == pytest.approx(analytic_gaussian_sigma(1.0, eps, 1e-6), rel=1e-6)
    assert gdp_epsilon(mu, 1e-6) == pytest.approx(eps, rel=1e-6)


@settings(max_examples=30, deadline=None)
@given(eps=st.floats(0.05, 30.0), frac=st.floats(0.05, 0.95), steps=st.integers(1, 6))
def test_split_composes_back_to_the_target(eps, frac, steps):
    mu = calibrate_gaussian(eps, 1e-6, accountant="gdp").mu
    parts = split_mu(mu, {"a": (frac, 1), "b": (1 - frac, steps)})
    composed = math.sqrt(parts["a"] ** 2 + steps * parts["b"] ** 2)
    assert composed == pytest.approx(mu, rel=1e-9)
    assert gdp_epsilon(composed, 1e-6) <= eps * (1 + 1e-6)


def test_rdp_crosscheck_is_no_tighter_than_exact():
    mu = calibrate_gaussian(1.0, 1e-6, accountant="gdp").mu
    parts = split_mu(mu, {"a": (0.3, 1), "b": (0.7, 1)})
    assert gaussian_epsilon([(1.0 / v, 1.0, 1) for v in parts.values()], 1e-6) >= 1.0 - 1e-6
    assert gaussian_epsilon([(1.0 / v, 1.0, 1) for v in parts.values()], 1e-6, "gdp") == pytest.approx(1.0, rel=1e-6)


@settings(max_examples=80, deadline=None)
@given(data=st.data(), gamma=st.floats(0.05, 4.0))
def test_popularity_weighted_stats_and_counts_move_within_their_sensitivity(data, gamma):
    """a_i in (0, 1] leaves the item statistics' bound unchanged; the stage-0 counts move by <= 1."""
    r = data.draw(datasets())
    a = torch.tensor(data.draw(st.lists(st.sampled_from([1.0, 0.5, 1e-3]), min_size=r.n_items, max_size=r.n_items)),
                     dtype=torch.float64)
    user = data.draw(st.integers(0, r.n_users - 1))
    moved = float((item_stats(r, "user", "gaussian", gamma, a) - item_stats(without_user(r, user), "user", "gaussian", gamma, a)).norm())
    assert moved <= item_stats_sensitivity("user", "gaussian", gamma) + 1e-9
    assert float((popularity_counts(r, "user") - popularity_counts(without_user(r, user), "user")).norm()) <= 1.0 + 1e-9
    pos = data.draw(st.integers(0, len(r) - 1))
    for nb in rating_neighbours(r, pos, float(data.draw(st.sampled_from([1.0, 5.0])))):
        moved = float((item_stats(r, "rating", "gaussian", gamma, a) - item_stats(nb, "rating", "gaussian", gamma, a)).norm())
        assert moved <= item_stats_sensitivity("rating", "gaussian", gamma) + 1e-9
        assert float((popularity_counts(r, "rating") - popularity_counts(nb, "rating")).norm()) <= 1.0 + 1e-9


def test_popularity_release_splits_the_callers_mu_exactly_and_needs_gaussian_noise():
    fold = tiny_fold()
    mu = 0.8
    spec = ItemMeansSpec(relation="user", popularity_alpha=0.5, popularity_share=0.2)
    rel = release_item_means(fold.train, spec, noise_generator(0), mu=mu)
    mu0 = 1.0 / rel.details["popularity_noise_std"]  # stage 0: sensitivity 1
    mu1 = rel.sensitivity / rel.noise_std
    assert mu0 ** 2 + mu1 ** 2 == pytest.approx(mu ** 2, rel=1e-12)
    assert "re-weighted" in rel.describe()
    plain = release_item_means(fold.train, ItemMeansSpec(relation="user"), noise_generator(0), mu=mu)
    assert plain.sensitivity / plain.noise_std == pytest.approx(mu) and "re-weighted" not in plain.describe()
    with pytest.raises(ConfigError):
        ItemMeansSpec(relation="user", noise="laplace", popularity_alpha=0.5)
    with pytest.raises(ConfigError):
        NoisyGram(relation="user", mean_noise="gaussian", mean_popularity_alpha=0.5, mean_popularity_share=1.0)


def test_popularity_weighting_lowers_the_error_of_user_level_means():
    """Users spend more of their unit norm on rarely rated items: the count-weighted squared error of the DP
    item means (against the exact means) drops, averaged over 20 noise draws on ML-100K-like skewed data."""
    fold = tiny_fold()
    train = fold.train
    counts = train.item_counts().double()
    exact = train.item_means().double()
    seen = counts > 0

    def err(alpha: float) -> float:
        tot = 0.0
        for seed in range(20):
            spec = ItemMeansSpec(relation="user", count_weight=0.5, popularity_alpha=alpha)
            rel = release_item_means(train, spec, noise_generator(seed), mu=2.0)
            tot += float((counts[seen] * (rel.means.double()[seen] - exact[seen]) ** 2).sum() / counts[seen].sum())
        return tot / 20

    assert err(0.5) < err(0.0)


def test_pooled_counts_weigh_the_two_measurements_by_their_variance():
    c = torch.tensor([100.0, 10.0, 50.0], dtype=torch.float64)
    k = c / 2 + torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)
    kappa = float(c.sum() / k.sum())
    # equal variances (kappa * k_std = c_std = 1, cv = 0) -> the mean of C~ and kappa K~
    assert torch.allclose(pooled_counts(c, torch.ones(3, dtype=torch.float64), k, 1.0 / kappa, cv=0.0), (c + kappa * k) / 2)
    # a huge stage-0 noise -> C~ itself
    assert torch.allclose(pooled_counts(c, torch.ones(3, dtype=torch.float64), k + 7, 1e9), c)


def test_means_at_zero_noise_are_the_exact_means():
    fold = tiny_fold()
    rel = release_item_means(fold.train, ItemMeansSpec(relation="rating"), noise_generator(0), epsilon=math.inf)
    seen = fold.train.item_counts() > 0
    assert torch.allclose(rel.means[seen], fold.train.item_means()[seen], atol=1e-5)


# ------------------------------------------------------------------ predictor
class TestNoisyGramContract(PredictorContract):
    """eps = inf at rating level: the fallbacks are then the exact item/global means."""

    tolerance = 1e-4

    def make_predictor(self):
        return NoisyGram(epsilon=math.inf, relation="rating", estimator="knn", k=20)


@pytest.mark.parametrize("estimator", ["knn", "ease", "lowrank", "pnbm", "none"])
@pytest.mark.parametrize("relation", ["rating", "user"])
def test_private_fit_is_deterministic_and_finite(estimator, relation):
    fold = tiny_fold()
    a = NoisyGram(epsilon=1.0, relation=relation, estimator=estimator, seed=3, rank=5, support=150).fit(fold.train)
    b = NoisyGram(epsilon=1.0, relation=relation, estimator=estimator, seed=3, rank=5, support=150).fit(fold.train)
    pa, pb = a.predict(fold.test.users, fold.test.items), b.predict(fold.test.users, fold.test.items)
    assert torch.isfinite(pa).all() and torch.equal(pa, pb)


def test_learned_similarity_beats_means_without_noise():
    fold = tiny_fold()
    rmse = {}
    for est in ("none", "knn", "lowrank"):
        m = NoisyGram(epsilon=math.inf, relation="rating", estimator=est, k=50, rank=5, reg=1.0).fit(fold.train)
        rmse[est] = float(((m.predict(fold.test.users, fold.test.items) - fold.test.values) ** 2).mean().sqrt())
    assert rmse["knn"] < rmse["none"] and rmse["lowrank"] < rmse["none"]


def test_pnbm_surrogate_rows_are_the_ridge_solutions_on_the_neighbours():
    gen = torch.Generator().manual_seed(0)  # public test data
    x = torch.randn(40, 7, generator=gen, dtype=torch.float64)
    g = x.t() @ x
    m = NoisyGram(epsilon=math.inf, estimator="pnbm", k=3, reg=2.0)
    m.noise_std_ = 0.0
    nb = torch.topk(g - torch.diag(torch.diagonal(g)) * 10, 3, dim=1).indices
    s = m._pnbm_surrogate(g, nb)
    for i in range(7):
        n = nb[i]
        w = torch.linalg.solve(g[n][:, n] + 2.0 * torch.eye(3, dtype=torch.float64), g[n, i])
        assert torch.allclose(s[i, n], w) and int((s[i] != 0).sum()) <= 3
    noisy = NoisyGram(epsilon=1.0, estimator="pnbm", k=4, reg=2.0)
    noisy.noise_std_ = 0.5
    noisy._pnbm_surrogate(g, nb)
    assert noisy.pnbm_ridge_ == pytest.approx(2.0 + 2 * 0.5 * math.sqrt(3))  # reg + the k x k block's noise edge


def test_pnbm_estimator_beats_means_without_noise_and_costs_no_budget():
    fold = tiny_fold()
    rmse = {}
    for est in ("none", "pnbm"):
        m = NoisyGram(epsilon=math.inf, relation="rating", estimator=est, k=30, reg=5.0).fit(fold.train)
        rmse[est] = float(((m.predict(fold.test.users, fold.test.items) - fold.test.values) ** 2).mean().sqrt())
    assert rmse["pnbm"] < rmse["none"]
    a = NoisyGram(epsilon=1.0, relation="user", estimator="pnbm", seed=2).fit(fold.train)
    b = NoisyGram(epsilon=1.0, relation="user", estimator="knn", seed=2).fit(fold.train)
    assert a.noise_std_ == b.noise_std_ and torch.equal(a.item_avg_, b.item_avg_)  # the same release, learned differently
    assert "zero extra privacy cost" in a.privacy_report()["learned_from_release"]


def test_noise_std_follows_the_calibration():
    fold = tiny_fold()
    m = NoisyGram(epsilon=2.0, relation="rating", clamp_b=1.5, mean_noise="gaussian", mean_fraction=0.25).fit(fold.train)
    mu = calibrate_gaussian(2.0, 1e-6, accountant="gdp").mu
    assert m.noise_std_ == pytest.approx(2 * 1.5**2 / (mu * math.sqrt(0.75)), rel=1e-9)
    rep = m.privacy_report()
    assert rep["epsilon_exact"] == pytest.approx(2.0, rel=1e-6)
    assert rep["relation"] == "rating" and "item-side" in rep["released"] and "own ratings" in rep["joint_dp"]
    assert rep["sensitivity"]["gram_triangle_l2"] == pytest.approx(2 * 1.5**2)


def test_laplace_means_compose_basically():
    fold = tiny_fold()
    m = NoisyGram(epsilon=1.0, relation="user", mean_noise="laplace", mean_fraction=0.4).fit(fold.train)
    assert m.privacy_report()["epsilon_exact"] == pytest.approx(1.0, rel=1e-6)


@pytest.mark.parametrize("bad", [dict(relation="item"), dict(estimator="svd"), dict(epsilon=0), dict(clamp_b=-1),
                                 dict(weighting="sqrt"), dict(support=1), dict(mean_noise="cauchy"), dict(count_weight=0.0),
                                 dict(estimator="pnbm", reg=0.0)])
def test_bad_config_is_one_line(bad):
    with pytest.raises(ConfigError):
        NoisyGram(**bad)


# ------------------------------------------------------------------ configs
@pytest.mark.parametrize("overrides", [["model=noisy_gram"], ["+experiment=private_rating"], ["+experiment=private_user"]])
def test_configs_compose_and_instantiate(overrides):
    cfg = tiny_cfg(*overrides, "epsilon=1", "data=synthetic")
    model = instantiate_node(cfg.model)
    assert model.epsilon == 1.0
    assert cfg.mechanism.name == "builtin"


def test_train_runs_a_private_rating_model_end_to_end(tmp_path: Path):
    from dprec_torch.training.run import train

    cfg = tiny_cfg("+experiment=private_rating", "epsilon=1", "data=synthetic", "device=cpu",
                   "compare_baselines=false", "tensorboard=false", f"output_dir={tmp_path}")
    metrics = train(cfg)
    assert metrics["privacy"]["epsilon"] == 1.0 and metrics["privacy"]["relation"] == "rating"
    assert math.isfinite(metrics["test_rmse"])


# ------------------------------------------------------------------ audit (scripts/audit.py drives trainable models only)
@pytest.mark.parametrize("relation", ["rating", "user"])
def test_canary_audit_stays_below_the_claim_and_has_power(relation):
    from dprec_torch.audit.fitted import audit_fitted

    base = tiny_fold().train
    private = audit_fitted(lambda s: NoisyGram(epsilon=1.0, relation=relation, estimator="knn", seed=s), base, relation,
                           trials=20, canaries=20)
    assert private.epsilon_lower_bound <= private.epsilon_claimed == 1.0
    leaky = audit_fitted(lambda s: NoisyGram(epsilon=math.inf, relation=relation, estimator="knn", seed=s), base, relation,
                         trials=20, canaries=20)
    assert leaky.epsilon_lower_bound > 2.0  # the same audit sees the canaries when nothing is noised


def test_fitted_object_holds_the_released_means_not_the_exact_ones():
    train = tiny_fold().train
    m = NoisyGram(epsilon=1.0).fit(train)
    assert torch.equal(m.fallback_.item_means_, m.item_avg_) and m.fallback_.global_mean == m.global_avg_
    assert not torch.allclose(m.item_avg_, train.item_means(), atol=1e-3)


def test_symmetric_solve_matches_lu_on_definite_and_indefinite_systems():
    """The pnbm surrogate's batched solve (Cholesky, eigen-solve fallback) gives LU's answer on both kinds of system."""
    from dprec_torch.predictors.noisy_gram import symmetric_solve

    g = torch.Generator().manual_seed(0)  # public test data
    x = torch.randn(6, 5, 5, generator=g, dtype=torch.float64)
    a = x + x.transpose(1, 2)
    a[:3] += 12.0 * torch.eye(5, dtype=torch.float64)  # the first three positive definite, the rest indefinite
    b = torch.randn(6, 5, generator=g, dtype=torch.float64)
    assert torch.linalg.cholesky_ex(a)[1][3:].ne(0).all()
    assert torch.allclose(symmetric_solve(a, b), torch.linalg.solve(a, b.unsqueeze(-1)).squeeze(-1), atol=1e-9)
