"""Mechanism optimizers: Laplace scale, clamp bound on every step, SGLD noise/schedule, privacy fields."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from dprec_torch.data.ratings import RatingScale
from dprec_torch.errors import ConfigError
from dprec_torch.mechanisms.base import laplace_noise
from dprec_torch.mechanisms.context import TrainingContext
from dprec_torch.mechanisms.dpsgd_paper import DPSGDLaplace
from dprec_torch.mechanisms.sgld import ScaledPosteriorSGLD
from dprec_torch.models.batching import PoissonBatchSampler
from dprec_torch.models.pnbm import PNBM
from dprec_torch.seeding import noise_generator
from dprec_torch.training.trainer import Trainer
from tests.helpers import tiny_fold

SCALE = RatingScale(1, 5)


def context(k: int = 10, c: float = 10.0) -> TrainingContext:
    return TrainingContext(total_steps=k, steps_per_epoch=1, n_ratings=1000, n_users=50, scale=SCALE,
                           max_user_ratings=200, entry_bound=lambda e: e * SCALE.span / c)


def test_laplace_sampler_has_stated_scale():
    b = 0.7
    x = laplace_noise(torch.Size([200_000]), b, noise_generator(0), torch.device("cpu")).double()
    assert float(x.abs().mean()) == pytest.approx(b, rel=0.01)  # E|X| = b (a std-as-scale bug gives b/sqrt(2))
    assert float(x.var()) == pytest.approx(2 * b * b, rel=0.02)
    assert stats.kstest(x.numpy(), stats.laplace(scale=b).cdf).pvalue > 1e-3


def test_dpsgd_noise_scale_is_gamma_k_deltaf_over_eps():
    p = torch.nn.Parameter(torch.zeros(300, 300))
    opt = DPSGDLaplace([p], context(k=10, c=10.0), epsilon=2.0, sampling_ratio=0.5, beta=1.0, seed=1)
    # t = 1: e_max = 0.5 + 3/2 = 2, DeltaF = 2 * 2 * 4 / 10 = 1.6, scale = 0.5 * 10 * 1.6 / 2 = 4
    assert opt.residual_bound(1) == pytest.approx(2.0)
    assert opt.sensitivity(1) == pytest.approx(1.6)
    assert opt.noise_scale(1) == pytest.approx(4.0)
    p.grad = torch.zeros_like(p)
    opt.add_noise()
    assert float(p.grad.abs().mean()) == pytest.approx(4.0, rel=0.02)
    assert opt.noise_scale(3) == pytest.approx(0.5 * 10 * 2 * (0.5 + 3 / 4) * 4 / 10 / 2.0)


def test_dpsgd_update_rule():
    """Alg. 1 line 7 (no noise at eps=inf): S <- S - eta (beta G + lambda S); line 1 rescales S by beta."""
    p = torch.nn.Parameter(torch.ones(2, 2))
    opt = DPSGDLaplace([p], context(), epsilon=math.inf, lr=0.1, beta=10.0, weight_decay=0.5)
    assert torch.allclose(p.data, torch.full((2, 2), 10.0))
    p.grad = torch.full((2, 2), 2.0)
    opt.step()
    assert torch.allclose(p.data, torch.full((2, 2), 10.0 - 0.1 * (10.0 * 2.0 + 0.5 * 10.0)))


def test_clamp_bound_holds_on_every_step():
    fold = tiny_fold()
    model = PNBM(fold.train.n_items, floor_c=1.0).attach(fold.train)
    sampler = PoissonBatchSampler(fold.train, model.item_means, 0.25, "rating", noise_generator(0))
    epochs = 3
    ctx = context(k=epochs * sampler.steps_per_epoch(), c=1.0)
    opt = DPSGDLaplace(model.parameters(), ctx, epsilon=1.0, sampling_ratio=0.25, seed=0)
    seen = []
    original = opt.clip_residuals

    def spy(residuals, batch=None, m=None):
        out = original(residuals, batch, m)
        bound = 0.5 + (SCALE.span - 1) / (opt.t + 1)
        seen.append((float(residuals.abs().max()), float(out.abs().max()), bound))
        return out

    opt.clip_residuals = spy
    Trainer(model, opt, sampler, epochs).fit(fold)
    assert len(seen) == ctx.total_steps
    assert all(clipped <= bound + 1e-6 for _, clipped, bound in seen)
    assert any(raw > bound for raw, _, bound in seen)  # the clamp was active, so the check can fail


def sgld(**kw) -> tuple[torch.nn.Parameter, ScaledPosteriorSGLD]:
    p = torch.nn.Parameter(torch.zeros(400, 400))
    args = dict(epsilon=20.0, lr=0.5, decay=0.3, temperature=0.004, weight_decay=0.0, max_user_ratings=200, seed=0)
    args.update(kw)
    opt = ScaledPosteriorSGLD([p], context(), **args)
    opt.prepare(None)  # no model in the context: only the chain's start (p x init_scale)
    return p, opt


def test_sgld_step_size_schedule():
    _, opt = sgld()
    assert [opt.step_size(t) for t in (1, 2, 10)] == pytest.approx([0.5, 0.5 * 2**-0.3, 0.5 * 10**-0.3])


def test_sgld_noise_variance_is_rho_eta_t():
    p, opt = sgld()
    for t in (1, 2, 3):
        before = p.detach().clone()
        p.grad = torch.zeros_like(p)
        opt.step()
        var = float((p.detach() - before).double().var())
        assert var == pytest.approx(0.004 * 0.5 * t**-0.3, rel=0.03)


def test_sgld_drift_is_scaled_by_eps_over_4b():
    p, opt = sgld(temperature=1e-12, epsilon=64.0)
    p.grad = torch.ones_like(p)
    opt.step()
    b = 4.0**2 * 200  # B = (r_max - r_min)^2 tau
    assert float(p.detach().mean()) == pytest.approx(-(64.0 / (4 * b)) * 0.5 / 2, rel=1e-3)


def test_dpsgd_privacy_fields():
    p = torch.nn.Parameter(torch.zeros(3, 3))
    rep = DPSGDLaplace([p], context(k=10, c=10.0), epsilon=5.0, sampling_ratio=1.0).privacy_report()
    assert rep["relation"] == "rating"
    assert rep["epsilon"] is None  # no defended rating-level guarantee
    assert rep["epsilon_claimed_by_paper"] == 5.0 and rep["epsilon_per_step"] == pytest.approx(0.5)
    assert rep["sensitivity"]["per_entry_delta_f_first_step"] == pytest.approx(1.6)
    assert rep["steps"] == 10 and rep["sampling_ratio"] == 1.0
    assert "ENTRY" in rep["analysis"]


def test_sgld_privacy_fields_report_eps_over_rho():
    _, opt = sgld(epsilon=20.0, temperature=0.004)
    rep = opt.privacy_report()
    assert rep["relation"] == "user" and rep["epsilon_nominal"] == 20.0
    assert rep["sensitivity"]["B_in_update"] == pytest.approx(16 * 200)
    # no model in the context: nothing bounds |e_ui|, so no epsilon is claimed (tests/test_sgld_provable.py has the models)
    assert rep["epsilon"] is None and rep["sensitivity"]["log_likelihood_bound_B"] is None


@pytest.mark.parametrize("eps", [0.0, -1.0, float("nan")])
def test_bad_epsilon_rejected(eps):
    with pytest.raises(ConfigError, match="epsilon"):
        DPSGDLaplace([torch.nn.Parameter(torch.zeros(2, 2))], context(), epsilon=eps)


def test_only_sgld_pays_for_the_prior_precision() -> None:
    """H is M x M for dense PNBM: built for the mechanism that reads it, not for every run."""
    from dprec_torch.mechanisms.context import prior_precision_for
    from dprec_torch.mechanisms.gaussian import GaussianDPSGD

    fold = tiny_fold()
    model = PNBM(fold.train.n_items).attach(fold.train)
    for cls in (DPSGDLaplace, GaussianDPSGD):
        assert prior_precision_for(cls, model, fold.train, 100.0) == []
    (h,) = prior_precision_for(ScaledPosteriorSGLD, model, fold.train, 100.0)
    c = fold.train.item_counts().double() / len(fold.train)
    p = torch.exp(99.0 * torch.log1p(-c.clamp_max(1 - 1e-12)))
    want = (1 - (c[:, None] * c[None, :]) * (p[:, None] * p[None, :])).float()  # Sec. 4.2, in one float64 piece
    assert h.dtype == model.S.dtype and torch.equal(h, want)  # the row blocks change no bit
    assert torch.equal(model.sgld_prior_precision(fold.train, 100.0, block=7)[0], want)
