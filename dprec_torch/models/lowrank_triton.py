"""The low-rank PNBM's user-level step on a GPU in three Triton kernels (:mod:`.pnbm_lowrank`'s equations).

One program per user u streams u's ratings (contiguous: a user-level batch is grouped by user, ``row_offsets``) in
blocks of ``BLOCK``, gathering the rows u_j of U (d float64 each, from cache: U is M x d) into registers:

* :func:`forward_sums`: p_sum_u = sum_j u_j y_uj, then f_uj = u_j . p_u - |u_j|^2 y_uj w_u with p_u = w_u p_sum_u;
* :func:`gradient_norms`: q_u = sum_j e_uj u_j, then ||g_u|| over the rows
  g_uj = -2 [e_uj (p_u - 2 u_j y_uj w_u) + q_u y_uj w_u] (Frobenius, or the sum of |entries|), never written out;
* :func:`scatter_clipped`: the same rows (one jit helper, :func:`_rows`, computes them in both kernels) times the
  user's clip factor, added into the [M, d] float64 gradient with atomic adds.

These replace about forty torch launches a step, four [R, d] row gathers among them (torch's row gather runs one
thread block per 64-byte row), and need no host round trip. A masked batch (``UserBatch.row_mask``) skips the
unsampled users' programs (f = 0, q = 0, norm 0, nothing added; the Trainer zeroes their residuals anyway).

Numbers: each sum is in float64, as the torch path's, in another order (a block's tree, then the blocks in turn), so
f, the norms and the gradient agree with the torch path to float64 rounding, not bit for bit. The clip's factor is
computed from these norms and applied to the rows the same helper recomputes; a user's released part has norm
<= C up to float64 rounding (as the GPU's atomic sums, whose order is not fixed, already were).
``TRITON_INTERPRET=1`` with ``DPREC_LOWRANK_KERNEL=triton`` runs the kernels on the CPU (tests);
``DPREC_LOWRANK_KERNEL=torch`` turns them off, and so does a launch that raises (:func:`guarded`, logged once).
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any, Callable, TypeVar

import torch

log = logging.getLogger(__name__)
T = TypeVar("T")

#: ratings a program reads at once, at most (fewer for wide ranks: :func:`_shape`)
BLOCK = 128
#: float64 entries of a [BLOCK, D] tile of rows u_j, at most (registers, not spills)
TILE = 2048
#: why the kernels were turned off in this process (a launch raised: e.g. a GPU or Triton they do not compile for)
failed: str | None = None
triton: Any = None  # imported by _kernels() on first use; module globals, as the JIT resolves them there
tl: Any = None
_rating_block: Any = None
_rows: Any = None
_user_span: Any = None


def runs(u: torch.Tensor, offsets: torch.Tensor | None) -> bool:
    """Whether the kernels compute this user-level batch: float64 U on a CUDA device (or on the CPU under the
    interpreter with ``DPREC_LOWRANK_KERNEL=triton``), the batch's row offsets known, the mode not ``torch``, and Triton
    imports (imported only here: a CPU run never pays for it)."""
    mode = os.environ.get("DPREC_LOWRANK_KERNEL", "auto")
    if offsets is None or u.dtype != torch.float64 or mode == "torch" or failed is not None:
        return False
    interpreted = mode == "triton" and os.environ.get("TRITON_INTERPRET", "0") == "1" and u.device.type == "cpu"
    return (u.device.type == "cuda" or interpreted) and _kernels() is not None


@functools.lru_cache(maxsize=1)
def _kernels() -> Any:
    """The three kernels (compiled on first launch), or None where Triton does not import."""
    global triton, tl, _rating_block, _rows, _user_span
    try:  # Triton ships with CUDA builds of torch; absent on CPU wheels
        import triton as _triton
        import triton.language as _tl
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return None
    triton, tl = _triton, _tl

    @triton.jit
    def rating_block(p0, end, items, y, U, d, D: tl.constexpr, BLOCK: tl.constexpr):  # pragma: no cover - GPU
        """(positions, valid, y as float64, the [BLOCK, D] tile of rows u_j, its mask) of ratings p0 .. p0 + BLOCK - 1
        below ``end``."""
        offs = p0 + tl.arange(0, BLOCK)
        m = offs < end
        j = tl.load(items + offs, mask=m, other=0).to(tl.int64)
        yv = tl.load(y + offs, mask=m, other=0.0).to(tl.float64)
        cols = tl.arange(0, D)
        tm = m[:, None] & (cols < d)[None, :]
        return offs, m, yv, tl.load(U + j[:, None] * d + cols[None, :], mask=tm, other=0.0), tm, j

    @triton.jit
    def rows(tile, ev, yw, p, q):  # pragma: no cover - GPU
        """g_uj = -2 [e (p_u - 2 u_j y w) + q_u y w] for a tile of ratings (the torch path's operations, in order)."""
        return ((p[None, :] - (tile * 2.0) * yw[:, None]) * ev[:, None] + q[None, :] * yw[:, None]) * -2.0

    @triton.jit
    def user_span(seg, sampled, MASKED: tl.constexpr, D: tl.constexpr):  # pragma: no cover - GPU
        """(u = the program's user, the start and end of u's ratings, the tile's columns, whether u was sampled)."""
        u = tl.program_id(0).to(tl.int64)
        take = True
        if MASKED:
            take = tl.load(sampled + u) != 0
        return u, tl.load(seg + u), tl.load(seg + u + 1), tl.arange(0, D), take

    _rating_block, _rows, _user_span = rating_block, rows, user_span

    @triton.jit
    def forward_sums(U, items, seg, y, w, sampled, p_sum, f, d,  # pragma: no cover - GPU
                     MASKED: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr):
        """p_sum[u] = sum_j u_j y_uj; f[j] = u_j . (w_u p_sum[u]) - |u_j|^2 y_uj w_u over u's ratings."""
        u, start, end, cols, take = _user_span(seg, sampled, MASKED, D)
        acc = tl.zeros([D], dtype=tl.float64)
        if take:
            for p0 in range(start, end, BLOCK):
                offs, m, yv, tile, tm, j = _rating_block(p0, end, items, y, U, d, D, BLOCK)
                acc += tl.sum(tile * yv[:, None], axis=0)
            w_u = tl.load(w + u).to(tl.float64)
            p = acc * w_u
            for p0 in range(start, end, BLOCK):
                offs, m, yv, tile, tm, j = _rating_block(p0, end, items, y, U, d, D, BLOCK)
                fv = tl.sum(tile * p[None, :], axis=1) - tl.sum(tile * tile, axis=1) * yv * w_u
                tl.store(f + offs, fv, mask=m)
        else:  # an unsampled row of a masked batch: f = 0 (its residuals are zeroed)
            for p0 in range(start, end, BLOCK):
                offs = p0 + tl.arange(0, BLOCK)
                tl.store(f + offs, tl.zeros([BLOCK], dtype=tl.float64), mask=offs < end)
        tl.store(p_sum + u * d + cols, acc, mask=cols < d)

    @triton.jit
    def gradient_norms(U, items, seg, y, e, p_sum, inv_sqrt, sampled, q_out, norms, d,  # pragma: no cover - GPU
                       L1: tl.constexpr, MASKED: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr):
        """q_out[u] = sum_j e_uj u_j; norms[u] = ||g_u|| (L1: sum |g|, else Frobenius) over the rows of :func:`rows`."""
        u, start, end, cols, take = _user_span(seg, sampled, MASKED, D)
        q = tl.zeros([D], dtype=tl.float64)
        total = tl.zeros([BLOCK], dtype=tl.float64)
        if take:
            for p0 in range(start, end, BLOCK):
                offs, m, yv, tile, tm, j = _rating_block(p0, end, items, y, U, d, D, BLOCK)
                ev = tl.load(e + offs, mask=m, other=0.0)
                q += tl.sum(tile * ev[:, None], axis=0)
            w_u = tl.load(inv_sqrt + u)
            p = tl.load(p_sum + u * d + cols, mask=cols < d, other=0.0) * w_u
            for p0 in range(start, end, BLOCK):
                offs, m, yv, tile, tm, j = _rating_block(p0, end, items, y, U, d, D, BLOCK)
                ev = tl.load(e + offs, mask=m, other=0.0)
                g = _rows(tile, ev, yv * w_u, p, q)
                v = tl.abs(g) if L1 else g * g
                total += tl.sum(tl.where(tm, v, 0.0), axis=1)
        tl.store(q_out + u * d + cols, q, mask=cols < d)
        s = tl.sum(total, axis=0)
        tl.store(norms + u, s if L1 else tl.sqrt(s))

    @triton.jit
    def scatter_clipped(U, items, seg, y, e, p_sum, inv_sqrt, q_in, factor, sampled, grad, d,  # pragma: no cover - GPU
                        MASKED: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr):
        """grad[j] += factor_u g_uj for every rating (u, j) (atomic float64 adds)."""
        u, start, end, cols, take = _user_span(seg, sampled, MASKED, D)
        if take:
            w_u = tl.load(inv_sqrt + u)
            p = tl.load(p_sum + u * d + cols, mask=cols < d, other=0.0) * w_u
            q = tl.load(q_in + u * d + cols, mask=cols < d, other=0.0)
            c = tl.load(factor + u)
            for p0 in range(start, end, BLOCK):
                offs, m, yv, tile, tm, j = _rating_block(p0, end, items, y, U, d, D, BLOCK)
                ev = tl.load(e + offs, mask=m, other=0.0)
                g = _rows(tile, ev, yv * w_u, p, q) * c
                tl.atomic_add(grad + j[:, None] * d + cols[None, :], g, mask=tm)

    return forward_sums, gradient_norms, scatter_clipped


def guarded(launch: Callable[[], T]) -> T | None:
    """``launch()``, or None after turning the kernels off for this process when it raises (logged once): the caller
    then computes the same numbers on the torch path. A kernel that does not compile raises before it runs."""
    global failed
    try:
        return launch()
    except Exception as err:  # noqa: BLE001 - any failure to compile or launch: the torch path is always there
        failed = f"{type(err).__name__}: {err}"
        log.warning("the low-rank PNBM's GPU kernels failed (%s); the torch path computes the same numbers instead "
                    "(DPREC_LOWRANK_KERNEL=torch chooses it from the start)", failed)
        return None


def _shape(d: int) -> dict[str, int]:
    """The tile's ``D`` (the power of two >= d, at least 2) and ``BLOCK`` (ratings a loop step: 128 up to D = 16,
    halved for each doubling of D beyond it, at least 16)."""
    width = max(2, 1 << (int(d) - 1).bit_length())
    return {"D": width, "BLOCK": max(16, min(BLOCK, TILE // width))}


def _mask_args(row_mask: torch.Tensor | None, seg: torch.Tensor) -> tuple[torch.Tensor, bool]:
    return (seg, False) if row_mask is None else (row_mask.contiguous(), True)


def forward_sums(U: torch.Tensor, items: torch.Tensor, seg: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
                 row_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(p_sum ``[N, d]``, f ``[R]``) of a user-level batch (N = len(seg) - 1 rows, their ratings ``seg[u]:seg[u+1]``),
    float64; w: n_u^(-1/2) per row (the model's float32 ``terms.w``, widened as the torch path's product does)."""
    n, d = int(seg.numel()) - 1, int(U.shape[1])
    p_sum = torch.empty(n, d, dtype=torch.float64, device=U.device)
    f = torch.empty(int(items.numel()), dtype=torch.float64, device=U.device)
    if n > 0:
        sampled, masked = _mask_args(row_mask, seg)
        _kernels()[0][(n,)](U.contiguous(), items, seg, y, w, sampled, p_sum, f, d, MASKED=masked, **_shape(d))
    return p_sum, f


def gradient_norms(U: torch.Tensor, items: torch.Tensor, seg: torch.Tensor, y: torch.Tensor, e: torch.Tensor,
                   p_sum: torch.Tensor, inv_sqrt: torch.Tensor, row_mask: torch.Tensor | None = None,
                   l1: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(q ``[N, d]``, ||g_u|| ``[N]``) in float64: the L1 norm with ``l1``, else Frobenius."""
    n, d = int(seg.numel()) - 1, int(U.shape[1])
    q = torch.empty(n, d, dtype=torch.float64, device=U.device)
    norms = torch.empty(n, dtype=torch.float64, device=U.device)
    if n > 0:
        sampled, masked = _mask_args(row_mask, seg)
        _kernels()[1][(n,)](U.contiguous(), items, seg, y, e.contiguous(), p_sum, inv_sqrt, sampled, q, norms, d,
                            L1=bool(l1), MASKED=masked, **_shape(d))
    return q, norms


def scatter_clipped(U: torch.Tensor, items: torch.Tensor, seg: torch.Tensor, y: torch.Tensor, e: torch.Tensor,
                    p_sum: torch.Tensor, inv_sqrt: torch.Tensor, q: torch.Tensor, factor: torch.Tensor,
                    row_mask: torch.Tensor | None = None) -> torch.Tensor:
    """sum_u factor_u g_u as an ``[M, d]`` float64 matrix."""
    n, d = int(seg.numel()) - 1, int(U.shape[1])
    grad = torch.zeros(U.shape, dtype=torch.float64, device=U.device)
    if n > 0:
        sampled, masked = _mask_args(row_mask, seg)
        _kernels()[2][(n,)](U.contiguous(), items, seg, y, e.contiguous(), p_sum, inv_sqrt, q,
                            factor.double().contiguous(), sampled, grad, d, MASKED=masked, **_shape(d))
    return grad
