"""Probabilistic neighbourhood-based model (PNBM), Wang & Tang Sec. 2.1. (Low-rank S = U U^T: :mod:`.pnbm_lowrank`,
``model=pnbm_lowrank``, or ``model=pnbm model.similarity=lowrank``, which :func:`dprec_torch.config.resolve_model_node` maps to it.)

Eq. (2):  r_hat_ui = r_bar_i + sum_{j != i} s_ij (r_uj - r_bar_j) I_uj / max(C, sum_{j != i} |s_ij| I_uj)

S is an M x M parameter kept symmetric with a zero diagonal (so j = i never contributes). The denominator is floored at
C, the paper's lower bound on |S_i| I_u^- (Sec. 3). At prediction time only each item's top-N_k neighbours count. Ratings
stay sparse. Two formulations compute the same numbers (``model.formulation``):

* ``sparse_pair`` -- the sums of Eq. (2) only over the (target (u, i), history j) pairs, sum_u |T_u| |R_u| of them,
  and the gradient as a scatter onto the co-rated (i, j) (:mod:`dprec_torch.models.pair_kernels`);
* ``dense`` -- the history block (users x items) times dense S^T, a |B| x M block of which the targets are read: a
  CSR x dense product on the CPU (nnz_B M multiply-adds), a dense GEMM on an accelerator where it fits
  (:func:`~dprec_torch.models.batching.dense_gemm_wins`: cuSPARSE ``csrmm`` is ~10x slower at ML-1M's 4 % density);
* ``auto`` -- ``sparse_pair`` on the CPU; on an accelerator ``dense`` up to ``dense_max_items`` items, else
  ``sparse_pair``.

The floor's kink. d = max(C, D) with D = sum_j |s_ij| I_uj has no derivative at D = C, and |s| none at s = 0. Both are
fixed here, explicitly, never left to autograd's choice:

* ``[D >= C]`` (``DENOMINATOR_RULE``): where it holds d = D and d d / d D = 1 (the |s| term of the gradient is kept),
  elsewhere d = C and the term is 0. The mask is computed ONCE per (batch, S version) from the forward's own D, in the
  forward's precision, and cached on the batch (``denominator_mask``); the forward value, the autograd gradient
  (:class:`FlooredDenominator`) and the per-user norms the private mechanisms clip
  (:mod:`dprec_torch.privacy.pnbm_clipping`) all read that one tensor.
* d|s|/ds = sign(s) with sign(0) = 0 (:class:`SignedAbs` on the dense path; ``sign_table`` / the numba flush on the
  sparse-pair paths; ``torch.sign`` in the norms).
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from dprec_torch.data.ratings import Ratings, _to_csr
from dprec_torch.errors import ConfigError
from dprec_torch.models.base import BaseModel, check_settings
from dprec_torch.models.batching import UserBatch, dense_gemm_wins, rows_times, same_key
from dprec_torch.models.pair_kernels import (BACKENDS, DEFAULT_BUDGET, HistoryTables, PairPlan, build_history, build_plan,
                                             centred_history, device_budget, pair_numba, pair_sums, use_numba)
from dprec_torch.models.history import BindsHistory

GRADIENTS = ("exact", "paper_eq5")
FORMULATIONS = ("auto", "dense", "sparse_pair")
# project_ on a GPU symmetrizes S up to this size in one tile (an M x M temporary: 268 MB in float32 at 8,192), not in
# 512-wide tiles whose ~150 small launches dominated a step's projection
GPU_WHOLE_SYMMETRIZE = 8192
DENOMINATOR_RULE = "D >= C"  # where the Eq. (2) denominator is D (gradient through |s|); below C it is the floor


def batch_history(batch: UserBatch, n_items: int) -> HistoryTables | None:
    """The batch's history block as :class:`HistoryTables`; None when ``x`` and ``ind`` do not share one sparsity pattern."""
    x, ind = batch.x, batch.ind
    if not (torch.equal(x.crow_indices(), ind.crow_indices()) and torch.equal(x.col_indices(), ind.col_indices())):
        return None
    crow = ind.crow_indices()
    n_rows = crow.numel() - 1
    rows = torch.repeat_interleave(torch.arange(n_rows, device=crow.device), crow[1:] - crow[:-1])
    return build_history(rows, ind.col_indices(), x.values(), ind.values(), n_rows, n_items)


class FlooredDenominator(torch.autograd.Function):
    """d = D where ``active`` else C, with dd/dD = ``active`` exactly (no subgradient left to autograd)."""

    @staticmethod
    def forward(ctx, raw: torch.Tensor, active: torch.Tensor, floor_c: float):  # type: ignore[override]
        ctx.save_for_backward(active)
        return torch.where(active, raw, torch.full_like(raw, floor_c))

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        (active,) = ctx.saved_tensors
        return torch.where(active, grad, torch.zeros_like(grad)), None, None


class SignedAbs(torch.autograd.Function):
    """|S| with d|s|/ds = sign(s), sign(0) = 0, stated explicitly (the dense path's |s|)."""

    @staticmethod
    def forward(ctx, S: torch.Tensor):  # type: ignore[override]
        ctx.save_for_backward(S)
        return S.abs()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        (S,) = ctx.saved_tensors
        return grad * torch.sign(S)


def floored(raw: torch.Tensor, active: torch.Tensor, floor_c: float) -> torch.Tensor:
    """max(C, D) through the shared mask: the value is max(C, D) wherever ``active`` = [D >= C] of this D."""
    return FlooredDenominator.apply(raw, active, float(floor_c))


def denominator_mask(batch: UserBatch, S: torch.Tensor, raw: torch.Tensor, floor_c: float) -> torch.Tensor:
    """The one [D >= C] mask of ``batch`` for this S (object and version), cached on the batch: the first caller (the
    forward of ``batch_predict``, or the clipping norms) computes it from its D; every later forward, gradient or norm of
    the same (batch, S version) reuses it, so they cannot disagree at D = C. The key is S's identity and ``_version``:
    every in-place update (optimizer steps, ``fill_``, ``load_state_dict``) bumps it; a write through ``S.data`` does
    not, so code that edits ``S.data`` directly must use a fresh batch.
    """
    mask = cached_denominator_mask(batch, S, floor_c)
    if mask is None:
        mask = raw.detach() >= floor_c  # [D >= C]: where d = max(C, D) is D itself (DENOMINATOR_RULE)
        batch.cache["_denominator_mask"] = (weakref.ref(S), _mask_key(batch, S, floor_c), mask)
    return mask


def _mask_key(batch: UserBatch, S: torch.Tensor, floor_c: float) -> tuple:
    return (S._version, S.data_ptr(), S.dtype, S.device, float(floor_c), batch.ind, batch.rows, batch.items)


def cached_denominator_mask(batch: UserBatch, S: torch.Tensor, floor_c: float) -> torch.Tensor | None:
    """The batch's cached [D >= C] mask for this S (object and version), or None."""
    hit = batch.cache.get("_denominator_mask")
    if hit is None or hit[0]() is not S:
        return None
    return hit[2] if same_key(hit[1], _mask_key(batch, S, floor_c)) else None


class PNBM(BindsHistory, BaseModel):
    """Item-item PNBM holding the similarity matrix ``S`` (M x M).

    Args:
        n_items: M. floor_c: C, the floor of the Eq. (2) denominator. seed: seeds the initialisation.
        n_neighbors: N_k, neighbours per item used at prediction time (Sec. 5.1: 500).
        init_scale: S^(1) ~ U(-init_scale, init_scale) before any mechanism rescaling.
        gradient: ``exact`` (autograd of Eq. (2), with the |s| and the denominator) or ``paper_eq5`` (the paper's
            simplified Eq. (5), which drops sign(s_ij)).
        formulation: ``auto`` | ``dense`` | ``sparse_pair`` (module docstring); same numbers either way.
        pair_budget: padded pairs per chunk of the sparse-pair kernels on the CPU (bounds their memory);
            on an accelerator at least ``pair_kernels.ACCELERATOR_MIN_BUDGET`` (:func:`~.pair_kernels.device_budget`).
        dense_max_items: ``auto`` picks ``dense`` on an accelerator up to this M (docs/performance.md).
        pair_backend: sparse-pair kernels on the CPU: ``numba`` (fused compiled loops, :mod:`.pair_numba`), ``torch``
            (chunked tensor ops, any device) or ``auto`` (numba on the CPU when it imports); same numbers either way.
        device: where S is initialised (the runner's device: a GPU run never symmetrises an M x M matrix on the CPU).
    """

    task = "rating"
    name = "PNBM"

    def __init__(self, n_items: int, floor_c: float = 10.0, n_neighbors: int = 500, init_scale: float = 0.1,
                 gradient: str = "exact", seed: int = 0, predict_batch_users: int = 4096, formulation: str = "auto",
                 pair_budget: int = DEFAULT_BUDGET, dense_max_items: int = 4096, pair_backend: str = "auto",
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        check_settings(("gradient", gradient, GRADIENTS), ("formulation", formulation, FORMULATIONS))
        if int(pair_budget) <= 0:
            raise ConfigError(f"model.pair_budget must be > 0, got {pair_budget}")
        check_settings(("pair_backend", pair_backend, BACKENDS), ("floor_c (C)", floor_c), ("n_neighbors (N_k)", n_neighbors))
        self.n_items, self.floor_c, self.n_neighbors = int(n_items), float(floor_c), int(n_neighbors)
        self.gradient, self.predict_batch_users = gradient, int(predict_batch_users)
        self.formulation, self.pair_budget, self.dense_max_items = formulation, int(pair_budget), int(dense_max_items)
        self.pair_backend = pair_backend
        self._predict_cache: dict = {}
        gen = torch.Generator().manual_seed(int(seed))
        # drawn on the CPU (the same S^(1) on every device), symmetrised where it will live
        init = ((torch.rand(n_items, n_items, generator=gen) * 2 - 1) * init_scale).to(device or "cpu")
        self.S = nn.Parameter(init)
        self.register_buffer("item_means", torch.zeros(n_items, device=init.device))
        self.project_(compiled=False)

    # ---------------------------------------------------------------- set-up
    @torch.no_grad()
    def project_(self, block: int = 512, compiled: bool = True) -> None:
        """Keep S symmetric with a zero diagonal: S <- (S + S^T) / 2, diag(S) <- 0 (post-processing).

        In place over pairs of ``block`` x ``block`` tiles (no M x M temporaries); on the CPU by
        :func:`~.pair_numba.symmetrize_` (the same float operations) unless ``compiled=False`` (the constructor).
        """
        s = self.S.data
        if compiled and s.is_contiguous() and use_numba(self.pair_backend, s):
            pair_numba.symmetrize_(s)
            return
        m = s.shape[0]
        if s.device.type != "cpu" and m <= GPU_WHOLE_SYMMETRIZE:  # one tile: 4 launches, not ~150 (each entry's sum is
            block = m  # the same (a + b) / 2 whatever the tiling: the same bits)
        for i in range(0, m, block):
            for j in range(i, m, block):
                a, b = s[i : i + block, j : j + block], s[j : j + block, i : i + block]
                avg = (a + b.T) * 0.5
                a.copy_(avg)
                b.copy_(avg.T)
        s.fill_diagonal_(0.0)

    # ---------------------------------------------------------- formulation
    def resolved_formulation(self, device: torch.device | None = None) -> str:
        """``dense`` or ``sparse_pair``: ``model.formulation``, with ``auto`` resolved for ``device``."""
        if self.formulation != "auto":
            return self.formulation
        device = self.S.device if device is None else device
        if device.type == "cpu" or self.n_items > self.dense_max_items:
            return "sparse_pair"
        return "dense"

    def pair_plan(self, batch: UserBatch) -> PairPlan | None:
        """The sparse-pair layout of ``batch`` (cached on the batch; rebuilt if its tensors are replaced); None when
        ``x`` and ``ind`` do not share one sparsity pattern (then the dense path is used)."""
        key = (batch.x, batch.ind, batch.rows, batch.items, (self.pair_budget, self.pair_backend))
        hit = batch.cache.get("_pair_plan")
        if hit is not None and same_key(hit[0], key):
            return hit[1]
        hist = batch_history(batch, self.n_items)
        plan = None if hist is None else build_plan(hist, batch.rows, batch.items,
                                                    device_budget(self.pair_budget, batch.ind.device), backend=self.pair_backend)
        batch.cache["_pair_plan"] = (key, plan)
        return plan

    def _sparse_plan(self, batch: UserBatch, S: torch.Tensor) -> PairPlan | None:
        return self.pair_plan(batch) if self.resolved_formulation(S.device) == "sparse_pair" else None

    # --------------------------------------------------------------- training
    def batch_terms(self, batch: UserBatch, S: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Numerator S_i R_u^- and floored denominator max(C, |S_i| I_u^-) of Eq. (2) at the batch targets."""
        num, raw, active = self.denominator_terms(batch, S)
        return num, floored(raw, active, self.floor_c)

    def denominator_terms(self, batch: UserBatch, S: torch.Tensor | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(S_i R_u^-, D = |S_i| I_u^-, [D >= C]) at the batch targets; the mask is the batch's shared one."""
        S = self.S if S is None else S
        plan = self._sparse_plan(batch, S)
        if plan is not None:
            num, raw, _ = pair_sums(S, plan, self.gradient == "paper_eq5")
        else:
            num = rows_times(batch, "x", S.T)[batch.rows, batch.items]
            raw = rows_times(batch, "ind", SignedAbs.apply(S).T)[batch.rows, batch.items]
        return num, raw, denominator_mask(batch, S, raw, self.floor_c)

    def floor_mask(self, batch: UserBatch) -> torch.Tensor:
        """The batch's one [D >= C] mask for the current S (the forward's, or computed now and cached)."""
        mask = cached_denominator_mask(batch, self.S, self.floor_c)
        if mask is None:
            with torch.no_grad():
                mask = self.denominator_terms(batch)[2]
        return mask

    def batch_predict(self, batch: UserBatch) -> torch.Tensor:
        """r_hat at the batch targets (Eq. (2), all neighbours, differentiable in S). With autograd on, the terms are
        kept on the batch for the step's ``surrogate_loss`` (used once, only while S is unchanged)."""
        num, den = self.batch_terms(batch)
        if torch.is_grad_enabled() and num.requires_grad:
            batch.cache["_forward_terms"] = (weakref.ref(self.S), self.S._version, num, den)
        return self.item_means[batch.items] + num / den

    def surrogate_loss(self, batch: UserBatch, residuals: torch.Tensor) -> torch.Tensor:
        """A scalar whose gradient in S is G = sum_(u,i) e_ui d r_hat_ui / dS (Eq. (4)/(5)).

        ``residuals`` are the (possibly clamped, Alg. 1 line 5) errors e_ui = r_hat_ui - r_ui, treated as constants.
        ``gradient=exact`` differentiates Eq. (2); ``paper_eq5`` uses d r_hat / d s_ij = (x_uj - r_hat_ui I_uj) / (S_i I_u^-).
        """
        e = residuals.detach()
        if self.gradient == "exact":  # batch_predict's own (num, den) if S has not changed since, else recomputed
            hit = batch.cache.pop("_forward_terms", None)
            fresh = hit is not None and hit[0]() is self.S and hit[1] == self.S._version
            num, den = (hit[2], hit[3]) if fresh else self.batch_terms(batch)
            return (e * (num / den)).sum()
        plan = self._sparse_plan(batch, self.S)
        if plan is not None:
            num, ab, lin = pair_sums(self.S, plan, True)
            den = floored(ab.detach(), denominator_mask(batch, self.S, ab, self.floor_c), self.floor_c)
            centred = num.detach() / den
            return (e * (num - centred * lin) / den).sum()
        num = rows_times(batch, "x", self.S.T)[batch.rows, batch.items]
        lin = rows_times(batch, "ind", self.S.T)[batch.rows, batch.items]
        with torch.no_grad():
            n0, den = self.batch_terms(batch)
            centred = n0 / den
        return (e * (num - centred * lin) / den).sum()

    def fused_step(self, batch: UserBatch, target: torch.Tensor, bound: float
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """A training step's forward and backward in one pass over the pairs (see ``BaseModel.fused_step``).

        For the element-wise clamp to [-``bound``, ``bound``] (inf: none), the same numbers as ``pred =
        batch_predict(batch)``, ``e = pred - target``, ``e' = clamp(e)``, ``surrogate_loss(batch, e').backward()``, bit
        for bit (:func:`~.pair_numba.fused_step`): S.grad receives dL/dS (accumulated) and (pred, e, e') are returned.
        Applies to ``gradient=exact`` on the sparse-pair formulation with the numba kernels (a CPU S); None otherwise.
        """
        S = self.S
        if self.gradient != "exact" or not S.requires_grad or not torch.is_grad_enabled():
            return None
        plan = self._sparse_plan(batch, S)
        if plan is None or not plan._numba(S) or self.item_means.device != S.device or target.device != S.device:
            return None
        pair_numba.set_threads(torch.get_num_threads())
        pred, res, clipped, grad = pair_numba.fused_step(plan.numba_layout(), S, self.floor_c, self.item_means,
                                                         batch.items, target, float(bound))
        if S.grad is None:
            S.grad = grad
        else:
            S.grad.add_(grad)
        return pred, res, clipped

    # ------------------------------------------------------- privacy quantities
    def gradient_entry_bound(self, residual_bound: float) -> float:
        """Sec. 3: |G_ij(u)| <= e_max * phi / C, from |r_uj - r_hat_ui I_uj| <= phi and |S_i| I_u^- >= C."""
        return residual_bound * self.scale.span / self.floor_c

    @torch.no_grad()
    def sgld_prior_precision(self, train: Ratings, batch_ratings: float, block: int = 256) -> list[torch.Tensor]:
        """H of Sec. 4.2: H_ij = 1 - |I_i||I_j|/L^2 (1 - |I_j|/L)^(l-1) (1 - |I_i|/L)^(l-1).

        L = |R^{>0}|, l = the mini-batch size (sampling with replacement, as the paper assumes); as printed in the
        paper (for realistic sizes H is within 1e-6 of 1). Float64 by blocks of rows into an S-typed M x M.
        """
        c = train.item_counts().to(self.S.device, torch.float64) / float(len(train))  # |I_i| / L
        p = torch.exp((batch_ratings - 1) * torch.log1p(-c.clamp_max(1 - 1e-12)))
        h = torch.empty_like(self.S, requires_grad=False)
        for a in range(0, self.n_items, block):
            b = min(self.n_items, a + block)
            h[a:b] = 1 - (c[a:b, None] * c[None, :]) * (p[a:b, None] * p[None, :])
        return [h]

    # ------------------------------------------------------------- prediction
    @torch.no_grad()
    def neighbour_matrix(self) -> torch.Tensor:
        """S restricted to each item's top-N_k neighbours (largest s_ij per row, as the reference code); one k-th value
        per row (``torch.topk``), cached per version of S."""
        S = self.S.detach()
        k = min(self.n_neighbors, S.shape[1])
        if k >= S.shape[1]:
            return S
        hit = self._predict_cache.get("neighbours")
        key = (S.data_ptr(), self.S._version, k, S.dtype, S.device)
        if hit is not None and hit[0] == key:
            return hit[1]
        kth = torch.topk(S, k, dim=1, sorted=False).values.min(1, keepdim=True).values
        out = torch.where(S >= kth, S, torch.zeros_like(S))
        self._predict_cache["neighbours"] = (key, out)
        return out

    @torch.no_grad()
    def predict(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """Eq. (2) with top-N_k neighbours over each user's full training history, clipped to the scale."""
        if self.history is None or self.fallback_ is None:
            raise RuntimeError("PNBM.predict called before attach(train)")
        dev = self.S.device
        users, items = users.to(dev), items.to(dev)
        hist = self.history
        Sk = self.neighbour_matrix()
        user_c, item_c = users.clamp(0, hist.n_users - 1), items.clamp(0, self.n_items - 1)
        if self.resolved_formulation(dev) == "sparse_pair":
            tables = centred_history(self._predict_cache, hist, self.item_means, dev)  # x = r_uj - r_bar_j, current r_bar
            plan = build_plan(tables, user_c, item_c, device_budget(self.pair_budget, dev), backend=self.pair_backend)
            num, ab, _ = plan.sums(Sk)
            out = self.item_means[item_c] + num / ab.clamp_min(self.floor_c)
            return self.fallback_.finish(users, items, out)
        out = torch.zeros(users.shape, device=dev)
        uniq, inv = torch.unique(user_c, return_inverse=True)
        row_of = torch.full((hist.n_users,), -1, dtype=torch.long, device=dev)
        for s in range(0, uniq.numel(), self.predict_batch_users):
            block = uniq[s : s + self.predict_batch_users]
            row_of[block] = torch.arange(block.numel(), device=dev)
            sel = row_of[hist.users] >= 0
            rows, its, vals = row_of[hist.users[sel]], hist.items[sel], hist.values[sel]
            num_full, den_full = self._block_products(rows, its, vals - self.item_means[its], block.numel(), Sk)
            q = (inv >= s) & (inv < s + block.numel())
            r, c = inv[q] - s, item_c[q]
            out[q] = self.item_means[c] + num_full[r, c] / den_full[r, c]
            row_of[block] = -1
        return self.fallback_.finish(users, items, out)

    def _block_products(self, rows: torch.Tensor, items: torch.Tensor, centred: torch.Tensor, n_rows: int,
                        Sk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """X Sk^T and max(C, I |Sk|^T) for a block of users (Eq. (2) over all items): dense GEMMs where they win."""
        if dense_gemm_wins(n_rows, self.n_items, Sk.device):
            x = torch.zeros((n_rows, self.n_items), device=Sk.device, dtype=Sk.dtype)
            x[rows, items] = centred.to(Sk.dtype)
            ind = torch.zeros_like(x)
            ind[rows, items] = 1.0
            return x @ Sk.T, (ind @ Sk.abs().T).clamp_min(self.floor_c)
        x = _to_csr(rows, items, centred, n_rows, self.n_items)
        ind = _to_csr(rows, items, torch.ones_like(centred), n_rows, self.n_items)
        return torch.sparse.mm(x, Sk.T), torch.sparse.mm(ind, Sk.abs().T).clamp_min(self.floor_c)
