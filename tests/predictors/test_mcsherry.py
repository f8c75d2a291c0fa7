"""McSherry-Mironov: covariance sensitivity bound, Gaussian noise scale, and the kNN prediction by hand."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from dprec_torch.data.ratings import Ratings, RatingScale
from dprec_torch.errors import ConfigError, DataError
from dprec_torch.predictors.mcsherry import (
    McSherryMironov,
    covariance_sensitivity,
    paper_covariance_bound,
    weighted_covariance,
)
from dprec_torch.privacy.calibration import analytic_gaussian_sigma, classic_gaussian_sigma, gaussian_delta
from dprec_torch.training.run import instantiate_node
from tests.contract import PredictorContract

SCALE = RatingScale(1.0, 5.0)
CONF = Path(__file__).resolve().parents[2] / "conf" / "model" / "mcsherry.yaml"


def _ratings(u: list[int], i: list[int], v: list[float], n_users: int, n_items: int) -> Ratings:
    return Ratings(torch.tensor(u), torch.tensor(i), torch.tensor(v, dtype=torch.float32), n_users, n_items, SCALE)


# ------------------------------------------------------------------ sensitivity
def test_sensitivity_for_a_first_rating_is_b_squared() -> None:
    # c = 0 only: x = 0, y has one entry in [-B, B], w_b = 1 -> ||y y^T|| = B^2
    assert covariance_sensitivity(clamp_b=1.5, alpha=8.0, beta_p=20.0, max_count=0) == pytest.approx(1.5**2)


def test_sensitivity_formula_by_hand_at_c_equal_one() -> None:
    b, alpha, beta = 1.0, 8.0, 20.0
    weight = (1.0 - 1.0 / math.sqrt(2)) * 1 * b * b  # |w_a - w_b| ||x||^2, c = 1
    shift = math.sqrt(alpha**2 / (1 + 1 + beta) ** 2 + b * b)  # Theorem 4
    outer = (1 / math.sqrt(2)) * shift * b * (1 + math.sqrt(2))
    assert covariance_sensitivity(b, alpha, beta, max_count=1) == pytest.approx(max(b * b, weight + outer))


def test_sensitivity_is_below_the_papers_bound_when_beta_p_is_large_enough() -> None:
    b, alpha = 1.0, 8.0
    beta = alpha**2 / (4 * b * b)  # the condition under which the slide's (1 + 2 sqrt 2) B^2 holds
    got = covariance_sensitivity(b, alpha, beta, max_count=5000)
    assert got <= paper_covariance_bound(b)
    # for large c the bound tends to 2 B^2 (shift -> B, weight term -> 0); the max sits at a finite c
    assert got > 2 * b * b
    assert covariance_sensitivity(b, alpha, beta, max_count=10**6) == pytest.approx(got)


@pytest.mark.parametrize("seed", range(4))
def test_sensitivity_bounds_the_real_change_of_the_covariance(seed: int) -> None:
    # add one rating to one user with MAvg held fixed; ||Cov(D') - Cov(D)||_F must stay below the bound
    gen = torch.Generator().manual_seed(seed)
    n_users, n_items, b, beta = 6, 12, 1.0, 2.0
    mask = torch.rand(n_users, n_items, generator=gen) < 0.5
    mask[0] = False
    mask[0, : 3 + seed] = True  # the user who gets the extra rating rates 3+seed items
    worst = 0.0
    for trial in range(30):  # small loop over random neighbours in a test, not in library code
        vals = torch.randint(1, 6, (n_users, n_items), generator=gen).float()
        vals[0, : 3 + seed] = 1.0 if trial % 2 else 5.0  # extreme residuals maximise the shift
        item_avg = torch.rand(n_items, generator=gen) * 4 + 1
        u, i = mask.nonzero(as_tuple=True)
        d = _ratings(u.tolist(), i.tolist(), vals[u, i].tolist(), n_users, n_items)
        new_item = 3 + seed + int(torch.randint(0, n_items - 3 - seed, (1,), generator=gen))
        new_val = 5.0 if trial % 2 else 1.0
        d2 = _ratings(u.tolist() + [0], i.tolist() + [new_item], vals[u, i].tolist() + [new_val], n_users, n_items)
        c1, _ = weighted_covariance(d, item_avg, b, beta)
        c2, _ = weighted_covariance(d2, item_avg, b, beta)
        worst = max(worst, float(torch.linalg.norm(c2 - c1)))
    bound = covariance_sensitivity(b, 2 * SCALE.span, beta, n_items - 1)
    assert worst <= bound
    assert worst > 0.3 * bound  # the bound is not vacuous on these cases


# ------------------------------------------------------------ Gaussian mechanism
def test_classic_sigma_matches_the_slide_formula() -> None:
    # sigma = sqrt(2 ln(2/delta)) / eps * Delta = sqrt(2 ln(2e5)) / 0.5 * 2
    assert classic_gaussian_sigma(2.0, 0.5, 1e-5) == pytest.approx(math.sqrt(2 * math.log(2e5)) * 4.0)


@pytest.mark.parametrize("eps", [0.1, 0.5, 0.9, 2.0, 8.0])
def test_analytic_sigma_is_tight_and_never_overshoots(eps: float) -> None:
    delta, sens = 1e-6, 2.7
    sigma = analytic_gaussian_sigma(sens, eps, delta)
    assert gaussian_delta(sigma, sens, eps) <= delta
    assert gaussian_delta(sigma * 0.999, sens, eps) > delta  # no slack left
    if eps < 1:
        assert sigma <= classic_gaussian_sigma(sens, eps, delta)


def test_gaussian_delta_by_hand() -> None:
    # Balle & Wang Thm. 8 with Delta = sigma = eps = 1: Phi(1/2 - 1) - e Phi(-1/2 - 1)
    phi = lambda x: 0.5 * (1 + math.erf(x / math.sqrt(2)))  # noqa: E731
    assert gaussian_delta(1.0, 1.0, 1.0) == pytest.approx(phi(-0.5) - math.e * phi(-1.5))


def _random_train(n_users: int, n_items: int, density: float, seed: int) -> Ratings:
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(n_users, n_items, generator=gen) < density
    u, i = mask.nonzero(as_tuple=True)
    v = torch.randint(1, 6, (u.numel(),), generator=gen).float()
    return Ratings(u, i, v, n_users, n_items, SCALE)


def test_fit_adds_noise_at_the_calibrated_scale() -> None:
    train = _random_train(60, 150, 0.2, seed=1)
    eps, delta = 2.0, 1e-5
    model = McSherryMironov(epsilon=eps, delta=delta, seed=0, variance_floor=0.0).fit(train)
    sens = covariance_sensitivity(1.0, 2 * SCALE.span, 20.0, 149)
    assert model.sensitivity_ == pytest.approx(sens)
    assert model.sigma_ == pytest.approx(analytic_gaussian_sigma(sens, eps * 0.5, delta))
    clean, _ = weighted_covariance(train, model.item_avg_, 1.0, 20.0)
    noise = model.cov_ - clean
    off = noise[~torch.eye(150, dtype=torch.bool)]
    # symmetrised i.i.d. N(0, sigma^2): off-diagonal std sigma/sqrt(2), diagonal std sigma
    assert float(off.std()) == pytest.approx(model.sigma_ / math.sqrt(2), rel=0.05)
    assert float(noise.diagonal().std()) == pytest.approx(model.sigma_, rel=0.25)


def test_classic_calibration_refuses_eps_cov_at_least_one() -> None:
    with pytest.raises(ConfigError, match="analytic"):
        McSherryMironov(epsilon=4.0, calibration="classic").fit(_random_train(10, 8, 0.5, 0))


# -------------------------------------------------------------------- predictor
def test_nonprivate_prediction_by_hand() -> None:
    # 3 users x 3 items; at eps = inf, G and MAvg are exact damped averages
    u = [0, 0, 0, 1, 1, 2, 2]
    i = [0, 1, 2, 0, 1, 0, 2]
    v = [5.0, 4.0, 1.0, 4.0, 5.0, 2.0, 4.0]
    train = _ratings(u, i, v, 3, 3)
    bm, bp = 2.0, 1.0
    model = McSherryMironov(epsilon=float("inf"), k=5, beta_m=bm, beta_p=bp).fit(train)
    g = sum(v) / len(v)
    m_avg = [(sum(x for x, it in zip(v, i) if it == j) + bm * g) / (i.count(j) + bm) for j in range(3)]
    assert model.item_avg_.tolist() == pytest.approx(m_avg, rel=1e-5)
    resid = {(a, b): x - m_avg[b] for a, b, x in zip(u, i, v)}
    off = [sum(r for (a, _), r in resid.items() if a == w) / (u.count(w) + bp) for w in range(3)]
    assert model.user_offset_.tolist() == pytest.approx(off, rel=1e-5)
    # user 1 has not rated item 2: neighbours = rated items {0, 1} with positive similarity
    s = model.sim_[2]
    nb = [j for j in (0, 1) if float(s[j]) > 0]
    num = sum(float(s[j]) * (resid[(1, j)] - off[1]) for j in nb)
    den = sum(float(s[j]) for j in nb)
    expect = m_avg[2] + off[1] + (num / den if den > 0 else 0.0)
    assert float(model.predict(torch.tensor([1]), torch.tensor([2]))[0]) == pytest.approx(min(max(expect, 1), 5), rel=1e-5)
    # correlation normalisation of the clean covariance
    c = model.cov_
    assert float(s[0]) == pytest.approx(float(c[2, 0] / torch.sqrt(c[2, 2] * c[0, 0])), rel=1e-4)


def test_unknown_user_gets_the_private_item_average() -> None:
    train = _random_train(20, 10, 0.5, seed=3)
    model = McSherryMironov(epsilon=1.0, seed=0).fit(_ratings(train.users.tolist(), train.items.tolist(), train.values.tolist(), 21, 11))
    pred = model.predict(torch.tensor([20, 20, 0]), torch.tensor([4, 10, 11]))
    assert float(pred[0]) == pytest.approx(float(model.item_avg_[4]))  # user 20 has no ratings
    assert float(pred[1]) == pytest.approx(float(model.item_avg_[10]))  # item 10 unrated: (MSum + beta_m G)/(MCnt + beta_m)
    assert float(pred[2]) == pytest.approx(model.global_avg_)  # item id out of range: G


def test_predict_is_seeded_and_recommend_excludes_training_items() -> None:
    train = _random_train(30, 25, 0.3, seed=4)
    a = McSherryMironov(epsilon=1.0, seed=9).fit(train)
    b = McSherryMironov(epsilon=1.0, seed=9).fit(train)
    q = torch.arange(30)
    assert torch.equal(a.predict(q, q % 25), b.predict(q, q % 25))
    rec = a.recommend(torch.tensor([0, 1, 2]), 5)
    for row, user in zip(rec.tolist(), [0, 1, 2]):
        rated = set(train.items[train.users == user].tolist())
        assert not (set(row) - {-1}) & rated
        # the recommended items are the best-scored unrated ones
        unrated = torch.tensor(sorted(set(range(25)) - rated))
        scores = a.predict(torch.full_like(unrated, user), unrated)
        best = float(scores.max())
        assert float(a.predict(torch.tensor([user]), torch.tensor([row[0]]))[0]) == pytest.approx(best)


def test_privacy_report_composes_the_budget() -> None:
    model = McSherryMironov(epsilon=1.5, delta=1e-6).fit(_random_train(20, 10, 0.5, 0))
    rep = model.privacy_report()
    assert rep["epsilon"] == 1.5 and rep["delta"] == 1e-6 and rep["relation"] == "rating"
    assert sum(rep["budget"].values()) == pytest.approx(1.0)
    assert rep["sensitivity"]["cov_l2"] == pytest.approx(model.sensitivity_)


def test_bad_config_and_data_raise_readable_errors() -> None:
    with pytest.raises(ConfigError, match="delta"):
        McSherryMironov(epsilon=1.0, delta=0.0)
    with pytest.raises(ConfigError, match="budget"):
        McSherryMironov(budget={"gsum": 0.5, "gcnt": 0.5, "msum": 0.5, "mcnt": 0.5, "cov": 0.5})
    empty = Ratings(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), torch.zeros(0), 2, 2, SCALE)
    with pytest.raises(DataError, match="empty"):
        McSherryMironov().fit(empty)
    with pytest.raises(DataError, match="1-D"):
        McSherryMironov(epsilon=float("inf")).fit(_random_train(5, 5, 0.5, 0)).predict(torch.tensor([[0]]), torch.tensor([[0]]))


def test_yaml_instantiates_with_top_level_keys() -> None:
    cfg = OmegaConf.merge(OmegaConf.create({"epsilon": 2.0, "seed": 1, "noise_seed": 1, "delta": 1e-7}), OmegaConf.load(CONF))
    model = instantiate_node(cfg.model)  # the path train.py takes (drops the bookkeeping `name`)
    assert isinstance(model, McSherryMironov) and model.delta == 1e-7 and model.epsilon == 2.0
    assert sum(model.budget.values()) == pytest.approx(1.0)


class _DampedFallback:
    """An unknown user gets MAvg_i = (sum r + beta_m G) / (n_i + beta_m) (exact at eps = inf)."""

    beta_m = 15.0

    def expected_unknown_user(self, train, item):
        n = float(train.item_counts()[item])
        s = float(train.item_sums()[item])
        return min(max((s + self.beta_m * train.global_mean) / (n + self.beta_m), train.scale.lo), train.scale.hi)


class TestMcSherryContract(_DampedFallback, PredictorContract):
    def make_predictor(self):
        return McSherryMironov(epsilon=float("inf"), beta_m=self.beta_m)


class TestPrivateMcSherryContract(_DampedFallback, PredictorContract):
    """At a huge epsilon the noisy averages sit within the tolerance of the exact ones."""

    tolerance = 1e-2

    def make_predictor(self):
        return McSherryMironov(epsilon=1e6, delta=1e-6, beta_m=self.beta_m, seed=0)


# ----------------------------------------------------------------------------- privacy statement
def test_privacy_report_states_relation_sensitivity_noise_and_accountant() -> None:
    train = _random_train(20, 10, 0.5, 0)
    model = McSherryMironov(epsilon=2.0, delta=1e-6).fit(train)
    rep = model.privacy_report()
    assert rep["relation"] == "rating" and "added or removed" in rep["neighbouring"]
    assert rep["sensitivity"] == {"gsum": 2.0, "gcnt": 1.0, "msum_l1": 2.0, "mcnt_l1": 1.0,
                                  "cov_l2": pytest.approx(covariance_sensitivity(1.0, 8.0, 20.0, 9)),
                                  "cov_l2_paper": pytest.approx(paper_covariance_bound(1.0)), "norms": rep["sensitivity"]["norms"]}
    assert "Laplace" in rep["noise"] and f"sigma={model.sigma_:.4g}" in rep["noise"]
    assert "basic sequential composition" in rep["accountant"] and "(2, 1e-06)" in rep["accountant"]
    assert McSherryMironov(epsilon=math.inf).fit(train).privacy_report()["accountant"] == "none"


def test_laplace_scales_are_the_stated_sensitivities_over_each_epsilon(monkeypatch) -> None:
    """The noise of step 1 is calibrated to exactly the sensitivities the harness checks (release_sensitivities)."""
    from dprec_torch.predictors import mcsherry

    scales = []
    real = mcsherry._laplace
    monkeypatch.setattr(mcsherry, "_laplace", lambda shape, scale, gen, dev: scales.append(scale) or real(shape, scale, gen, dev))
    train = _random_train(20, 10, 0.5, 0)
    model = McSherryMironov(epsilon=2.0).fit(train)
    sens = model.release_sensitivities(train.scale, train.n_items)
    assert scales == pytest.approx([sens[k] / (2.0 * model.budget[k]) for k in ("gsum", "gcnt", "msum", "mcnt")])
    assert model.sigma_ == pytest.approx(analytic_gaussian_sigma(sens["cov"], 2.0 * model.budget["cov"], model.delta))


def test_ratings_outside_the_scale_are_refused_when_private() -> None:
    """Every sensitivity assumes lo <= r <= hi: a 7 on a 1-5 scale would move GSum by 4 > span/2 (fails on the old
    code, which released it)."""
    bad = _ratings([0, 1], [0, 1], [5.0, 7.0], 2, 2)
    with pytest.raises(DataError, match="outside the rating scale"):
        McSherryMironov(epsilon=1.0).fit(bad)
    McSherryMironov(epsilon=math.inf).fit(bad)  # the non-private pipeline claims nothing
