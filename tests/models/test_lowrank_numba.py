"""The low-rank PNBM's fused CPU kernels (``models.lowrank_numba``) give the torch path's numbers bit for bit.

Each kernel against the torch expression it replaces (forward sums, per-user gradient rows with their L2 and L1 norms,
the clipped scatter, the feature dots), over ranks and feature counts on both sides of the sum kernel's vector width
and with zeros and cancellations in the data; then whole training runs with ``DPREC_LOWRANK_KERNEL=torch`` (the torch
path) and the kernels: the same U and predictions to the last bit. The row-sum check itself must be able to fail: a
wrong lane width is caught.
"""

from __future__ import annotations

import pytest
import torch

import dprec_torch
from dprec_torch.models import lowrank_numba as K
from dprec_torch.models import pnbm_lowrank as L

pytestmark = pytest.mark.skipif(not K.available(), reason="numba does not import")


def batch(seed: int, n_users: int = 40, n_items: int = 30, d: int = 8):
    """Grouped rows (user-level batch layout), items, float32 y, float64 e, U, with zeros in y and in U."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.randint(1, 25, (n_users,), generator=gen)
    counts[3] = 1
    rows = torch.repeat_interleave(torch.arange(n_users), counts)
    items = torch.randint(0, n_items, (rows.numel(),), generator=gen)
    y = (torch.randn(rows.numel(), generator=gen) * 10 ** (2 * torch.rand(rows.numel(), generator=gen) - 1)).float()
    y[::5] = 0.0
    e = torch.randn(rows.numel(), generator=gen, dtype=torch.float64)
    U = torch.randn(n_items, d, generator=gen, dtype=torch.float64) * 10 ** (2 * torch.rand(n_items, 1, generator=gen) - 1)
    U[2] = 0.0
    return rows, items, y, e, U, n_users


@pytest.mark.parametrize("d", [1, 3, 4, 5, 8, 9, 17, 33])  # d < 4, d = W, tails, two vectors, the cascade
@pytest.mark.parametrize("seed", [0, 1])
def test_forward_and_gradient_kernels_are_the_torch_path_bit_for_bit(d, seed, monkeypatch):
    monkeypatch.setenv("DPREC_LOWRANK_KERNEL", "numba")  # the kernels on this small batch too
    rows, items, y, e, U, n = batch(seed, d=d)
    assert K.exact(torch.float64, d)
    seg = L.user_segments(rows, n)
    assert seg is not None and L.kernels_for(seg, U)
    w = torch.bincount(rows, minlength=n).float().clamp_min(1.0).rsqrt()
    # forward: p_sum and f as LowRankPNBM._f's torch expressions
    ui = U.index_select(0, items)
    p_sum = torch.zeros(n, d, dtype=U.dtype).index_add_(0, rows, ui * y[:, None])
    f = (ui * (p_sum * w[:, None]).index_select(0, rows)).sum(1) - (U * U).sum(1).index_select(0, items) * y * w[rows]
    kp, kf = K.forward_sums(U.numpy(), items.numpy(), seg.numpy(), y.numpy(), w.numpy(), (U * U).sum(1).numpy(),
                            K.rank_tag(d), K.lane_tag(torch.float64), K.user_chunks(seg))
    assert torch.equal(torch.from_numpy(kp), p_sum) and torch.equal(torch.from_numpy(kf), f)
    # gradient rows and norms: the kernel branch of per_user_gradients against its torch branch, on 1, 2 and 3 threads
    # (the kernels split the users into runs, one per thread: the numbers must not depend on the split)
    threads = torch.get_num_threads()
    try:
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            assert K.user_chunks(seg).size == min(t, K.numba.config.NUMBA_NUM_THREADS) + 1
            kp_t, kf_t = K.forward_sums(U.numpy(), items.numpy(), seg.numpy(), y.numpy(), w.numpy(), (U * U).sum(1).numpy(),
                                        K.rank_tag(d), K.lane_tag(torch.float64), K.user_chunks(seg))
            assert torch.equal(torch.from_numpy(kp_t), p_sum) and torch.equal(torch.from_numpy(kf_t), f), t
            for norm in (2, 1):
                ref_rows, ref_norms = L.per_user_gradients(rows, items, y.double(), U, n, e, (ui, p_sum), None, norm)
                got_rows, got_norms = L.per_user_gradients(rows, items, y, U, n, e, (None, p_sum), seg, norm)
                assert torch.equal(got_rows, ref_rows) and torch.equal(got_norms, ref_norms), (norm, t)
    finally:
        torch.set_num_threads(threads)
    # the clipped scatter (rows times their user's factor, summed per item in index order) from deferred rows,
    # recomputed as scattered, the items split over the threads by a skewed load: the norms and the clipped sum bit for
    # bit, on 1-3 threads, whatever the split of the item ids
    factor = torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    ref = torch.zeros(U.shape, dtype=torch.float64).index_add_(0, items, ref_rows * factor[rows][:, None])
    load = torch.bincount(items, minlength=U.shape[0]) ** 2
    l2_ref = L.per_user_gradients(rows, items, y.double(), U, n, e, (ui, p_sum), None, 2)[1]
    try:
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            for counts in (load, None):
                deferred, norms = L.per_user_gradients(rows, items, y, U, n, e, (None, p_sum), seg, 2, True, counts)
                assert isinstance(deferred, L.DeferredRows) and torch.equal(norms, l2_ref), t
                assert torch.equal(deferred.clipped_sum(factor), ref), t
                assert torch.equal(deferred.materialize(), ref_rows)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("n_f", [1, 5, 8, 19, 27, 40])
def test_feature_dots_are_torchs_float32_row_sums(n_f):
    gen = torch.Generator().manual_seed(n_f)
    wf = torch.randn(30, n_f, generator=gen) * 10 ** (3 * torch.rand(30, 1, generator=gen) - 1)
    phi = (torch.rand(50, n_f, generator=gen) < 0.3).float() - 0.5 * torch.rand(50, n_f, generator=gen)
    rows, items = torch.randint(0, 30, (2000,), generator=gen), torch.randint(0, 50, (2000,), generator=gen)
    ref = wf.index_select(0, rows).mul_(phi.index_select(0, items)).sum(1)
    got = K.feature_dots(wf.numpy(), phi.numpy(), rows.numpy(), items.numpy(), K.width(torch.float32))
    assert got.dtype == wf.numpy().dtype and torch.equal(torch.from_numpy(got), ref)


def test_the_kernels_serve_big_batches_unless_told(monkeypatch):
    assert K.available(K.MIN_RATINGS) and not K.available(K.MIN_RATINGS - 1) and K.available()
    monkeypatch.setenv("DPREC_LOWRANK_KERNEL", "numba")
    assert K.available(10)
    monkeypatch.setenv("DPREC_LOWRANK_KERNEL", "torch")
    assert not K.available(K.MIN_RATINGS)


def test_the_row_sum_check_catches_a_wrong_lane_width(monkeypatch):
    """The guard that keeps the torch path where the order differs must be able to say no."""
    K.exact.cache_clear()
    try:
        monkeypatch.setattr(K, "width", lambda dtype: 2 * (32 // torch.empty((), dtype=dtype).element_size()))
        assert not K.exact(torch.float64, 8) and not K.exact(torch.float32, 27)
    finally:
        monkeypatch.undo()
        K.exact.cache_clear()
    assert K.exact(torch.float64, 8)


@pytest.mark.parametrize("mech", [["mechanism=gaussian", "epsilon=8", "mechanism.sampling_ratio=0.5"],
                                  ["mechanism=dpsgd", "epsilon=8", "mechanism.sampling_ratio=0.5"],
                                  ["mechanism=sgld", "epsilon=8"]])
def test_training_is_the_same_with_and_without_the_kernels(tmp_path, monkeypatch, mech):
    """Whole runs (public item features, the clip, the noise under one noise seed): the same U and test RMSE."""
    out = []
    for kernel in ("torch", "numba"):  # numba: the kernels on this small data too (auto leaves them to big batches)
        monkeypatch.setenv("DPREC_LOWRANK_KERNEL", kernel)
        run = dprec_torch.train(["data=synthetic", "model=pnbm_lowrank", *mech, "mechanism.epochs=3", "device=cpu",
                                 "noise_seed=5", "compare_baselines=false", "tensorboard=false",
                                 f"output_dir={tmp_path / kernel}"])
        out.append((run.model().U.detach().clone(), run.metrics["test_rmse"]))
    assert torch.equal(out[0][0], out[1][0]) and out[0][1] == out[1][1]


_LAYER_PROBE = """
import os, numba
from dprec_torch.models import lowrank_numba as K
K.prefer_openmp()
print(numba.config.THREADING_LAYER, os.environ.get("OMP_WAIT_POLICY"))
"""


@pytest.mark.parametrize("user_policy", [None, "ACTIVE"])
def test_the_low_rank_model_picks_openmp_and_leaves_the_environment_as_it_was(user_policy):
    """In a fresh process: the OpenMP layer where no parallel kernel ran yet, and the wait policy the load of numba's
    runtime read is gone from the environment afterwards (child processes see the user's), a user's own kept."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "NUMBA_THREADING_LAYER")}
    if user_policy:
        env["OMP_WAIT_POLICY"] = user_policy
    out = subprocess.run([sys.executable, "-c", _LAYER_PROBE], env=env, capture_output=True, text=True, check=True)
    layer, policy = out.stdout.split()
    try:
        from numba.np.ufunc import omppool  # noqa: F401
    except Exception:
        pytest.skip("numba has no OpenMP runtime here")
    assert layer == "omp"
    assert policy == (user_policy or "None")
