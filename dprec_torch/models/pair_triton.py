"""Fused per-user L1 norms of PNBM's gradient on a GPU (Triton): no (target, history) pair is materialised.

The provable clipped-Laplace mechanism clips ||G_u||_1 (``privacy.pnbm_clipping``), the sum over u's targets
t = (u, i) and history items j of

    |e_t (x_uj / d_t - a_t sign(s_ij))|                                          (pnbm_clipping, (*))

which has no product form (sign(s_ij) sits inside the absolute value). The torch path enumerates the ~0.3 G pairs of
ML-1M as a chain of gathers and element-wise kernels in float64 temporaries; here one Triton program per target
streams its user's history in blocks, reads s_ij from row i of S and sums the terms in registers. The per-target sums
are then added per user by ``torch.segment_reduce`` over the targets sorted by user (deterministic: no atomics).

The values agree with the torch enumeration to float64 rounding (the order of the additions differs); the clip
compares these norms with C, so the released sum is within C (1 + 1e-12) of the bound, far inside the harness's
tolerance. ``TRITON_INTERPRET=1`` runs the kernel on the CPU for tests.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

#: history entries a program reads at once
BLOCK = 128
triton: Any = None  # imported by _kernel() on first use; module globals, so the JIT resolves ``tl`` as it expects
tl: Any = None
history_block: Any = None  # the kernel's helper, a module global too (the interpreter resolves names there only)


def interpreting() -> bool:
    """Whether Triton runs in its CPU interpreter (``TRITON_INTERPRET=1``: tests without a GPU)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def available(S: torch.Tensor) -> bool:
    """Whether the fused kernel can run for this S: S is on a CUDA device (or on the CPU under the interpreter) and
    Triton imports (it is imported only then: a CPU run never pays for it)."""
    if not (S.device.type == "cuda" or (interpreting() and S.device.type == "cpu")):
        return False
    return _kernel() is not None


@functools.lru_cache(maxsize=1)
def _kernel() -> Any:
    """The compiled-on-first-launch Triton kernel, or None where Triton does not import."""
    global triton, tl, history_block
    try:  # Triton ships with CUDA builds of torch; absent on CPU wheels
        import triton as _triton
        import triton.language as _tl
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return None
    triton, tl = _triton, _tl

    @triton.jit
    def _history_block(p0, end, cols, xv, s_row, BLOCK: tl.constexpr):  # pragma: no cover - GPU
        """(mask, j, x_uj, s_ij) of the history entries p0 .. p0 + BLOCK - 1 (below ``end``) of one target's user."""
        offs = p0 + tl.arange(0, BLOCK)
        m = offs < end
        j = tl.load(cols + offs, mask=m, other=0).to(tl.int64)
        return m, j, tl.load(xv + offs, mask=m, other=0.0), tl.load(s_row + j, mask=m, other=0.0)

    history_block = _history_block

    @triton.jit
    def target_norm(rows, items, crow, cols, xv, e, den, a, active, floor, S, stride_s, out,  # pragma: no cover - GPU
                    INCLUDE_DIAGONAL: tl.constexpr, SQUARE: tl.constexpr, TERMS: tl.constexpr, BLOCK: tl.constexpr):
        """out[t] = sum_j |v_tj| (SQUARE: sum_j v_tj^2), v_tj = e_t (x_uj / d_t - a_t sign(s_ij)), over u's history j
        (j != i unless INCLUDE_DIAGONAL). TERMS: d_t and a_t from a first pass over the same history (pnbm_clipping's
        target_terms: n_t = sum_j x_uj s_ij, D_t = sum_j |s_ij| in float64, d_t = D_t where ``active`` else the floor,
        a_t = n_t / d_t^2 where active else 0), not read from ``den`` and ``a``."""
        t = tl.program_id(0)
        r = tl.load(rows + t)
        i = tl.load(items + t).to(tl.int64)
        start = tl.load(crow + r)
        end = tl.load(crow + r + 1)
        e_t = tl.load(e + t)
        if TERMS:
            num = tl.zeros([BLOCK], dtype=tl.float64)
            raw = tl.zeros([BLOCK], dtype=tl.float64)
            for p0 in range(start, end, BLOCK):
                m, j, x, s = history_block(p0, end, cols, xv, S + i * stride_s, BLOCK)
                s = s.to(tl.float64)
                num += x * s
                raw += tl.abs(s)
            n_t = tl.sum(num, axis=0)
            raw_t = tl.sum(raw, axis=0)
            on = tl.load(active + t) != 0
            d_t = tl.where(on, raw_t, tl.load(floor))
            a_t = tl.where(on, n_t / (d_t * d_t), 0.0)
        else:
            d_t = tl.load(den + t)
            a_t = tl.load(a + t)
        total = tl.zeros([BLOCK], dtype=tl.float64)
        for p0 in range(start, end, BLOCK):
            m, j, x, s = history_block(p0, end, cols, xv, S + i * stride_s, BLOCK)
            sg = tl.where(s > 0, 1.0, tl.where(s < 0, -1.0, 0.0)).to(tl.float64)
            v = e_t * (x / d_t - a_t * sg)
            v = v * v if SQUARE else tl.abs(v)
            if not INCLUDE_DIAGONAL:  # s_ii's entry is discarded (pnbm_clipping's module doc)
                m = m & (j != i)
            total += tl.where(m, v, 0.0)
        tl.store(out + t, tl.sum(total, axis=0))

    return target_norm


def user_norms(rows: torch.Tensor, items: torch.Tensor, crow: torch.Tensor, cols: torch.Tensor, xv: torch.Tensor,
               e: torch.Tensor, den: torch.Tensor | None, a: torch.Tensor | None, S: torch.Tensor, n_rows: int,
               include_diagonal: bool, p: int = 1, active: torch.Tensor | None = None,
               floor_c: float | None = None) -> torch.Tensor:
    """||G_u||_p (p = 1 or 2) for every batch row (float64, shape ``[n_rows]``): the pair sums of
    :func:`dprec_torch.models.pair_numba.user_l1_norms` (p = 1) or of the closed form
    :func:`dprec_torch.privacy.pnbm_clipping.per_user_grad_norms` (p = 2), one Triton program per target, float64
    accumulation; the L2 sums are not the closed form's (no cancellation of its expanded square).

    ``den``/``a``: the targets' d_t and a_t (:func:`~dprec_torch.privacy.pnbm_clipping.target_terms`); None with
    ``active`` (the batch's [D >= C] mask) and ``floor_c``: the kernel computes them from the same history in float64
    (the same sums in another order: no [rows x M] float64 products, which took two float64 GEMMs a step)."""
    n_t = int(rows.numel())
    out = torch.zeros(n_rows, dtype=torch.float64, device=S.device)
    if n_t == 0:
        return out
    S = S.detach().contiguous()
    terms = den is None
    if terms:
        if active is None or floor_c is None:
            raise ValueError("user_norms needs den and a, or active and floor_c")
        flags = active.to(torch.int8).contiguous()
        floor = torch.full((1,), float(floor_c), dtype=torch.float64, device=S.device)
        den = a = flags  # (not read)
    else:
        flags = floor = den
    per_target = torch.empty(n_t, dtype=torch.float64, device=S.device)
    _kernel()[(n_t,)](
        rows.contiguous(), items.contiguous(), crow.contiguous(), cols.contiguous(), xv.contiguous(),
        e.contiguous(), den.contiguous(), a.contiguous(), flags, floor, S, S.stride(0), per_target,
        INCLUDE_DIAGONAL=bool(include_diagonal), SQUARE=p == 2, TERMS=terms, BLOCK=BLOCK,
    )
    order = torch.argsort(rows, stable=True)
    lengths = torch.bincount(rows, minlength=n_rows)
    sums = torch.segment_reduce(per_target[order], "sum", lengths=lengths, unsafe=True)
    return sums.sqrt() if p == 2 else sums
