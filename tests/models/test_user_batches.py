"""User-level batches drawn from the users' segments, their CSR blocks built on first read, and the low-rank PNBM's
per-rating terms gathered from every user's (one feature solve over all users): the same batches and, at q = 1, the
same bits as the per-batch path."""

from __future__ import annotations

import pytest
import torch

from dprec_torch.data.item_features import ItemFeatures
from dprec_torch.data.ratings import Ratings, RatingScale
from dprec_torch.models.batching import make_batch, user_offsets
from dprec_torch.models.pnbm_lowrank import LowRankPNBM


def grouped_ratings(seed: int, n_users: int = 40, n_items: int = 30, density: float = 0.3) -> Ratings:
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(n_users, n_items, generator=gen) < density
    mask[::7] = False  # users without a rating: rows of no target
    users, items = torch.nonzero(mask, as_tuple=True)  # grouped by ascending user, as the data layer stores them
    values = torch.randint(1, 6, (users.numel(),), generator=gen).float()
    return Ratings(users, items, values, n_users, n_items, RatingScale(1, 5))


@pytest.mark.parametrize("kernel", ["torch", "numba"])  # the run copies in torch ops, or the CPU kernel's
@pytest.mark.parametrize("seed", range(4))
def test_segment_batches_are_the_mask_batches(seed, kernel, monkeypatch):
    monkeypatch.setenv("DPREC_LOWRANK_KERNEL", kernel)
    data = grouped_ratings(seed)
    gen = torch.Generator().manual_seed(100 + seed)
    user_mask = torch.rand(data.n_users, generator=gen) < 0.4
    means = torch.linspace(2.0, 4.0, data.n_items)
    fast = make_batch(data, means, None, user_mask, offsets=user_offsets(data))
    slow = make_batch(data, means, None, user_mask)
    for name in ("users", "rows", "items", "values", "target_index"):
        assert torch.equal(getattr(fast, name), getattr(slow, name)), name
    per_rating = torch.randn(len(data), generator=gen)
    assert torch.equal(fast.gather(per_rating), per_rating[slow.target_index])
    assert fast.is_user_level() and slow.is_user_level()
    counts = torch.bincount(fast.rows, minlength=fast.users.numel())
    assert torch.equal(fast.row_offsets, torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)]))
    assert fast.x_ is None  # the CSR blocks wait for a reader ...
    for name in ("x", "ind"):  # ... and are then the eager ones
        a, b = getattr(fast, name), getattr(slow, name)
        assert torch.equal(a.crow_indices(), b.crow_indices()) and torch.equal(a.values(), b.values())


def test_offsets_need_ratings_grouped_by_user():
    data = grouped_ratings(0)
    shuffled = data.select(torch.randperm(len(data), generator=torch.Generator().manual_seed(0)))
    assert user_offsets(data) is not None and user_offsets(shuffled) is None


def test_a_rating_mask_batch_is_not_user_level():
    data = grouped_ratings(1)
    users = torch.ones(data.n_users, dtype=torch.bool)
    pick = torch.rand(len(data), generator=torch.Generator().manual_seed(0)) < 0.5
    batch = make_batch(data, torch.full((data.n_items,), 3.0), pick, users)
    assert not batch.is_user_level()


def model_with_features(data: Ratings) -> LowRankPNBM:
    gen = torch.Generator().manual_seed(5)
    phi = (torch.rand(data.n_items, 4, generator=gen) < 0.4).float()
    model = LowRankPNBM(data.n_items, rank=3, init_std=0.5, clamp_r=1.0, beta_p=2.0, item_features=False, seed=0)
    model.attach(data)
    model.features_ = ItemFeatures(phi, ["a", "b", "c", "d"], "test")
    with torch.no_grad():
        model.item_means.copy_(torch.linspace(2.0, 4.0, data.n_items))
    return model


@pytest.mark.parametrize("kernel", ["torch", "numba"])
@pytest.mark.parametrize("q", [1.0, 0.5])
def test_gathered_terms_are_the_batch_terms(q, kernel, monkeypatch):
    """Each user's terms (offset, feature weights, clamped residuals, targets) are a function of that user alone: the
    terms gathered from every user's equal the batch's own solve, to the last bit for the full batch."""
    monkeypatch.setenv("DPREC_LOWRANK_KERNEL", kernel)
    data = grouped_ratings(3)
    model = model_with_features(data)
    gen = torch.Generator().manual_seed(9)
    user_mask = (torch.rand(data.n_users, generator=gen) < q) if q < 1 else torch.ones(data.n_users, dtype=torch.bool)
    gathered = make_batch(data, model.item_means, None, user_mask, offsets=user_offsets(data))
    own = make_batch(data, model.item_means, None, user_mask)
    own.source = None  # the batch's own terms: its users' solve
    a, b = model._terms(gathered), model._terms(own)
    for name in ("y", "w", "pred_base", "target"):
        if q == 1.0:
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        else:
            torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(model.batch_predict(gathered), model.batch_predict(own), rtol=1e-5, atol=1e-6)
