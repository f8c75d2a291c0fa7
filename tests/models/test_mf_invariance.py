"""MF steps are per-example steps: invariant to the sampling ratio and to the dataset size.

Every mechanism divides the summed (clipped, noised) gradient by the expected batch size B = q n and the
dense decay by n, so the expected update is lr x the gradient of the MEAN objective whatever q or n is.
PNBM keeps the paper's summed semantics (B = 1), bit for bit.
"""

from __future__ import annotations

import math

import pytest
import torch

from dprec_torch.data.ratings import Ratings
from dprec_torch.errors import ConfigError
from dprec_torch.mechanisms.context import TrainingContext
from dprec_torch.mechanisms.gaussian import GaussianDPSGD
from dprec_torch.mechanisms.sgd import MapSGD
from dprec_torch.mechanisms.sgld import ScaledPosteriorSGLD
from dprec_torch.models.batching import full_batch
from dprec_torch.models.mf import MF
from dprec_torch.training.run import setup_training
from tests.helpers import tiny_cfg, tiny_fold


def _context(train: Ratings, q: float, n_units: int, reduction: str = "mean", model=None) -> TrainingContext:
    return TrainingContext(10, 10, n_units, train.n_users, train.scale, n_units=n_units, model=model,
                           expected_batch_size=q * n_units, gradient_reduction=reduction)


def _first_update(make_opt, train: Ratings, q: float, copies: int, reduction: str = "mean") -> list[torch.Tensor]:
    """The parameter change of one step whose summed gradient is its expectation over a Poisson(q) batch
    of ``copies`` duplicates of ``train``: E[sum_batch g_x] = q x copies x sum_x g_x (linear in the gradient)."""
    model = MF(train.n_users, train.n_items, dim=4, seed=0).attach(train)
    with torch.no_grad():  # a non-trivial point: every parameter gets a gradient
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    batch = full_batch(train, train.item_means())
    model.surrogate_loss(batch, (model.batch_predict(batch) - batch.values).detach()).backward()
    before = [p.detach().clone() for p in model.parameters()]
    opt = make_opt(model, _context(train, q, copies * len(train), reduction))
    for p in model.parameters():
        p.grad.mul_(q * copies)
    opt.step()
    return [p.detach() - b for p, b in zip(model.parameters(), before)]


def _makers(wd: float) -> dict:
    return {
        "none": lambda m, ctx: MapSGD(m.parameters(), ctx, lr=3.0, weight_decay=wd, beta=1.0),
        "gaussian": lambda m, ctx: GaussianDPSGD(m.parameters(), ctx, epsilon=math.inf, clip_norm=1.0, lr=3.0,
                                                 weight_decay=wd, sampling_ratio=ctx.expected_batch_size / ctx.n_units),
    }


MAKERS = _makers(2.0)


@pytest.mark.parametrize("mech", sorted(MAKERS))
def test_expected_mf_step_does_not_depend_on_the_sampling_ratio(mech):
    train = tiny_fold().train
    ref = _first_update(MAKERS[mech], train, 1.0, 1)
    assert sum(float(d.abs().sum()) for d in ref) > 0
    for q in (0.5, 0.1, 0.02):
        for a, b in zip(ref, _first_update(MAKERS[mech], train, q, 1)):
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-7), q


@pytest.mark.parametrize("mech", sorted(MAKERS))
def test_duplicating_the_dataset_does_not_change_the_data_term_of_the_step(mech):
    """With lambda = 0 the step is the same on k copies of the data (the decay lambda / n is a FIXED prior
    in the summed objective, so k copies weaken it k-fold, as they should)."""
    train, make = tiny_fold().train, _makers(0.0)[mech]
    ref = _first_update(make, train, 1.0, 1)
    for q, copies in [(1.0, 3), (0.1, 7)]:
        for a, b in zip(ref, _first_update(make, train, q, copies)):
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-7), (q, copies)


def test_summed_semantics_scale_with_the_batch():
    """The old (and PNBM's) semantics: the same lr makes a step 10 x larger on 10 x the data."""
    train = tiny_fold().train
    one = _first_update(MAKERS["none"], train, 1.0, 1, "sum")
    ten = _first_update(lambda m, ctx: MapSGD(m.parameters(), ctx, lr=3.0, weight_decay=0.0, beta=1.0), train, 1.0, 10, "sum")
    base = _first_update(lambda m, ctx: MapSGD(m.parameters(), ctx, lr=3.0, weight_decay=0.0, beta=1.0), train, 1.0, 1, "sum")
    assert any(not torch.allclose(a, b) for a, b in zip(one, ten))
    for a, b in zip(ten, base):
        assert torch.allclose(a, 10 * b, rtol=1e-4, atol=1e-6)


def test_mean_step_is_lr_times_the_mean_gradient_plus_decay_over_n():
    train = tiny_fold().train
    n, q, lr, lam = len(train), 0.25, 3.0, 2.0
    model = MF(train.n_users, train.n_items, dim=4, seed=0).attach(train)
    g = [torch.randn(p.shape, generator=torch.Generator().manual_seed(7)) for p in model.parameters()]
    before = [p.detach().clone() for p in model.parameters()]
    opt = MapSGD(model.parameters(), _context(train, q, n), lr=lr, weight_decay=lam, beta=1.0)
    for p, gi in zip(model.parameters(), g):
        p.grad = gi.clone()
    opt.step()
    for p, b, gi in zip(model.parameters(), before, g):
        assert torch.allclose(p.detach(), b - lr * (gi / (q * n) + lam / n * b), atol=1e-6)


def _cfg(tmp_path, *overrides):
    data = ["data._target_=dprec_torch.data.synthetic.load_synthetic", "data.name=synthetic", "+data.preset=tiny"]
    return tiny_cfg(*data, "device=cpu", "compare_baselines=false", "tensorboard=false", f"output_dir={tmp_path}",
                    *overrides)


@pytest.mark.parametrize("mechanism,unit", [("none", "rating"), ("gaussian", "rating"), ("gaussian", "user"),
                                            ("dpsgd_paper", "rating"), ("dpsgd", "rating")])
def test_the_runner_hands_mf_mechanisms_the_expected_batch(tmp_path, mechanism, unit):
    extra = [f"mechanism.unit={unit}"] if mechanism == "gaussian" else []
    cfg = _cfg(tmp_path, "model=mf", f"mechanism={mechanism}", "epsilon=5", *extra)
    s = setup_training(cfg, tiny_fold(), torch.device("cpu"))
    ctx, q = s.optimizer.context, float(cfg.mechanism.sampling_ratio)
    n = len(s.fold.train) if unit == "rating" else s.fold.train.n_users
    assert ctx.gradient_reduction == "mean" and ctx.n_units == n
    assert s.optimizer.grad_divisor == pytest.approx(q * n) and s.optimizer.decay_divisor == n


def test_pnbm_keeps_the_papers_summed_gradient(tmp_path):
    cfg = _cfg(tmp_path, "model=pnbm", "mechanism=dpsgd_paper", "epsilon=1")
    s = setup_training(cfg, tiny_fold(), torch.device("cpu"))
    assert s.optimizer.context.gradient_reduction == "sum"
    assert s.optimizer.grad_divisor == 1.0 and s.optimizer.decay_divisor == 1.0


def test_mf_sgld_step_is_normalised_by_the_number_of_ratings():
    train = tiny_fold().train
    model = MF(train.n_users, train.n_items, dim=4, seed=0).attach(train)
    kw = dict(epsilon=10.0, lr=2.0, decay=0.5, temperature=1.0, weight_decay=1.0, sampling_ratio=1.0, likelihood_bound="model")
    mean = ScaledPosteriorSGLD(model.parameters(), _context(train, 1.0, len(train), model=model), **kw)
    summed = ScaledPosteriorSGLD(model.parameters(), _context(train, 1.0, len(train), "sum", model), **kw)
    mean.prepare(model)
    summed.prepare(model)
    assert summed.step_size(4) == pytest.approx(2.0 * 4**-0.5)
    assert mean.step_size(4) == pytest.approx(2.0 * 4**-0.5 / len(train))
    assert mean.noise_std(4) == pytest.approx(math.sqrt(mean.step_size(4)))  # Langevin: noise follows the step


def test_mean_reduction_needs_an_expected_batch_size():
    train = tiny_fold().train
    with pytest.raises(ConfigError, match="expected_batch_size"):
        TrainingContext(1, 1, len(train), train.n_users, train.scale, gradient_reduction="mean")
    with pytest.raises(ConfigError, match="gradient_reduction"):
        TrainingContext(1, 1, len(train), train.n_users, train.scale, gradient_reduction="avg")
