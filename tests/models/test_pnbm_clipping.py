"""Per-user PNBM gradients: exact against autograd, L1/L2 norms, chunking, user isolation, clipping."""

from __future__ import annotations

import pytest
import torch

from dprec_torch.errors import ConfigError
from dprec_torch.models.batching import full_batch, make_batch
from dprec_torch.models.pnbm import PNBM
from dprec_torch.privacy import pnbm_clipping as pc
from tests.helpers import tiny_fold, toy_ratings


def small_model(train, floor_c: float, init_scale: float, seed: int = 1) -> PNBM:
    m = PNBM(train.n_items, floor_c=floor_c, init_scale=init_scale, seed=seed)
    return m.attach(train)


def user_batch(train, model: PNBM, n_users: int = 40):
    """A user-level batch of the first ``n_users`` users (all their ratings are targets)."""
    users = torch.zeros(train.n_users, dtype=torch.bool)
    users[:n_users] = True
    return make_batch(train, model.item_means, users[train.users], users)


def autograd_user_gradient(model: PNBM, batch, residuals: torch.Tensor, row: int) -> torch.Tensor:
    """G_u by autograd of surrogate_loss(gradient=exact) with every other user's residuals zeroed."""
    e = torch.where(batch.rows == row, residuals, torch.zeros_like(residuals))
    model.zero_grad()
    model.surrogate_loss(batch, e).backward()
    g = model.S.grad.double().clone()
    g.fill_diagonal_(0.0)
    return g


@pytest.fixture(scope="module")
def tiny():
    return tiny_fold().train


@pytest.mark.parametrize("floor_c,init_scale", [(2.0, 0.5), (50.0, 0.1), (5.0, 0.2)])
def test_per_user_gradient_matches_autograd(tiny, floor_c, init_scale):
    """Both regimes: denominator above the floor (|s| term active) and at the floor (term absent)."""
    model = small_model(tiny, floor_c, init_scale)
    batch = user_batch(tiny, model)
    res = (model.batch_predict(batch) - batch.values).detach()
    _, _, a = pc.target_terms(model, batch)
    G = pc.per_user_gradient(model, batch, res).to_dense()
    for row in range(0, 40, 4):
        ref = autograd_user_gradient(model, batch, res, row)
        assert torch.allclose(G[row], ref, atol=1e-6, rtol=1e-4), row
    if floor_c == 2.0:
        assert float((a != 0).double().mean()) > 0.5  # the |s| / denominator term really is exercised
    if floor_c == 50.0:
        assert float((a != 0).double().mean()) < 0.5


def test_rating_level_batch_matches_autograd(tiny):
    """Targets a subset of the history (rating sampling): still one G per batch row."""
    model = small_model(tiny, 2.0, 0.5)
    gen = torch.Generator().manual_seed(3)
    pick = torch.rand(len(tiny), generator=gen) < 0.3
    users = torch.zeros(tiny.n_users, dtype=torch.bool)
    users[tiny.users[pick]] = True
    batch = make_batch(tiny, model.item_means, pick, users)
    res = (model.batch_predict(batch) - batch.values).detach()
    G = pc.per_user_gradient(model, batch, res).to_dense()
    for row in (0, 5, 17):
        assert torch.allclose(G[row], autograd_user_gradient(model, batch, res, row), atol=1e-6, rtol=1e-4)


def test_norms_pairs_closed_form_and_chunks_agree(tiny):
    model = small_model(tiny, 2.0, 0.5)
    batch = user_batch(tiny, model, 60)
    res = (model.batch_predict(batch) - batch.values).detach()
    G = pc.per_user_gradient(model, batch, res).to_dense()
    l1_ref, l2_ref = G.abs().sum((1, 2)), G.pow(2).sum((1, 2)).sqrt()
    l1 = pc.per_user_grad_norms(model, batch, res, p=1)
    l1_chunked = pc.per_user_grad_norms(model, batch, res, p=1, chunk_pairs=997)
    l2_pairs = pc.per_user_grad_norms(model, batch, res, p=2, method="pairs", chunk_pairs=4096)
    l2_closed = pc.per_user_grad_norms(model, batch, res, p=2, method="closed")
    assert torch.allclose(l1, l1_ref, rtol=1e-9)
    assert torch.allclose(l1_chunked, l1_ref, rtol=1e-9)
    assert torch.allclose(l2_pairs, l2_ref, rtol=1e-9)
    assert torch.allclose(l2_closed, l2_ref, rtol=1e-7)


def test_user_gradient_depends_on_own_data_only(tiny):
    """Changing another user's ratings leaves G_u unchanged (r_bar and S fixed): the user-level claim."""
    model = small_model(tiny, 2.0, 0.5)
    batch = user_batch(tiny, model)
    res = (model.batch_predict(batch) - batch.values).detach()
    G = pc.per_user_gradient(model, batch, res).to_dense()
    other = tiny.select(torch.arange(len(tiny)))
    other.values = torch.where(other.users == 7, 6.0 - other.values, other.values)  # flip user 7's ratings
    b2 = user_batch(other, model)
    res2 = (model.batch_predict(b2) - b2.values).detach()
    G2 = pc.per_user_gradient(model, b2, res2).to_dense()
    changed = (G - G2).abs().sum((1, 2)) > 1e-12
    assert changed[7] and int(changed.sum()) == 1


def test_hand_computed_two_item_user():
    """One user, items 0 and 1, floor active: G[0, 1] = e_0 x_1 / C and G[1, 0] = e_1 x_0 / C."""
    train = toy_ratings([[5, 1], [3, 3], [1, 5]])
    model = small_model(train, 10.0, 0.1)
    batch = full_batch(train, model.item_means)
    res = (model.batch_predict(batch) - batch.values).detach()
    G = pc.per_user_gradient(model, batch, res).to_dense()
    x0, x1 = 5 - 3.0, 1 - 3.0  # item means are 3
    e = res[batch.rows == 0]
    assert float(G[0, 0, 1]) == pytest.approx(float(e[0]) * x1 / 10.0, rel=1e-6)
    assert float(G[0, 1, 0]) == pytest.approx(float(e[1]) * x0 / 10.0, rel=1e-6)


def test_clipping_bounds_every_user(tiny):
    model = small_model(tiny, 2.0, 0.5)
    batch = full_batch(tiny, model.item_means)
    res = (model.batch_predict(batch) - batch.values).detach()
    for p, c in ((1, 0.5), (2, 0.05)):
        clipped, before = pc.clip_user_residuals(model, batch, res, c, p)
        after = pc.per_user_grad_norms(model, batch, clipped, p=p)
        assert float(after.max()) <= c * (1 + 1e-5)
        small = before <= c
        assert torch.allclose(after[small], before[small], rtol=1e-5)  # unclipped users untouched


def test_rating_unit_and_bad_norm_are_config_errors(tiny):
    model = small_model(tiny, 2.0, 0.5)
    batch = full_batch(tiny, model.item_means)
    res = (model.batch_predict(batch) - batch.values).detach()
    with pytest.raises(ConfigError, match="unit=user"):
        pc.per_example_grad_norms(model, batch, res, "rating")
    with pytest.raises(ConfigError, match="1 or 2"):
        pc.per_user_grad_norms(model, batch, res, p=3)
    assert torch.allclose(pc.per_example_grad_norms(model, batch, res, "user"), pc.per_user_grad_norms(model, batch, res, p=2))


# --------------------------------------------------------------------------------- the floor's kink
def _floor_user(seed: int, straddle: bool):
    """User 0 rates items 0..10 (so D = 10 = C at S = 1 for every target); user 1 rates all 12 items.

    ``straddle``: s_01 = s_10 = 1 - 2^-24, so targets 0 and 1 have D = 9 + (1 - 2^-24) < C in float64,
    while the float32 forward sum rounds it to exactly C.
    """
    from dprec_torch.data.ratings import Ratings, RatingScale

    g = torch.Generator().manual_seed(seed)
    users = torch.tensor([0] * 11 + [1] * 12)
    items = torch.cat([torch.arange(11), torch.arange(12)])
    vals = torch.randint(1, 6, (23,), generator=g).float()
    data = Ratings(users, items, vals, 2, 12, RatingScale(1, 5))
    out = []
    for form, backend in (("sparse_pair", "numba"), ("sparse_pair", "torch"), ("dense", "torch")):
        m = PNBM(12, floor_c=10.0, formulation=form, pair_backend=backend).attach(data)
        with torch.no_grad():
            m.S.fill_(1.0)
            if straddle:
                m.S[0, 1] = m.S[1, 0] = torch.tensor(1 - 2**-24)
            m.S.fill_diagonal_(0.0)
        um = torch.tensor([True, False])
        out.append((m, make_batch(data, m.item_means, um[data.users], um)))
    return out


def _released_l1(model, batch, clipped):
    model.zero_grad()
    model.surrogate_loss(batch, clipped).backward()
    g = model.S.grad.double().clone()
    g.fill_diagonal_(0.0)
    return float(g.abs().sum())


@pytest.mark.parametrize("straddle", [False, True])
def test_released_gradient_at_the_floor_is_clipped_to_c(straddle):
    """D = C exactly (S = 1, 11 ratings, C = 10), and D a hair below C in float64 but = C in the float32
    forward: the released G_u after clipping stays within c on every backend. The old norm decided the
    floor in float64 on its own and let the released contribution reach 1.019 c here (seed 2)."""
    for seed in (2, 3, 5):
        for model, batch in _floor_user(seed, straddle):
            res = (model.batch_predict(batch) - batch.values).detach()
            norms = pc.per_user_grad_norms(model, batch, res, p=1)
            c = 0.5 * float(norms[0])  # clipping active
            clipped, _ = pc.clip_user_residuals(model, batch, res, c, p=1)
            assert _released_l1(model, batch, clipped) <= c * (1 + 1e-5)
            assert torch.allclose(pc.per_user_gradient(model, batch, res).to_dense()[0],
                                  autograd_user_gradient(model, batch, res, 0), atol=1e-6, rtol=1e-4)


def test_one_floor_mask_is_shared_by_forward_and_norm():
    """The [D >= C] mask is computed once per (batch, S version) and reused, and refreshed after S changes."""
    from dprec_torch.models.pnbm import DENOMINATOR_RULE

    assert DENOMINATOR_RULE == "D >= C"
    model, batch = _floor_user(2, False)[0]
    _, raw, active = model.denominator_terms(batch)
    assert bool(active.all()) and torch.all(raw == 10.0)  # the boundary counts as active: |s| term kept
    _, _, again = model.denominator_terms(batch)
    assert again is active
    with torch.no_grad():
        model.S.mul_(0.5)  # D = 5 < C now: a new S version, a new mask
    _, _, after = model.denominator_terms(batch)
    assert after is not active and not bool(after.any())


@pytest.mark.parametrize("include_diagonal", [False, True])
def test_compiled_l1_norms_are_the_torch_enumeration_bit_for_bit(tiny, include_diagonal):
    """The numba kernel (CPU, ``pair_backend`` auto/numba) adds the same float64 terms in the same order per user."""
    from dprec_torch.models import pair_numba

    if not pair_numba.available():
        pytest.skip("numba does not import here")
    model = small_model(tiny, 2.0, 0.5)
    with torch.no_grad():
        model.S[0, 1] = model.S[1, 0] = 0.0  # sign(0) = 0 in both paths
    batch = user_batch(tiny, model, n_users=tiny.n_users)
    res = (model.batch_predict(batch) - batch.values).detach()
    norms = {}
    for backend in ("torch", "numba"):
        model.pair_backend = backend
        norms[backend] = pc.per_user_grad_norms(model, batch, res, p=1, include_diagonal=include_diagonal)
    assert norms["torch"].abs().sum() > 0
    assert torch.equal(norms["torch"], norms["numba"])
