"""lowrank_dpsgd (issue 17, item 3): DP-SGD with per-user clipping on S = U U^T.

Per-user gradients against autograd, the clipped step's sensitivity on adversarial datasets (hypothesis), the
accountant calibration, the predictor contract, configs and a canary audit.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hypothesis import given, settings
from hypothesis import strategies as st

from dprec_torch.errors import ConfigError
from dprec_torch.predictors.lowrank_dpsgd import LowRankDPSGD, clipped_sum, per_user_gradients, rdp_total_mu, sgd_noise_multiplier
from dprec_torch.privacy.opacus_accounting import OpacusAccountant
from dprec_torch.training.run import instantiate_node
from tests.contract import PredictorContract
from tests.helpers import CONF_DIR, tiny_fold
from tests.test_noisy_gram import datasets


def _autograd_user_gradient(items: torch.Tensor, y: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """dL_u/dU by autograd from the definition f_ui = n^(-1/2) sum_{j != i} s_ij y_uj, S = U U^T."""
    uu = u.clone().requires_grad_(True)
    s = uu[items] @ uu[items].t()
    s = s - torch.diag(torch.diagonal(s))
    f = (s @ y) / math.sqrt(items.numel())
    (g,) = torch.autograd.grad(((y - f) ** 2).sum(), uu)
    return g


@settings(max_examples=40, deadline=None)
@given(data=st.data(), d=st.integers(1, 3), seed=st.integers(0, 10**6))
def test_per_user_gradients_match_autograd(data, d, seed):
    r = data.draw(datasets())
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(r.n_items, d, generator=gen, dtype=torch.float64)
    y = torch.randn(len(r), generator=gen, dtype=torch.float64)
    rows, norms = per_user_gradients(r.users, r.items, y, u, r.n_users)
    for user in range(r.n_users):
        sel = r.users == user
        mine = torch.zeros_like(u).index_add_(0, r.items[sel], rows[sel])
        ref = _autograd_user_gradient(r.items[sel], y[sel], u)
        assert torch.allclose(mine, ref, atol=1e-9)
        assert float(norms[user]) == pytest.approx(float(ref.norm()), abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), clip=st.floats(0.01, 10.0), scale=st.floats(0.01, 5.0), seed=st.integers(0, 10**6))
def test_clipped_step_moves_at_most_c_when_a_user_leaves(data, clip, scale, seed):
    r = data.draw(datasets())
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(r.n_items, 2, generator=gen, dtype=torch.float64) * scale
    y = torch.randn(len(r), generator=gen, dtype=torch.float64).clamp(-1, 1)

    def step(keep: torch.Tensor) -> torch.Tensor:
        # the other users' residuals are unchanged by a neighbour (public means, each user's own offset)
        rows, norms = per_user_gradients(r.users[keep], r.items[keep], y[keep], u, r.n_users)
        return clipped_sum(r.users[keep], r.items[keep], rows, norms, clip, r.n_items)

    user = data.draw(st.integers(0, r.n_users - 1))
    full = step(torch.ones(len(r), dtype=torch.bool))
    own = step(r.users == user)
    assert float(own.norm()) <= clip * (1 + 1e-9)  # the user's clipped contribution
    assert torch.allclose(full - step(r.users != user), own, atol=1e-9)  # removing the user removes exactly it


def test_noise_multiplier_is_the_smallest_that_meets_the_target():
    sigma = sgd_noise_multiplier(1.0, 1e-6, 5.0, 0.1, 100)

    def eps(s):
        acc = OpacusAccountant("rdp")
        acc.step(5.0, 1.0)
        acc.step(s, 0.1, steps=100)
        return acc.get_epsilon(1e-6)

    assert eps(sigma) <= 1.0
    assert eps(sigma * 0.99) > 1.0


@pytest.mark.parametrize("eps", [0.5, 1.0, 10.0])
def test_item_mean_share_never_exhausts_the_budget(eps):
    """mu_rdp is the largest single-release mu the accountant allows; any mean_fraction < 1 leaves room for the
    steps (mean_fraction = 0.9 at eps = 1 used to leave none when the share was taken of the GDP mu)."""
    mu = rdp_total_mu(eps, 1e-6)
    one = OpacusAccountant("rdp")
    one.step(1.0 / mu, 1.0)
    assert one.get_epsilon(1e-6) <= eps
    more = OpacusAccountant("rdp")
    more.step(1.0 / (mu * 1.001), 1.0)
    assert more.get_epsilon(1e-6) > eps
    sigma = sgd_noise_multiplier(eps, 1e-6, 1.0 / (math.sqrt(0.9) * mu), 0.1, 200)
    assert math.isfinite(sigma)
    fold = tiny_fold()
    rep = LowRankDPSGD(epsilon=eps, mean_fraction=0.9, steps=5, dim=2).fit(fold.train).privacy_report()
    assert rep["epsilon_accountant"] <= eps


def test_prv_accountant_calibrates_tighter_and_reports_its_own_epsilon():
    """accountant=prv: the whole history [(item means, q = 1), (sigma, q, T)] is within eps by Opacus's PRV upper
    bound, needs less noise than RDP for the same target, and the single-release mu never exceeds the exact
    Gaussian-DP mu (PRV cannot beat the tight analytic curve of one Gaussian release)."""
    from dprec_torch.privacy.gaussian_release import total_mu

    eps = 2.0
    mu_prv, mu_rdp = rdp_total_mu(eps, 1e-6, "prv"), rdp_total_mu(eps, 1e-6, "rdp")
    assert mu_rdp < mu_prv <= total_mu(eps, 1e-6)
    mean_mult = 1.0 / (math.sqrt(0.5) * mu_prv)
    sigma = sgd_noise_multiplier(eps, 1e-6, mean_mult, 0.1, 50, "prv")
    assert sigma < sgd_noise_multiplier(eps, 1e-6, 1.0 / (math.sqrt(0.5) * mu_rdp), 0.1, 50, "rdp")
    acc = OpacusAccountant("prv")
    acc.step(mean_mult, 1.0)
    acc.step(sigma, 0.1, steps=50)
    assert acc.get_epsilon(1e-6) <= eps
    rep = LowRankDPSGD(epsilon=eps, steps=5, dim=2, accountant="prv").fit(tiny_fold().train).privacy_report()
    assert rep["epsilon_accountant"] <= eps and "PRV" in rep["accountant"]


def test_means_alone_over_budget_is_one_line():
    with pytest.raises(ConfigError):
        sgd_noise_multiplier(0.1, 1e-6, 0.5, 0.1, 10)


def test_report_states_relation_release_and_accountant():
    fold = tiny_fold()
    m = LowRankDPSGD(epsilon=1.0, steps=20, sampling_ratio=0.2, dim=3, seed=1).fit(fold.train)
    rep = m.privacy_report()
    assert rep["epsilon"] == 1.0 and rep["epsilon_accountant"] <= 1.0 + 1e-9
    assert rep["relation"] == "user" and "item side" in rep["released"] and "own ratings" in rep["joint_dp"]
    assert rep["sensitivity"]["sgd_step_l2"] == 1.0 and rep["sensitivity"]["item_stats_l2"] == 1.0


def test_private_fit_is_deterministic_and_finite():
    fold = tiny_fold()
    kw = dict(epsilon=2.0, steps=15, sampling_ratio=0.3, dim=2, seed=4)
    pa = LowRankDPSGD(**kw).fit(fold.train).predict(fold.test.users, fold.test.items)
    pb = LowRankDPSGD(**kw).fit(fold.train).predict(fold.test.users, fold.test.items)
    assert torch.isfinite(pa).all() and torch.equal(pa, pb)


def test_training_without_noise_beats_means_only():
    fold = tiny_fold()
    m = LowRankDPSGD(epsilon=math.inf, steps=150, sampling_ratio=0.5, dim=4, lr=5.0, clip=10.0, seed=0).fit(fold.train)
    rmse = float(((m.predict(fold.test.users, fold.test.items) - fold.test.values) ** 2).mean().sqrt())
    m.item_factors_ = torch.zeros_like(m.item_factors_)
    m._index_users(m.train_)
    base = float(((m.predict(fold.test.users, fold.test.items) - fold.test.values) ** 2).mean().sqrt())
    assert rmse < base


class TestLowRankDPSGDContract(PredictorContract):
    """eps = inf: the fallbacks are the user-weighted noiseless item statistics, so the tolerance is loose."""

    tolerance = 0.6

    def make_predictor(self):
        return LowRankDPSGD(epsilon=math.inf, steps=5, dim=2)


@pytest.mark.parametrize("bad", [dict(dim=0), dict(sampling_ratio=0.0), dict(clip=math.inf), dict(mean_fraction=1.0),
                                 dict(count_weight=-1.0), dict(accountant="gdp"), dict(epsilon=0)])
def test_bad_config_is_one_line(bad):
    with pytest.raises(ConfigError):
        LowRankDPSGD(**bad)


def test_config_composes_and_trains_end_to_end(tmp_path: Path):
    from dprec_torch.training.run import train

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=["model=lowrank_dpsgd", "epsilon=1", "data=synthetic", "device=cpu", "model.steps=10",
                                           "compare_baselines=false", "tensorboard=false", f"output_dir={tmp_path}"])
    assert isinstance(instantiate_node(cfg.model), LowRankDPSGD)
    metrics = train(cfg)
    assert metrics["privacy"]["epsilon"] == 1.0 and metrics["privacy"]["relation"] == "user"
    assert math.isfinite(metrics["test_rmse"])


def test_canary_audit_stays_below_the_claim_and_has_power():
    from dprec_torch.audit.fitted import audit_fitted

    base = tiny_fold().train
    kw = dict(steps=30, sampling_ratio=0.5, dim=4, lr=5.0, clip=10.0)
    private = audit_fitted(lambda s: LowRankDPSGD(epsilon=1.0, seed=s, **kw), base, "user", trials=20, canaries=20)
    assert private.epsilon_lower_bound <= private.epsilon_claimed == 1.0
    leaky = audit_fitted(lambda s: LowRankDPSGD(epsilon=math.inf, seed=s, **kw), base, "user", trials=20, canaries=20)
    assert leaky.epsilon_lower_bound > private.epsilon_lower_bound
