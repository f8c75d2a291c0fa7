"""Fused CPU kernels (numba) for the sparse-pair sums of Eq. (2) and their gradient.

Same maths as :mod:`dprec_torch.models.pair_kernels` (see its docstring): for every target
(u, i) and history item j in R_u,

    num_ui = sum_j s_ij x_uj,   abs_ui = sum_j |s_ij| w_uj,   lin_ui = sum_j s_ij w_uj

and the backward scatter dL/ds_ij += g_num_ui x_uj + g_abs_ui sign(s_ij) w_uj + g_lin_ui w_uj.

Why a compiled kernel: the torch chunk path makes about eight passes over padded
(target x history) temporaries per chunk; here every pair is one read of S, one of x (and w)
and two or three multiply-adds, with no temporaries. Targets are processed sorted by
(item, user), so the reads of row i of S and the writes to row i of the gradient stay in cache.
Work is split into ``pieces`` of about equal pair counts whose boundaries fall between items,
so two threads never write the same row of the gradient (no atomics, deterministic sums).

Used only for CPU tensors when numba imports (``available()``); every other case runs the
torch path, which computes the same numbers (``tests/test_pair_numba.py``).
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

if numba is not None and "NUMBA_THREADING_LAYER" not in os.environ:
    # numba's default OpenMP layer leaves its threads spin-waiting after each kernel; on a small
    # CPU they then steal the cores from torch's next ops (measured: the Laplace noise after a
    # backward took 6-45x more CPU time). The workqueue layer's threads sleep between kernels.
    numba.config.THREADING_LAYER = "workqueue"

BACKENDS = ("auto", "torch", "numba")
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
    h_w: np.ndarray  # [nnz] (ones when the weights are the indicator)
    has_w: bool
    t_item: np.ndarray  # int32 [T] processing order
    t_row: np.ndarray  # int64 [T]
    t_index: np.ndarray  # int64 [T]: position in target order
    piece: np.ndarray  # int64 [n_pieces + 1] boundaries in processing order (between items)
    n_targets: int
    n_items: int
    _acc: np.ndarray | None = None

    def accumulator(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A zero M x M x C buffer, kept between calls (the combine pass leaves it zeroed)."""
        if self._acc is None or self._acc.shape != shape or self._acc.dtype != dtype:
            self._acc = np.zeros(shape, dtype=dtype)
        return self._acc


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
    w = h_w if h_w is not None else torch.ones_like(h_x)
    # item ids as uint16 where they fit: the history stream is re-read once per target, and
    # 6 instead of 8 bytes per pair made the forward ~1.4x faster on the ML-1M-size data
    hi = h_items.to(torch.int32).numpy()
    hi = hi.astype(np.uint16) if n_items < 2**16 else hi
    return NumbaLayout(ptr.long().numpy(), hi, h_x.numpy(), w.to(h_x.dtype).numpy(),
                       h_w is not None, t_item.to(torch.int32).numpy(), t_row.long().numpy(), order.long().numpy(),
                       np.asarray(sorted(set(bounds)), dtype=np.int64), int(rows.numel()), int(n_items))


def sums(layout: NumbaLayout, S: torch.Tensor, need_lin: bool
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(num, abs, lin) at every target (target order); lin is None unless ``need_lin``."""
    s = S.detach().contiguous().numpy()
    n = layout.n_targets
    num = np.zeros(n, dtype=s.dtype)
    ab = np.zeros(n, dtype=s.dtype)
    lin = np.zeros(n if need_lin else 0, dtype=s.dtype)
    lo = layout
    _sums_kernel(s, lo.ptr, lo.h_items, lo.h_x.astype(s.dtype, copy=False), lo.h_w.astype(s.dtype, copy=False),
                 lo.has_w, lo.t_item, lo.t_row, lo.t_index, lo.piece, need_lin, num, ab, lin)
    return torch.from_numpy(num), torch.from_numpy(ab), torch.from_numpy(lin) if need_lin else None


def grad(layout: NumbaLayout, S: torch.Tensor, g_num: torch.Tensor | None, g_abs: torch.Tensor | None,
         g_lin: torch.Tensor | None) -> torch.Tensor:
    """dL/dS (dense M x M) from the per-target upstream gradients (target order; None = zero).

    The pairs are scattered into one channel per present gradient, interleaved (M x M x C) so a
    pair's writes share a cache line; then one pass forms dL/dS = acc_num + sign(S) acc_abs + acc_lin
    and zeroes the accumulator, which the layout keeps for the next step (no page faults, no memset).
    """
    present = [g is not None for g in (g_num, g_abs, g_lin)]
    chans = [-1, -1, -1]
    c = 0
    for n, p in enumerate(present):
        if p:
            chans[n], c = c, c + 1
    m = S.shape[0]
    if c == 0:
        return torch.zeros_like(S)
    s = S.detach().contiguous().numpy()
    acc = layout.accumulator((m, m, c), s.dtype)
    zeros = np.zeros(layout.n_targets, dtype=acc.dtype)  # absent channels (never written: their c is -1)
    gs = [zeros if g is None else g.detach().to(S.dtype).contiguous().numpy() for g in (g_num, g_abs, g_lin)]
    lo = layout
    _grad_kernel(acc, lo.ptr, lo.h_items, lo.h_x.astype(acc.dtype, copy=False), lo.h_w.astype(acc.dtype, copy=False),
                 lo.has_w, lo.t_item, lo.t_row, lo.t_index, lo.piece, gs[0], gs[1], gs[2], chans[0], chans[1], chans[2])
    out = np.empty_like(s)
    _combine_kernel(acc, s, chans[0], chans[1], chans[2], out)  # also zeroes acc for the next call
    return torch.from_numpy(out)


def _run_grad(layout: NumbaLayout, vals: np.ndarray, nbrs: np.ndarray, out: np.ndarray,
              gs: tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]) -> None:
    zeros = np.zeros(layout.n_targets, dtype=vals.dtype)  # absent channels (never read: their flag is off)
    arrs = [zeros if g is None else g.detach().to(torch.from_numpy(vals).dtype).contiguous().numpy() for g in gs]
    lo = layout
    _topk_grad_kernel(vals, nbrs, out, lo.ptr, lo.h_items, lo.h_x.astype(vals.dtype, copy=False),
                      lo.h_w.astype(vals.dtype, copy=False), lo.t_item, lo.t_row, lo.t_index, lo.piece,
                      arrs[0], arrs[1], arrs[2], gs[0] is not None, gs[1] is not None, gs[2] is not None, int(lo.n_items))


def topk_sums(layout: NumbaLayout, values: torch.Tensor, neighbors: torch.Tensor, need_lin: bool
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(num, abs, lin) for a top-k S (s_{i, n_is} = values[i, s], 0 off the support), target order.

    Each thread rebuilds the dense row i of S in an M-vector when its targets move to item i
    (O(k) writes), then runs the dense kernel's loop: memory O(M k + threads M).
    """
    v = values.detach().contiguous().numpy()
    nb = neighbors.to(torch.int32).contiguous().numpy()
    n = layout.n_targets
    num, ab = np.zeros(n, dtype=v.dtype), np.zeros(n, dtype=v.dtype)
    lin = np.zeros(n if need_lin else 0, dtype=v.dtype)
    lo = layout
    _topk_sums_kernel(v, nb, lo.ptr, lo.h_items, lo.h_x.astype(v.dtype, copy=False), lo.h_w.astype(v.dtype, copy=False),
                      lo.has_w, lo.t_item, lo.t_row, lo.t_index, lo.piece, need_lin, num, ab, lin, int(lo.n_items))
    return torch.from_numpy(num), torch.from_numpy(ab), torch.from_numpy(lin) if need_lin else None


def topk_grad(layout: NumbaLayout, values: torch.Tensor, neighbors: torch.Tensor, g_num: torch.Tensor | None,
              g_abs: torch.Tensor | None, g_lin: torch.Tensor | None) -> torch.Tensor:
    """dL/dvalues (M x k) for a top-k S: the dense gradient's row i read at the k support entries.

    Each thread accumulates row i of the dense gradient in an M x 3 buffer while its targets
    are at item i, then reads the k support entries out (sign(v_is) on the |s| channel).
    """
    v = values.detach().contiguous().numpy()
    out = np.zeros_like(v)
    _run_grad(layout, v, neighbors.to(torch.int32).contiguous().numpy(), out, (g_num, g_abs, g_lin))
    return torch.from_numpy(out)


def symmetrize_(S: torch.Tensor, block: int = 64) -> None:
    """S <- (S + S^T) / 2 with a zero diagonal, in place (CPU), over block x block tile pairs in parallel.

    The same float operations as the torch tiles of ``PNBM.project_`` (bit-identical), in one pass.
    """
    set_threads(torch.get_num_threads())
    _symmetrize_kernel(S.detach().numpy(), int(block))


def set_threads(n: int) -> None:
    """Use ``n`` numba threads (capped at numba's maximum); called to follow torch.set_num_threads."""
    if numba is not None:
        numba.set_num_threads(max(1, min(int(n), numba.config.NUMBA_NUM_THREADS)))


if numba is not None:

    @njit(inline="always", cache=True, nogil=True)
    def _target_sums(row, lo, hi, h_items, h_x, h_w, has_w, k, need_lin, num, ab, lin):  # pragma: no cover - compiled
        """num, abs, lin of one target whose item's row of S is ``row``, over history entries lo..hi-1."""
        a = 0.0
        b = 0.0
        c = 0.0
        for p in range(lo, hi):
            v = row[h_items[p]]
            a += v * h_x[p]
            if has_w:
                b += abs(v) * h_w[p]
                c += v * h_w[p]
            else:
                b += abs(v)
                c += v
        num[k] = a
        ab[k] = b
        if need_lin:
            lin[k] = c

    @njit(parallel=True, cache=True, nogil=True)
    def _sums_kernel(s, ptr, h_items, h_x, h_w, has_w, t_item, t_row, t_index, piece, need_lin, num, ab, lin):  # pragma: no cover - compiled
        for q in prange(piece.shape[0] - 1):
            for t in range(piece[q], piece[q + 1]):
                r = t_row[t]
                _target_sums(s[t_item[t]], ptr[r], ptr[r + 1], h_items, h_x, h_w, has_w, t_index[t], need_lin,
                             num, ab, lin)

    @njit(parallel=True, cache=True, nogil=True)
    def _grad_kernel(acc, ptr, h_items, h_x, h_w, has_w, t_item, t_row, t_index, piece,
                     g_num, g_abs, g_lin, c_num, c_abs, c_lin):  # pragma: no cover - compiled
        # acc[i, j, c]: channel c_num sums g_num x_uj, c_abs sums g_abs w_uj, c_lin sums g_lin w_uj (-1: absent).
        # sign(s_ij) is applied once per entry afterwards, not per pair (reading S here doubled the time).
        for q in prange(piece.shape[0] - 1):
            for t in range(piece[q], piece[q + 1]):
                i = t_item[t]
                r = t_row[t]
                k = t_index[t]
                cn = g_num[k]
                ca = g_abs[k]
                cl = g_lin[k]
                for p in range(ptr[r], ptr[r + 1]):
                    j = h_items[p]
                    w = h_w[p]
                    if c_num >= 0:
                        acc[i, j, c_num] += cn * h_x[p]
                    if c_abs >= 0:
                        acc[i, j, c_abs] += ca * w
                    if c_lin >= 0:
                        acc[i, j, c_lin] += cl * w

    @njit(parallel=True, cache=True, nogil=True)
    def _combine_kernel(acc, s, c_num, c_abs, c_lin, out):  # pragma: no cover - compiled
        # out = acc_num + sign(s) acc_abs + acc_lin, and acc <- 0, row by row
        m = s.shape[0]
        for i in prange(m):
            for j in range(m):
                v = 0.0
                if c_num >= 0:
                    v += acc[i, j, c_num]
                if c_abs >= 0:
                    sv = s[i, j]
                    v += acc[i, j, c_abs] * (np.float32(sv > 0) - np.float32(sv < 0))
                if c_lin >= 0:
                    v += acc[i, j, c_lin]
                out[i, j] = v
                for c in range(acc.shape[2]):
                    acc[i, j, c] = 0

    @njit(parallel=True, cache=True, nogil=True)
    def _topk_sums_kernel(vals, nbrs, ptr, h_items, h_x, h_w, has_w, t_item, t_row, t_index, piece, need_lin,
                          num, ab, lin, m):  # pragma: no cover - compiled
        k = nbrs.shape[1]
        for q in prange(piece.shape[0] - 1):
            row = np.zeros(m, dtype=vals.dtype)  # dense row `cur` of S, zero off the support
            cur = -1
            for t in range(piece[q], piece[q + 1]):
                i = t_item[t]
                if i != cur:
                    if cur >= 0:
                        for c in range(k):
                            row[nbrs[cur, c]] = 0
                    for c in range(k):
                        row[nbrs[i, c]] = vals[i, c]
                    cur = i
                r = t_row[t]
                _target_sums(row, ptr[r], ptr[r + 1], h_items, h_x, h_w, has_w, t_index[t], need_lin, num, ab, lin)

    @njit(parallel=True, cache=True, nogil=True)
    def _topk_grad_kernel(vals, nbrs, out, ptr, h_items, h_x, h_w, t_item, t_row, t_index, piece,
                          g_num, g_abs, g_lin, has_num, has_abs, has_lin, m):  # pragma: no cover - compiled
        # Row i of the dense gradient is accumulated in `acc` while the targets are at item i, then
        # out[i, c] = acc_num + sign(v_ic) acc_abs + acc_lin at column nbrs[i, c].
        k = nbrs.shape[1]
        for q in prange(piece.shape[0] - 1):
            acc = np.zeros((m, 3), dtype=vals.dtype)  # row `cur`: [j, 0] g_num x, [j, 1] g_abs w, [j, 2] g_lin w (one cache line)
            cur = -1
            for t in range(piece[q], piece[q + 1] + 1):
                i = t_item[t] if t < piece[q + 1] else -1
                if i != cur:
                    if cur >= 0:  # flush row `cur`, then clear the buffer
                        for c in range(k):
                            j = nbrs[cur, c]
                            sv = vals[cur, c]
                            out[cur, c] = acc[j, 0] + acc[j, 1] * (np.float32(sv > 0) - np.float32(sv < 0)) + acc[j, 2]
                        acc[:] = 0
                    cur = i
                if i < 0:
                    break
                r = t_row[t]
                kk = t_index[t]
                cn = g_num[kk]
                ca = g_abs[kk]
                cl = g_lin[kk]
                for p in range(ptr[r], ptr[r + 1]):
                    j = h_items[p]
                    if has_num:
                        acc[j, 0] += cn * h_x[p]
                    if has_abs:
                        acc[j, 1] += ca * h_w[p]
                    if has_lin:
                        acc[j, 2] += cl * h_w[p]

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
