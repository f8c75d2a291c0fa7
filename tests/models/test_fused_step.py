"""The fused PNBM training step (one numba pass: sums, pred, residual, clamp, gradient) is the separate
``batch_predict`` -> ``clip_residuals`` -> ``surrogate_loss().backward()`` step, bit for bit."""

from __future__ import annotations

import math

import pytest
import torch

from dprec_torch.data.synthetic import load_synthetic
from dprec_torch.mechanisms.base import MechanismOptimizer
from dprec_torch.mechanisms.clipped_sgld import ClippedSGLD
from dprec_torch.mechanisms.context import TrainingContext, prior_precision_for
from dprec_torch.mechanisms.dpsgd import ClippedLaplaceDPSGD
from dprec_torch.mechanisms.dpsgd_paper import DPSGDLaplace
from dprec_torch.mechanisms.gaussian import GaussianDPSGD
from dprec_torch.mechanisms.none import NoMechanism
from dprec_torch.mechanisms.sgld import ScaledPosteriorSGLD
from dprec_torch.models import pair_numba
from dprec_torch.models.base import BaseModel
from dprec_torch.models.batching import PoissonBatchSampler, full_batch
from dprec_torch.models.pair_kernels import build_history, build_plan, pair_sums
from dprec_torch.models.pnbm import PNBM, floored
from dprec_torch.training.trainer import Trainer

pytestmark = pytest.mark.skipif(pair_numba.numba is None, reason="numba does not import here")

MECHANISMS = {  # the conf/mechanism defaults of the three mechanisms whose clipping is element-wise
    "none": (NoMechanism, dict(lr=0.4, weight_decay=0.005, beta=10.0, seed=0)),
    "dpsgd_paper": (DPSGDLaplace, dict(epsilon=1.0, lr=0.4, weight_decay=0.005, beta=10.0, seed=0)),
    "sgld_paper": (ScaledPosteriorSGLD, dict(epsilon=1.0, lr=10.0, decay=0.3, temperature=0.004, weight_decay=0.02,
                                             max_user_ratings=200, init_scale=10.0, seed=0)),
}


@pytest.fixture(scope="module")
def train():
    """ML-100K-size synthetic data (943 users x 1682 items, 80K training ratings)."""
    return load_synthetic(preset="ml-100k", fold=1, seed=3).folds[0].train


def setup(train, mech: str, dtype: torch.dtype, steps: int = 3, floor_c: float = 10.0):
    model = PNBM(train.n_items, floor_c=floor_c, formulation="sparse_pair", pair_backend="numba").attach(train)
    model.S.data = model.S.data.to(dtype)  # the item means stay float32: pred is promoted, as in torch
    cls, kwargs = MECHANISMS[mech]
    ctx = TrainingContext(total_steps=steps, steps_per_epoch=1, n_ratings=len(train), n_users=train.n_users,
                          scale=train.scale, entry_bound=model.gradient_entry_bound, model=model,
                          prior_precision=prior_precision_for(cls, model, train, len(train)))
    opt = cls(model.parameters(), ctx, **kwargs)
    opt.prepare(model)
    return model, opt


def separate_step(model: PNBM, opt, batch, target: torch.Tensor | None = None):
    """Today's path: (pred, residuals, clipped, S.grad)."""
    target = batch.values if target is None else target
    model.S.grad = None
    pred = model.batch_predict(batch)
    residuals = (pred - target).detach()
    clipped = opt.clip_residuals(residuals, batch, model)
    model.surrogate_loss(batch, clipped).backward()
    grad, model.S.grad = model.S.grad, None
    return pred.detach(), residuals, clipped, grad


def fused(model: PNBM, opt, batch, target: torch.Tensor | None = None):
    model.S.grad = None
    out = model.fused_step(batch, batch.values if target is None else target, opt.elementwise_residual_clip())
    assert out is not None
    grad, model.S.grad = model.S.grad, None
    return (*out, grad)


def assert_identical(a, b) -> None:
    for x, y, name in zip(a, b, ("pred", "residuals", "clipped", "S.grad")):
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert torch.equal(x, y), f"{name}: max |diff| {(x.double() - y.double()).abs().max().item():.3g}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mech", list(MECHANISMS))
def test_fused_step_is_the_separate_step_bit_for_bit(train, mech: str, dtype: torch.dtype) -> None:
    model, opt = setup(train, mech, dtype)
    bound = opt.elementwise_residual_clip()
    # both override the base defaults (None: no element-wise clamp; no fused step)
    assert type(opt).elementwise_residual_clip is not MechanismOptimizer.elementwise_residual_clip
    assert type(model).fused_step is not BaseModel.fused_step
    assert (bound == math.inf) == (mech != "dpsgd_paper")
    want = separate_step(model, opt, full_batch(train, model.item_means))
    got = fused(model, opt, full_batch(train, model.item_means))  # a fresh batch: no cached sums or terms
    assert_identical(got, want)
    assert got[3].abs().sum() > 0
    if mech == "dpsgd_paper":
        assert bool((got[1].abs() > bound).any()) and bool((got[1].abs() < bound).any())  # the clamp acts


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_both_sides_of_the_denominator_floor(train, dtype: torch.dtype) -> None:
    """At floor_c = 40 part of the targets sit on the floor (d = C, no |s| gradient) and part above it."""
    model, opt = setup(train, "dpsgd_paper", dtype, floor_c=40.0)
    batch = full_batch(train, model.item_means)
    ab = model.denominator_terms(batch)[1].detach()
    assert bool((ab >= 40).any()) and bool((ab < 40).any())
    assert_identical(fused(model, opt, full_batch(train, model.item_means)),
                     separate_step(model, opt, full_batch(train, model.item_means)))


def test_a_huge_residual_enters_the_gradient_exactly_clamped(train) -> None:
    """Privacy rests on the clamp: a target moved by 10^6 gives the gradient of a residual of exactly e_max(t)."""
    model, opt = setup(train, "dpsgd_paper", torch.float32)
    bound = opt.elementwise_residual_clip()
    batch = full_batch(train, model.item_means)
    far = batch.values.clone()
    far[:50] = -1e6  # residuals of about +10^6 and, below, -10^6
    far[50:100] = 1e6
    got = fused(model, opt, batch, far)
    assert torch.equal(got[2][:50], torch.full((50,), bound)) and torch.equal(got[2][50:100], torch.full((50,), -bound))
    near = far.clone()
    near[:50] = -1e3  # another residual beyond the bound: the same clamped gradient, bit for bit
    near[50:100] = 1e3
    assert torch.equal(fused(model, opt, full_batch(train, model.item_means), near)[3], got[3])
    # and the gradient is that of the separate path fed the clamped residuals
    want = separate_step(model, opt, full_batch(train, model.item_means), far)
    assert torch.equal(want[2], got[2]) and torch.equal(want[3], got[3])


def test_thread_count_does_not_change_a_bit(train) -> None:
    model, opt = setup(train, "dpsgd_paper", torch.float32)
    before = torch.get_num_threads()
    outs = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            outs.append(fused(model, opt, full_batch(train, model.item_means)))  # the layout's pieces follow n
    finally:
        torch.set_num_threads(before)
    assert_identical(outs[0], outs[1])


@pytest.mark.parametrize("weights", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kernel_matches_autograd_with_empty_histories_and_weights(weights: bool, dtype: torch.dtype) -> None:
    """The kernel alone, against PNBM's graph over PairSums: random histories (some rows empty), weighted or
    indicator, sign(0), both sides of the floor, float32 item means and targets with a float64 S."""
    g = torch.Generator().manual_seed(4)
    n_rows, m = 70, 45
    key = torch.unique(torch.randint(0, n_rows * m, (1200,), generator=g))
    rows, items = key // m, key % m
    x = torch.randn(rows.numel(), generator=g)
    w = torch.rand(rows.numel(), generator=g) if weights else None
    hist = build_history(rows, items, x, w, n_rows + 3, m)  # 3 rows without a history
    t_rows = torch.randint(0, n_rows + 3, (600,), generator=g)
    t_items = torch.randint(0, m, (600,), generator=g)
    S = torch.randn(m, m, generator=g, dtype=dtype)
    S[torch.rand(m, m, generator=g) < 0.1] = 0.0
    means = torch.rand(m, generator=g) * 4 + 1
    target = torch.randint(1, 6, (600,), generator=g).float()
    floor_c, bound = 6.0, 0.8
    plan = build_plan(hist, t_rows, t_items, backend="numba")
    Sp = S.clone().requires_grad_(True)
    num, ab, _ = pair_sums(Sp, plan)
    active = ab.detach() >= floor_c
    assert bool(active.any()) and bool((~active).any())
    den = floored(ab, active, floor_c)
    pred = means[t_items] + num / den
    res = (pred - target).detach()
    clipped = res.clamp(-bound, bound)
    (clipped * (num / den)).sum().backward()
    got = pair_numba.fused_step(plan.numba_layout(), S, floor_c, means, t_items, target, bound)
    assert_identical(got, (pred.detach(), res, clipped, Sp.grad))


def run_trainer(train, mech: str, fused_on: bool, steps: int = 3):
    model, opt = setup(train, mech, torch.float32, steps=steps)
    calls = []
    if fused_on:
        real = model.fused_step
        model.fused_step = lambda *a: calls.append(1) or real(*a)
    else:
        model.fused_step = lambda *a: None  # the separate path
    sampler = PoissonBatchSampler(train, model.item_means, 1.0, "user" if mech == "sgld_paper" else "rating",
                                  torch.Generator().manual_seed(1))
    trainer = Trainer(model, opt, sampler, epochs=steps)
    sq = [trainer._step()[0] for _ in range(steps)]
    return model.S.detach().clone(), torch.stack(sq), dict(opt.state["mechanism"]), len(calls), opt


@pytest.mark.parametrize("mech", list(MECHANISMS))
def test_trainer_steps_are_the_same_with_the_fused_path(train, mech: str) -> None:
    """Three Trainer steps (noise, update, projection): the same S, losses and mechanism state either way."""
    S1, sq1, st1, n1, opt = run_trainer(train, mech, True)
    S0, sq0, st0, n0, _ = run_trainer(train, mech, False)
    assert n1 == 3 and n0 == 0
    assert torch.equal(S1, S0) and torch.equal(sq1, sq0)
    assert st1 == st0
    if mech == "dpsgd_paper":  # clip_residuals still ran and recorded the third step's e_max
        assert st1["residual_bound"] == opt.residual_bound(3) < math.inf


def test_a_mechanism_whose_clamp_differs_is_refused(train) -> None:
    """The gradient already holds the kernel's clamp: a declared bound that clip_residuals does not apply raises."""
    model, opt = setup(train, "dpsgd_paper", torch.float32)
    opt.elementwise_residual_clip = lambda: 2 * DPSGDLaplace.residual_bound(opt)
    sampler = PoissonBatchSampler(train, model.item_means, 1.0, "rating", torch.Generator().manual_seed(1))
    with pytest.raises(RuntimeError, match="elementwise_residual_clip"):
        Trainer(model, opt, sampler, epochs=3)._step()


def test_only_element_wise_clipping_is_declared(train) -> None:
    """Per-user clipping (dpsgd, gaussian) keeps the base default (None); a subclass that clips otherwise falls back
    (None); sgld's clipped chain and MapSGD's rating_reg do not claim a clamp."""
    for cls in (ClippedLaplaceDPSGD, GaussianDPSGD):
        assert cls.elementwise_residual_clip is MechanismOptimizer.elementwise_residual_clip
        assert cls.elementwise_residual_clip(None) is None

    class OtherClip(DPSGDLaplace):
        def clip_residuals(self, residuals, batch=None, model=None):
            return residuals * 0.5

    model, opt = setup(train, "dpsgd_paper", torch.float32)
    other = OtherClip(model.parameters(), opt.context, epsilon=1.0, seed=0)
    assert other.elementwise_residual_clip() is None
    _, none_opt = setup(train, "none", torch.float32)
    none_opt.rating_reg = 0.1
    assert none_opt.elementwise_residual_clip() is None
    _, sgld = setup(train, "sgld_paper", torch.float32)
    assert sgld.elementwise_residual_clip() == math.inf  # the posterior-sampling chain does not clip
    assert ClippedSGLD.elementwise_residual_clip is MechanismOptimizer.elementwise_residual_clip  # per-user clip: None


def test_fused_step_declines_what_it_does_not_compute(train) -> None:
    for kwargs in (dict(gradient="paper_eq5", pair_backend="numba"), dict(pair_backend="torch")):
        model = PNBM(train.n_items, formulation="sparse_pair", **kwargs).attach(train)
        batch = full_batch(train, model.item_means)
        assert model.fused_step(batch, batch.values, math.inf) is None
    model = PNBM(train.n_items, formulation="sparse_pair", pair_backend="numba").attach(train)
    batch = full_batch(train, model.item_means)
    with torch.no_grad():
        assert model.fused_step(batch, batch.values, math.inf) is None
