"""Fused CPU kernels (numba) for the sparse-pair sums of Eq. (2) and their gradient.

Same maths as :mod:`dprec_torch.models.pair_kernels` (see its docstring): for every target (u, i) and history item
j in R_u,

    num_ui = sum_j s_ij x_uj,   abs_ui = sum_j |s_ij| w_uj,   lin_ui = sum_j s_ij w_uj

and the backward scatter dL/ds_ij += g_num_ui x_uj + g_abs_ui sign(s_ij) w_uj + g_lin_ui w_uj, with sign(0) = 0
written out (``_gradient_entry``). The floor max(C, abs) is not applied here: ``g_abs`` arrives already masked by the
caller's one [D >= C] mask (:mod:`dprec_torch.models.pnbm`).

Why a compiled kernel: the torch chunk path makes about eight passes over padded (target x history) temporaries per
chunk; here every pair is one read of S, one of x (and w) and two or three multiply-adds, with no temporaries. Targets
are processed sorted by (item, user), so the reads of row i of S and the writes to row i of the gradient stay in
cache. Work is split into ``pieces`` of about equal pair counts whose boundaries fall between items, so two threads
never write the same row of the gradient (no atomics, deterministic sums).

Used only for CPU tensors when numba imports (``available()``); every other case runs the torch path, which computes
the same numbers (``tests/models/test_pair_numba.py``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np
import torch

log = logging.getLogger(__name__)

try:  # numba is a dependency, but the torch path must keep working where it cannot load
    import numba
    from numba import njit, prange
except Exception as exc:  # pragma: no cover - exercised only without numba
    numba = None
    _IMPORT_ERROR: Exception | None = exc
else:
    _IMPORT_ERROR = None

if numba is not None and "NUMBA_THREADING_LAYER" not in os.environ and numba.config.THREADING_LAYER == "default":
    # numba's default OpenMP layer leaves its threads spin-waiting after each kernel, stealing the cores from torch's
    # next ops on a small CPU (the Laplace noise after a backward took 6-45x more CPU time); workqueue's threads sleep.
    # A layer chosen before this module loads (lowrank_numba.prefer_openmp) stands.
    numba.config.THREADING_LAYER = "workqueue"

PIECES_PER_THREAD = 8


def available() -> bool:
    """True when the numba kernels can run (numba imported and not disabled by DPREC_PAIR_KERNEL=torch)."""
    return numba is not None and os.environ.get("DPREC_PAIR_KERNEL", "auto") != "torch"


def use_numba(backend: str, S: torch.Tensor) -> bool:
    """Whether ``backend`` (auto | torch | numba) runs the numba kernels for this S."""
    if backend == "torch" or S.device.type != "cpu":
        return False
    if backend == "numba" and numba is None:
        raise RuntimeError(f"pair backend 'numba' requested but numba does not import: {_IMPORT_ERROR}")
    return available() or backend == "numba"


@dataclass
class NumbaLayout:
    """Targets sorted by (item, row) over a CSR copy of the histories, cut into balanced pieces."""

    ptr: np.ndarray  # int64 [n_rows + 1]
    h_items: np.ndarray  # uint16 (M < 65536) or int32 [nnz]
    h_x: np.ndarray  # [nnz]
    h_w: np.ndarray | None  # [nnz]; None when the weights are the indicator
    t_item: np.ndarray  # int32 [T] processing order
    t_row: np.ndarray  # int64 [T]
    t_index: np.ndarray  # int64 [T]: position in target order
    piece: np.ndarray  # int64 [n_pieces + 1] boundaries in processing order (between items)
    n_targets: int
    n_items: int


def build_layout(ptr: torch.Tensor, h_items: torch.Tensor, h_x: torch.Tensor, h_w: torch.Tensor | None,
                 rows: torch.Tensor, items: torch.Tensor, n_items: int) -> NumbaLayout:
    """Layout for targets (rows[t], items[t]) over CSR histories (``ptr``, ``h_items``, ``h_x``, ``h_w``)."""
    length = (ptr[1:] - ptr[:-1])[rows]
    keep = torch.nonzero(length > 0).flatten()
    key = items[keep].long() * (ptr.numel() + 1) + rows[keep].long()
    order = keep[torch.argsort(key)]
    t_item, t_row = items[order], rows[order]
    work = (ptr[1:] - ptr[:-1])[t_row].double()
    n_threads = torch.get_num_threads()
    n_pieces = max(1, min(int(order.numel()), n_threads * PIECES_PER_THREAD))
    bounds = [0]
    if order.numel():
        cum = torch.cumsum(work, 0)
        # first target of each item, so a cut never splits an item's targets
        starts = torch.nonzero(torch.cat([torch.ones(1, dtype=torch.bool), t_item[1:] != t_item[:-1]])).flatten()
        goal = cum[-1] * torch.arange(1, n_pieces, dtype=torch.float64) / n_pieces
        before = torch.cat([torch.zeros(1, dtype=torch.float64), cum])[starts]  # work before each item start
        cut = starts[torch.searchsorted(before, goal).clamp_max(starts.numel() - 1)]
        bounds += sorted(set(cut.tolist()) - {0})
    bounds.append(int(order.numel()))
    # item ids as uint16 where they fit: the history stream is re-read once per target (~1.4x faster forward on ML-1M)
    hi = h_items.to(torch.int32).numpy()
    hi = hi.astype(np.uint16) if n_items < 2**16 else hi
    return NumbaLayout(ptr.long().numpy(), hi, h_x.numpy(), None if h_w is None else h_w.to(h_x.dtype).numpy(),
                       t_item.to(torch.int32).numpy(), t_row.long().numpy(), order.long().numpy(),
                       np.asarray(sorted(set(bounds)), dtype=np.int64), int(rows.numel()), int(n_items))


def sums(layout: NumbaLayout, S: torch.Tensor, need_lin: bool
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(num, abs, lin) at every target (target order); lin is None unless ``need_lin``."""
    s = S.detach().contiguous().numpy()
    n = layout.n_targets
    num = np.zeros(n, dtype=s.dtype)
    ab = np.zeros(n, dtype=s.dtype)
    lin = np.zeros(n, dtype=s.dtype) if need_lin else None
    _sums_kernel(s, *_layout_args(layout, s.dtype), num, ab, lin)
    return torch.from_numpy(num), torch.from_numpy(ab), None if lin is None else torch.from_numpy(lin)


def grad(layout: NumbaLayout, S: torch.Tensor, g_num: torch.Tensor | None, g_abs: torch.Tensor | None,
         g_lin: torch.Tensor | None) -> torch.Tensor:
    """dL/dS (dense M x M) from the per-target upstream gradients (target order; None = zero).

    Each thread owns whole items (the pieces are cut between items). While its targets are at item i it scatters their
    pairs into an M x C row buffer (C = the present channels, interleaved so a pair's writes share a cache line); when
    the targets move on it writes row i of dL/dS = acc_num + sign(s_i) acc_abs + acc_lin and clears the buffer. Rows of
    items without targets stay zero.
    """
    gs = _channels(S.dtype, g_num, g_abs, g_lin)
    n_chan = sum(g is not None for g in gs)
    if n_chan == 0:
        return torch.zeros_like(S)
    s = S.detach().contiguous().numpy()
    out = np.zeros_like(s)  # calloc: rows the kernel never writes cost no page faults
    _grad_kernel(s, out, *_layout_args(layout, s.dtype), gs[0], gs[1], gs[2], n_chan)
    return torch.from_numpy(out)


def fused_step(layout: NumbaLayout, S: torch.Tensor, floor_c: float, item_means: torch.Tensor, items: torch.Tensor,
               target: torch.Tensor, bound: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One training step's forward and backward of PNBM's exact gradient in one pass over the pairs.

    Per item block (the targets at item i, in the layout's order) and per target k = (u, i): the sums num_k, abs_k
    (:func:`sums`' float operations), d_k = abs_k if abs_k >= C else C (the [D >= C] rule of
    :mod:`dprec_torch.models.pnbm`), pred_k = r_bar_i + num_k / d_k, e_k = pred_k - target_k, the clamp
    e'_k = min(max(e_k, -bound), bound) (``bound`` = inf: none), and the coefficients autograd gives
    ``sum(e' * (num / d))``: g_num = e' / d, g_abs = -e' ((num / d) / d) where [D >= C], else 0; then target k's pairs
    are scattered into the row buffer while u's history is still in cache, and row i of dL/dS is written as
    :func:`grad` writes it. Every value is computed with the float operations, in the order and precision, of
    ``batch_predict`` -> ``pred - target`` -> ``clamp`` -> ``surrogate_loss(...).backward()`` (pred in the promoted
    dtype of the item means and S, residuals in that of pred and target), so the results are bit-identical to that
    path's (``tests/models/test_fused_step.py``).

    Returns (pred, residuals, clipped residuals, dL/dS), the first three in target order. Targets with an empty
    history (no pairs) get num = abs = 0, as in :func:`sums`.
    """
    s = S.detach().contiguous().numpy()
    n = layout.n_targets
    st = S.dtype
    pred_dtype = torch.promote_types(item_means.dtype, st)
    res_dtype = torch.promote_types(pred_dtype, target.dtype)
    np_pred = torch.empty(0, dtype=pred_dtype).numpy().dtype
    np_res = torch.empty(0, dtype=res_dtype).numpy().dtype
    num, ab = np.zeros(n, dtype=s.dtype), np.zeros(n, dtype=s.dtype)
    pred, res, clipped = np.empty(n, dtype=np_pred), np.empty(n, dtype=np_res), np.empty(n, dtype=np_res)
    g_num, g_abs = np.empty(n, dtype=s.dtype), np.empty(n, dtype=s.dtype)
    out = np.zeros_like(s)
    im = item_means.detach().contiguous().numpy()
    tg = target.detach().contiguous().numpy()
    consts = np.array([floor_c], dtype=s.dtype)  # C in S's precision (torch.full_like(raw, C); raw >= C)
    limits = np.array([-bound, bound], dtype=np_res)  # the clamp's Python-float bounds in the residuals' precision
    _fused_kernel(s, out, *_layout_args(layout, s.dtype), im, tg, consts, limits, num, ab, pred, res, clipped, g_num, g_abs)
    if layout.t_index.shape[0] < n:  # targets without a history: num = abs = 0, the same formulas in torch
        seen = np.zeros(n, dtype=np.bool_)
        seen[layout.t_index] = True
        k = torch.from_numpy(np.flatnonzero(~seen))
        den = torch.full((k.numel(),), floor_c, dtype=st)
        p = item_means.detach()[items[k]] + torch.zeros(k.numel(), dtype=st) / den
        e = p - target.detach()[k]
        torch.from_numpy(pred)[k] = p
        torch.from_numpy(res)[k] = e
        torch.from_numpy(clipped)[k] = e.clamp(-bound, bound)
    return torch.from_numpy(pred), torch.from_numpy(res), torch.from_numpy(clipped), torch.from_numpy(out)


def _channels(dtype: torch.dtype, *gs: torch.Tensor | None) -> list[np.ndarray | None]:
    """The upstream gradients as arrays of ``dtype``; absent ones stay None (compiled out of the kernels)."""
    return [None if g is None else g.detach().to(dtype).contiguous().numpy() for g in gs]


def _layout_args(lo: NumbaLayout, dtype: np.dtype) -> tuple:
    """The layout's arrays as the kernels take them: (ptr, h_items, h_x, h_w, t_item, t_row, t_index, piece), x and the
    weights in ``dtype``; h_w None for the indicator (w = 1, compiled out)."""
    h_w = None if lo.h_w is None else lo.h_w.astype(dtype, copy=False)
    return lo.ptr, lo.h_items, lo.h_x.astype(dtype, copy=False), h_w, lo.t_item, lo.t_row, lo.t_index, lo.piece


def topk_sums(layout: NumbaLayout, values: torch.Tensor, neighbors: torch.Tensor, need_lin: bool
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(num, abs, lin) for a top-k S (s_{i, n_is} = values[i, s], 0 off the support), target order: each thread
    rebuilds the dense row i of S in an M-vector when its targets move to item i, then runs the dense kernel's loop."""
    v = values.detach().contiguous().numpy()
    nb = neighbors.to(torch.int32).contiguous().numpy()
    n = layout.n_targets
    num, ab = np.zeros(n, dtype=v.dtype), np.zeros(n, dtype=v.dtype)
    lin = np.zeros(n, dtype=v.dtype) if need_lin else None
    _topk_sums_kernel(v, nb, *_layout_args(layout, v.dtype), num, ab, lin, int(layout.n_items))
    return torch.from_numpy(num), torch.from_numpy(ab), None if lin is None else torch.from_numpy(lin)


def topk_grad(layout: NumbaLayout, values: torch.Tensor, neighbors: torch.Tensor, g_num: torch.Tensor | None,
              g_abs: torch.Tensor | None, g_lin: torch.Tensor | None) -> torch.Tensor:
    """dL/dvalues (M x k) for a top-k S: the dense gradient's row i, accumulated in an M x C buffer per thread while its
    targets are at item i, read at the k support entries (sign(v_is) on the |s| channel)."""
    v = values.detach().contiguous().numpy()
    out = np.zeros_like(v)
    gs = _channels(values.dtype, g_num, g_abs, g_lin)
    n_chan = sum(g is not None for g in gs)
    if n_chan:
        _topk_grad_kernel(v, neighbors.to(torch.int32).contiguous().numpy(), out, *_layout_args(layout, v.dtype),
                          gs[0], gs[1], gs[2], n_chan, int(layout.n_items))
    return torch.from_numpy(out)


def symmetrize_(S: torch.Tensor, block: int = 64) -> None:
    """S <- (S + S^T) / 2 with a zero diagonal, in place (CPU), over block x block tile pairs in parallel: the same
    float operations as the torch tiles of ``PNBM.project_`` (bit-identical)."""
    set_threads(torch.get_num_threads())
    _symmetrize_kernel(S.detach().numpy(), int(block))


def user_l1_norms(rows: torch.Tensor, items: torch.Tensor, crow: torch.Tensor, cols: torch.Tensor, xv: torch.Tensor,
                  e: torch.Tensor, den: torch.Tensor, a: torch.Tensor, S: torch.Tensor, n_rows: int,
                  include_diagonal: bool) -> torch.Tensor:
    """||G_u||_1 per batch row: sum over u's targets t = (u, i) and history items j of |e_t (x_uj / d_t - a_t sign(s_ij))|
    (the pairs of :func:`dprec_torch.privacy.pnbm_clipping.iter_pairs`).

    Parallel over rows; within a row the terms are added in the torch path's order (targets ascending, then history
    position), with the same float64 operations (a_t sign(s_ij) is exact, so no fused multiply-add can round
    differently): the same bits as the chunked torch enumeration, which stays the path on a GPU.
    """
    set_threads(torch.get_num_threads())
    order = torch.argsort(rows, stable=True)
    row_ptr = torch.zeros(n_rows + 1, dtype=torch.int64)
    row_ptr[1:] = torch.cumsum(torch.bincount(rows, minlength=n_rows), 0)
    acc = np.zeros(n_rows, dtype=np.float64)
    _user_l1_kernel(row_ptr.numpy(), order.numpy(), items.numpy(), crow.numpy(), cols.numpy(), xv.numpy(), e.numpy(),
                    den.numpy(), a.numpy(), S.detach().contiguous().numpy(), bool(include_diagonal), acc)
    return torch.from_numpy(acc)


def set_threads(n: int) -> None:
    """Use ``n`` numba threads (capped at numba's maximum); called to follow torch.set_num_threads."""
    if numba is not None:
        numba.set_num_threads(max(1, min(int(n), numba.config.NUMBA_NUM_THREADS)))


if numba is not None:

    @njit(inline="always", cache=True, nogil=True)
    def _add_pair(row, p, h_items, h_x, h_w, lin, a, b, c):  # pragma: no cover - compiled
        """Pair (target, history entry p) added to the target's (num, abs, lin) running sums."""
        v = row[h_items[p]]
        a += v * h_x[p]
        if h_w is None:  # indicator weights (compiled out): w = 1
            b += abs(v)
            if lin is not None:
                c += v
        else:
            b += abs(v) * h_w[p]
            if lin is not None:
                c += v * h_w[p]
        return a, b, c

    @njit(inline="always", cache=True, nogil=True)
    def _item_sums(row, t, end, ptr, h_items, h_x, h_w, t_item, t_row, t_index, num, ab, lin):  # pragma: no cover - compiled
        """(num, abs, lin) of the targets t, t+1, ... (< end) at item t_item[t], whose row of S is ``row``; returns the
        first target past them. ``lin`` None: not computed.

        Two targets are summed side by side: each sum is still one sequential chain (the same float operations in the
        same order), but two chains hide the add latency (~1.2x). Unsigned indices: no negative-index wraparound code.
        """
        i = t_item[t]
        while t < end and t_item[t] == i:
            r0 = t_row[t]
            p0, e0 = np.uint64(ptr[r0]), np.uint64(ptr[r0 + 1])
            a0 = b0 = c0 = 0.0
            two = t + 1 < end and t_item[t + 1] == i
            if two:
                r1 = t_row[t + 1]
                p1, e1 = np.uint64(ptr[r1]), np.uint64(ptr[r1 + 1])
                a1 = b1 = c1 = 0.0
                for _ in range(min(e0 - p0, e1 - p1)):
                    a0, b0, c0 = _add_pair(row, p0, h_items, h_x, h_w, lin, a0, b0, c0)
                    a1, b1, c1 = _add_pair(row, p1, h_items, h_x, h_w, lin, a1, b1, c1)
                    p0 += np.uint64(1)
                    p1 += np.uint64(1)
                for p in range(p1, e1):
                    a1, b1, c1 = _add_pair(row, p, h_items, h_x, h_w, lin, a1, b1, c1)
                k = t_index[t + 1]
                num[k] = a1
                ab[k] = b1
                if lin is not None:
                    lin[k] = c1
            for p in range(p0, e0):
                a0, b0, c0 = _add_pair(row, p, h_items, h_x, h_w, lin, a0, b0, c0)
            k = t_index[t]
            num[k] = a0
            ab[k] = b0
            if lin is not None:
                lin[k] = c0
            t += 2 if two else 1
        return t

    @njit(parallel=True, cache=True, nogil=True)
    def _sums_kernel(s, ptr, h_items, h_x, h_w, t_item, t_row, t_index, piece, num, ab, lin):  # pragma: no cover - compiled
        for q in prange(piece.shape[0] - 1):
            t = piece[q]
            while t < piece[q + 1]:
                t = _item_sums(s[t_item[t]], t, piece[q + 1], ptr, h_items, h_x, h_w, t_item, t_row, t_index, num, ab, lin)

    @njit(inline="always", cache=True, nogil=True)
    def _scatter_target(acc, k, lo, hi, h_items, h_x, h_w, g_num, g_abs, g_lin):  # pragma: no cover - compiled
        """Target k's pairs into the row buffer: acc[j, num] += g_num_k x_uj, acc[j, abs] += g_abs_k w_uj,
        acc[j, lin] += g_lin_k w_uj over history entries lo..hi-1. Absent channels and indicator weights are passed as
        None, so numba compiles them out (a runtime flag per channel cost ~1.5x)."""
        c_abs = 0 if g_num is None else 1
        c_lin = c_abs if g_abs is None else c_abs + 1
        zero = acc.dtype.type(0)  # keeps cn, ca, cl in acc's precision (float32 products, as the torch path)
        cn = zero if g_num is None else g_num[k]
        ca = zero if g_abs is None else g_abs[k]
        cl = zero if g_lin is None else g_lin[k]
        for p in range(np.uint64(lo), np.uint64(hi)):  # unsigned: no negative-index wraparound code per access
            j = h_items[p]
            if g_num is not None:
                acc[j, 0] += cn * h_x[p]
            if h_w is None:  # indicator weights: w = 1 exactly
                if g_abs is not None:
                    acc[j, c_abs] += ca
                if g_lin is not None:
                    acc[j, c_lin] += cl
            else:
                if g_abs is not None:
                    acc[j, c_abs] += ca * h_w[p]
                if g_lin is not None:
                    acc[j, c_lin] += cl * h_w[p]

    @njit(inline="always", cache=True, nogil=True)
    def _scatter_item(acc, t, end, ptr, h_items, h_x, h_w, t_item, t_row, t_index, g_num, g_abs, g_lin
                      ):  # pragma: no cover - compiled
        """The targets t, t+1, ... (< end) at item t_item[t] into the row buffer; returns the first target past them."""
        i = t_item[t]
        while t < end and t_item[t] == i:
            r = t_row[t]
            _scatter_target(acc, t_index[t], ptr[r], ptr[r + 1], h_items, h_x, h_w, g_num, g_abs, g_lin)
            t += 1
        return t

    @njit(inline="always", cache=True, nogil=True)
    def _gradient_entry(acc, j, sv, g_num, g_abs, g_lin):  # pragma: no cover - compiled
        """acc_num + sign(s_ij) acc_abs + acc_lin at column j of the row buffer."""
        c_abs = 0 if g_num is None else 1
        c_lin = c_abs if g_abs is None else c_abs + 1
        v = 0.0
        if g_num is not None:
            v += acc[j, 0]
        if g_abs is not None:
            v += acc[j, c_abs] * (np.float32(sv > 0) - np.float32(sv < 0))
        if g_lin is not None:
            v += acc[j, c_lin]
        return v

    @njit(parallel=True, cache=True, nogil=True)
    def _grad_kernel(s, out, ptr, h_items, h_x, h_w, t_item, t_row, t_index, piece, g_num, g_abs, g_lin, n_chan
                     ):  # pragma: no cover - compiled
        # Row i of the gradient is accumulated in `acc` (M x n_chan) while the targets are at item i; sign(s_ij) is
        # applied once per entry at the flush, not per pair (reading S per pair doubled the time).
        m = s.shape[0]
        for q in prange(piece.shape[0] - 1):
            acc = np.zeros((m, n_chan), dtype=out.dtype)
            t = piece[q]
            end = piece[q + 1]
            while t < end:
                i = t_item[t]
                t = _scatter_item(acc, t, end, ptr, h_items, h_x, h_w, t_item, t_row, t_index, g_num, g_abs, g_lin)
                for j in range(m):  # flush row i and clear the buffer
                    out[i, j] = _gradient_entry(acc, j, s[i, j], g_num, g_abs, g_lin)
                    for c in range(n_chan):
                        acc[j, c] = 0

    @njit(inline="always", cache=True, nogil=True)
    def _fused_coefficients(k, i, im, tg, consts, limits, num, ab, pred, res, clipped, g_num, g_abs
                            ):  # pragma: no cover - compiled
        """Target k at item i: pred, residual, clamp and (g_num, g_abs), each in the dtype torch computes it in."""
        st, pt, rt = num.dtype.type, pred.dtype.type, res.dtype.type
        c = consts[0]
        a = ab[k]
        active = a >= c
        d = a if active else c
        q = num[k] / d
        p = pt(im[i]) + pt(q)
        pred[k] = p
        e = rt(p) - rt(tg[k])
        res[k] = e
        if e < limits[0]:
            e = limits[0]
        if e > limits[1]:
            e = limits[1]
        clipped[k] = e
        ce = st(e)  # autograd: d(e' * q)/dq = 1 * e', cast to q's dtype
        g_num[k] = ce / d  # DivBackward: grad / other
        g_abs[k] = (-ce) * (q / d) if active else st(0)  # -grad * ((self / other) / other), masked by [D >= C]

    @njit(parallel=True, cache=True, nogil=True)
    def _fused_kernel(s, out, ptr, h_items, h_x, h_w, t_item, t_row, t_index, piece, im, tg, consts, limits,
                      num, ab, pred, res, clipped, g_num, g_abs):  # pragma: no cover - compiled
        # Per item block: each target's (or pair of targets') sums, then at once its coefficients and its
        # scatter into the row buffer (the user's history was just read), then row i is flushed as in _grad_kernel.
        m = s.shape[0]
        for q in prange(piece.shape[0] - 1):
            acc = np.zeros((m, 2), dtype=out.dtype)
            t = piece[q]
            end = piece[q + 1]
            while t < end:
                i = t_item[t]
                row = s[i]
                while t < end and t_item[t] == i:
                    two = t + 1 < end and t_item[t + 1] == i
                    stop = t + 2 if two else t + 1
                    _item_sums(row, t, stop, ptr, h_items, h_x, h_w, t_item, t_row, t_index, num, ab, None)
                    for tt in range(t, stop):
                        k = t_index[tt]
                        _fused_coefficients(k, i, im, tg, consts, limits, num, ab, pred, res, clipped, g_num, g_abs)
                        r = t_row[tt]
                        _scatter_target(acc, k, ptr[r], ptr[r + 1], h_items, h_x, h_w, g_num, g_abs, None)
                    t = stop
                for j in range(m):  # flush row i and clear the buffer
                    out[i, j] = _gradient_entry(acc, j, s[i, j], g_num, g_abs, None)
                    acc[j, 0] = 0
                    acc[j, 1] = 0

    @njit(parallel=True, cache=True, nogil=True)
    def _topk_sums_kernel(vals, nbrs, ptr, h_items, h_x, h_w, t_item, t_row, t_index, piece,
                          num, ab, lin, m):  # pragma: no cover - compiled
        k = nbrs.shape[1]
        for q in prange(piece.shape[0] - 1):
            row = np.zeros(m, dtype=vals.dtype)  # dense row i of S, zero off the support
            t = piece[q]
            while t < piece[q + 1]:
                i = t_item[t]
                for c in range(k):
                    row[nbrs[i, c]] = vals[i, c]
                t = _item_sums(row, t, piece[q + 1], ptr, h_items, h_x, h_w, t_item, t_row, t_index, num, ab, lin)
                for c in range(k):
                    row[nbrs[i, c]] = 0

    @njit(parallel=True, cache=True, nogil=True)
    def _topk_grad_kernel(vals, nbrs, out, ptr, h_items, h_x, h_w, t_item, t_row, t_index, piece,
                          g_num, g_abs, g_lin, n_chan, m):  # pragma: no cover - compiled
        # Row i of the dense gradient is accumulated in `acc` while the targets are at item i, then out[i, c] =
        # acc_num + sign(v_ic) acc_abs + acc_lin at column nbrs[i, c].
        k = nbrs.shape[1]
        for q in prange(piece.shape[0] - 1):
            acc = np.zeros((m, n_chan), dtype=vals.dtype)  # row i, channels interleaved (one cache line per j)
            t = piece[q]
            end = piece[q + 1]
            while t < end:
                i = t_item[t]
                t = _scatter_item(acc, t, end, ptr, h_items, h_x, h_w, t_item, t_row, t_index, g_num, g_abs, g_lin)
                for c in range(k):  # flush row i at its support, then clear the buffer
                    out[i, c] = _gradient_entry(acc, nbrs[i, c], vals[i, c], g_num, g_abs, g_lin)
                acc[:] = 0

    @njit(parallel=True, cache=True, nogil=True)
    def _user_l1_kernel(row_ptr, order, items, crow, cols, xv, e, den, a, s, include_diagonal, acc):  # pragma: no cover
        for r in prange(row_ptr.shape[0] - 1):
            total = 0.0
            for k in range(row_ptr[r], row_ptr[r + 1]):
                t = order[k]
                i = items[t]
                et, dt, at = e[t], den[t], a[t]
                for pos in range(crow[r], crow[r + 1]):
                    j = cols[pos]
                    sij = s[i, j]
                    sg = 1.0 if sij > 0 else (-1.0 if sij < 0 else 0.0)
                    val = et * (xv[pos] / dt - at * sg)
                    if include_diagonal or i != j:
                        total += abs(val)
            acc[r] = total

    @njit(parallel=True, cache=True, nogil=True)
    def _symmetrize_kernel(s, block):  # pragma: no cover - compiled
        # tile (bi, bj >= bi) owns the pairs (i in bi, j in bj, i < j): no two threads touch one entry
        m = s.shape[0]
        nb = (m + block - 1) // block
        for bi in prange(nb):
            for bj in range(bi, nb):
                for i in range(bi * block, min(m, (bi + 1) * block)):
                    j0 = max(bj * block, i + 1)
                    for j in range(j0, min(m, (bj + 1) * block)):
                        a = (s[i, j] + s[j, i]) * 0.5
                        s[i, j] = a
                        s[j, i] = a
                    if bj == bi:
                        s[i, i] = 0
