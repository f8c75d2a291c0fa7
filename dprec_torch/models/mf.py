"""Biased matrix factorisation (MF), the model behind DPSGD-MF, DPPS-MF and Gaussian DP-SGD.

    r_hat_ui = clip( mu + b_u + b_i + <p_u, q_i> ),   mu = mu_0 + s * g     (Koren et al. 2009, biased SVD)

``mu`` is the global bias: ``mu_0`` is the midpoint of the public rating scale (never a data statistic) and ``g`` a learned
scalar, scaled by ``s = mu_scale``. The scaling is a preconditioner: every rating of a batch pulls on ``mu``, so in the
mean objective (``gradient_reduction = "mean"``) its curvature is ``s^2``, against ~ n_u / n for a user's parameters;
without it a step size that suits the per-user and per-item parameters makes ``mu`` oscillate and diverge. ``b_u``/``b_i``
are user/item biases and ``p_u``/``q_i`` d-dimensional factors, all ``nn.Embedding`` tables. User factors start at zero
and item factors at N(0, init_std^2): one random side breaks the symmetry, and a user who never appears in a gradient
keeps ``b_u = 0, p_u = 0``.

Training predictions are clipped to ``[r_min, r_max]`` as well (``clip_training_predictions``): the error e_ui =
clip(r_hat_ui) - r_ui then lies in ``[-Delta r, Delta r]``, which bounds each user's log-likelihood for DPPS-MF
(B = Delta r^2 tau), and the gradient of the clipped prediction is the raw one masked by ``lo < r_hat_ui < hi``.

Every example's gradient is e_ui * d r_hat_ui / d theta with (unmasked)
    d/d g = s,  d/d b_u = 1,  d/d b_i = 1,  d/d p_u = q_i,  d/d q_i = p_u,
so per-example gradient norms are closed-form (:meth:`MF.per_example_grad_norms`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from dprec_torch.data.ratings import Ratings, RatingScale
from dprec_torch.errors import ConfigError
from dprec_torch.models.base import BaseModel, check_settings
from dprec_torch.models.batching import UserBatch
from dprec_torch.models.release import fallback_from_state, fallback_state
from dprec_torch.interfaces import MeanFallback

FALLBACKS = ("mean", "model")
UNITS = ("rating", "user")


class MF(BaseModel):
    """Biased MF over ``n_users`` x ``n_items`` with ``dim`` latent factors.

    Args:
        n_users, n_items: sizes of the id space (the runner passes them).
        dim: d, the latent dimension (Wang & Tang Sec. 5.1 grid: 10, 15, 20).
        init_std: item factors q_i ~ N(0, init_std^2); user factors and biases start at 0.
        mu_scale: s in mu = mu_0 + s g (preconditions the global bias; module doc).
        fallback: ``mean`` -- users/items without training ratings get :class:`MeanFallback` (item mean, then global
            mean: statistics of the training data, NOT covered by any mechanism's guarantee); ``model`` -- predictions
            are post-processing of the learned parameters only (ids outside the table use zero vectors and biases).
        clip_training_predictions: clip r_hat to the scale while training too (module doc). seed: seeds the initialisation.
    """

    task = "rating"
    name = "MF"
    dpsgd_perturb_residuals = True
    #: ``lr`` is a per-example step whatever the sampling ratio or dataset size (the dense decay is divided by #units
    #: too; SGLD divides its step by #ratings instead, keeping the posterior)
    gradient_reduction = "mean"
    #: a step reads the batch targets only: rating-level batches skip the history blocks (~10x faster on ML-1M)
    reads_history = False

    def __init__(self, n_users: int, n_items: int, dim: int = 15, init_std: float = 0.1, mu_scale: float = 0.1,
                 fallback: str = "mean", clip_training_predictions: bool = True, seed: int = 0) -> None:
        super().__init__()
        if isinstance(dim, bool) or int(dim) != dim or dim <= 0:
            raise ConfigError(f"model.dim (d) must be a positive integer, got {dim}")
        if not init_std >= 0:
            raise ConfigError(f"model.init_std must be >= 0, got {init_std}")
        if not mu_scale > 0:
            raise ConfigError(f"model.mu_scale must be > 0, got {mu_scale}")
        check_settings(("fallback", fallback, FALLBACKS))
        if n_users <= 0 or n_items <= 0:
            raise ConfigError(f"MF needs n_users > 0 and n_items > 0, got {n_users} and {n_items}")
        self.n_users, self.n_items, self.dim = int(n_users), int(n_items), int(dim)
        self.fallback, self.clip_training_predictions = fallback, bool(clip_training_predictions)
        gen = torch.Generator().manual_seed(int(seed))
        self.mu_scale = float(mu_scale)
        self.global_bias = nn.Parameter(torch.zeros(()))  # g
        self.register_buffer("mu_offset", torch.zeros(()))  # mu_0, the scale midpoint (public)
        self.user_bias = nn.Embedding(self.n_users, 1)
        self.item_bias = nn.Embedding(self.n_items, 1)
        self.user_factors = nn.Embedding(self.n_users, self.dim)
        self.item_factors = nn.Embedding(self.n_items, self.dim)
        with torch.no_grad():
            for table in (self.user_bias, self.item_bias, self.user_factors):
                table.weight.zero_()
            self.item_factors.weight.copy_(torch.randn(self.n_items, self.dim, generator=gen) * float(init_std))
        self.scale_: RatingScale | None = None

    # ---------------------------------------------------------------- set-up
    def attach(self, train: Ratings) -> "MF":
        """BUILD from data (before training): the rating scale (public), mu_0 := its midpoint, the mean fallback if used."""
        self._check_shape(train)
        self.scale_ = train.scale
        with torch.no_grad():
            self.mu_offset.fill_((train.scale.lo + train.scale.hi) / 2)
        self.fallback_ = MeanFallback(train) if self.fallback == "mean" else None
        return self

    def _check_shape(self, train: Ratings) -> None:
        if train.n_items != self.n_items or train.n_users != self.n_users:
            raise ConfigError(f"model has {self.n_users} users x {self.n_items} items but the data has "
                              f"{train.n_users} x {train.n_items}")

    def restore(self, train: Ratings, state: dict) -> "MF":
        """RESTORE what was released (models/release.py) from ``state``; ``train`` is only checked for its id space."""
        self._check_shape(train)
        self.load_state_dict(state)
        return self

    def get_extra_state(self) -> dict:
        scale = None if self.scale_ is None else [float(self.scale_.lo), float(self.scale_.hi)]
        return {"scale": scale, "fallback": fallback_state(self.fallback_)}

    def set_extra_state(self, state: dict) -> None:
        self.scale_ = None if state["scale"] is None else RatingScale(*state["scale"])
        self.fallback_ = fallback_from_state(state["fallback"], self.global_bias.device)

    @property
    def scale(self) -> RatingScale:
        if self.scale_ is None:
            raise RuntimeError("MF used before attach(train)")
        return self.scale_

    # ----------------------------------------------------------------- maths
    @property
    def mu(self) -> torch.Tensor:
        """mu = mu_0 + s g."""
        return self.mu_offset + self.mu_scale * self.global_bias

    def raw(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """mu + b_u + b_i + <p_u, q_i> (unclipped, differentiable)."""
        return (self.mu + self.user_bias(users).squeeze(-1) + self.item_bias(items).squeeze(-1)
                + (self.user_factors(users) * self.item_factors(items)).sum(-1))

    def in_range(self, raw: torch.Tensor) -> torch.Tensor:
        """1 where d clip(r_hat)/d r_hat = 1 (strictly inside the scale, or no training clip), else 0."""
        if not self.clip_training_predictions:
            return torch.ones_like(raw)
        return ((raw > self.scale.lo) & (raw < self.scale.hi)).to(raw.dtype)

    @staticmethod
    def batch_users(batch: UserBatch) -> torch.Tensor:
        """Global user id of every target."""
        return batch.users[batch.rows]

    # --------------------------------------------------------------- training
    def batch_predict(self, batch: UserBatch) -> torch.Tensor:
        """r_hat at the batch targets (clipped to the scale when ``clip_training_predictions``)."""
        r = self.raw(self.batch_users(batch), batch.items)
        return self.scale.clip(r) if self.clip_training_predictions else r

    def surrogate_loss(self, batch: UserBatch, residuals: torch.Tensor) -> torch.Tensor:
        """sum_t e_t m_t r_hat_t, whose gradient is G = sum e_ui d clip(r_hat_ui)/d theta; ``residuals`` (the
        mechanism's clipped/perturbed e_ui) are constants, m_t is :meth:`in_range`."""
        r = self.raw(self.batch_users(batch), batch.items)
        e = residuals.detach() * self.in_range(r.detach())
        return (e * r).sum()

    def visit_penalty(self, batch: UserBatch) -> torch.Tensor:
        """(1/2) sum_t (b_u^2 + b_i^2 + |p_u|^2 + |q_i|^2) over the batch targets t = (u, i): the per-visited-rating
        regulariser of classic SGD-MF (Koren et al. 2009 Eq. (5)); its gradient is (b_u, b_i, p_u, q_i) once per
        visit. Only ``mechanism=none`` reads it (``mechanism.rating_reg``; see mechanisms/sgd.py)."""
        users = self.batch_users(batch)
        return 0.5 * (self.user_bias(users).square().sum() + self.item_bias(batch.items).square().sum()
                      + self.user_factors(users).square().sum() + self.item_factors(batch.items).square().sum())

    @torch.no_grad()
    def batch_visits(self, batch: UserBatch) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(parameter, k) pairs: k bounds, row by row, the curvature of the batch's summed loss sum_t e_t^2 / 2 in
        that parameter's biases: c_u (the targets of user u) for b_u and p_u, c_i for b_i and q_i, s^2 |batch| for g
        (d r_hat / d g = s, every target reads it). For p_u and q_i it counts visits (their curvature is
        c_u |q_i|^2, c_i |p_u|^2). Only ``mechanism.per_rating_step`` reads it: a row's step is at most 1 / k, the
        Newton step of its bias (mechanisms/sgd.py)."""
        users = self.batch_users(batch)
        dtype = self.global_bias.dtype
        c_u = torch.bincount(users, minlength=self.n_users).to(dtype)[:, None]
        c_i = torch.bincount(batch.items, minlength=self.n_items).to(dtype)[:, None]
        c_g = torch.tensor(self.mu_scale**2 * users.numel(), dtype=dtype, device=c_u.device)
        return [(self.global_bias, c_g), (self.user_bias.weight, c_u), (self.user_factors.weight, c_u),
                (self.item_bias.weight, c_i), (self.item_factors.weight, c_i)]

    @torch.no_grad()
    def per_example_grad_norms(self, batch: UserBatch, residuals: torch.Tensor, unit: str) -> torch.Tensor:
        """L2 norm of each example's gradient e * d clip(r_hat)/d theta over ALL parameters.

        ``unit=rating`` -> one norm per target (u, i), with e~ = e m (m = :meth:`in_range`):
            ||g_ui|| = |e~_ui| sqrt(s^2 + 2 + ||p_u||^2 + ||q_i||^2)     (g, b_u, b_i, p_u, q_i)
        ``unit=user`` -> one norm per batch row (user u, all of u's targets in the batch):
            ||g_u||^2 = (1 + s^2) (sum_i e~_ui)^2          (b_u and g)
                      + sum_i e~_ui^2 (1 + ||p_u||^2)      (b_i and q_i: u rates each item once)
                      + ||sum_i e~_ui q_i||^2              (p_u)
        computed with ``index_add_`` over the batch rows (no loop over users).
        """
        if unit not in UNITS:
            raise ConfigError(f"unit must be one of {UNITS}, got '{unit}'")
        users = self.batch_users(batch)
        r = self.raw(users, batch.items)
        e = residuals.to(r.dtype) * self.in_range(r)
        p, q = self.user_factors(users), self.item_factors(batch.items)
        if unit == "rating":
            return e.abs() * torch.sqrt(self.mu_scale**2 + 2.0 + (p * p).sum(-1) + (q * q).sum(-1))
        n_rows = batch.users.numel()
        s = torch.zeros(n_rows, dtype=e.dtype, device=e.device).index_add_(0, batch.rows, e)
        sq = torch.zeros(n_rows, dtype=e.dtype, device=e.device).index_add_(0, batch.rows, e * e)
        v = torch.zeros(n_rows, self.dim, dtype=e.dtype, device=e.device).index_add_(0, batch.rows, e[:, None] * q)
        p_rows = self.user_factors(batch.users)
        norm2 = (1.0 + self.mu_scale**2) * s * s + sq * (1.0 + (p_rows * p_rows).sum(-1)) + (v * v).sum(-1)
        return torch.sqrt(norm2)

    # ------------------------------------------------------- privacy quantities
    def gradient_entry_bound(self, residual_bound: float) -> float:
        """Bound on one gradient entry |e d r_hat/d theta_j|: infinite for MF. The factor entries e_ui q_ik and e_ui p_uk
        are unbounded without a norm projection, so Wang & Tang's per-entry sensitivity does not exist; DPSGD-MF perturbs
        the residuals instead and Gaussian DP-SGD clips per example."""
        return math.inf

    def sgld_prior_precision(self, train: Ratings, batch_ratings: float) -> list[torch.Tensor | None]:
        """Per-parameter divisors h of SGLD's prior term lambda theta / h (Alg. 2 line 5). MF's prior is N(0, 1/lambda) on
        every bias and factor entry and N(mu_0, 1/lambda) on mu itself -- not on g: with mu = mu_0 + s g that is a
        precision lambda s^2 on g, i.e. h_g = 1 / s^2. Data-independent (``train`` and ``batch_ratings`` are unused):
        MF's full-data prior gradient is dense, so Eq. (11)'s correction does not arise."""
        h_g = torch.tensor(1.0 / self.mu_scale**2, device=self.global_bias.device)
        return [h_g if p is self.global_bias else None for p in self.parameters()]

    # ------------------------------------------------------------- prediction
    @torch.no_grad()
    def predict(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """clip(mu + b_u + b_i + <p_u, q_i>), with the configured fallback for unknown users/items."""
        dev = self.global_bias.device
        users, items = users.to(dev).long(), items.to(dev).long()
        ok_u = (users >= 0) & (users < self.n_users)
        ok_i = (items >= 0) & (items < self.n_items)
        u, i = users.clamp(0, self.n_users - 1), items.clamp(0, self.n_items - 1)
        bu = self.user_bias(u).squeeze(-1) * ok_u
        bi = self.item_bias(i).squeeze(-1) * ok_i
        dot = (self.user_factors(u) * self.item_factors(i)).sum(-1) * (ok_u & ok_i)
        out = self.mu + bu + bi + dot
        if self.fallback_ is not None:
            return self.fallback_.finish(users, items, out)
        return self.scale.clip(out)
