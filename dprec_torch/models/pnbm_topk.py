"""PNBM with a top-k sparse similarity (``model=pnbm_topk``): S stored as k neighbours per item.

Wang & Tang Eq. (2) with s_ij = 0 outside a fixed support N(i) of k items per item:

    r_hat_ui = r_bar_i + sum_{s < k} v_is x_u,n_is / max(C, sum_{s < k} |v_is| I_u,n_is)

``neighbors`` (M x k, a buffer) holds n_is and ``S_values`` (M x k, the parameter) v_is, so memory is O(M k) instead
of O(M^2), for catalogues where a dense S does not fit. The gradient, the per-entry sensitivity e_max phi / C (Sec. 3)
and the mechanisms are those of dense PNBM restricted to the support; ``project_`` keeps s_ij = s_ji wherever both
(i, j) and (j, i) are in the support. An item is never its own neighbour. At prediction time the top-N_k selection is
dense PNBM's, on S extended by zeros off the support.

The support is chosen once, at ``attach(train)`` (``support``):

* ``pcc`` (default) -- each item's k items of largest shrunk Pearson correlation, pcc_ij n_ij / (n_ij +
  ``support_shrinkage``) (n_ij co-raters; a non-private item-kNN similarity). On ML-100K and the synthetic
  ML-1M-size data this support keeps the test RMSE of dense PNBM at k = 200 (docs/performance.md).
* ``corating`` -- each item's k items with the most co-raters (ties: smaller id).
* ``random`` -- k distinct random items per item (seeded by ``support_seed``).

``pcc`` and ``corating`` are **not private**: the released neighbour lists depend on the training ratings, and no
mechanism's epsilon covers that choice (``privacy_caveat`` says so and is logged at ``attach``); use them for non-private
runs and the accuracy/memory comparison. ``random`` is data-independent (the guarantee is unaffected), at a cost in accuracy.

The floor max(C, D) and |v| follow dense PNBM's explicit rule at their kinks (``[D >= C]`` keeps the |v| term,
sign(0) = 0; :mod:`dprec_torch.models.pnbm`), through the batch's one cached mask.

Kernels: on the CPU (``pair_backend=auto|numba``) the fused loops of :func:`~.pair_numba.topk_sums` / ``topk_grad``, which
rebuild row i of S (and accumulate row i of the gradient) in per-thread M-vectors; otherwise (``torch``, any device) the
sparse-pair kernel of dense PNBM (:mod:`.pair_kernels`) with targets grouped by blocks of ``row_block`` items whose rows
of S are rebuilt densely from the k values (``row_block x (M+1)`` cells, bounded by ``block_budget``). Work per epoch is
the sum_u |T_u| |R_u| pairs plus O(M^2) zero-filling, whatever k is; memory is O(M k + nnz + block_budget), never O(M^2).
"""

from __future__ import annotations

import logging
import weakref

import torch
from torch import nn

from dprec_torch.data.ratings import Ratings
from dprec_torch.errors import ConfigError
from dprec_torch.models.base import BaseModel, check_settings
from dprec_torch.models.batching import UserBatch, same_key
from dprec_torch.models.history import BindsHistory
from dprec_torch.models.pair_kernels import (BACKENDS, DEFAULT_BUDGET, PairPlan, build_plan, centred_history,
                                              gram_row_blocks, pair_numba, row_groups, sign_table, use_numba)
from dprec_torch.models.pnbm import GRADIENTS, PNBM, batch_history, denominator_mask, floored

log = logging.getLogger(__name__)

SUPPORTS = ("pcc", "corating", "random")
DATA_DEPENDENT_CAVEAT = (
    "model=pnbm_topk support={support}: each item's neighbour list is chosen from NON-PRIVATE statistics of the "
    "training data ({what}); the released lists reveal them and no mechanism's epsilon covers this choice "
    "(support=random is data-independent)."
)


# ------------------------------------------------------------------ support
@torch.no_grad()
def corating_support(train: Ratings, k: int, block_cells: int = 1 << 20) -> torch.Tensor:
    """Each item's k items with the most co-raters n_ij = sum_u I_ui I_uj (j != i; ties: smaller j), by blocks of rows
    with the pair scatter: memory O(nnz + block_cells + M k)."""
    ones = torch.ones(len(train), device=train.device)
    blocks = gram_row_blocks(train.users, train.items, [(ones, None)], train.n_users, train.n_items,
                             max(1, block_cells // (train.n_items + 1)))
    return _top_k_rows(train.n_items, k, ((s, e, g[0]) for s, e, g in blocks), train.device)


@torch.no_grad()
def pcc_support(train: Ratings, k: int, shrinkage: float = 50.0, block_cells: int = 1 << 20) -> torch.Tensor:
    """Each item's k items of largest shrunk Pearson correlation (j != i; ties: smaller j): score_ij = pcc_ij n_ij /
    (n_ij + shrinkage), the significance-weighted item similarity of :func:`dprec_torch.predictors.similarity.pearson`
    (n_ij co-raters), from four Gram products by blocks of rows."""
    x = train.values - train.item_means()[train.items]
    ones, sq = torch.ones_like(x), x * x
    channels = [(x, x), (sq, None), (ones, sq), (ones, None)]  # num, sum x_ui^2, sum x_uj^2, n_ij
    blocks = gram_row_blocks(train.users, train.items, channels, train.n_users, train.n_items,
                             max(1, block_cells // (train.n_items + 1)))

    def scores():
        for start, stop, (num, sq_i, sq_j, n) in blocks:
            den = torch.sqrt(sq_i * sq_j)
            pcc = torch.where(den > 0, num / den.clamp_min(1e-12), torch.zeros_like(num))
            yield start, stop, pcc * n / (n + shrinkage) if shrinkage > 0 else pcc

    return _top_k_rows(train.n_items, k, scores(), train.device)


def _top_k_rows(m: int, k: int, blocks, device: torch.device) -> torch.Tensor:
    """Sorted indices of the k largest scores per row, the item itself excluded, ties to the smaller id; ``blocks``
    yields (start, stop, scores[start:stop]) covering all M rows."""
    out = torch.empty(m, k, dtype=torch.long, device=device)
    cols = torch.arange(m, device=device, dtype=torch.float64)[None, :]
    for start, stop, score in blocks:
        # tie-break: a tiny decreasing function of the column (well below any score difference)
        sc = score.double() - cols * 1e-12
        sc[torch.arange(stop - start, device=device), torch.arange(start, stop, device=device)] = float("-inf")
        out[start:stop] = torch.topk(sc, k, dim=1).indices
    return torch.sort(out, dim=1).values


@torch.no_grad()
def random_support(n_items: int, k: int, seed: int, device: torch.device, block: int = 512) -> torch.Tensor:
    """k distinct random items j != i per item i (data-independent), seeded."""
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    out = torch.empty(n_items, k, dtype=torch.long)
    for start in range(0, n_items, block):
        stop = min(start + block, n_items)
        score = torch.rand(stop - start, n_items, generator=gen)
        score[torch.arange(stop - start), torch.arange(start, stop)] = -1.0
        out[start:stop] = torch.topk(score, k, dim=1).indices
    return torch.sort(out, dim=1).values.to(device)


def mirror_index(neighbors: torch.Tensor) -> torch.Tensor:
    """Flat position of (j, i) for every support entry (i, j), or -1 when (j, i) is not in the support."""
    m, k = neighbors.shape
    rows = torch.arange(m, device=neighbors.device)[:, None].expand(m, k)
    keys = (rows * m + neighbors).reshape(-1)  # sorted: rows ascending, neighbours sorted per row
    want = (neighbors * m + rows).reshape(-1)
    pos = torch.searchsorted(keys, want).clamp_max(keys.numel() - 1)
    return torch.where(keys[pos] == want, pos, torch.full_like(pos, -1))


# ------------------------------------------------------------------ kernel
def _dense_rows(values: torch.Tensor, neighbors: torch.Tensor, a: int, b: int) -> torch.Tensor:
    """Rows a..b-1 of S as a dense (b - a) x (M + 1) block (zero off the support and in the padding column)."""
    m = values.shape[0]
    out = torch.zeros(b - a, m + 1, dtype=values.dtype, device=values.device)
    out.scatter_(1, neighbors[a:b], values[a:b])
    return out.view(-1)


class TopKPairSums(torch.autograd.Function):
    """(num, abs, lin) at the plan's targets, differentiable in the M x k values: the pair kernel of
    :mod:`.pair_kernels`, reading S from dense blocks of ``row_block`` rows rebuilt from the k values per row."""

    @staticmethod
    def forward(ctx, values, neighbors, plan, need_lin):  # type: ignore[override]
        ctx.set_materialize_grads(False)
        ctx.plan = plan
        ctx.save_for_backward(values, neighbors)
        key = (weakref.ref(values), values._version, values.dtype, neighbors._version, neighbors.data_ptr())
        hit = plan.cached_sums(key, need_lin)
        if hit is None and use_numba(plan.backend, values):
            pair_numba.set_threads(torch.get_num_threads())
            out = pair_numba.topk_sums(plan.numba_layout(), values, neighbors, need_lin)
            plan._cache["sums"] = (key, need_lin, out)
            hit = tuple(t.clone() if t is not None else None for t in out)
        if hit is None:
            out = plan.new_sums(values, need_lin)
            for a, b, chunks in row_groups(plan):
                sa = _dense_rows(values, neighbors, a, b)
                for bk, s, e in chunks:
                    plan.chunk_sums(sa, bk, s, e, need_lin, None, out)
            hit = plan.finish_sums(out, key, need_lin)
        num, ab, lin = hit
        return num, ab, (lin if lin is not None else torch.zeros_like(num))

    @staticmethod
    def backward(ctx, g_num, g_abs, g_lin):  # type: ignore[override]
        values, neighbors = ctx.saved_tensors
        if g_num is None and g_abs is None and g_lin is None:
            return None, None, None, None
        plan: PairPlan = ctx.plan
        if use_numba(plan.backend, values):
            pair_numba.set_threads(torch.get_num_threads())
            return pair_numba.topk_grad(plan.numba_layout(), values, neighbors, g_num, g_abs, g_lin), None, None, None
        m, k = values.shape
        gs = [plan.gathered(g, values.dtype) for g in (g_num, g_abs, g_lin)]
        out = torch.zeros(m, k, dtype=values.dtype, device=values.device)
        for a, b, chunks in row_groups(plan):
            sa = sign_table(_dense_rows(values, neighbors, a, b)) if gs[1] is not None else None
            gd = torch.zeros((b - a) * (m + 1), dtype=values.dtype, device=values.device)
            for bk, s, e in chunks:
                plan.chunk_grad(sa, gd, bk, s, e, gs)
            out[a:b] += gd.view(b - a, m + 1).gather(1, neighbors[a:b])
        return out, None, None, None


# ------------------------------------------------------------------- model
class PNBMTopK(BindsHistory, BaseModel):
    """Item-item PNBM over a fixed top-k support (module docstring).

    Args:
        n_items: M. sparse_k: k, neighbours stored per item (memory M k).
        support: ``pcc`` | ``corating`` (both non-private, flagged) | ``random`` (data-independent).
        support_shrinkage: the shrinkage of ``pcc``. support_seed: seeds ``random``.
        floor_c, n_neighbors, init_scale, gradient, seed, pair_budget, pair_backend: as
            :class:`~dprec_torch.models.pnbm.PNBM`; at prediction time each item keeps its top-min(N_k, k) values.
        block_budget: cells of a dense block of S rows (bounds the kernel's working memory).
    """

    task = "rating"
    name = "PNBM-topk"

    def __init__(self, n_items: int, sparse_k: int = 200, support: str = "pcc", support_shrinkage: float = 50.0,
                 support_seed: int = 0, floor_c: float = 10.0, n_neighbors: int = 500, init_scale: float = 0.1,
                 gradient: str = "exact", seed: int = 0, block_budget: int = 1 << 20, pair_budget: int = DEFAULT_BUDGET,
                 pair_backend: str = "auto") -> None:
        super().__init__()
        check_settings(("gradient", gradient, GRADIENTS), ("pair_backend", pair_backend, BACKENDS),
                       ("support", support, SUPPORTS))
        if not 0 < int(sparse_k) < int(n_items):
            raise ConfigError(f"model.sparse_k must be in [1, M - 1] = [1, {int(n_items) - 1}], got {sparse_k}")
        check_settings(("floor_c (C)", floor_c), ("n_neighbors (N_k)", n_neighbors))
        self.n_items, self.k = int(n_items), int(sparse_k)
        self.support, self.support_seed, self.support_shrinkage = support, int(support_seed), float(support_shrinkage)
        self.floor_c, self.n_neighbors, self.gradient = float(floor_c), int(n_neighbors), gradient
        self.block_budget, self.pair_budget, self.pair_backend = int(block_budget), int(pair_budget), pair_backend
        gen = torch.Generator().manual_seed(int(seed))
        self.S_values = nn.Parameter((torch.rand(self.n_items, self.k, generator=gen) * 2 - 1) * init_scale)
        self.register_buffer("neighbors", torch.zeros(self.n_items, self.k, dtype=torch.long))
        self.register_buffer("item_means", torch.zeros(self.n_items))
        self.register_buffer("mirror", torch.full((self.n_items * self.k,), -1, dtype=torch.long))
        self._predict_cache: dict = {}

    # ---------------------------------------------------------------- set-up
    def attach(self, train: Ratings) -> "PNBMTopK":
        """BUILD from data (before training): bind the histories, r_bar, the fallback; choose the support N(i)
        (see ``support``) and symmetrise."""
        dev = self.S_values.device
        super().attach(train)
        if self.support == "random":
            nbrs = random_support(self.n_items, self.k, self.support_seed, dev)
            self.privacy_caveat = None
        else:
            data = train.to(dev)
            if self.support == "pcc":
                nbrs = pcc_support(data, self.k, self.support_shrinkage)
                what = f"shrunk Pearson correlations, shrinkage {self.support_shrinkage:g}"
            else:
                nbrs = corating_support(data, self.k)
                what = "co-rating counts"
            self.privacy_caveat = DATA_DEPENDENT_CAVEAT.format(support=self.support, what=what)
            log.warning(self.privacy_caveat)
        self.neighbors.copy_(nbrs)
        self.mirror.copy_(mirror_index(self.neighbors))
        self.project_()
        return self

    def get_extra_state(self) -> dict:
        return {**super().get_extra_state(), "privacy_caveat": self.privacy_caveat}

    def set_extra_state(self, state: dict) -> None:
        super().set_extra_state(state)
        self.privacy_caveat = state.get("privacy_caveat")

    @torch.no_grad()
    def project_(self) -> None:
        """s_ij, s_ji <- (s_ij + s_ji) / 2 wherever both are in the support (symmetric S on the support). Entries whose
        mirror is outside the support are left alone (averaging them with the implicit zero, dense PNBM's projection of
        the zero-extended S, trained worse: +0.03 test RMSE on synthetic ML-1M-size data, k = 200)."""
        v = self.S_values.data.view(-1)
        pos = torch.nonzero(self.mirror >= 0).flatten()
        v[pos] = (v[pos] + v[self.mirror[pos]]) * 0.5

    def memory_bytes(self) -> int:
        """Bytes of the model state (values, neighbours, mirror): O(M k)."""
        return sum(t.numel() * t.element_size() for t in (self.S_values, self.neighbors, self.mirror))

    # --------------------------------------------------------------- training
    @property
    def row_block(self) -> int:
        """Items per dense block of S rows: block_budget // (M + 1) (at least 1)."""
        return max(1, self.block_budget // (self.n_items + 1))

    def pair_plan(self, batch: UserBatch) -> PairPlan:
        """The pair layout of ``batch`` grouped by row blocks (cached on the batch)."""
        key = (batch.x, batch.ind, batch.rows, batch.items, self.pair_budget, self.row_block, self.pair_backend)
        hit = batch.cache.get("_topk_plan")
        if hit is not None and same_key(hit[0], key):
            return hit[1]
        hist = batch_history(batch, self.n_items)
        if hist is None:
            raise ValueError("PNBMTopK needs batch.x and batch.ind on one sparsity pattern (as make_batch builds them)")
        plan = build_plan(hist, batch.rows, batch.items, self.pair_budget, self.row_block, self.pair_backend)
        batch.cache["_topk_plan"] = (key, plan)
        return plan

    def _sums(self, batch: UserBatch, values: torch.Tensor):
        return TopKPairSums.apply(values, self.neighbors, self.pair_plan(batch), self.gradient == "paper_eq5")

    def batch_terms(self, batch: UserBatch, S: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Numerator and floored denominator of Eq. (2) at the batch targets (``S`` = M x k values)."""
        values = self.S_values if S is None else S
        num, ab, _ = self._sums(batch, values)
        return num, floored(ab, denominator_mask(batch, values, ab, self.floor_c), self.floor_c)

    def batch_predict(self, batch: UserBatch) -> torch.Tensor:
        """r_hat at the batch targets (Eq. (2) on the support, differentiable in the values)."""
        num, den = self.batch_terms(batch)
        return self.item_means[batch.items] + num / den

    def surrogate_loss(self, batch: UserBatch, residuals: torch.Tensor) -> torch.Tensor:
        """Scalar whose gradient is G = sum e_ui d r_hat_ui / dv (exact, or the paper's Eq. (5))."""
        e = residuals.detach()
        num, ab, lin = self._sums(batch, self.S_values)
        active = denominator_mask(batch, self.S_values, ab, self.floor_c)  # the one [D >= C] mask (pnbm.py)
        if self.gradient == "exact":
            return (e * (num / floored(ab, active, self.floor_c))).sum()
        den = floored(ab.detach(), active, self.floor_c)
        return (e * (num - (num.detach() / den) * lin) / den).sum()

    # ------------------------------------------------------- privacy quantities
    gradient_entry_bound = PNBM.gradient_entry_bound  # Sec. 3: |G_ij(u)| <= e_max phi / C, as for dense PNBM

    @torch.no_grad()
    def sgld_prior_precision(self, train: Ratings, batch_ratings: float) -> list[torch.Tensor]:
        """H of Sec. 4.2 (Eq. (11)) at the support entries: H_is = 1 - c_i c_j p_i p_j, j = n_is."""
        c = train.item_counts().to(self.S_values.device, torch.float64) / float(len(train))  # |I_i| / L
        p = torch.exp((batch_ratings - 1) * torch.log1p(-c.clamp_max(1 - 1e-12)))
        h = 1 - (c[:, None] * p[:, None]) * (c[self.neighbors] * p[self.neighbors])
        return [h.to(self.S_values.dtype)]

    # ------------------------------------------------------------- prediction
    @torch.no_grad()
    def neighbour_values(self) -> torch.Tensor:
        """The values dense PNBM's top-N_k selection keeps on the zero-extended S (the rest set to 0), cached per version.

        Row i of the zero-extended S holds the k values and M - k zeros; its N_k-th largest entry is the N_k-th largest
        value if N_k <= #(v > 0), else 0 if N_k <= #(v >= 0) + M - k, else a negative value; entries >= it are kept
        (as ``PNBM.neighbour_matrix``).
        """
        v = self.S_values.detach()
        n_k = self.n_neighbors
        if n_k >= self.n_items:
            return v
        key = (self.S_values._version, v.data_ptr())
        hit = self._predict_cache.get("values")
        if hit is not None and hit[0] == key:
            return hit[1]
        desc = torch.sort(v, dim=1, descending=True).values
        pos = (v > 0).sum(1, keepdim=True)
        zeros = (v == 0).sum(1, keepdim=True) + (self.n_items - self.k)
        at = lambda r: desc.gather(1, (r - 1).clamp(0, self.k - 1))  # noqa: E731 - r-th largest value (1-based)
        kth = torch.where(n_k <= pos, at(torch.full_like(pos, n_k)),
                          torch.where(n_k <= pos + zeros, torch.zeros_like(desc[:, :1]), at(n_k - zeros)))
        out = torch.where(v >= kth, v, torch.zeros_like(v))
        self._predict_cache["values"] = (key, out)
        return out

    @torch.no_grad()
    def predict(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """Eq. (2) on the support (top-N_k values) over each user's full training history, clipped."""
        if self.history is None or self.fallback_ is None:
            raise RuntimeError("PNBMTopK.predict called before attach(train)")
        dev = self.S_values.device
        users, items = users.to(dev), items.to(dev)
        u, i = users.clamp(0, self.history.n_users - 1), items.clamp(0, self.n_items - 1)
        tables = centred_history(self._predict_cache, self.history, self.item_means, dev)  # x = r_uj - r_bar_j, current r_bar
        plan = build_plan(tables, u, i, self.pair_budget, self.row_block, self.pair_backend)
        num, ab, _ = TopKPairSums.apply(self.neighbour_values(), self.neighbors, plan, False)
        out = self.item_means[i] + num / ab.clamp_min(self.floor_c)
        return self.fallback_.finish(users, items, out)

