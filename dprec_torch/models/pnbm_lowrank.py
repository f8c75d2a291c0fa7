"""PNBM with a low-rank similarity S = U U^T (``model=pnbm model.similarity=lowrank``, rank ``model.rank``).

Eq. (2) of Wang & Tang predicts r_hat_ui = r_bar_i + sum_{j != i} s_ij (r_uj - r_bar_j) I_uj / d_ui. This form keeps
that prediction with S = U U^T (U is M x d, so a mechanism noises M d numbers a step instead of M^2) and with the
normalisation that makes it learn under user-level noise. With the user's own damped offset and clamped residuals

    b_u  = sum_{j in R_u} (r_uj - r_bar_j) / (n_u + beta_p),          n_u = |R_u|
    y_uj = clamp(r_uj - r_bar_j - b_u, -Gamma_r, Gamma_r)

the model is

    p_u  = n_u^(-1/2) sum_{j in R_u} u_j y_uj                              (the user's aggregate, [d])
    f_ui = u_i . p_u - |u_i|^2 y_ui n_u^(-1/2) [i in R_u]                   (= n_u^(-1/2) sum_{j in R_u, j != i} s_ij y_uj)
    r_hat_ui = clip(r_bar_i + b_u + f_ui),      L_u(U) = sum_{i in R_u} (y_ui - f_ui)^2.

Denominator rule: d_ui = n_u^(1/2) (public per user, no kink), in place of Eq. (2)'s max(C, sum_j |s_ij| I_uj): the
latter couples every pair (i, j) of a profile through |u_i . u_j| and has no per-user closed-form gradient. The
diagonal of S never enters (j != i), so S = U U^T needs no separate diagonal. r_bar (the buffer ``item_means``) is
what a mechanism releases (the DP item means); b_u, y and p_u are recomputed by each user from the released r_bar, U
and their own ratings (joint DP, the billboard model) and are never released.

Per-user gradient (explicit, batched; checked against autograd in the tests), with e_ui = y_ui - f_ui and
q_u = sum_{i in R_u} e_ui u_i: row j of dL_u/dU is zero unless j in R_u, where

    g_uj = -2 [ e_uj (p_u - 2 u_j y_uj n_u^(-1/2)) + q_u y_uj n_u^(-1/2) ].

The training residual the Trainer clips is e'_ui = f_ui - y_ui = -e_ui (:meth:`LowRankPNBM.training_targets` gives
the clamped target r_bar_i + b_u + y_ui), and ``surrogate_loss`` is 2 sum e'_ui f_ui, whose gradient in U is
sum_u dL_u/dU: scaling a user's residuals by min(1, C / ||g_u||_F) clips that user's whole gradient. No clamp, max or
abs acts on U, so there is no kink for autograd to choose a subgradient at (the clamp of y reads data only).

Public item features (``model.item_features``, :mod:`dprec_torch.data.item_features`): each user also fits their
own ridge weights on them, w_u = (Phi_Ru^T Phi_Ru + lambda I)^-1 Phi_Ru^T y_u (:mod:`.content`), and the model reads
y'_uj = clamp(y_uj - w_u . phi_j, -Gamma_r, Gamma_r) in place of y and adds w_u . phi_i to the prediction. w_u is a
function of u's own ratings and public data only (never released), so each user's gradient is still a function of
that user alone and the per-user clip bounds it: the release and its epsilon are unchanged.

``gradient_reduction = "mean"``: the mechanisms divide the (clipped, noised) sum by the expected batch size q N
(Opacus's ``scale_grad``), so ``lr`` is a step on the mean per-user loss.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import nn

from dprec_torch.data.ratings import Ratings
from dprec_torch.errors import ConfigError
from dprec_torch.models.base import BaseModel
from dprec_torch.models.batching import UserBatch
from dprec_torch.models import lowrank_triton
from dprec_torch.models.history import BindsHistory
from dprec_torch.models.content import check_item_features, public_features_text, resolve_item_features, feature_systems
from dprec_torch.startup import lazy_import

lowrank_numba = lazy_import("dprec_torch.models.lowrank_numba")  # numba loads with the first CPU kernel, not in a GPU run

DENOMINATOR_RULE = "n_u^(1/2)"  # d_ui of Eq. (2) in the low-rank form (module docstring)


# ------------------------------------------------------------------------------------------- equations
def user_residuals(rows: torch.Tensor, items: torch.Tensor, values: torch.Tensor, item_means: torch.Tensor,
                   n_rows: int, beta_p: float, clamp_r: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(b_u per row [n_rows], y per rating [R]) of the ratings (rows, items, values) (module docstring), float64 sums."""
    e = values.double() - item_means.double()[items]
    n = torch.bincount(rows, minlength=n_rows).double()
    b = torch.zeros(n_rows, dtype=torch.float64, device=e.device).index_add_(0, rows, e) / (n + beta_p).clamp_min(1e-12)
    return b.float(), (e - b[rows]).clamp(-clamp_r, clamp_r).float()


def user_aggregates(users: torch.Tensor, items: torch.Tensor, y: torch.Tensor, u: torch.Tensor, n_users: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(p_u for every user [N, d], n_u^(-1/2) per rating [R]) over the given ratings."""
    n = torch.bincount(users, minlength=n_users).to(u.dtype)
    inv_sqrt = n.clamp_min(1.0).rsqrt()
    p = torch.zeros(n_users, u.shape[1], dtype=u.dtype, device=u.device).index_add_(0, users, u[items] * y[:, None])
    return p * inv_sqrt[:, None], inv_sqrt[users]


def take_rows(mat: torch.Tensor, index: torch.Tensor, cache: dict | None = None) -> torch.Tensor:
    """``mat.index_select(0, index)`` for a 2-D ``mat``, the same values. Off the CPU it is a 1-D gather of the
    flattened entries: torch's row gather runs one thread block per row, which for U's rows (d float64, 64 bytes at
    d = 8) copied 19 MB in 163 us on an H200. ``cache``: keeps the flat index of an ``index`` reused every step (a
    masked batch's, in its invariant cache)."""
    if mat.device.type == "cpu" or mat.dim() != 2 or not mat.is_contiguous():
        return mat.index_select(0, index)
    return flat_rows(mat, index, cache)


def flat_rows(mat: torch.Tensor, index: torch.Tensor, cache: dict | None = None) -> torch.Tensor:
    """Rows ``index`` of the contiguous 2-D ``mat`` as one gather of its flattened entries (:func:`take_rows`)."""
    d = int(mat.shape[1])
    key = ("_flat_rows", id(index), d)
    hit = cache.get(key) if cache is not None else None
    if hit is not None and hit[0] is index:
        flat = hit[1]
    else:
        wide = index.to(torch.int32 if mat.numel() < 2 ** 31 else torch.int64)
        flat = (wide[:, None] * d + torch.arange(d, dtype=wide.dtype, device=wide.device)).reshape(-1)
        if cache is not None:
            cache[key] = (index, flat)
    return mat.reshape(-1).index_select(0, flat).view(-1, d)


def user_segments(rows: torch.Tensor, n_rows: int, known: torch.Tensor | None = None) -> torch.Tensor | None:
    """Offsets ``[n_rows + 1]`` of each row's ratings when ``rows`` is grouped by row in ascending order (a batch drawn
    from ratings sorted by user), where the CPU kernels may run (:func:`kernels_for`); None otherwise. ``known``: the
    batch's own offsets (``UserBatch.row_offsets``), when its sampler built it from them."""
    if rows.device.type != "cpu" or not lowrank_numba.available(int(rows.numel())):
        return None
    if known is not None:
        return known
    if rows.numel() > 1 and not bool((rows[1:] >= rows[:-1]).all()):
        return None
    seg = torch.zeros(n_rows + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(rows, minlength=n_rows), 0, out=seg[1:])
    return seg


def kernels_for(seg: torch.Tensor | None, u: torch.Tensor) -> bool:
    """Whether the fused CPU kernels (:mod:`.lowrank_numba`) compute this batch: grouped rows, U on the CPU, and their
    row sums are torch's here (the same numbers as the torch path, bit for bit)."""
    return seg is not None and u.device.type == "cpu" and lowrank_numba.exact(torch.float64, int(u.shape[1]))


@dataclass
class _RowTerms:
    """What recomputes the per-user gradient rows g_uj of a user-level batch (module docstring): U, each rating's item
    and y, the users' rating offsets, the errors e, sum_j u_j y_uj and n_u^(-1/2) per user, and q_u."""

    U: torch.Tensor
    items: torch.Tensor
    seg: torch.Tensor
    y: torch.Tensor
    e: torch.Tensor
    p_sum: torch.Tensor
    inv_sqrt: torch.Tensor
    q: torch.Tensor


@dataclass
class DeferredRows(_RowTerms):
    """The per-user gradient rows of a CPU kernel batch, not written out: what :func:`.lowrank_numba.gradient_terms`
    read and left (q_u, the ratings sorted by item range), from which :meth:`clipped_sum` recomputes each row, bit for
    bit, as it scatters it on all threads. Recomputing took about the time that writing the rows and reading them back
    did (measured at ML-1M, q = 0.3), without an ``[R, d]`` float64 array (1.3 GB for a 20M-rating batch at d = 8);
    :meth:`materialize` gives that tensor."""

    rows: torch.Tensor = None  # type: ignore[assignment] # the batch row of each rating
    order: torch.Tensor = None  # type: ignore[assignment] # the ratings sorted by the scatter's item ranges
    bounds: torch.Tensor = None  # type: ignore[assignment]

    def materialize(self) -> torch.Tensor:
        rows, _, _ = lowrank_numba.gradient_rows(self.U.numpy(), self.items.numpy(), self.seg.numpy(), self.y.numpy(),
                                                 self.e.numpy(), self.p_sum.numpy(), self.inv_sqrt.numpy(), False,
                                                 lowrank_numba.rank_tag(self.U.shape[1]),
                                                 lowrank_numba.lane_tag(torch.float64), lowrank_numba.user_chunks(self.seg))
        return torch.from_numpy(rows)

    def clipped_sum(self, factor: torch.Tensor) -> torch.Tensor:
        """sum_u factor_u g_u as ``[M, d]`` float64, each item's sum in rating order (``index_add_``'s numbers)."""
        m, d = self.U.shape
        return torch.from_numpy(lowrank_numba.scatter_clipped(
            self.U.numpy(), self.items.numpy(), self.rows.numpy(), self.y.numpy(), self.e.numpy(), self.p_sum.numpy(),
            self.inv_sqrt.numpy(), self.q.numpy(), factor.numpy(), int(m), lowrank_numba.rank_tag(d),
            self.order.numpy(), self.bounds.numpy()))


def per_user_gradients(users: torch.Tensor, items: torch.Tensor, y: torch.Tensor, u: torch.Tensor, n_users: int,
                       e: torch.Tensor | None = None, forward: tuple[torch.Tensor | None, torch.Tensor] | None = None,
                       seg: torch.Tensor | None = None, norm: int = 2, deferred: bool = False,
                       item_counts: torch.Tensor | None = None, inv_sqrt: torch.Tensor | None = None,
                       gather_cache: dict | None = None) -> tuple[torch.Tensor | DeferredRows, torch.Tensor]:
    """Rows g_uj (one per rating, module docstring) of each user's gradient dL_u/dU, and the per-user norms ``[N]``
    (``norm`` = 2: Frobenius; 1: the sum of |entries|).

    ``e``: the errors e_ui = y_ui - f_ui when the caller has them (possibly scaled per user); computed from U otherwise.
    ``forward``: (u_j per rating or None, sum_j u_j y_uj per user) when the caller's forward computed them (the same
    numbers). ``seg``: the users' rating offsets (:func:`user_segments`): with ``e`` and ``forward``, one fused CPU
    pass (:func:`.lowrank_numba.gradient_terms`), the same numbers; there ``deferred`` returns the rows as
    :class:`DeferredRows` (``item_counts``: its threads' load), not as a tensor. ``inv_sqrt``: n_u^(-1/2) per user in
    U's dtype when the caller knows the counts (the same numbers as the bincount's; no host wait on a GPU).
    ``gather_cache``: :func:`take_rows`'s.
    """
    if e is not None and forward is not None and kernels_for(seg, u):
        inv_sqrt = (seg[1:] - seg[:-1]).to(u.dtype).clamp_min(1.0).rsqrt()  # the counts, as bincount gives them
        chunks = lowrank_numba.user_chunks(seg)
        out = owner = order = bounds = None
        if deferred:  # the ratings sorted by item range for the scatter's threads (item_counts: their load only)
            counts = item_counts if item_counts is not None else torch.ones(u.shape[0], dtype=torch.int64)
            owner = lowrank_numba.item_owner(counts, chunks.size - 1)
            order = torch.empty(items.numel(), dtype=torch.int64)
            bounds = torch.empty(chunks.size - 1, chunks.size, dtype=torch.int64)
        else:
            out = torch.empty(items.numel(), u.shape[1], dtype=torch.float64)
        q, l2, l1 = lowrank_numba.gradient_terms(
            u.numpy(), items.numpy(), seg.numpy(), y.numpy(), e.numpy(), forward[1].numpy(), inv_sqrt.numpy(), norm == 1,
            lowrank_numba.rank_tag(u.shape[1]), lowrank_numba.lane_tag(torch.float64), chunks,
            None if out is None else out.numpy(), owner, *(None if t is None else t.numpy() for t in (order, bounds)))
        rows = out if out is not None else DeferredRows(u, items, seg, y, e, forward[1], inv_sqrt, torch.from_numpy(q),
                                                        rows=users, order=order, bounds=bounds)
        return rows, torch.from_numpy(l1) if norm == 1 else torch.from_numpy(l2).sqrt()
    y = y.to(u.dtype)  # (the kernel widens each y itself: the same numbers without a float64 copy of y)
    if forward is None or forward[0] is None:
        ui = take_rows(u, items, gather_cache)
        p_sum = torch.zeros(n_users, u.shape[1], dtype=u.dtype, device=u.device).index_add_(0, users, ui * y[:, None])
    else:
        ui, p_sum = forward
    if inv_sqrt is None:
        inv_sqrt = torch.bincount(users, minlength=n_users).to(u.dtype).clamp_min(1.0).rsqrt()
    p, w = p_sum * inv_sqrt[:, None], inv_sqrt.index_select(0, users)
    p_rows = take_rows(p, users, gather_cache)
    if e is None:
        e = y - ((ui * p_rows).sum(1) - (ui * ui).sum(1) * y * w)
    q = torch.zeros_like(p).index_add_(0, users, ui * e[:, None])
    # -2 [e (p_u - 2 u_j y w) + q_u y w], in place, each operation the same as written out
    yw = (y * w)[:, None]
    rows = p_rows.sub_(torch.mul(ui, 2.0).mul_(yw)).mul_(e[:, None])
    rows.add_(take_rows(q, users, gather_cache).mul_(yw)).mul_(-2.0)
    if norm == 1:
        return rows, torch.zeros(n_users, dtype=u.dtype, device=u.device).index_add_(0, users, rows.abs().sum(1))
    norms = torch.zeros(n_users, dtype=u.dtype, device=u.device).index_add_(0, users, (rows * rows).sum(1)).sqrt()
    return rows, norms


def clipped_sum(users: torch.Tensor, items: torch.Tensor, rows: torch.Tensor, norms: torch.Tensor, clip: float,
                n_items: int) -> torch.Tensor:
    """sum_u clip(g_u, C) as an ``[M, d]`` matrix: each user's rows scaled by min(1, C / ||g_u||_F)."""
    scale = torch.clamp(clip / norms.clamp_min(1e-30), max=1.0)
    return torch.zeros(n_items, rows.shape[1], dtype=rows.dtype, device=rows.device).index_add_(0, items, rows * scale[users][:, None])


@dataclass
class DeferredRowsTriton(_RowTerms):
    """The per-user gradient rows of a GPU batch (:mod:`.lowrank_triton`), not written out: what
    :func:`.lowrank_triton.gradient_norms` read and left (q_u), from which :meth:`clipped_sum` recomputes each row with
    the same jit helper as it adds it into the gradient."""

    row_mask: torch.Tensor | None = None

    def _users(self) -> torch.Tensor:
        """The row of each rating, from the offsets."""
        return torch.repeat_interleave(torch.arange(self.seg.numel() - 1, device=self.seg.device), self.seg.diff())

    def materialize(self) -> torch.Tensor:
        """The rows ``[R, d]`` float64: :func:`per_user_gradients`'s torch path at the same e and n_u^(-1/2) (its p_u and
        q_u summed again, equal to the kernels' to float64 rounding)."""
        return per_user_gradients(self._users(), self.items, self.y, self.U, int(self.seg.numel()) - 1, self.e,
                                  inv_sqrt=self.inv_sqrt)[0]

    def clipped_sum(self, factor: torch.Tensor) -> torch.Tensor:
        """sum_u factor_u g_u as ``[M, d]`` float64 (atomic adds: the order of each item's sum is not fixed); on the
        torch path from :meth:`materialize` where the kernel fails (:func:`.lowrank_triton.guarded`)."""
        out = lowrank_triton.guarded(lambda: lowrank_triton.scatter_clipped(
            self.U, self.items, self.seg, self.y, self.e, self.p_sum, self.inv_sqrt, self.q, factor, self.row_mask))
        if out is not None:
            return out
        rows = self.materialize() * factor.double().index_select(0, self._users())[:, None]
        return torch.zeros(self.U.shape, dtype=torch.float64, device=self.U.device).index_add_(0, self.items, rows)


class _ExplicitGradient(torch.autograd.Function):
    """The surrogate's value forward; backward, dL/dU as the explicit per-user rows summed in float64 (the same numbers
    the mechanisms' per-user norms are computed from), cast to U's dtype. ``clipped``: the clip's (rows, per-user
    factor) at exactly these residuals (:meth:`LowRankPNBM.stash_clipped_rows`), else None."""

    @staticmethod
    def forward(ctx, U, value, rows, items, y, residuals, n_rows, seg, clipped):  # type: ignore[override]
        ctx.save_for_backward(U.detach(), rows, items, y, residuals)
        ctx.n_rows, ctx.seg, ctx.clipped = n_rows, seg, clipped
        return value.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        U, rows, items, y, residuals = ctx.saved_tensors
        if ctx.clipped is None:  # no rows stashed by the clip: compute them at the (scaled) residuals
            g, factor = per_user_gradients(rows, items, y.double(), U.double(), ctx.n_rows, -residuals.double())[0], None
        else:
            g, factor = ctx.clipped
        if isinstance(g, (DeferredRows, DeferredRowsTriton)):  # a kernel's rows (the clip stashes them with its factors)
            out = g.clipped_sum(factor)
        else:
            if factor is not None:  # each rating's row times its user's factor, then summed per item
                g = g * factor.index_select(0, rows)[:, None]
            out = torch.zeros(U.shape, dtype=torch.float64, device=U.device).index_add_(0, items, g)
        return (out * grad.double()).to(U.dtype), None, None, None, None, None, None, None, None


# ----------------------------------------------------------------------------------------------- model
@dataclass
class _BatchTerms:
    """What a batch's Eq. (2) terms read from the data and r_bar (no U): its history and the residuals."""

    rows: torch.Tensor  # history: batch row of each rating
    items: torch.Tensor
    y: torch.Tensor  # y of each history rating
    w: torch.Tensor  # n_u^(-1/2) per batch row
    y_target: torch.Tensor  # y at the batch targets
    targets_are_history: bool  # user-level batch: the targets ARE the history, in the same order
    pred_base: torch.Tensor  # r_bar_i + b_u (+ w_u . phi_i with public item features) at the batch targets
    target: torch.Tensor  # the clamped training target r_bar_i + b_u + y_ui (+ w_u . phi_i) at the batch targets
    seg: torch.Tensor | None = None  # user level, CPU: each row's rating offsets (user_segments), for the kernels


@dataclass
class _UserTerms:
    """The part of the terms that is the same wherever a user sits in a batch: b_u and n_u^(-1/2) per row, y before
    the feature weights per rating, and each row's ridge system of the feature weights (None without features)."""

    b: torch.Tensor
    w: torch.Tensor
    y0: torch.Tensor
    system: tuple[torch.Tensor, torch.Tensor] | None


class LowRankPNBM(BindsHistory, BaseModel):
    """PNBM whose similarity is S = U U^T (module docstring): ``model=pnbm_lowrank``.

    Args:
        n_items: M. rank: d (U is M x d). init_std: U_0 ~ N(0, init_std^2) entrywise (seeded by ``seed``,
        data-independent). clamp_r: Gamma_r, the clamp of a residual. beta_p: damping of the user's own offset b_u.
        item_features: ``true`` | ``false`` | ``auto`` (on when the data has a public catalogue attached): each user's
        own ridge weights on the public item features (module docstring). feature_reg: lambda of that ridge.
        device: where U is initialised.
    """

    task = "rating"
    name = "PNBM"
    gradient_reduction = "mean"  # mechanisms divide the clipped, noised sum by q N (module docstring)
    masked_batches = True  # p_u and g_u read u's ratings only; e_u = 0 gives q_u = 0 and rows of exactly 0

    def __init__(self, n_items: int, rank: int = 8, init_std: float = 0.03, clamp_r: float = 1.0, beta_p: float = 5.0,
                 item_features: bool | str = False, feature_reg: float = 10.0, seed: int = 0,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        if int(rank) < 1:
            raise ConfigError(f"model.rank (d of S = U U^T) must be >= 1, got {rank}")
        if not (clamp_r > 0 and beta_p >= 0 and init_std > 0):
            raise ConfigError(f"model.similarity=lowrank needs clamp_r > 0, beta_p >= 0, init_std > 0 "
                              f"(got {clamp_r}, {beta_p}, {init_std})")
        self.n_items, self.rank = int(n_items), int(rank)
        self.clamp_r, self.beta_p, self.init_std = float(clamp_r), float(beta_p), float(init_std)
        if not feature_reg > 0:
            raise ConfigError(f"model.feature_reg={feature_reg} must be > 0 (the ridge of each user's feature weights)")
        self.item_features = check_item_features(item_features, "model.item_features")
        self.feature_reg = float(feature_reg)
        self.features_ = None  # the public item features bound with the data (bind)
        gen = torch.Generator().manual_seed(int(seed))  # drawn on the CPU: the same U_0 on every device
        # float64 U: the per-user rows are summed in float64 and the noise is added to that sum before any rounding
        # (a float32 gradient would round the clipped sum first; M x rank numbers, so the cost is small)
        init = torch.randn(self.n_items, self.rank, generator=gen, dtype=torch.float64) * self.init_std
        self.U = nn.Parameter(init.to(device or "cpu"))
        self.register_buffer("item_means", torch.zeros(self.n_items, device=self.U.device))
        self._predict_cache: dict = {}

    # ---------------------------------------------------------------- set-up
    def bind(self, train: Ratings) -> "LowRankPNBM":
        """Bind the histories and resolve the public item features the model reads (``item_features``)."""
        super().bind(train)
        self.features_ = resolve_item_features(self.item_features, train, "model.item_features")
        if train.device.type == "cpu" and lowrank_numba.available(len(train)):
            lowrank_numba.prefer_openmp()  # before any parallel kernel fixes numba's threading layer
        return self

    def public_item_features(self) -> str | None:
        """The privacy report's statement of the public item features read (None without them)."""
        return public_features_text(self.features_, self.feature_reg, "; U learns what they leave")

    def _user_terms(self, rows: torch.Tensor, items: torch.Tensor, values: torch.Tensor, n_rows: int) -> _UserTerms:
        """The :class:`_UserTerms` of the ratings (rows, items, values) for the current r_bar."""
        b, y = user_residuals(rows, items, values, self.item_means, n_rows, self.beta_p, self.clamp_r)
        w = torch.bincount(rows, minlength=n_rows).float().clamp_min(1.0).rsqrt()
        system = None if self.features_ is None else feature_systems(rows, items, y, self.features_, self.feature_reg, n_rows)
        return _UserTerms(b, w, y, system)

    def _feature_part(self, ut: _UserTerms, rows: torch.Tensor, items: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(y per rating: what the rows' own feature weights leave, clamped; the weights w_u per row; w_u . phi_i per
        rating), or (y0, None, None) without features. The solve runs on the rows as given: LAPACK's rounding of one
        row's solve depends on its place in the batch (:meth:`_source_features` solves every user once, in place)."""
        if ut.system is None:
            return ut.y0, None, None
        wf = torch.linalg.solve(ut.system[0], ut.system[1].unsqueeze(-1)).squeeze(-1)
        content = self._content(wf, rows, items)
        return (ut.y0 - content).clamp(-self.clamp_r, self.clamp_r), wf, content

    def _content(self, w: torch.Tensor | None, rows: torch.Tensor, items: torch.Tensor) -> torch.Tensor | None:
        """w_u . phi_i for the pairs (rows, items), None without features."""
        if w is None or self.features_ is None:
            return None
        phi = self.features_.matrix.to(w.device, w.dtype)
        if (w.device.type == "cpu" and lowrank_numba.available(int(rows.numel()))
                and lowrank_numba.exact(w.dtype, int(w.shape[1]))):  # the same numbers, one pass
            return torch.from_numpy(lowrank_numba.feature_dots(w.contiguous().numpy(), phi.contiguous().numpy(),
                                                               rows.numpy(), items.numpy(), lowrank_numba.width(w.dtype)))
        return w.index_select(0, rows).mul_(phi.index_select(0, items)).sum(1)

    # --------------------------------------------------------------- training
    def _terms(self, batch: UserBatch) -> _BatchTerms:
        """The batch's data terms for the current r_bar (cached on the batch, keyed by r_bar's version)."""
        key = (self.item_means._version, self.item_means.data_ptr(), self.beta_p, self.clamp_r)
        cache = batch.invariant_cache  # (a masked batch: its full batch's, the same rows every step)
        hit = cache.get("_lowrank_terms")
        if hit is not None and hit[0] == key and hit[1] is batch.values:
            return hit[2]
        if not batch.has_history:
            raise ConfigError("model.similarity=lowrank reads each sampled user's whole history: the batch has none")
        n_rows = int(batch.users.numel())
        if batch.is_user_level():  # user level: the targets are the whole history
            if batch.source is None:
                ut = self._user_terms(batch.rows, batch.items, batch.values, n_rows)
                y, _, content = self._feature_part(ut, batch.rows, batch.items)
                pred_base, target = self._bases(self._base(batch, ut.b), y, content)
                w = ut.w
            else:  # every rating's terms from the source's (per-user sums in its order): gathered, the same bits
                y_all, bases = self._source_ratings(batch.source)
                y, both = batch.gather(y_all), batch.gather(bases)
                pred_base, target = both[:, 0], both[:, 1]
                w = self._source_terms(batch.source).w.index_select(0, batch.users)
            terms = _BatchTerms(batch.rows, batch.items, y, w, y, True, pred_base, target, user_segments(batch.rows, n_rows, batch.row_offsets))
        else:  # rating level: the history from the CSR block (x = r - r_bar, built from this model's live r_bar)
            crow = batch.x.crow_indices()
            rows = torch.repeat_interleave(torch.arange(n_rows, device=crow.device), crow[1:] - crow[:-1])
            items = batch.x.col_indices()
            ut = self._user_terms(rows, items, batch.x.values() + self.item_means[items], n_rows)
            y, wf, _ = self._feature_part(ut, rows, items)
            content = self._content(wf, batch.rows, batch.items)
            # the targets' residuals, as the history's (clamp, then the feature weights' part, clamp)
            y_t = (batch.values.double() - self.item_means.double()[batch.items]
                   - ut.b.double()[batch.rows]).clamp(-self.clamp_r, self.clamp_r).float()
            if content is not None:
                y_t = (y_t - content).clamp(-self.clamp_r, self.clamp_r)
            terms = _BatchTerms(rows, items, y, ut.w, y_t, False, *self._bases(self._base(batch, ut.b), y_t, content))
        cache["_lowrank_terms"] = (key, batch.values, terms)
        return terms

    def _base(self, batch: UserBatch, b: torch.Tensor) -> torch.Tensor:
        return self.item_means.index_select(0, batch.items) + b.index_select(0, batch.rows)

    @staticmethod
    def _bases(base: torch.Tensor, y: torch.Tensor, content: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(what f is added to in a prediction, the training target): r_bar_i + b_u (+ w_u . phi_i), and
        r_bar_i + b_u + y_ui (+ w_u . phi_i), in that order of additions."""
        if content is None:
            return base, base + y
        return base + content, base + y + content

    def _source_ratings(self, train: Ratings) -> tuple[torch.Tensor, torch.Tensor]:
        """(y, [R, 2] prediction base and training target) of every rating in ``train`` (:meth:`_bases`), cached with
        :meth:`_source_features`: a user-level step gathers its ratings' instead of recomputing them (the two bases
        side by side: one gather)."""
        y, _, content = self._source_features(train)
        hit = self._predict_cache.get("ratings")
        if hit is not None and hit[0] is y:
            return hit[1]
        b = self._source_terms(train).b
        base = self.item_means.index_select(0, train.items) + b.index_select(0, train.users)
        out = (y, torch.stack(self._bases(base, y, content), 1))
        self._predict_cache["ratings"] = (y, out)
        return out

    def _source_terms(self, train: Ratings) -> _UserTerms:
        """Every user's :class:`_UserTerms` in ``train`` (rows = users), cached per r_bar version: they read r_bar and
        the user's own ratings only, so a step gathers its users' instead of recomputing them."""
        key = (self.item_means._version, self.item_means.data_ptr(), self.beta_p, self.clamp_r, self.feature_reg)
        hit = self._predict_cache.get("terms")
        if hit is not None and hit[0] is train.values and hit[1] is train.users and hit[2] == key:
            return hit[3]
        terms = self._user_terms(train.users, train.items, train.values, train.n_users)
        self._predict_cache["terms"] = (train.values, train.users, key, terms)
        return terms

    def _source_features(self, train: Ratings) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """:meth:`_feature_part` of every rating in ``train`` (one batched solve over all users, rows = users), cached
        with :meth:`_source_terms`. A step gathers its users' y and w_u . phi_i from it: at q = 1 the batch IS this
        solve's input, so the bits are those of a per-batch solve; below q = 1 each user's weights no longer depend on
        who else was sampled (LAPACK rounds a system by its place in the batch)."""
        ut = self._source_terms(train)
        hit = self._predict_cache.get("features")
        if hit is not None and hit[0] is ut:
            return hit[1]
        out = self._feature_part(ut, train.users, train.items)
        self._predict_cache["features"] = (ut, out)
        return out

    def _f(self, batch: UserBatch, terms: _BatchTerms, U: torch.Tensor) -> torch.Tensor:
        """f_ui at the batch targets (module docstring), differentiable in U (except from the fused CPU kernel of a
        user-level batch, whose gradient is the explicit one of :meth:`surrogate_loss`, never autograd's). Every target
        is in its user's history."""
        n_rows = int(batch.users.numel())
        if terms.targets_are_history and lowrank_triton.runs(U, batch.row_offsets):  # GPU: one program per user
            out = lowrank_triton.guarded(lambda: lowrank_triton.forward_sums(
                U.detach(), terms.items, batch.row_offsets, terms.y, terms.w, batch.row_mask))
            if out is not None:
                batch.cache["_forward_sums"] = (weakref.ref(U), U._version, terms, None, out[0])
                return out[1]
        if terms.targets_are_history and kernels_for(terms.seg, U):  # one pass per user (lowrank_numba), same numbers
            Ud = U.detach()
            sq = (Ud * Ud).sum(1)
            p_sum, f = lowrank_numba.forward_sums(Ud.numpy(), terms.items.numpy(), terms.seg.numpy(), terms.y.numpy(),
                                                  terms.w.numpy(), sq.numpy(), lowrank_numba.rank_tag(Ud.shape[1]),
                                                  lowrank_numba.lane_tag(torch.float64), lowrank_numba.user_chunks(terms.seg))
            p_sum = torch.from_numpy(p_sum)
            batch.cache["_forward_sums"] = (weakref.ref(U), U._version, terms, None, p_sum)
            return torch.from_numpy(f)
        # index_select, not U[items]: its backward is index_add_, bit-reproducible across CPU threads (advanced
        # indexing's backward, an accumulating index_put_, is not)
        cache = batch.invariant_cache  # (the flat gather indices of a masked batch's fixed rows)
        ui = take_rows(U, batch.items, cache)
        hist = ui if terms.items is batch.items else U.index_select(0, terms.items)
        p_sum = torch.zeros(n_rows, U.shape[1], dtype=U.dtype, device=U.device).index_add_(0, terms.rows,
                                                                                            hist * terms.y[:, None])
        if terms.targets_are_history:  # the gradient is explicit (surrogate_loss), not autograd through f: it reuses
            # these sums, and |u_i|^2 per item is each rating's own row sum, bit for bit
            batch.cache["_forward_sums"] = (weakref.ref(U), U._version, terms, ui.detach(), p_sum.detach())
            sq = (U * U).sum(1).index_select(0, batch.items)
        else:
            sq = (ui * ui).sum(1)
        p = p_sum * terms.w[:, None]
        return (ui * take_rows(p, batch.rows, cache)).sum(1) - sq * terms.y_target * terms.w.index_select(0, batch.rows)

    def batch_predict(self, batch: UserBatch) -> torch.Tensor:
        """r_bar_i + b_u + f_ui at the batch targets (unclipped; differentiable in U). With autograd on, f is kept on
        the batch for the step's ``surrogate_loss`` (used once, only while U is unchanged)."""
        terms = self._terms(batch)
        f = self._f(batch, terms, self.U)
        if torch.is_grad_enabled() and (f.requires_grad or terms.targets_are_history):  # (the CPU kernels' f has no graph)
            batch.cache["_forward_f"] = (weakref.ref(self.U), self.U._version, f)
        return terms.pred_base + f

    def training_targets(self, batch: UserBatch) -> torch.Tensor:
        """The clamped targets r_bar_i + b_u + y_ui: the Trainer's residual is then f_ui - y_ui (module docstring)."""
        terms = self._terms(batch)
        return terms.target

    def surrogate_loss(self, batch: UserBatch, residuals: torch.Tensor) -> torch.Tensor:
        """2 sum e'_ui f_ui with e' = ``residuals`` (f - y, possibly scaled per user) held constant: its gradient in U is
        sum_u (scale_u) dL_u/dU.

        On user-level batches the gradient is the explicit per-user rows (:func:`per_user_gradients`) summed in float64
        (:class:`_ExplicitGradient`): exactly the rows whose norms the mechanisms clip (:meth:`per_user_gradient_rows`,
        float64 too), so a user's clipped contribution stays within C to float64 rounding."""
        hit = batch.cache.pop("_forward_f", None)
        terms = self._terms(batch)
        if hit is not None and hit[0]() is self.U and hit[1] == self.U._version:
            f = hit[2]
        else:
            f = self._f(batch, terms, self.U)
        if not terms.targets_are_history:  # rating-level batches (no per-user clip): autograd
            return 2.0 * (residuals.detach().to(f.dtype) * f).sum()
        value = 2.0 * (residuals.detach().double() * f.detach().double()).sum()
        stash = batch.cache.pop("_clipped_rows", None)  # the clip's own rows and factors (stash_clipped_rows), if current
        clipped = stash[2] if stash is not None and stash[0] is residuals and stash[1] == self.U._version else None
        return _ExplicitGradient.apply(self.U, value, terms.rows, terms.items, terms.y, residuals.detach(),
                                       int(batch.users.numel()), terms.seg, clipped)

    def stash_clipped_rows(self, batch: UserBatch, clipped: torch.Tensor, rows: torch.Tensor, factor: torch.Tensor) -> None:
        """Keep the clip's rows (at the unclipped residuals) and each user's clip factor (float64) for the step's
        ``surrogate_loss`` at exactly ``clipped``: rows are linear in the residuals, so rows times their user's factor
        ARE the gradient rows at ``clipped`` (computed once)."""
        batch.cache["_clipped_rows"] = (clipped, self.U._version, (rows, factor))

    @torch.no_grad()
    def per_user_gradient_rows(self, batch: UserBatch, residuals: torch.Tensor, p: int = 2, deferred: bool = False
                               ) -> tuple[torch.Tensor | DeferredRows, torch.Tensor]:
        """(rows g_uj per target, ||g_u||_p per batch row: p = 2 Frobenius, p = 1 the sum of |entries|) of the gradient
        of ``surrogate_loss`` at ``residuals`` (explicit formula, module docstring); the batch must be user level.
        ``deferred``: the rows as :class:`DeferredRows` where the CPU kernels run (for :meth:`stash_clipped_rows`)."""
        terms = self._terms(batch)
        if not terms.targets_are_history:
            raise ConfigError("per-user gradient norms need user-level batches (every rating of each sampled user): "
                              "set mechanism.unit=user")
        e = -residuals.detach().double()  # e = y - f; float64, as the gradient surrogate_loss releases
        hit = batch.cache.get("_forward_sums")
        fwd = hit[3:] if hit is not None and hit[0]() is self.U and hit[1] == self.U._version and hit[2] is terms else None
        if deferred and fwd is not None and lowrank_triton.runs(self.U, batch.row_offsets):  # GPU: the norms in a kernel
            U, off, inv = self.U.detach(), batch.row_offsets, self._inv_sqrt(batch, always=True)
            out = lowrank_triton.guarded(lambda: lowrank_triton.gradient_norms(U, terms.items, off, terms.y, e, fwd[1],
                                                                               inv, batch.row_mask, p == 1))
            if out is not None:
                return DeferredRowsTriton(U, terms.items, off, terms.y, e, fwd[1], inv, out[0], batch.row_mask), out[1]
        return per_user_gradients(terms.rows, terms.items, terms.y, self.U.detach().double(),
                                  int(batch.users.numel()), e, fwd, terms.seg, p,  # p: the norm's order
                                  deferred, self._item_load() if deferred else None, self._inv_sqrt(batch),
                                  batch.invariant_cache)

    @staticmethod
    def _inv_sqrt(batch: UserBatch, always: bool = False) -> torch.Tensor | None:
        """n_u^(-1/2) per batch row in float64 from the batch's row offsets (a user-level batch's counts), cached with
        them; None without offsets (:func:`per_user_gradients` then counts the rows itself, the same numbers), and on
        the CPU unless ``always`` (the CPU kernels and the bincount cost no host wait there)."""
        off = batch.row_offsets
        if off is None or (off.device.type == "cpu" and not always):
            return None
        hit = batch.invariant_cache.get("_inv_sqrt64")
        if hit is None or hit[0] is not off:
            hit = batch.invariant_cache["_inv_sqrt64"] = (off, (off[1:] - off[:-1]).double().clamp_min(1.0).rsqrt())
        return hit[1]

    def _item_load(self) -> torch.Tensor | None:
        """Ratings per item in the bound training data: only how :class:`DeferredRows` splits the item ids over its
        threads (no number depends on it), once per binding."""
        hit = self._predict_cache.get("item_load")
        if hit is None or hit[0] is not self.history:
            load = None if self.history is None else self.history.item_counts().cpu()
            hit = self._predict_cache["item_load"] = (self.history, load)
        return hit[1]

    def per_example_grad_norms(self, batch: UserBatch, residuals: torch.Tensor, unit: str) -> torch.Tensor:
        """||g_u||_F per batch row (``unit`` = user only: a rating moves its user's b_u, y and p_u)."""
        if unit != "user":
            raise ConfigError("model.similarity=lowrank clips per user (a rating enters its user's b_u and p_u): unit=user")
        return self.per_user_gradient_rows(batch, residuals)[1]

    def gradient_entry_bound(self, residual_bound: float) -> float:
        """No bound: U is unbounded, so no per-entry gradient bound exists (Wang & Tang's Alg. 1 needs the full form)."""
        raise ConfigError("Alg. 1's per-entry gradient bound |G_ij| <= e_max phi / C is the full-S form's: "
                          "add model=pnbm (the full S) to use mechanism=dpsgd_paper")

    # ------------------------------------------------------------- prediction
    def _user_state(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(b_u [N], p_u [N, d], n_u^(-1/2) [N], sorted keys u M + j of the history, y in that order, the feature
        weights w_u [N, F] or None) for the current U and r_bar, cached per version of both."""
        assert self.history is not None
        means_key = (self.item_means._version, self.item_means.data_ptr(), self.U.device)
        key = (self.U._version, self.U.data_ptr(), *means_key)
        hit = self._predict_cache.get("users")
        if hit is not None and hit[0] == key:
            return hit[1]
        h = self.history.to(self.U.device)
        fixed = self._predict_cache.get("fixed")  # U-free terms: computed once per item-means release
        if fixed is None or fixed[0] != means_key:
            ut = self._source_terms(h)
            y, wf, _ = self._source_features(h)
            keys = h.users * self.n_items + h.items
            order = torch.argsort(keys)
            fixed = (means_key, (ut.b, ut.w, keys[order], y[order], wf, y))
            self._predict_cache["fixed"] = fixed
        b, w, keys_sorted, y_sorted, wf, y = fixed[1]
        p, _ = user_aggregates(h.users, h.items, y, self.U.detach(), h.n_users)
        out = (b, p, w, keys_sorted, y_sorted, wf)
        self._predict_cache["users"] = (key, out)
        return out

    @torch.no_grad()
    def predict(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """clip(r_bar_i + b_u + f_ui) over each user's training history (j != i); the fallback for unknown ids."""
        if self.history is None or self.fallback_ is None:
            raise RuntimeError("PNBM.predict called before attach(train)")
        dev = self.U.device
        users, items = users.to(dev), items.to(dev)
        b, p, w, keys, y_sorted, wf = self._user_state()
        uc = users.clamp(0, self.history.n_users - 1)
        ic = items.clamp(0, self.n_items - 1)
        ui = self.U.detach()[ic]
        f = (ui * p[uc]).sum(1)
        if keys.numel():  # a pair that is itself a training rating: drop j = i from the sum (Eq. (2))
            q = uc * self.n_items + ic
            pos = torch.searchsorted(keys, q).clamp_max(keys.numel() - 1)
            rated = keys[pos] == q
            f = f - torch.where(rated, (ui * ui).sum(1) * y_sorted[pos] * w[uc], torch.zeros_like(f))
        content = self._content(wf, uc, ic)
        if content is not None:
            f = f + content
        return self.fallback_.finish(users, items, self.item_means[ic] + b[uc] + f)

