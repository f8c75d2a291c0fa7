"""Biased MF: hand-computed predictions, fallbacks, closed-form per-example gradient norms, contract."""

from __future__ import annotations

import pytest
import torch

from dprec_torch.errors import ConfigError
from dprec_torch.mechanisms.context import TrainingContext
from dprec_torch.mechanisms.sgd import MapSGD
from dprec_torch.models.batching import PoissonBatchSampler, full_batch
from dprec_torch.models.mf import MF
from dprec_torch.seeding import noise_generator
from tests.contract import PredictorContract
from tests.helpers import tiny_fold, toy_ratings

TOY = toy_ratings([[5, 3, None], [4, None, 1], [None, 2, 2]])


def toy_model(**kw) -> MF:
    """MF on TOY with hand-set parameters (mu = 3 + 0.1 * 2 = 3.2)."""
    m = MF(3, 3, dim=2, **kw).attach(TOY)
    with torch.no_grad():
        m.global_bias.fill_(2.0)
        m.user_bias.weight.copy_(torch.tensor([[0.5], [-0.5], [0.0]]))
        m.item_bias.weight.copy_(torch.tensor([[0.3], [0.0], [-0.3]]))
        m.user_factors.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0], [0.0, 0.0]]))
        m.item_factors.weight.copy_(torch.tensor([[1.0, 1.0], [0.5, -1.0], [0.0, 0.2]]))
    return m


def test_hand_computed_predictions_and_clipping():
    m = toy_model()
    out = m.predict(torch.tensor([0, 1, 1, 2]), torch.tensor([0, 0, 1, 2]))
    # u0,i0: 3.2 + 0.5 + 0.3 + 1.0 = 5.0; u1,i0: 3.2 - 0.5 + 0.3 + 2.0 = 5.0; u1,i1: 3.2 - 0.5 + 0 - 2 = 0.7 -> 1
    # u2,i2: 3.2 + 0 - 0.3 + 0 = 2.9
    assert torch.allclose(out, torch.tensor([5.0, 5.0, 1.0, 2.9]), atol=1e-6)


def test_mu_starts_at_the_scale_midpoint_not_a_data_statistic():
    m = MF(3, 3).attach(TOY)
    assert float(m.mu.detach()) == pytest.approx(3.0)
    assert float(m.user_factors.weight.detach().abs().max()) == 0.0
    assert float(m.item_factors.weight.detach().abs().max()) > 0


def test_model_fallback_is_post_processing_of_parameters():
    m = toy_model(fallback="model")
    out = m.predict(torch.tensor([7, -1, 0]), torch.tensor([0, 2, 9]))
    # unknown user: mu + b_i; unknown item: mu + b_u
    assert torch.allclose(out, torch.tensor([3.2 + 0.3, 3.2 - 0.3, 3.2 + 0.5]), atol=1e-6)


def test_mean_fallback_uses_training_means():
    m = toy_model(fallback="mean")
    out = m.predict(torch.tensor([7, 0]), torch.tensor([0, 9]))
    assert torch.allclose(out, torch.tensor([4.5, TOY.global_mean]), atol=1e-6)


@pytest.mark.parametrize("kw,match", [({"dim": 0}, "dim"), ({"dim": -3}, "dim"), ({"dim": 2.5}, "dim"),
                                      ({"fallback": "zero"}, "fallback"), ({"mu_scale": 0.0}, "mu_scale"),
                                      ({"init_std": -1.0}, "init_std")])
def test_bad_values_are_config_errors(kw, match):
    with pytest.raises(ConfigError, match=match):
        MF(3, 3, **kw)


def test_attach_checks_sizes():
    with pytest.raises(ConfigError, match="users"):
        MF(4, 3).attach(TOY)


def test_surrogate_gradient_is_the_gradient_of_the_clipped_squared_error():
    fold = tiny_fold()
    m = MF(fold.train.n_users, fold.train.n_items, dim=4, init_std=1.0, seed=1).attach(fold.train)
    with torch.no_grad():
        m.user_factors.weight.normal_(0, 1.0)  # make some predictions leave [1, 5]
    b = full_batch(fold.train, fold.train.item_means())
    pred = m.batch_predict(b)
    loss = 0.5 * ((pred - b.values) ** 2).sum()
    want = torch.autograd.grad(loss, list(m.parameters()))
    got = torch.autograd.grad(m.surrogate_loss(b, (pred - b.values).detach()), list(m.parameters()))
    raw = m.raw(m.batch_users(b), b.items)
    assert bool(((raw < 1) | (raw > 5)).any())  # the clip mask matters here
    for w, g in zip(want, got):
        assert torch.allclose(w, g, atol=1e-4)


def brute_force_norms(m: MF, batch, residuals: torch.Tensor, unit: str) -> torch.Tensor:
    """Per-example gradient norms by one backward per example (test-only loop)."""
    groups = batch.rows if unit == "user" else torch.arange(batch.n_targets)
    n = int(batch.users.numel()) if unit == "user" else batch.n_targets
    out = torch.zeros(n, dtype=torch.float64)
    for k in range(n):
        e = torch.where(groups == k, residuals, torch.zeros_like(residuals))
        grads = torch.autograd.grad(m.surrogate_loss(batch, e), list(m.parameters()))
        out[k] = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
    return out


@pytest.mark.parametrize("unit", ["rating", "user"])
def test_closed_form_per_example_norms_match_autograd(unit):
    fold = tiny_fold()
    m = MF(fold.train.n_users, fold.train.n_items, dim=3, init_std=0.7, seed=2).attach(fold.train)
    with torch.no_grad():
        m.user_factors.weight.normal_(0, 0.7)
        m.user_bias.weight.normal_(0, 0.5)
    sampler = PoissonBatchSampler(fold.train, fold.train.item_means(), 0.01, unit, noise_generator(3))
    batch = sampler.sample()
    res = (m.batch_predict(batch) - batch.values).detach()
    closed = m.per_example_grad_norms(batch, res, unit).double()
    assert torch.allclose(closed, brute_force_norms(m, batch, res, unit), rtol=1e-4, atol=1e-5)


def test_per_example_norms_reject_unknown_unit():
    m = toy_model()
    b = full_batch(TOY, TOY.item_means())
    with pytest.raises(ConfigError, match="unit"):
        m.per_example_grad_norms(b, torch.zeros(b.n_targets), "item")


def test_sgld_prior_puts_lambda_on_mu_not_on_g():
    m = MF(3, 3, mu_scale=0.1).attach(TOY)
    h = m.sgld_prior_precision(TOY, 4.0)
    params = list(m.parameters())
    assert len(h) == len(params) and params[0] is m.global_bias
    assert float(h[0]) == pytest.approx(100.0) and all(x is None for x in h[1:])


class _FittedMF:
    """MF behind fit/predict: 150 non-private mini-batch SGD steps (MeanFallback for unknown ids)."""

    def fit(self, train):
        self.model = MF(train.n_users, train.n_items, dim=8, fallback="mean", seed=0).attach(train)
        n = len(train)  # MF's mean semantics: lr on (sum over the batch) / (0.02 n), decay lambda / n
        ctx = TrainingContext(150, 50, n, train.n_users, train.scale, n_units=n, expected_batch_size=0.02 * n,
                              gradient_reduction="mean")
        opt = MapSGD(self.model.parameters(), ctx, lr=0.02 * 0.02 * n, weight_decay=10.0, beta=1.0)
        sampler = PoissonBatchSampler(train, train.item_means(), 0.02, "rating", noise_generator(0))
        for _ in range(150):
            b = sampler.sample()
            opt.zero_grad()
            pred = self.model.batch_predict(b)
            self.model.surrogate_loss(b, (pred - b.values).detach()).backward()
            opt.step()
        return self

    def predict(self, users, items):
        return self.model.predict(users, items)


class TestMFContract(PredictorContract):
    def make_predictor(self):
        return _FittedMF()


# ------------------------------------------------------------ DPSGD-MF (Berlioz et al. 2015)
def _dpsgd_mf(model: MF, steps: int, **kw):
    from dprec_torch.mechanisms.dpsgd_mf import DPSGDMF

    ctx = TrainingContext(steps, steps, len(TOY), TOY.n_users, TOY.scale, entry_bound=model.gradient_entry_bound, model=model)
    return DPSGDMF(model.parameters(), ctx, beta=1.0, **kw)


def test_dpsgd_mf_is_selected_by_the_model_and_scales_noise_k_delta_r_over_eps():
    m = MF(3, 3).attach(TOY)
    opt = _dpsgd_mf(m, 10, epsilon=2.0, sampling_ratio=1.0, e_max=1.5)
    assert opt.perturb_residuals and opt.max_visits == 10 and opt.visit_delta == 0.0
    assert opt.residual_noise_scale == pytest.approx(10 * 4.0 / 2.0)  # K Delta r / eps
    out = opt.clip_residuals(torch.zeros(5000), None, m)
    assert float(out.abs().max()) <= 1.5 and float(out.abs().max()) == 1.5  # noisy, then clamped to e_max
    rep = opt.privacy_report()
    assert rep["epsilon"] == 2.0 and rep["delta"] == 0.0 and rep["relation"].startswith("rating (value change")
    assert rep["sensitivity"]["delta_r"] == 4.0 and rep["epsilon_per_visit"] == pytest.approx(0.2)


def test_dpsgd_mf_laplace_noise_has_the_stated_scale():
    m = MF(3, 3).attach(TOY)
    opt = _dpsgd_mf(m, 5, epsilon=10.0, e_max=1e9)
    x = opt.clip_residuals(torch.zeros(200_000), None, m).double()
    assert float(x.abs().mean()) == pytest.approx(5 * 4.0 / 10.0, rel=0.01)  # E|Lap(b)| = b


def test_dpsgd_mf_bounds_visits_by_a_binomial_tail_when_subsampled():
    from scipy.stats import binom

    m = MF(3, 3).attach(TOY)
    opt = _dpsgd_mf(m, 500, epsilon=1.0, sampling_ratio=0.02, delta=1e-6)
    k = opt.max_visits
    assert binom.sf(k, 500, 0.02) <= 1e-6 < binom.sf(k - 1, 500, 0.02)
    assert opt.residual_noise_scale == pytest.approx(k * 4.0 / 1.0)
    assert opt.privacy_report()["delta"] == pytest.approx(binom.sf(k, 500, 0.02))
    with pytest.raises(ConfigError, match="delta"):
        _dpsgd_mf(m, 500, epsilon=1.0, sampling_ratio=0.02, delta=0.0)


def test_dpsgd_mf_epsilon_spent_grows_to_epsilon():
    m = MF(3, 3).attach(TOY)
    opt = _dpsgd_mf(m, 4, epsilon=2.0, sampling_ratio=1.0)
    spent = []
    for p in m.parameters():
        p.grad = torch.zeros_like(p)
    for _ in range(4):
        opt.step()
        spent.append(opt.epsilon_spent())
    assert spent == pytest.approx([0.5, 1.0, 1.5, 2.0])


def test_dpsgd_residual_variant_must_match_the_model():
    """DPSGD-MF (mechanism=dpsgd_mf) and Alg. 1 (mechanism=dpsgd_paper) are two classes; each refuses the other's model.
    Under Alg. 1's key, MF is trained by DPSGD-MF (the table dprec_torch.forms.FORMS)."""
    from dprec_torch.forms import mechanism_class
    from dprec_torch.mechanisms.dpsgd_mf import DPSGDMF
    from dprec_torch.mechanisms.dpsgd_paper import DPSGDLaplace
    from dprec_torch.models.pnbm import PNBM

    m = MF(3, 3).attach(TOY)
    ctx = TrainingContext(4, 4, len(TOY), TOY.n_users, TOY.scale, entry_bound=m.gradient_entry_bound, model=m)
    assert mechanism_class(DPSGDLaplace, m) is DPSGDMF and type(DPSGDMF(m.parameters(), ctx, epsilon=2.0)) is DPSGDMF
    pnbm = PNBM(3, floor_c=1.0).attach(TOY)
    alg1 = DPSGDLaplace(pnbm.parameters(), TrainingContext(4, 4, len(TOY), TOY.n_users, TOY.scale,
                                                            entry_bound=pnbm.gradient_entry_bound, model=pnbm), epsilon=2.0)
    assert type(alg1) is DPSGDLaplace
    with pytest.raises(ConfigError, match="perturb_residuals.*dpsgd_mf"):
        alg1.clip_residuals(torch.zeros(3), None, m)
    opt = _dpsgd_mf(m, 4, epsilon=2.0)
    with pytest.raises(ConfigError, match="perturb_residuals"):
        opt.clip_residuals(torch.zeros(3), None, pnbm)
    with pytest.raises(ConfigError, match="dpsgd_paper"):
        _dpsgd_mf(pnbm, 4, epsilon=2.0)


# ------------------------------------------------------------------------ restore what was released
@pytest.mark.parametrize("fallback", ["mean", "model"])
def test_restore_takes_everything_from_the_state_and_nothing_from_the_data(fallback):
    """``restore`` must not refit: other training data of the same shape changes no prediction."""
    m = toy_model(fallback=fallback)
    state = m.state_dict()
    other = toy_ratings([[1, 1, 1], [1, None, 1], [None, 1, 1]], lo=1, hi=3)  # other values and another scale
    r = MF(3, 3, dim=2, fallback=fallback).restore(other, state)
    users, items = torch.tensor([0, 1, 2, 7, 0]), torch.tensor([0, 1, 2, 0, 9])  # incl. unknown ids
    assert torch.equal(r.predict(users, items), m.predict(users, items))
    assert r.scale == m.scale and (r.fallback_ is None) == (fallback == "model")
    with pytest.raises(ConfigError, match="users x"):
        MF(4, 3, dim=2).restore(TOY, state)


def test_pnbm_restore_keeps_the_released_item_means():
    """A PNBM whose item means were replaced (a DP release) is restored with THOSE means and fallback."""
    from dprec_torch.models.pnbm import PNBM
    from dprec_torch.privacy.item_means import ItemMeansRelease, ItemMeansSpec, install_item_means

    fold = tiny_fold()
    m = PNBM(fold.train.n_items, floor_c=1.0, seed=0).attach(fold.train)
    released = ItemMeansRelease(torch.linspace(1, 5, fold.train.n_items, dtype=torch.float64), 3.3,
                                ItemMeansSpec("centred", "user", "laplace"), epsilon=1.0)
    install_item_means(m, released)
    users, items = fold.test.users, fold.test.items
    r = PNBM(fold.train.n_items, floor_c=1.0, seed=1).restore(fold.train, m.state_dict())
    assert torch.equal(r.item_means, m.item_means) and not torch.equal(r.item_means, fold.train.item_means())
    assert torch.equal(r.predict(users, items), m.predict(users, items))
    assert r.fallback_.global_mean == pytest.approx(3.3)
