"""The numba sparse-pair kernels compute the torch chunk path's numbers (sums and gradient)."""

from __future__ import annotations

import pytest
import torch

from dprec_torch.errors import ConfigError
from dprec_torch.models import pair_numba
from dprec_torch.models.batching import full_batch
from dprec_torch.models.pair_kernels import build_history, build_plan
from dprec_torch.models.pnbm import PNBM
from tests.helpers import tiny_fold

pytestmark = pytest.mark.skipif(pair_numba.numba is None, reason="numba does not import here")


def random_case(seed: int, n_rows: int = 60, m: int = 40, nnz: int = 900, n_targets: int = 500,
                weights: bool = False, dtype: torch.dtype = torch.float64):
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, n_rows, (nnz,), generator=g)
    items = torch.randint(0, m, (nnz,), generator=g)
    key = torch.unique(rows * m + items)  # no duplicate (row, item)
    rows, items = key // m, key % m
    x = torch.randn(rows.numel(), generator=g, dtype=dtype)
    w = torch.rand(rows.numel(), generator=g, dtype=dtype) if weights else None
    hist = build_history(rows, items, x, w, n_rows + 3, m)  # 3 rows with an empty history
    t_rows = torch.randint(0, n_rows + 3, (n_targets,), generator=g)
    t_items = torch.randint(0, m, (n_targets,), generator=g)
    S = torch.randn(m, m, generator=g, dtype=dtype)
    S[torch.rand(m, m, generator=g) < 0.1] = 0.0  # sign(0) = 0 must match too
    return hist, t_rows, t_items, S


@pytest.mark.parametrize("weights", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sums_and_grad_match_torch_path(weights: bool, dtype: torch.dtype) -> None:
    hist, t_rows, t_items, S = random_case(1, weights=weights, dtype=dtype)
    ref = build_plan(hist, t_rows, t_items, budget=64, backend="torch")
    fast = build_plan(hist, t_rows, t_items, backend="numba")
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for a, b in zip(ref.sums(S, need_lin=True), fast.sums(S, need_lin=True)):
        torch.testing.assert_close(b, a, atol=tol, rtol=tol)
    g = torch.Generator().manual_seed(2)
    ups = [torch.randn(t_rows.numel(), generator=g, dtype=dtype) for _ in range(3)]
    for mask in [(1, 1, 1), (1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 0), (0, 0, 0)]:
        gs = [u if on else None for u, on in zip(ups, mask)]
        torch.testing.assert_close(fast.grad(S, *gs), ref.grad(S, *gs), atol=tol * 10, rtol=tol)


def test_targets_with_empty_history_are_zero() -> None:
    hist, t_rows, t_items, S = random_case(3)
    fast = build_plan(hist, t_rows, t_items, backend="numba")
    num, ab, lin = fast.sums(S, need_lin=True)
    empty = hist.length[t_rows] == 0
    assert empty.any()
    assert (num[empty] == 0).all() and (ab[empty] == 0).all() and (lin[empty] == 0).all()
    assert (ab[~empty] > 0).all()


def test_pieces_never_split_an_item() -> None:
    """Two threads must never write the same gradient row: piece boundaries fall between items."""
    hist, t_rows, t_items, _ = random_case(4, n_targets=3000)
    with_threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        lay = build_plan(hist, t_rows, t_items, backend="numba").numba_layout()
    finally:
        torch.set_num_threads(with_threads)
    assert lay.piece[0] == 0 and lay.piece[-1] == lay.t_item.size
    for b in lay.piece[1:-1]:
        assert lay.t_item[b - 1] != lay.t_item[b]
    assert (torch.from_numpy(lay.t_item[1:]) >= torch.from_numpy(lay.t_item[:-1])).all()  # sorted by item


def test_pnbm_training_step_same_with_either_backend() -> None:
    train = tiny_fold(5).train
    grads = {}
    for backend in ("torch", "numba"):
        model = PNBM(train.n_items, gradient="exact", pair_backend=backend).attach(train)
        model.S.data = model.S.data.double()
        model.item_means.data = model.item_means.data.double()
        batch = full_batch(train, model.item_means)
        pred = model.batch_predict(batch)
        model.surrogate_loss(batch, (pred - batch.values).detach()).backward()
        grads[backend] = (pred.detach(), model.S.grad.clone())
    torch.testing.assert_close(grads["numba"][0], grads["torch"][0], atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(grads["numba"][1], grads["torch"][1], atol=1e-12, rtol=1e-12)


def test_torch_backend_never_calls_numba(monkeypatch: pytest.MonkeyPatch) -> None:
    hist, t_rows, t_items, S = random_case(6)
    monkeypatch.setattr(pair_numba, "sums", lambda *a, **k: pytest.fail("numba used with backend=torch"))
    build_plan(hist, t_rows, t_items, backend="torch").sums(S)


def test_unknown_backend_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="pair_backend"):
        PNBM(10, pair_backend="cuda-magic")


@pytest.mark.parametrize("gradient", ["exact", "paper_eq5"])
def test_topk_model_same_with_either_backend(gradient: str) -> None:
    from dprec_torch.models.pnbm_topk import PNBMTopK

    train = tiny_fold(7).train
    out = {}
    for backend in ("torch", "numba"):
        model = PNBMTopK(train.n_items, sparse_k=15, support="random", gradient=gradient, pair_backend=backend,
                         block_budget=2000).attach(train)
        model.S_values.data = model.S_values.data.double()
        model.S_values.data[::3, ::4] = 0.0  # sign(0) = 0 on the |s| channel
        model.item_means.data = model.item_means.data.double()
        batch = full_batch(train, model.item_means)
        pred = model.batch_predict(batch)
        model.surrogate_loss(batch, (pred - batch.values).detach()).backward()
        test = tiny_fold(7).test
        out[backend] = (pred.detach(), model.S_values.grad.clone(), model.predict(test.users, test.items))
    for a, b in zip(out["torch"], out["numba"]):
        torch.testing.assert_close(b, a, atol=1e-10, rtol=1e-10)


def test_int32_item_ids_same_as_uint16() -> None:
    """Catalogues of 65,536+ items keep int32 ids in the layout; the kernels take either."""
    import numpy as np

    hist, t_rows, t_items, S = random_case(8)
    plan = build_plan(hist, t_rows, t_items, backend="numba")
    lay = plan.numba_layout()
    assert lay.h_items.dtype == np.uint16
    small = pair_numba.sums(lay, S, need_lin=True)
    g = torch.randn(t_rows.numel(), dtype=S.dtype)
    small_grad = pair_numba.grad(lay, S, g, g, g)
    lay.h_items = lay.h_items.astype(np.int32)
    for a, b in zip(small, pair_numba.sums(lay, S, need_lin=True)):
        assert torch.equal(a, b)
    assert torch.equal(small_grad, pair_numba.grad(lay, S, g, g, g))


def test_symmetrize_bit_identical_to_torch_tiles() -> None:
    g = torch.Generator().manual_seed(9)
    for m in (1, 5, 64, 130):
        S = torch.randn(m, m, generator=g)
        ref = PNBM(m, pair_backend="torch")
        fast = PNBM(m, pair_backend="numba")
        ref.S.data.copy_(S)
        fast.S.data.copy_(S)
        ref.project_()
        fast.project_()
        assert torch.equal(ref.S.data, fast.S.data)
        assert torch.equal(fast.S.data, fast.S.data.T) and (fast.S.data.diagonal() == 0).all()


def test_symmetrize_tiling_changes_no_bit() -> None:
    """A GPU projects S in one tile (``GPU_WHOLE_SYMMETRIZE``), the torch path elsewhere in 512-wide tiles: each entry
    is (s_ij + s_ji) / 2 either way, so every tiling gives the same bits (a partial last tile included)."""
    g = torch.Generator().manual_seed(11)
    S = torch.randn(1100, 1100, generator=g)
    out = []
    for block in (512, 1100, 257):
        m = PNBM(1100, pair_backend="torch")
        m.S.data.copy_(S)
        m.project_(block=block, compiled=False)
        out.append(m.S.data.clone())
    assert torch.equal(out[0], out[1]) and torch.equal(out[0], out[2])
    assert torch.equal(out[0], out[0].T) and (out[0].diagonal() == 0).all()


@pytest.mark.parametrize("weights", [False, True])
def test_kernels_keep_their_sequential_float_order(weights: bool) -> None:
    """Bit for bit: each target's sums are float32 products added in history order into float64,
    and the gradient is accumulated in float32 in (item, row) target order, then combined in
    float64. Faster kernels (interleaved targets, row buffers) must not change published numbers."""
    import numpy as np

    hist, t_rows, t_items, S = random_case(11, weights=weights, dtype=torch.float32)
    key = torch.unique(t_rows * S.shape[0] + t_items)  # distinct targets: their order is then fixed
    t_rows, t_items = key // S.shape[0], key % S.shape[0]
    fast = build_plan(hist, t_rows, t_items, backend="numba")
    num, ab, lin = fast.sums(S, need_lin=True)
    ptr, its, xs = hist.csr_ptr.tolist(), hist.csr_items.tolist(), hist.csr_x.numpy()
    ws = None if hist.csr_w is None else hist.csr_w.numpy()
    s = S.numpy()
    for k, (r, i) in enumerate(zip(t_rows.tolist(), t_items.tolist())):
        a = b = c = 0.0  # Python floats: float64 sums of float32 products
        for p in range(ptr[r], ptr[r + 1]):
            v = s[i, its[p]]
            w = np.float32(1) if ws is None else ws[p]
            a += float(v * xs[p])
            b += float(abs(v) * w) if ws is not None else float(abs(v))
            c += float(v * w) if ws is not None else float(v)
        assert (num[k].item(), ab[k].item(), lin[k].item()) == (float(np.float32(a)), float(np.float32(b)), float(np.float32(c)))
    g = torch.Generator().manual_seed(12)
    g_num, g_abs = (torch.randn(t_rows.numel(), generator=g) for _ in range(2))
    got = fast.grad(S, g_num, g_abs, None).numpy()
    acc = np.zeros((S.shape[0], S.shape[0], 2), dtype=np.float32)
    gn, ga = g_num.numpy(), g_abs.numpy()
    for k in sorted(range(t_rows.numel()), key=lambda k: (int(t_items[k]), int(t_rows[k]))):
        r, i = int(t_rows[k]), int(t_items[k])
        for p in range(ptr[r], ptr[r + 1]):
            acc[i, its[p], 0] += gn[k] * xs[p]
            acc[i, its[p], 1] += ga[k] * (np.float32(1) if ws is None else ws[p])
    want = (acc[..., 0].astype(np.float64) + (acc[..., 1] * np.sign(s)).astype(np.float64)).astype(np.float32)
    assert np.array_equal(got, want)
