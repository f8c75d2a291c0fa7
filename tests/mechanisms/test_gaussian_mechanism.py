"""Gaussian DP-SGD: clipped per-example norms <= c on real batches, noise std = sigma c, epsilon = Opacus's."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from opacus.accountants import PRVAccountant, RDPAccountant
from opacus.accountants.utils import get_noise_multiplier

from dprec_torch.data.ratings import RatingScale
from dprec_torch.errors import ConfigError
from dprec_torch.mechanisms.context import TrainingContext
from dprec_torch.mechanisms.gaussian import GaussianDPSGD
from dprec_torch.models.batching import PoissonBatchSampler
from dprec_torch.models.mf import MF
from dprec_torch.privacy.calibration import calibrate_gaussian
from dprec_torch.privacy.opacus_accounting import RDP_ORDERS, OpacusAccountant
from dprec_torch.seeding import noise_generator
from tests.helpers import tiny_fold

SCALE = RatingScale(1, 5)
# tiny q with few steps puts the optimal RDP order at the top of the list: a valid, slightly loose bound
pytestmark = pytest.mark.filterwarnings("ignore:Optimal order is the largest alpha")


def context(k: int = 100, n_ratings: int = 8000, n_users: int = 300) -> TrainingContext:
    return TrainingContext(total_steps=k, steps_per_epoch=10, n_ratings=n_ratings, n_users=n_users, scale=SCALE)


def trained_ish_mf(fold, seed: int = 0) -> MF:
    """MF with non-trivial factors, so per-example norms vary and many exceed c."""
    m = MF(fold.train.n_users, fold.train.n_items, dim=4, init_std=0.8, seed=seed).attach(fold.train)
    with torch.no_grad():
        m.user_factors.weight.normal_(0, 0.8, generator=torch.Generator().manual_seed(seed))
    return m


def per_example_grad_norms_brute_force(m: MF, batch, residuals: torch.Tensor, unit: str) -> torch.Tensor:
    """Independent per-example gradients: one backward per example (test-only loop)."""
    groups = batch.rows if unit == "user" else torch.arange(batch.n_targets)
    n = int(batch.users.numel()) if unit == "user" else batch.n_targets
    norms = torch.zeros(n, dtype=torch.float64)
    for k in range(n):
        e = torch.where(groups == k, residuals, torch.zeros_like(residuals))
        grads = torch.autograd.grad(m.surrogate_loss(batch, e), list(m.parameters()))
        norms[k] = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
    return norms


@pytest.mark.parametrize("unit,c", [("rating", 1.0), ("rating", 0.3), ("user", 2.0), ("user", 0.5)])
def test_clipped_per_example_norms_never_exceed_c(unit, c):
    fold = tiny_fold()
    m = trained_ish_mf(fold)
    sampler = PoissonBatchSampler(fold.train, fold.train.item_means(), 0.02, unit, noise_generator(1))
    opt = GaussianDPSGD(m.parameters(), context(), epsilon=math.inf, unit=unit, clip_norm=c)
    n_clipped = 0
    for _ in range(3):
        batch = sampler.sample()
        res = (m.batch_predict(batch) - batch.values).detach()
        before = per_example_grad_norms_brute_force(m, batch, res, unit)
        after = per_example_grad_norms_brute_force(m, batch, opt.clip_residuals(res, batch, m), unit)
        assert float(after.max()) <= c + 1e-5
        small = before <= c
        assert torch.allclose(after[small], before[small], atol=1e-6)  # unclipped examples untouched
        assert torch.allclose(after[~small], torch.full_like(after[~small], c), atol=1e-5)
        n_clipped += int((~small).sum())
    assert n_clipped > 0  # the bound was tested where it binds


def test_user_unit_refuses_rating_batches():
    fold = tiny_fold()
    m = trained_ish_mf(fold)
    batch = PoissonBatchSampler(fold.train, fold.train.item_means(), 0.05, "rating", noise_generator(0)).sample()
    opt = GaussianDPSGD(m.parameters(), context(), epsilon=1.0, unit="user")
    with pytest.raises(ConfigError, match="unit=user"):
        opt.clip_residuals(torch.zeros(batch.n_targets), batch, m)


def test_noise_std_is_sigma_times_c():
    p = torch.nn.Parameter(torch.zeros(400, 500))
    opt = GaussianDPSGD([p], context(), epsilon=math.inf, noise_multiplier=1.5, clip_norm=0.4, delta=1e-5, seed=0)
    p.grad = torch.zeros_like(p)
    opt.add_noise()
    assert float(p.grad.double().std()) == pytest.approx(1.5 * 0.4, rel=0.01)
    assert opt.privacy_report()["noise"] == {"distribution": "Gaussian", "noise_multiplier": 1.5, "std": pytest.approx(0.6)}


def test_sigma_is_opacus_get_noise_multiplier():
    opt = GaussianDPSGD([torch.nn.Parameter(torch.zeros(2))], context(k=200), epsilon=2.0, delta=1e-5, sampling_ratio=0.05)
    want = get_noise_multiplier(target_epsilon=2.0, target_delta=1e-5, sample_rate=0.05, steps=200, accountant="rdp",
                                epsilon_tolerance=0.01, alphas=RDP_ORDERS)
    assert opt.noise_multiplier == want


@pytest.mark.parametrize("sigma,q,steps,delta", [(1.1, 0.01, 1000, 1e-5), (0.8, 0.1, 50, 1e-6), (3.0, 1.0, 20, 1e-6)])
def test_rdp_epsilon_equals_a_direct_opacus_call(sigma, q, steps, delta):
    ours = OpacusAccountant("rdp")
    for _ in range(steps):
        ours.step(noise_multiplier=sigma, sample_rate=q)
    direct = RDPAccountant()
    for _ in range(steps):
        direct.step(noise_multiplier=sigma, sample_rate=q)
    assert ours.get_epsilon(delta) == direct.get_epsilon(delta=delta, alphas=RDP_ORDERS)
    # where the optimal order is within Opacus's defaults, it is Opacus's default answer exactly
    assert ours.get_epsilon(delta) == pytest.approx(direct.get_epsilon(delta=delta), rel=1e-12)


def test_prv_epsilon_equals_a_direct_opacus_call():
    ours = OpacusAccountant("prv")
    ours.step(noise_multiplier=1.0, sample_rate=0.02, steps=300)
    direct = PRVAccountant()
    direct.history = [(1.0, 0.02, 300)]
    assert ours.get_epsilon(1e-6) == pytest.approx(direct.get_epsilon(delta=1e-6), rel=1e-9)


def test_mechanism_epsilon_spent_tracks_the_accountant():
    p = torch.nn.Parameter(torch.zeros(3))
    opt = GaussianDPSGD([p], context(k=40), epsilon=math.inf, noise_multiplier=1.2, sampling_ratio=0.1, delta=1e-6)
    for _ in range(40):
        p.grad = torch.zeros_like(p)
        opt.step()
    direct = RDPAccountant()
    direct.history = [(1.2, 0.1, 40)]
    assert opt.epsilon_spent() == direct.get_epsilon(delta=1e-6, alphas=RDP_ORDERS)
    assert opt.privacy_report()["epsilon"] == opt.epsilon_spent()


def test_small_epsilon_is_reachable_at_small_delta():
    # Opacus's default orders stop at 63, which cannot certify eps < log(1e6)/62 = 0.22
    sigma = calibrate_gaussian(0.1, 1e-6, 0.02, 500, search="opacus").sigma
    acc = OpacusAccountant("rdp")
    acc.step(sigma, 0.02, steps=500)
    assert 0.09 <= acc.get_epsilon(1e-6) <= 0.1


@settings(max_examples=6, deadline=None)
@given(eps=st.sampled_from([0.3, 1.0, 4.0]), q=st.floats(0.005, 0.2), steps=st.integers(5, 300))
def test_calibrated_noise_never_overshoots_target_epsilon(eps, q, steps):
    opt = GaussianDPSGD([torch.nn.Parameter(torch.zeros(2))], context(k=steps), epsilon=eps, delta=1e-6, sampling_ratio=q)
    rep = opt.privacy_report()
    assert rep["epsilon"] <= eps
    assert rep["epsilon"] >= eps - 0.011  # Opacus's binary search stops within its tolerance


def test_privacy_report_fields():
    opt = GaussianDPSGD([torch.nn.Parameter(torch.zeros(2))], context(k=50), epsilon=1.0, delta=1e-6, unit="user",
                        clip_norm=2.0, sampling_ratio=0.2, accountant="rdp")
    rep = opt.privacy_report()
    assert opt.relation == "user" and GaussianDPSGD.relation is None
    assert {"mechanism", "relation", "sensitivity", "noise", "steps", "sampling_ratio", "epsilon", "delta",
            "accountant", "analysis"} <= set(rep)
    assert rep["relation"] == "user" and rep["sensitivity"]["clip_norm"] == 2.0 and rep["sensitivity"]["norm"] == "L2"
    assert rep["steps"] == 50 and rep["sampling_ratio"] == 0.2 and rep["delta"] == 1e-6
    assert rep["accountant"] == "opacus rdp" and rep["epsilon"] <= 1.0
    assert rep["noise"]["std"] == pytest.approx(2.0 * rep["noise"]["noise_multiplier"])


def test_no_noise_reports_infinite_epsilon():
    rep = GaussianDPSGD([torch.nn.Parameter(torch.zeros(2))], context(), epsilon=math.inf).privacy_report()
    assert rep["epsilon"] == math.inf and rep["noise"]["noise_multiplier"] == 0.0 and "NOT private" in rep["analysis"]


@pytest.mark.parametrize("kw,match", [({"clip_norm": 0.0}, "clip_norm"), ({"clip_norm": -1.0}, "clip_norm"),
                                      ({"unit": "item"}, "unit"), ({"accountant": "gdp"}, "accountant"),
                                      ({"delta": 0.0}, "delta"), ({"sampling_ratio": 0.0}, "sampling_ratio"),
                                      ({"epsilon": 0.0}, "epsilon"), ({"noise_multiplier": -1.0}, "noise_multiplier")])
def test_bad_values_are_config_errors(kw, match):
    args = dict(epsilon=1.0, delta=1e-6)
    args.update(kw)
    with pytest.raises(ConfigError, match=match):
        GaussianDPSGD([torch.nn.Parameter(torch.zeros(2))], context(), **args)


def test_accountant_round_trips_through_state_dict():
    p = torch.nn.Parameter(torch.zeros(3))
    opt = GaussianDPSGD([p], context(k=10), epsilon=2.0, noise_multiplier=1.0, delta=1e-6, sampling_ratio=0.5, seed=0)
    for _ in range(4):
        p.grad = torch.zeros_like(p)
        opt.step()
    sd = opt.state_dict()
    fresh = GaussianDPSGD([torch.nn.Parameter(torch.zeros(3))], context(k=10), epsilon=2.0, noise_multiplier=1.0,
                          delta=1e-6, sampling_ratio=0.5)
    fresh.load_state_dict(sd)
    assert fresh.accountant.history == opt.accountant.history and fresh.epsilon_spent() == opt.epsilon_spent()


@pytest.mark.parametrize("unit", ["rating", "user"])
def test_report_says_add_remove_only(unit):
    """For every rating-level relation: Opacus accounts add/remove of one unit; the
    report must not read as add/remove/change (a changed rating is two add/remove steps)."""
    fold = tiny_fold()
    m = MF(fold.train.n_users, fold.train.n_items, dim=3).attach(fold.train)
    opt = GaussianDPSGD(m.parameters(), context(), 1.0, unit=unit, sampling_ratio=0.1)
    r = opt.privacy_report()
    assert r["neighbouring"].startswith("add/remove") and "not covered" in r["neighbouring"]
    assert "change" not in r["guarantee"]
