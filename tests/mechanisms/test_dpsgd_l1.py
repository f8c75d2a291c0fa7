"""mechanism=dpsgd_l1: every clipped contribution within the calibrated bound, noise, accounting, DP means, wiring."""

from __future__ import annotations

import math

import pytest
import torch

from dprec_torch.errors import ConfigError
from dprec_torch.mechanisms.context import TrainingContext
from dprec_torch.mechanisms.dpsgd import ClippedLaplaceDPSGD
from dprec_torch.models.batching import PoissonBatchSampler, full_batch, poisson_steps_per_epoch
from dprec_torch.models.mf import MF
from dprec_torch.models.pnbm import PNBM
from dprec_torch.privacy.analysis import amplified_epsilon
from dprec_torch.seeding import noise_generator
from dprec_torch.training.trainer import Trainer
from tests.helpers import tiny_cfg, tiny_fold


def setup(q: float = 0.2, epochs: int = 1, epsilon: float = 1.0, **kw):
    fold = tiny_fold()
    train = fold.train
    model = PNBM(train.n_items, floor_c=2.0, seed=0).attach(train)
    steps = poisson_steps_per_epoch(q)
    ctx = TrainingContext(total_steps=epochs * steps, steps_per_epoch=steps,
                          n_ratings=len(train), n_users=train.n_users, scale=train.scale,
                          entry_bound=model.gradient_entry_bound)
    opt = ClippedLaplaceDPSGD(model.parameters(), ctx, epsilon, sampling_ratio=q, seed=3, **kw)
    opt.prepare(model)  # the DP item means and S's start, before any batch (as setup_training does)
    sampler = PoissonBatchSampler(train, model.item_means, q, "user", noise_generator(5))
    return fold, model, sampler, opt


def autograd_l1(model, batch, clipped: torch.Tensor, row: int) -> float:
    e = torch.where(batch.rows == row, clipped, torch.zeros_like(clipped))
    model.zero_grad()
    model.surrogate_loss(batch, e).backward()
    g = model.S.grad.double().clone()
    g.fill_diagonal_(0.0)
    model.zero_grad()
    return float(g.abs().sum())


def test_every_clipped_user_is_within_the_calibrated_bound_every_step():
    """Spy on a real short run: after clipping, every user's whole G_u has L1 <= c = noise scale x eps_s."""
    fold, model, sampler, opt = setup(q=0.2, epochs=1, clip_norm=0.05, lr=0.5, init="random")
    real_clip = opt.clip_residuals
    seen = {"steps": 0, "users": 0, "clipped": 0}
    gen = torch.Generator().manual_seed(0)

    def spy(residuals, batch, model_):
        clipped = real_clip(residuals, batch, model_)
        c = opt.noise_scale * opt.step_epsilon  # the bound the Laplace noise is calibrated to
        assert c == pytest.approx(opt.clip_norm)
        from dprec_torch.privacy.pnbm_clipping import per_user_grad_norms

        before = per_user_grad_norms(model_, batch, residuals, p=1)
        after = per_user_grad_norms(model_, batch, clipped, p=1)
        assert float(after.max()) <= c * (1 + 1e-5)
        rows = torch.randperm(batch.users.numel(), generator=gen)[:3]
        for r in rows.tolist():  # an independent check by autograd of the model's own loss
            assert autograd_l1(model_, batch, clipped, r) <= c * (1 + 1e-4)
        seen["steps"] += 1
        seen["users"] += int(batch.users.numel())
        seen["clipped"] += int((before > c).sum())
        return clipped

    opt.clip_residuals = spy
    Trainer(model, opt, sampler, 1).fit(fold)
    assert seen["steps"] == opt.context.total_steps == 5
    assert seen["clipped"] > seen["users"] // 2  # the bound actually binds


def test_noise_scale_and_exact_accounting():
    _, model, sampler, opt = setup(q=0.2, epochs=3, epsilon=2.0, clip_norm=0.7, mean_fraction=0.25)
    T, q = 15, 0.2
    eps0 = 0.5
    eps_s = math.log1p(math.expm1((2.0 - eps0) / T) / q)
    assert opt.step_epsilon == pytest.approx(eps_s, rel=1e-12)
    assert opt.noise_scale == pytest.approx(0.7 / eps_s)
    assert opt.planned_epsilon() == pytest.approx(2.0, rel=1e-12)
    assert eps0 + T * amplified_epsilon(eps_s, q) == pytest.approx(2.0)
    rep = opt.privacy_report()
    assert rep["epsilon"] == pytest.approx(2.0) and rep["relation"] == "user" and rep["delta"] == 0.0
    for key in ("sensitivity", "noise", "sampling", "composition", "guarantee", "analysis", "item_means"):
        assert rep[key]
    model.S.grad = torch.zeros_like(model.S)
    opt.add_noise()
    opt.account()  # (the step's record: step() calls it after the update)
    assert float(model.S.grad.abs().mean()) == pytest.approx(0.7 / eps_s, rel=0.02)  # Laplace scale = E|X|
    assert opt.epsilon_spent() == pytest.approx(eps0 + amplified_epsilon(eps_s, q))


def test_rating_relation_doubles_the_sgd_part():
    _, _, _, opt = setup(q=0.5, epochs=1, epsilon=1.0, relation="rating", mean_fraction=0.5)
    assert opt.group == 2
    assert 0.5 + 2 * 2 * amplified_epsilon(opt.step_epsilon, 0.5) == pytest.approx(1.0)
    assert opt.privacy_report()["relation"] == "rating"


def test_prepare_releases_the_dp_item_means_before_any_batch():
    """The constructor only calibrates; prepare() releases r_bar (and sets S) once, before the sampler builds a batch,
    so every batch is centred by the DP means (no batch is repaired afterwards)."""
    fold = tiny_fold()
    model = PNBM(fold.train.n_items, floor_c=2.0, seed=0).attach(fold.train)
    ctx = TrainingContext(total_steps=1, steps_per_epoch=1, n_ratings=len(fold.train), n_users=fold.train.n_users,
                          scale=fold.train.scale, entry_bound=model.gradient_entry_bound)
    exact, start = fold.train.item_means(), model.S.detach().clone()
    opt = ClippedLaplaceDPSGD(model.parameters(), ctx, 1.0, sampling_ratio=1.0, seed=3)
    assert torch.equal(model.item_means, exact) and torch.equal(model.S.detach(), start) and opt.mean_release is None
    opt.prepare(model)
    assert not torch.allclose(model.item_means, exact)  # released with noise
    S = model.S.detach()
    assert torch.equal(S.diagonal(), torch.zeros(model.n_items)) and float(S[0, 1]) == 1.0  # constant init
    batch = PoissonBatchSampler(fold.train, model.item_means, 1.0, "user", noise_generator(5)).sample()
    assert torch.equal(batch.x.values(), full_batch(fold.train, model.item_means).x.values())  # centred by the DP means
    assert model.fallback_.global_mean == pytest.approx(opt.mean_release.global_mean)
    with pytest.raises(RuntimeError, match="release the item means again"):
        opt.prepare(model)


def test_diagonal_is_dropped_before_the_noise():
    _, model, _, opt = setup(q=1.0, epochs=1, epsilon=math.inf)
    model.S.grad = torch.ones_like(model.S)
    opt.add_noise()
    assert float(model.S.grad.diagonal().abs().sum()) == 0.0 and float(model.S.grad[0, 1]) == 1.0


@pytest.mark.parametrize("kw,match", [
    (dict(unit="rating", relation="rating"), "unit=user"),
    (dict(clip_norm=0.0), "clip_norm"),
    (dict(clip_norm=math.inf), "clip_norm"),
    (dict(mean_fraction=0.0), "non-private"),
    (dict(init="zeros"), "init"),
    (dict(relation="item"), "relation"),
])
def test_bad_values_are_config_errors(kw, match):
    with pytest.raises(ConfigError, match=match):
        setup(**kw)


def test_mf_l1_norms_match_autograd():
    from dprec_torch.privacy.mf_clipping import mf_grad_norms_l1

    train = tiny_fold().train
    model = MF(train.n_users, train.n_items, dim=4, init_std=0.3, seed=1).attach(train)
    with torch.no_grad():
        model.user_factors.weight.normal_(0, 0.3, generator=torch.Generator().manual_seed(2))
    batch = full_batch(train, train.item_means())
    res = (model.batch_predict(batch) - batch.values).detach()

    def l1(mask):
        model.zero_grad()
        model.surrogate_loss(batch, torch.where(mask, res, torch.zeros_like(res))).backward()
        return sum(float(p.grad.abs().sum()) for p in model.parameters() if p.grad is not None)

    per_rating = mf_grad_norms_l1(model, batch, res, "rating")
    per_user = mf_grad_norms_l1(model, batch, res, "user")
    for t in (0, 10, 99):
        assert float(per_rating[t]) == pytest.approx(l1(torch.arange(res.numel()) == t), rel=1e-5)
    for row in (0, 3):
        assert float(per_user[row]) == pytest.approx(l1(batch.rows == row), rel=1e-5)


def test_train_py_config_runs_and_reports_the_defended_epsilon(tmp_path):
    from dprec_torch.training.run import train

    cfg = tiny_cfg("data=synthetic", "mechanism=dpsgd_l1", "epsilon=1", "mechanism.epochs=1",
                   "compare_baselines=false", "tensorboard=false", f"output_dir={tmp_path}")
    m = train(cfg)
    assert m["privacy"]["epsilon"] == pytest.approx(1.0) and m["privacy"]["relation"] == "user"
    assert math.isfinite(m["test_rmse"])


@pytest.mark.parametrize("unit", ["rating", "user"])
def test_mf_per_unit_clipping_bound_holds_in_training(unit, tmp_path):
    """MF: per-rating (rating level) or per-user clipping, every step within c; runs through train()."""
    from dprec_torch.privacy.mf_clipping import mf_grad_norms_l1
    from dprec_torch.training.run import train

    checked = []
    real = ClippedLaplaceDPSGD.clip_residuals

    def spy(self, residuals, batch=None, model=None):
        out = real(self, residuals, batch, model)
        checked.append(float(mf_grad_norms_l1(model, batch, out, self.unit).max()) <= self.clip_norm * (1 + 1e-6))
        return out

    ClippedLaplaceDPSGD.clip_residuals = spy
    try:
        cfg = tiny_cfg("data=synthetic", "model=mf", "mechanism=dpsgd_l1", "epsilon=2", f"mechanism.unit={unit}",
                       f"mechanism.relation={unit}", "mechanism.sampling_ratio=0.2", "mechanism.epochs=1",
                       "compare_baselines=false", "tensorboard=false", f"output_dir={tmp_path}")
        m = train(cfg)
    finally:
        ClippedLaplaceDPSGD.clip_residuals = real
    assert len(checked) == 5 and all(checked)
    assert m["privacy"]["epsilon"] == pytest.approx(2.0) and m["privacy"]["relation"] == unit


@pytest.mark.parametrize("unit,relation,group", [("rating", "rating", 2), ("user", "rating", 2), ("user", "user", 1)])
def test_group_factor_covers_a_changed_rating(unit, relation, group):
    """Changing one rating's value moves the clipped sum by up to 2c under EITHER unit,
    so relation=rating needs g = 2 with unit=rating too (the old code used g = 1 there)."""
    from dprec_torch.privacy.analysis import analyse_dpsgd_l1, composed_epsilon

    fold = tiny_fold()
    train = fold.train
    model = MF(train.n_users, train.n_items, dim=3, seed=0).attach(train)
    q, steps = 0.5, 2
    ctx = TrainingContext(total_steps=steps, steps_per_epoch=2, n_ratings=len(train), n_users=train.n_users,
                          scale=train.scale)
    opt = ClippedLaplaceDPSGD(model.parameters(), ctx, 1.0, sampling_ratio=q, unit=unit, relation=relation, model=model)
    opt.prepare(model)
    assert opt.group == group
    # the defended epsilon is the configured one once the factor is applied
    assert composed_epsilon(opt.step_epsilon, q, steps, 0.0, group) == pytest.approx(1.0)
    a = analyse_dpsgd_l1(1.0, steps, q, 1.0, 0.0, relation, unit)
    assert a.sensitivity["group_factor"] == group
    if relation == "rating":
        assert a.sensitivity["change_one_rating"] == pytest.approx(2.0)
