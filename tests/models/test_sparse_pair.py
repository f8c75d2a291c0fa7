"""The sparse-pair formulation of PNBM gives the dense formulation's numbers (Eq. (2), Eq. (4)/(5)).

Every test builds two models with the same S, one per formulation, and compares predictions,
the loss and dS -- on random data (float64, tight tolerance), on sampled batches, with
non-unit indicator weights, and on ML-100K (float32).
"""

from __future__ import annotations

import pytest
import torch

from dprec_torch.data.ratings import Ratings, RatingScale
from dprec_torch.errors import ConfigError
from dprec_torch.mechanisms.context import TrainingContext
from dprec_torch.mechanisms.sgd import MapSGD
from dprec_torch.models.batching import PoissonBatchSampler, UserBatch, full_batch
from dprec_torch.models.pair_kernels import build_history, build_plan
from dprec_torch.models.pnbm import PNBM
from dprec_torch.seeding import noise_generator
from tests.helpers import ml100k_available, tiny_fold


def random_ratings(n_users: int = 60, n_items: int = 40, density: float = 0.3, seed: int = 0) -> Ratings:
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(n_users, n_items, generator=g) < density
    mask[:, 0] |= torch.rand(n_users, generator=g) < 0.5  # a popular item
    mask[3] = False  # a user without ratings
    mask[4, :] = True  # a user who rated everything
    u, i = mask.nonzero(as_tuple=True)
    v = torch.randint(1, 6, (u.numel(),), generator=g).float()
    return Ratings(u, i, v, n_users, n_items, RatingScale(1, 5))


def pair_of_models(train: Ratings, floor_c: float, gradient: str = "exact", dtype=torch.float64, seed: int = 0,
                   symmetric: bool = False, budget: int = 97):
    """Two PNBMs with one random (by default non-symmetric, signed, partly zero) S."""
    g = torch.Generator().manual_seed(seed + 100)
    S = torch.randn(train.n_items, train.n_items, generator=g, dtype=torch.float64)
    S[torch.rand(S.shape, generator=g) < 0.1] = 0.0
    if symmetric:
        S = (S + S.T) / 2
    models = []
    for form in ("dense", "sparse_pair"):
        m = PNBM(train.n_items, floor_c=floor_c, n_neighbors=max(2, train.n_items // 3), gradient=gradient,
                 formulation=form, pair_budget=budget).attach(train).to(dtype)
        with torch.no_grad():
            m.S.copy_(S.to(dtype))
        models.append(m)
    return models


def as_dtype(batch: UserBatch, dtype) -> UserBatch:
    return UserBatch(batch.users, batch.x.to(dtype), batch.ind.to(dtype), batch.rows, batch.items,
                     batch.values.to(dtype), batch.target_index)


def compare(models, batch: UserBatch, rtol: float = 1e-10, atol: float = 1e-10, clamp: float | None = None):
    """Assert equal terms, predictions, surrogate loss and dS across the two formulations."""
    outs = []
    for m in models:
        m.zero_grad()
        num, den = m.batch_terms(batch)
        pred = m.batch_predict(batch)
        e = (pred - batch.values).detach()
        if clamp is not None:
            e = e.clamp(-clamp, clamp)
        loss = m.surrogate_loss(batch, e)
        loss.backward()
        outs.append((num.detach(), den.detach(), pred.detach(), loss.detach(), m.S.grad.clone()))
    for a, b, what in zip(outs[0], outs[1], ("num", "den", "pred", "loss", "grad")):
        assert torch.allclose(a, b, rtol=rtol, atol=atol), f"{what} differs: max |diff| {float((a - b).abs().max()):.3g}"
    return outs


@pytest.mark.parametrize("gradient", ["exact", "paper_eq5"])
@pytest.mark.parametrize("floor_c", [0.5, 4.0, 1e3])  # floor inactive, mixed, always active
def test_full_batch_random_data(gradient, floor_c):
    train = random_ratings()
    models = pair_of_models(train, floor_c, gradient)
    batch = as_dtype(full_batch(train, models[0].item_means), torch.float64)
    outs = compare(models, batch)
    assert float(outs[0][4].abs().max()) > 0  # the comparison is not vacuous


@pytest.mark.parametrize("gradient", ["exact", "paper_eq5"])
@pytest.mark.parametrize("unit", ["rating", "user"])
def test_sampled_batches_random_data(gradient, unit):
    train = random_ratings(seed=1)
    models = pair_of_models(train, 2.0, gradient, seed=1)
    sampler = PoissonBatchSampler(train, models[0].item_means, 0.3, unit, noise_generator(5))
    for _ in range(3):
        batch = as_dtype(sampler.sample(), torch.float64)
        compare(models, batch, clamp=1.5)


def test_non_unit_indicator_weights_and_targets_outside_history():
    """ind with arbitrary weights (w_uj != 1) and a target whose user has no history."""
    train = random_ratings(seed=2)
    models = pair_of_models(train, 1.0, "exact", seed=2)
    b = full_batch(train, models[0].item_means)
    g = torch.Generator().manual_seed(3)
    ind = torch.sparse_csr_tensor(b.ind.crow_indices(), b.ind.col_indices(),
                                  torch.rand(b.ind.values().numel(), generator=g, dtype=torch.float64) + 0.5, size=b.ind.shape,
                                  check_invariants=False)
    # append a target on an empty row (user 3 has no ratings) and one on an unrated item
    empty_row = int(b.users.numel())
    users = torch.cat([b.users, torch.tensor([3])])
    crow = torch.cat([b.x.crow_indices(), b.x.crow_indices()[-1:]])
    shape = (users.numel(), train.n_items)
    x = torch.sparse_csr_tensor(crow, b.x.col_indices(), b.x.values().double(), size=shape, check_invariants=False)
    ind = torch.sparse_csr_tensor(crow, ind.col_indices(), ind.values(), size=shape, check_invariants=False)
    rows = torch.cat([b.rows, torch.tensor([empty_row, 0])])
    items = torch.cat([b.items, torch.tensor([5, 7])])
    values = torch.cat([b.values.double(), torch.tensor([3.0, 4.0], dtype=torch.float64)])
    batch = UserBatch(users, x, ind, rows, items, values, torch.arange(values.numel()))
    outs = compare(models, batch)
    assert float(outs[0][0][-2]) == 0.0  # no history: empty sums


def test_predict_matches_dense_with_top_neighbours():
    train = random_ratings(seed=4)
    models = pair_of_models(train, 1.0, "exact", dtype=torch.float32, seed=4, symmetric=True)
    g = torch.Generator().manual_seed(9)
    users = torch.randint(-2, train.n_users + 3, (500,), generator=g)  # includes unknown ids
    items = torch.randint(-2, train.n_items + 3, (500,), generator=g)
    a, b = (m.predict(users, items) for m in models)
    assert torch.allclose(a, b, atol=1e-5)


def test_training_trajectory_same_under_both_formulations():
    """Five MapSGD steps from the same start land on the same S (and the same test predictions)."""
    fold = tiny_fold()
    states = []
    for form in ("dense", "sparse_pair"):
        m = PNBM(fold.train.n_items, floor_c=1.0, formulation=form, seed=0).attach(fold.train)
        opt = MapSGD(m.parameters(), TrainingContext(5, 1, len(fold.train), fold.train.n_users, fold.train.scale),
                     lr=0.4, beta=10.0)
        b = full_batch(fold.train, m.item_means)
        for _ in range(5):
            opt.zero_grad()
            pred = m.batch_predict(b)
            m.surrogate_loss(b, pred - b.values).backward()
            opt.step()
            m.project_()
        states.append((m.S.detach().clone(), m.predict(fold.test.users, fold.test.items)))
    assert torch.allclose(states[0][0], states[1][0], rtol=1e-4, atol=1e-4)
    assert torch.allclose(states[0][1], states[1][1], atol=1e-4)


def test_cached_terms_follow_in_place_updates():
    """batch_predict -> update S in place -> batch_predict must see the new S (no stale cache)."""
    train = random_ratings(seed=5)
    dense, sparse = pair_of_models(train, 1.0, "exact", seed=5)
    batch = as_dtype(full_batch(train, dense.item_means), torch.float64)
    first = sparse.batch_predict(batch).detach()
    with torch.no_grad():
        for m in (dense, sparse):
            m.S.mul_(-0.5).add_(0.1)
    second = sparse.batch_predict(batch).detach()
    assert not torch.allclose(first, second)
    assert torch.allclose(second, dense.batch_predict(batch).detach(), rtol=1e-10, atol=1e-10)
    # an explicit S argument (finite differences use it) is honoured too
    other = torch.randn_like(sparse.S.detach())
    assert torch.allclose(sparse.batch_terms(batch, other)[0], dense.batch_terms(batch, other)[0], rtol=1e-10, atol=1e-10)


def test_plan_chunks_respect_the_budget_and_count_pairs():
    """Memory stays bounded: every chunk holds <= budget padded pairs; pairs = sum_t |R_u(t)|."""
    train = random_ratings(n_users=200, n_items=80, seed=6)
    rows, items = train.users, train.items
    hist = build_history(rows, items, train.values, None, train.n_users, train.n_items)
    budget = 300
    plan = build_plan(hist, rows, items, budget)
    assert plan.n_pairs == int((train.user_counts().double() ** 2).sum())
    for b, s, e in plan.chunks:
        assert (e - s) * hist.width[b] <= max(budget, hist.width[b])
    assert plan.n_pairs <= plan.n_padded <= 1.6 * plan.n_pairs  # length buckets keep padding small


def test_auto_formulation_and_bad_values():
    m = PNBM(50, formulation="auto", dense_max_items=100)
    assert m.resolved_formulation(torch.device("cpu")) == "sparse_pair"
    assert m.resolved_formulation(torch.device("cuda")) == "dense"
    assert PNBM(500, dense_max_items=100).resolved_formulation(torch.device("cuda")) == "sparse_pair"
    with pytest.raises(ConfigError, match="formulation"):
        PNBM(5, formulation="fast")
    with pytest.raises(ConfigError, match="pair_budget"):
        PNBM(5, pair_budget=0)


def test_mismatched_sparsity_patterns_fall_back_to_dense():
    train = random_ratings(seed=7)
    dense, sparse = pair_of_models(train, 1.0, "exact", seed=7)
    b = as_dtype(full_batch(train, dense.item_means), torch.float64)
    x = b.x.to_dense()
    x[0, -1] = 0.25  # an entry of x outside ind's pattern
    b2 = UserBatch(b.users, x.to_sparse_csr(), b.ind, b.rows, b.items, b.values, b.target_index)
    assert sparse.pair_plan(b2) is None
    assert torch.allclose(sparse.batch_terms(b2)[0], dense.batch_terms(b2)[0], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("backend", ["torch", "numba"])
@pytest.mark.parametrize("gradient", ["exact", "paper_eq5"])
def test_ml100k_full_batch(gradient, backend):
    """ML-100K u1 (or, without DPREC_DATA, synthetic data of its size): sparse-pair == dense."""
    if ml100k_available():
        from dprec_torch.data.movielens import load_movielens

        fold = load_movielens("ml-100k", fold=1).folds[0]
    else:
        from dprec_torch.data.synthetic import load_synthetic

        fold = load_synthetic(preset="ml-100k", fold=1, seed=0).folds[0]
    models = []
    for form in ("dense", "sparse_pair"):
        m = PNBM(fold.train.n_items, floor_c=10.0, gradient=gradient, formulation=form, seed=0,
                 pair_backend=backend).attach(fold.train)
        with torch.no_grad():
            m.S.mul_(10.0)  # Alg. 1 line 1 (beta = 10): denominators above the floor for most targets
        models.append(m)
    batch = full_batch(fold.train, models[0].item_means)
    outs = compare(models, batch, rtol=1e-4, atol=1e-4, clamp=2.0)
    assert float(outs[0][4].abs().max()) > 1.0
    a, b = (m.predict(fold.test.users, fold.test.items) for m in models)
    assert torch.allclose(a, b, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_sparse_pair_on_cuda_matches_cpu():
    train = random_ratings(seed=8)
    grads = []
    for dev in ("cpu", "cuda"):
        m = PNBM(train.n_items, floor_c=1.0, formulation="sparse_pair", seed=0).attach(train.to(dev)).to(dev)
        b = full_batch(train.to(dev), m.item_means)
        pred = m.batch_predict(b)
        m.surrogate_loss(b, pred - b.values).backward()
        grads.append(m.S.grad.cpu())
    assert torch.allclose(grads[0], grads[1], atol=1e-4, rtol=1e-4)
