"""DP-ALS: per-user sampling, sensitivity harness (hypothesis), accounting, contract, config."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dprec_torch.errors import ConfigError
from dprec_torch.predictors.dpals import (
    DPALS,
    als_round_statistics,
    als_sensitivity,
    clip_rows,
    power_sensitivity,
    power_statistics,
    user_residuals,
)
from dprec_torch.data.preprocess import per_user_sample
from dprec_torch.privacy.calibration import calibrate_gaussian
from dprec_torch.training.run import instantiate_node
from tests.contract import PredictorContract
from tests.helpers import tiny_cfg, tiny_fold
from tests.predictors.test_noisy_gram import datasets, public_means, with_value, without_rating, without_user

TOL = 1e-9


def released(r, means, v, m, gu, gr, reg=1.0, beta_p=5.0, seed=0):
    """The pre-noise vector one ALS round releases: (triangles of A_j, b_j) over all items."""
    _, y = user_residuals(r, means, beta_p, gr)
    keep = per_user_sample(r, m, seed, hash="lehmer")
    a, b = als_round_statistics(r, y, keep, v, reg, gu)
    iu = torch.triu_indices(v.shape[1], v.shape[1])
    return torch.cat([a[:, iu[0], iu[1]].reshape(-1), b.reshape(-1)])


def power_released(r, means, q, m, gr, beta_p=5.0, seed=0):
    _, y = user_residuals(r, means, beta_p, gr)
    keep = per_user_sample(r, m, seed, hash="lehmer")
    return power_statistics(r, y, keep, q, gr * math.sqrt(m))


# ------------------------------------------------------------------ per-user sampling
@settings(max_examples=60, deadline=None)
@given(data=st.data(), m=st.integers(1, 4), seed=st.integers(0, 10**6))
def test_sample_is_capped_and_a_function_of_the_users_own_ratings(data, m, seed):
    r = data.draw(datasets())
    keep = per_user_sample(r, m, seed, hash="lehmer")
    assert int(torch.bincount(r.users[keep], minlength=r.n_users).max()) <= m
    other = data.draw(st.integers(0, r.n_users - 1))
    r1 = without_user(r, other)
    keep1 = per_user_sample(r1, m, seed, hash="lehmer")
    assert torch.equal(keep[r.users != other], keep1)  # nobody else's selection moved


# ------------------------------------------------------------------ sensitivity harness
def _factors(draw, n_items: int, d: int) -> torch.Tensor:
    vals = [draw(st.floats(-3.0, 3.0)) for _ in range(n_items * d)]
    return torch.tensor(vals, dtype=torch.float64).reshape(n_items, d)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), d=st.integers(1, 3), m=st.integers(1, 4), gu=st.floats(0.1, 3.0), gr=st.floats(0.2, 3.0))
def test_als_round_moves_at_most_delta_when_a_user_leaves(data, d, m, gu, gr):
    r = data.draw(datasets())
    means, v = public_means(data.draw, r.n_items), _factors(data.draw, r.n_items, d)
    user = data.draw(st.integers(0, r.n_users - 1))
    moved = float((released(r, means, v, m, gu, gr) - released(without_user(r, user), means, v, m, gu, gr)).norm())
    assert moved <= als_sensitivity(m, gu, gr, "user") * (1 + 1e-9) + TOL


@settings(max_examples=40, deadline=None)
@given(data=st.data(), d=st.integers(1, 3), m=st.integers(1, 4), gu=st.floats(0.1, 3.0), gr=st.floats(0.2, 3.0))
def test_als_round_moves_at_most_2delta_when_a_rating_changes(data, d, m, gu, gr):
    r = data.draw(datasets())
    means, v = public_means(data.draw, r.n_items), _factors(data.draw, r.n_items, d)
    pos = data.draw(st.integers(0, len(r) - 1))
    base = released(r, means, v, m, gu, gr)
    for nb in (without_rating(r, pos), with_value(r, pos, float(data.draw(st.sampled_from([1.0, 5.0]))))):
        moved = float((base - released(nb, means, v, m, gu, gr)).norm())
        assert moved <= als_sensitivity(m, gu, gr, "rating") * (1 + 1e-9) + TOL


@settings(max_examples=60, deadline=None)
@given(data=st.data(), d=st.integers(1, 3), m=st.integers(1, 4), gr=st.floats(0.2, 3.0))
def test_power_iteration_moves_at_most_c0_squared(data, d, m, gr):
    r = data.draw(datasets())
    if r.n_items < d:
        return
    means = public_means(data.draw, r.n_items)
    q = torch.linalg.qr(_factors(data.draw, r.n_items, d) + 1e-3 * torch.eye(r.n_items, d, dtype=torch.float64))[0]
    user = data.draw(st.integers(0, r.n_users - 1))
    moved = float((power_released(r, means, q, m, gr) - power_released(without_user(r, user), means, q, m, gr)).norm())
    assert moved <= power_sensitivity(m, gr, "user") * (1 + 1e-9) + TOL


def test_clip_rows_bounds_every_row():
    f = torch.tensor([[3.0, 4.0], [0.1, 0.0], [0.0, 0.0]])
    out = clip_rows(f, 1.0)
    assert torch.allclose(out.norm(dim=1), torch.tensor([1.0, 0.1, 0.0]))


# ------------------------------------------------------------------ accounting
@pytest.mark.parametrize("mean_noise", ["gaussian", "laplace"])
@pytest.mark.parametrize("relation", ["user", "rating"])
def test_whole_run_composes_to_the_target(mean_noise, relation):
    fold = tiny_fold()
    m = DPALS(epsilon=2.0, relation=relation, mean_noise=mean_noise, iterations=3, power_iters=2, dim=3).fit(fold.train)
    rep = m.privacy_report()
    assert rep["epsilon_exact"] == pytest.approx(2.0, rel=1e-6)
    assert rep["epsilon_rdp_crosscheck"] >= 2.0 - 1e-6
    assert rep["relation"] == relation and "own ratings" in rep["joint_dp"]
    mus = m.mu_
    assert mus["als"] == pytest.approx(mus["power"] * math.sqrt((1 - m.init_fraction - (m.mean_fraction if mean_noise == "gaussian" else 0))
                                                                 / 3 / (m.init_fraction / 2)), rel=1e-9)
    assert m.als_std_ == pytest.approx(als_sensitivity(m.max_ratings_per_user, 1.0, 1.0, relation) / mus["als"], rel=1e-12)
    if mean_noise == "gaussian":
        gauss = math.sqrt(sum(mus[k] ** 2 * n for k, (_, n) in m.plan_.items()))
        assert gauss == pytest.approx(calibrate_gaussian(2.0, 1e-6, accountant="gdp").mu, rel=1e-9)


# ------------------------------------------------------------------ predictor
class TestDPALSContract(PredictorContract):
    """eps = inf, rating-level Gaussian means: fallbacks are the exact item/global means."""

    tolerance = 1e-4

    def make_predictor(self):
        return DPALS(epsilon=math.inf, relation="rating", mean_noise="gaussian", max_ratings_per_user=None,
                     clip_factor=math.inf, clamp_r=math.inf, dim=4, iterations=4, item_reg=5.0, noise_reg=0.0)


def test_private_fit_is_deterministic():
    fold = tiny_fold()
    a = DPALS(epsilon=5.0, seed=2).fit(fold.train).predict(fold.test.users, fold.test.items)
    b = DPALS(epsilon=5.0, seed=2).fit(fold.train).predict(fold.test.users, fold.test.items)
    assert torch.isfinite(a).all() and torch.equal(a, b)


@pytest.mark.parametrize("bad", [dict(max_ratings_per_user=None), dict(clip_factor=math.inf), dict(relation="item"),
                                 dict(dim=0), dict(mean_noise="cauchy"), dict(mean_fraction=0.95, mean_noise="gaussian")])
def test_bad_config_is_one_line(bad):
    with pytest.raises(ConfigError):
        DPALS(epsilon=1.0, **bad)


def test_config_composes_and_instantiates():
    cfg = tiny_cfg("model=dpals", "epsilon=10", "data=synthetic")
    model = instantiate_node(cfg.model)
    assert model.epsilon == 10.0 and cfg.mechanism.name == "builtin"


def test_canary_audit_stays_below_the_claim_and_has_power():
    from dprec_torch.audit.fitted import audit_fitted

    base = tiny_fold().train
    private = audit_fitted(lambda s: DPALS(epsilon=1.0, dim=3, iterations=1, seed=s), base, "user", trials=20, canaries=20)
    assert private.epsilon_lower_bound <= private.epsilon_claimed == 1.0
    leaky = audit_fitted(lambda s: DPALS(epsilon=math.inf, dim=3, iterations=1, seed=s), base, "user", trials=20, canaries=20)
    assert leaky.epsilon_lower_bound > 2.0
