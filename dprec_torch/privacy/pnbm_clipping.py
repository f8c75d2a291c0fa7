"""Per-user gradient norms of PNBM's similarity matrix S, without an M x M matrix per user.

PNBM (Eq. (2)) predicts, for target (u, i),

    r_hat_ui = r_bar_i + n_ui / d_ui,   n_ui = sum_j s_ij x_uj,   d_ui = max(C, D_ui),   D_ui = sum_j |s_ij| I_uj

with x_uj = (r_uj - r_bar_j) I_uj. ``surrogate_loss(gradient="exact")`` differentiates this, so the gradient of
target (u, i) is supported on row i, columns j in R_u:

    d r_hat_ui / d s_ij = x_uj / d_ui - a_ui sign(s_ij) I_uj,   a_ui = [D_ui >= C] n_ui / d_ui^2      (*)

(the second term is the |s| in the denominator). At the kinks the model fixes the rule (:mod:`dprec_torch.models.pnbm`,
``DENOMINATOR_RULE``): where D_ui >= C (the boundary D = C included) d = D and the |s| term is KEPT; where D_ui < C,
d = C and the term is 0; sign(0) = 0. The mask [D >= C] is not recomputed here: it is the batch's one cached mask
(``PNBM.floor_mask``), the tensor the forward and the released gradient use, so the clipped norm and the released
gradient cannot follow different rules (what matters for a user with D = C exactly, e.g. S = constant 1, C = 10 and
11 ratings). User u's whole contribution to the summed gradient is

    G_u = sum_{i in R_u} e_ui d r_hat_ui / dS,    supported on rows i in R_u x columns j in R_u,

and depends on no other user's data (r_bar and S are fixed during the step). A rating r_uj enters the targets' rows
through x_uj as well, but only inside G_u. Scaling u's residuals by f scales G_u by f, so clipping G_u to norm c is
a residual rescaling. Two ways to get ||G_u||:

* **pair enumeration** (any p): list the Sum_u |R_u|^2 pairs (target (u, i), history j) in bounded chunks
  (``chunk_pairs``), evaluate (*) times e_ui, accumulate |.| or (.)^2 per user. Different targets of one user have
  different rows i, so every pair is a distinct entry of G_u.
* **closed form** (p = 2 only), three sparse x dense products like ``batch_terms``:

      sum_{j != i} (x_uj/d - a sgn_ij)^2 = (||x_u||^2 - x_ui^2)/d^2 - 2 (a/d) (x_u . sgn(S_i)) + a^2 (I_u . |sgn(S_i)|).

The diagonal s_ii is always 0 in the model (``project_`` zeroes it after every update), so its gradient entry is
discarded: by default it is excluded from the norm, and the mechanism must then zero the diagonal of the summed
gradient before adding noise (``zero_diagonal_``), so the released sum is exactly the sum of the clipped off-diagonal
G_u.
"""

from __future__ import annotations

from typing import Any

import torch

from dprec_torch.errors import ConfigError
from dprec_torch.models import pair_triton
from dprec_torch.models.batching import rows_times
from dprec_torch.models.pair_kernels import pair_numba, use_numba
from dprec_torch.models.pnbm import PNBM

DEFAULT_CHUNK_PAIRS = 1 << 22  # (target, history) pairs per chunk on the CPU: ~0.5 GB of temporaries
ACCELERATOR_CHUNK_PAIRS = 1 << 26  # on a GPU: ~8 GB, so ML-1M's 0.3 G pairs take 5 chunks, not 77


def chunk_size(chunk_pairs: int | None, device: torch.device) -> int:
    """``chunk_pairs``, or (None) :data:`DEFAULT_CHUNK_PAIRS` on the CPU, :data:`ACCELERATOR_CHUNK_PAIRS` elsewhere."""
    if chunk_pairs is not None:
        return int(chunk_pairs)
    return DEFAULT_CHUNK_PAIRS if device.type == "cpu" else ACCELERATOR_CHUNK_PAIRS


def _check_pnbm(model: Any) -> None:
    if not isinstance(model, PNBM):  # the dense form: S, floor_c, the bound histories
        raise ConfigError(f"per-user PNBM gradient norms need a PNBM model, got {type(model).__name__}")
    if model.gradient != "exact":
        raise ConfigError(f"per-user clipping needs model.gradient=exact (the released gradient), got '{model.gradient}'")


@torch.no_grad()
def target_terms(model: Any, batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(n_ui, d_ui, a_ui) of (*) at every batch target, in float64; WHICH branch of the floor each target takes is the
    model's shared mask (module docstring), never a float64 re-decision (at D ~ C a float32 forward and a float64 norm
    could round to opposite sides of C)."""
    active = model.floor_mask(batch)
    S = model.S.detach().double()
    num = rows_times(batch, "x", S.T)[batch.rows, batch.items]
    raw = rows_times(batch, "ind", S.abs().T)[batch.rows, batch.items]
    den = torch.where(active, raw, torch.full_like(raw, model.floor_c))
    a = torch.where(active, num / (den * den), torch.zeros_like(num))
    return num, den, a


def _history(batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    crow = batch.x.crow_indices()
    return crow, batch.x.col_indices(), batch.x.values().to(torch.float64)


def iter_pairs(model: Any, batch: Any, residuals: torch.Tensor, include_diagonal: bool = False,
               chunk_pairs: int | None = None):
    """Yield chunks ``(row, i, j, value)`` of the nonzero-support entries of every G_u: ``value = e_ui (x_uj/d_ui -
    a_ui sign(s_ij))`` for target (u, i) and history item j of u, ``row`` the batch row of u. Chunks hold at most
    ``max(chunk_pairs, largest profile)`` pairs (None: :func:`chunk_size` for the batch's device)."""
    for t, i, j, val in _pair_chunks(model, batch, residuals, chunk_pairs):
        if not include_diagonal:
            keep = i != j
            t, i, j, val = t[keep], i[keep], j[keep], val[keep]
        yield batch.rows[t], i, j, val


def _pair_chunks(model: Any, batch: Any, residuals: torch.Tensor, chunk_pairs: int | None):
    """``(t, i, j, value)`` of every (target t, history item j) pair, the diagonal j = i included, chunk by chunk."""
    _check_pnbm(model)
    chunk_pairs = chunk_size(chunk_pairs, residuals.device)
    _, den, a = target_terms(model, batch)
    e = residuals.detach().to(torch.float64)
    crow, cols, xv = _history(batch)
    S = model.S.detach()
    h = crow[batch.rows + 1] - crow[batch.rows]  # history length of each target's user
    ends = torch.cumsum(h, 0)
    n_t = int(h.numel())
    start = 0
    while start < n_t:  # loop over chunks of targets, not over users
        base = int(ends[start - 1]) if start > 0 else 0
        stop = int(torch.searchsorted(ends, torch.tensor(base + chunk_pairs, device=ends.device), right=True))
        stop = max(stop, start + 1)
        t = torch.repeat_interleave(torch.arange(start, stop, device=h.device), h[start:stop])
        first = torch.repeat_interleave(ends[start:stop] - h[start:stop] - base, h[start:stop])
        offset = torch.arange(t.numel(), device=h.device) - first
        pos = crow[batch.rows[t]] + offset
        i, j = batch.items[t], cols[pos]
        yield t, i, j, e[t] * (xv[pos] / den[t] - a[t] * torch.sign(S[i, j]).to(torch.float64))
        start = stop


@torch.no_grad()
def per_user_grad_norms(model: Any, batch: Any, residuals: torch.Tensor, p: float = 2, include_diagonal: bool = False,
                        chunk_pairs: int | None = None, method: str = "auto") -> torch.Tensor:
    """||G_u||_p for every batch row (user), shape ``[len(batch.users)]``, float64. ``method``: ``pairs`` (enumeration,
    any p), ``closed`` (p = 2 closed form), ``auto`` (p = 2: the fused Triton pair sums on a GPU, the closed form
    elsewhere; p = 1: the fused pair sums, numba on the CPU, Triton on a GPU)."""
    if p not in (1, 2):
        raise ConfigError(f"clipping norm must be 1 or 2, got {p}")
    if method not in ("auto", "pairs", "closed"):
        raise ConfigError(f"method must be auto, pairs or closed, got '{method}'")
    _check_pnbm(model)
    n_rows = int(batch.users.numel())
    triton_ok = method != "closed" and model.pair_backend != "torch" and pair_triton.available(model.S)
    if method == "closed" or (method == "auto" and p == 2 and not triton_ok):
        if p != 2:
            raise ConfigError("the closed form exists for the L2 norm only")
        return _closed_form_l2(model, batch, residuals, include_diagonal).sqrt()
    kernel = (pair_numba if p == 1 and use_numba(model.pair_backend, model.S)  # the same bits, compiled (CPU)
              else pair_triton if triton_ok else None)  # fused, no pair temporaries (GPU)
    if kernel is pair_triton:  # d_t, a_t summed in the kernel, under the batch's shared [D >= C] mask
        crow, cols, xv = _history(batch)
        return pair_triton.user_norms(batch.rows, batch.items, crow, cols, xv, residuals.detach().to(torch.float64),
                                      None, None, model.S.detach(), n_rows, include_diagonal, p=p,
                                      active=model.floor_mask(batch), floor_c=model.floor_c)
    if kernel is not None:
        _, den, a = target_terms(model, batch)
        crow, cols, xv = _history(batch)
        return kernel.user_l1_norms(batch.rows, batch.items, crow, cols, xv, residuals.detach().to(torch.float64), den,
                                    a, model.S.detach(), n_rows, include_diagonal)
    acc = torch.zeros(n_rows, dtype=torch.float64, device=residuals.device)
    for t, i, j, val in _pair_chunks(model, batch, residuals, chunk_pairs):
        if not include_diagonal:  # zeroed, not compacted: the same sums, one pass and no host sync fewer
            val = torch.where(i != j, val, torch.zeros_like(val))
        acc.index_add_(0, batch.rows[t], val.abs() if p == 1 else val * val)
    return acc if p == 1 else acc.sqrt()


def _closed_form_l2(model: Any, batch: Any, residuals: torch.Tensor, include_diagonal: bool) -> torch.Tensor:
    """Sum over u's targets of e_ui^2 sum_j (x_uj/d - a sgn_ij)^2 (see the module docstring)."""
    _check_pnbm(model)
    _, den, a = target_terms(model, batch)
    e = residuals.detach().to(torch.float64)
    sgn = torch.sign(model.S.detach().double())
    crow, cols, xv = _history(batch)
    rows_of_entry = torch.repeat_interleave(torch.arange(crow.numel() - 1, device=crow.device), crow[1:] - crow[:-1])
    xsq = torch.zeros(crow.numel() - 1, dtype=torch.float64, device=xv.device).index_add_(0, rows_of_entry, xv * xv)
    xs = rows_times(batch, "x", sgn.T)[batch.rows, batch.items]
    cnt = rows_times(batch, "ind", sgn.abs().T)[batch.rows, batch.items]
    x_self = _self_value(batch, rows_of_entry, cols, xv)
    sq = xsq[batch.rows]
    if not include_diagonal:
        sq = sq - x_self * x_self
    per_target = sq / (den * den) - 2 * (a / den) * xs + a * a * cnt
    out = torch.zeros(crow.numel() - 1, dtype=torch.float64, device=xv.device)
    return out.index_add_(0, batch.rows, (e * e) * per_target.clamp_min(0))


def _self_value(batch: Any, rows_of_entry: torch.Tensor, cols: torch.Tensor, xv: torch.Tensor) -> torch.Tensor:
    """x_ui at every target (0 if i is not in u's history); the history's (row, column, value) per entry."""
    m = batch.x.shape[1]
    hist_key = rows_of_entry * m + cols
    tgt_key = batch.rows * m + batch.items
    if hist_key.numel() == 0:
        return torch.zeros(tgt_key.numel(), dtype=torch.float64, device=xv.device)
    pos = torch.searchsorted(hist_key, tgt_key).clamp_max(hist_key.numel() - 1)
    found = hist_key[pos] == tgt_key
    return torch.where(found, xv[pos], torch.zeros_like(xv[pos]))


@torch.no_grad()
def per_user_gradient(model: Any, batch: Any, residuals: torch.Tensor, include_diagonal: bool = False) -> torch.Tensor:
    """All G_u as one sparse COO tensor ``[n_rows, M, M]`` (tests and small batches only)."""
    empty = torch.zeros(0, dtype=torch.long)
    parts = list(iter_pairs(model, batch, residuals, include_diagonal, chunk_pairs=DEFAULT_CHUNK_PAIRS))
    rows, i, j, v = (torch.cat(c) for c in zip(*(parts or [(empty, empty, empty, torch.zeros(0, dtype=torch.float64))])))
    m = int(model.S.shape[0])
    return torch.sparse_coo_tensor(torch.stack([rows, i, j]), v, (int(batch.users.numel()), m, m),
                                   check_invariants=False).coalesce()


def clip_factors(norms: torch.Tensor, bound: float) -> torch.Tensor:
    """min(1, c / ||G_u||) per user (1 where the norm is 0)."""
    return torch.where(norms > bound, bound / norms.clamp_min(1e-300), torch.ones_like(norms))


def clip_user_residuals(model: Any, batch: Any, residuals: torch.Tensor, bound: float, p: float,
                        chunk_pairs: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Residuals scaled so that every ||G_u||_p <= bound; returns (clipped residuals, per-user norms before)."""
    norms = per_user_grad_norms(model, batch, residuals, p=p, chunk_pairs=chunk_pairs)
    return (residuals.double() * clip_factors(norms, bound)[batch.rows]).to(residuals.dtype), norms


@torch.no_grad()
def zero_diagonal_(grad: torch.Tensor) -> torch.Tensor:
    """Drop the diagonal of the summed gradient (data-independent; ``project_`` discards it anyway)."""
    grad.fill_diagonal_(0.0)
    return grad


def per_example_grad_norms(model: Any, batch: Any, residuals: torch.Tensor, unit: str) -> torch.Tensor:
    """The hook Gaussian DP-SGD calls (``model.per_example_grad_norms(batch, residuals, unit)``), L2, off-diagonal;
    ``unit=user`` only (the error says why)."""
    if unit != "user":
        raise ConfigError("PNBM supports per-example clipping with unit=user only: a rating r_uj enters the gradient of "
                          "every other rating of user u (through the history), so per-rating clipping bounds nothing")
    return per_user_grad_norms(model, batch, residuals, p=2)
