"""DP-SGD on a low-rank learned similarity S = U U^T (issue 17, item 3: fewer noised parameters).

A neighbourhood model in PNBM's spirit whose similarity is low rank, so DP-SGD noises M*d numbers per step
instead of M^2 (``model=lowrank_dpsgd``; a fitted predictor on the runner's ``fit_fold`` path, like
``model=noisy_gram``). With the user's residuals y_uj = clamp(r_uj - r~_j - b_u, -Gamma_r, Gamma_r)
(r~: DP item means, b_u: the user's own damped offset, as in :mod:`dprec_torch.predictors.dpals`) and
n_u = |R_u|:

    p_u = n_u^(-1/2) sum_{j in R_u} u_j y_uj,               (the user's aggregate on the shared factors)
    f_ui = u_i . p_u - |u_i|^2 y_ui n_u^(-1/2) [i in R_u]   (= n_u^(-1/2) sum_{j in R_u, j != i} s_ij y_uj, s = U U^T)
    r^_ui = clip(r~_i + b_u + f_ui),   L_u(U) = sum_{i in R_u} (y_ui - f_ui)^2.

Per-user gradient (explicit, batched; checked against autograd in the tests), with e_ui = y_ui - f_ui and
q_u = sum_{i in R_u} e_ui u_i: row j of dL_u/dU is zero unless j in R_u, where

    g_uj = -2 [ e_uj (p_u - 2 u_j y_uj n_u^(-1/2)) + q_u y_uj n_u^(-1/2) ].

So user u's whole gradient is the rows {g_uj : j in R_u}; its Frobenius norm is sqrt(sum_j |g_uj|^2).

DP-SGD (Abadi et al. 2016; Opacus's ``DPOptimizer`` order clip -> sum -> noise -> scale): each step samples
users by Poisson sampling with rate q, clips each sampled user's gradient to Frobenius norm <= C, sums,
adds N(0, (sigma C)^2) to each of the M*d entries, divides by the expected batch size q N and takes the heavy-ball
step v <- momentum v + g~ + weight_decay U, U <- U - lr v (post-processing of the noisy sums). Relation: add/remove
one user's whole profile (each user's contribution to one step is its clipped gradient: sensitivity C).

Budget: the DP item means (Gaussian, L2 sensitivity 1, :func:`release_item_means` with ``count_weight``) get
mu_m = sqrt(mean_fraction) x mu_rdp, i.e. noise multiplier 1 / mu_m at q = 1, where mu_rdp is the largest mu whose
single Gaussian release (multiplier 1/mu, q = 1) Opacus's RDP accountant puts at eps <= target (RDP of an
unsampled Gaussian is alpha mu^2 / 2, so the means take the share ``mean_fraction`` of it and any share < 1 leaves
room); sigma of the T DP-SGD steps is then the smallest (bisection) for which the same accountant gives
eps <= target for the whole history [(1/mu_m, q = 1, 1 step), (sigma, q, T steps)]. The reported epsilon is
that accountant's figure. ``accountant=prv`` runs the same calibration with Opacus's PRV accountant (numerical
composition of privacy random variables, Gopi et al. 2021, whose epsilon is an upper bound within its error
``eps_error``): about 5 % less noise than RDP for the same (eps, delta).

Joint DP (billboard model): released are r~, g and U (item side); b_u and p_u are computed by each user from
U and their own ratings, and a prediction for u reads u's ratings.
"""

from __future__ import annotations

import logging
import math
from functools import lru_cache
from typing import Any

import torch

from dprec_torch.data.ratings import Ratings
from dprec_torch.errors import ConfigError, DataError
from dprec_torch.models.pnbm_lowrank import clipped_sum, per_user_gradients, user_aggregates  # noqa: F401 (the equations: one copy)
from dprec_torch.predictors.content import (JOINT_DP_SUFFIX, check_item_features, feature_weights, public_features_text,
                                            resolve_item_features)
from dprec_torch.predictors.base import BasePredictor, query_pairs
from dprec_torch.predictors.release import fallback_release
from dprec_torch.predictors.dpals import user_residuals
from dprec_torch.privacy.budget import check_epsilon_delta
from dprec_torch.privacy.gaussian_release import (
    RELATION_TEXT,
    check_popularity,
    install_private_fallback,
    item_stats_sensitivity,
    release_item_means,
)
from dprec_torch.privacy.opacus_accounting import ACCOUNTANT_TEXT, ACCOUNTANTS, OpacusAccountant
from dprec_torch.seeding import noise_generator

log = logging.getLogger(__name__)


def _rdp_epsilon(history: tuple[tuple[float, float, int], ...], delta: float, accountant: str = "rdp") -> float:
    acc = OpacusAccountant(accountant)
    for sigma, q, steps in history:
        acc.step(sigma, q, steps=steps)
    return acc.get_epsilon(delta)


@lru_cache(maxsize=256)
def rdp_total_mu(epsilon: float, delta: float, accountant: str = "rdp") -> float:
    """The largest mu (bisection, relative tolerance 1e-4, rounded down) with the accountant's epsilon of one
    unsampled Gaussian release with noise multiplier 1/mu <= ``epsilon``."""
    lo, hi = 1e-3, 1.0
    while _rdp_epsilon(((1.0 / hi, 1.0, 1),), delta, accountant) <= epsilon:
        lo, hi = hi, hi * 2.0
    while _rdp_epsilon(((1.0 / lo, 1.0, 1),), delta, accountant) > epsilon:
        lo, hi = lo / 2.0, lo
    while hi / lo > 1.0001:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if _rdp_epsilon(((1.0 / mid, 1.0, 1),), delta, accountant) <= epsilon else (lo, mid)
    return lo


@lru_cache(maxsize=256)  # a pure function of its numbers; the audit refits the same plan many times
def sgd_noise_multiplier(epsilon: float, delta: float, mean_multiplier: float, sampling_ratio: float, steps: int,
                         accountant: str = "rdp") -> float:
    """The smallest sigma (bisection, relative tolerance 1e-3, rounded up) with the accountant's epsilon of
    [(mean_multiplier, q = 1, 1 step), (sigma, q, steps)] <= ``epsilon``."""
    def eps_of(sigma: float) -> float:
        acc = OpacusAccountant(accountant)
        acc.step(mean_multiplier, 1.0)
        acc.step(sigma, sampling_ratio, steps=steps)
        return acc.get_epsilon(delta)

    lo, hi = 1e-2, 1.0
    while eps_of(hi) > epsilon:
        lo, hi = hi, hi * 2.0
        if hi > 1e5:
            raise ConfigError(f"lowrank_dpsgd: no noise multiplier reaches epsilon={epsilon} after the item means "
                              "(lower mean_fraction or steps)")
    while hi / lo > 1.001:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if eps_of(mid) <= epsilon else (mid, hi)
    return hi


class LowRankDPSGD(BasePredictor):
    """DP-SGD with per-user clipping on S = U U^T (module docstring).

    Args:
        epsilon, delta: target of the whole run (``inf``: same training, no noise, no clipping bound on the claim).
        dim: d. steps: T. sampling_ratio: q (Poisson, per user). clip: C (per-user Frobenius norm). lr, weight_decay,
        momentum: the SGD step (heavy ball). clamp_r: Gamma_r. beta_p: user-offset damping. init_scale: RMS entry of the random U_0 (seeded,
        data-independent). mean_fraction: share of mu^2 for the item means. mean_prior_std, count_weight,
        mean_popularity_alpha/share (:func:`release_item_means`'s popularity re-weighting, inside the same mu): their
        release options. accountant: ``rdp`` or ``prv`` (Opacus). seed: noise, sampling and init seed (None: secret, drawn from the OS entropy source).
    """

    name = "lowrank_dpsgd"
    task = "rating"
    relation = "user"

    def __init__(
        self,
        epsilon: float = 1.0,
        delta: float = 1e-6,
        dim: int = 8,
        steps: int = 200,
        sampling_ratio: float = 0.1,
        clip: float = 1.0,
        lr: float = 1.0,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        clamp_r: float = 1.0,
        beta_p: float = 5.0,
        init_scale: float = 0.1,
        mean_fraction: float = 0.5,
        mean_prior_std: float = 0.5,
        mean_popularity_alpha: float = 0.0,
        mean_popularity_share: float = 0.1,
        count_weight: float | None = 0.5,
        accountant: str = "rdp",
        item_features: bool | str = False,
        feature_reg: float = 10.0,
        seed: int | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(device)
        self.epsilon, self.delta = check_epsilon_delta(epsilon, delta, "lowrank_dpsgd")
        if int(dim) < 1 or int(steps) < 1 or not 0 < sampling_ratio <= 1:
            raise ConfigError(f"lowrank_dpsgd: need dim >= 1, steps >= 1, 0 < sampling_ratio <= 1 (got {dim}, {steps}, {sampling_ratio})")
        if not (clip > 0 and math.isfinite(clip) and lr > 0 and weight_decay >= 0 and clamp_r > 0 and beta_p >= 0 and init_scale > 0):
            raise ConfigError("lowrank_dpsgd: need finite clip > 0, lr > 0, weight_decay >= 0, clamp_r > 0, beta_p >= 0, init_scale > 0")
        if not 0 <= momentum < 1:
            raise ConfigError(f"lowrank_dpsgd: momentum must be in [0, 1), got {momentum}")
        if not 0 < mean_fraction < 1:
            raise ConfigError(f"lowrank_dpsgd: mean_fraction must be in (0, 1), got {mean_fraction}")
        if accountant not in ACCOUNTANTS:
            raise ConfigError(f"lowrank_dpsgd: accountant={accountant!r}; use one of {ACCOUNTANTS}")
        self.dim, self.steps, self.sampling_ratio, self.clip = int(dim), int(steps), float(sampling_ratio), float(clip)
        self.lr, self.weight_decay, self.clamp_r, self.beta_p = float(lr), float(weight_decay), float(clamp_r), float(beta_p)
        self.momentum = float(momentum)
        self.init_scale, self.mean_fraction, self.mean_prior_std = float(init_scale), float(mean_fraction), float(mean_prior_std)
        check_popularity(mean_popularity_alpha, mean_popularity_share)
        self.mean_popularity_alpha, self.mean_popularity_share = float(mean_popularity_alpha), float(mean_popularity_share)
        self.count_weight = None if count_weight is None else float(count_weight)
        item_stats_sensitivity("user", "gaussian", self.count_weight)  # validates gamma
        if not feature_reg > 0:
            raise ConfigError(f"lowrank_dpsgd: feature_reg={feature_reg} must be > 0 (the ridge of each user's feature weights)")
        self.item_features, self.feature_reg = check_item_features(item_features, "lowrank_dpsgd"), float(feature_reg)
        self.accountant, self.seed = accountant, None if seed is None else int(seed)  # None: secret noise (seeding.py)

    @property
    def private(self) -> bool:
        return math.isfinite(self.epsilon)

    def release_sensitivities(self) -> dict[str, float]:
        """Item statistics (L2) and one DP-SGD step's clipped sum (L2 = C) under add/remove one user."""
        return {"item_stats": item_stats_sensitivity("user", "gaussian", self.count_weight), "sgd_step": self.clip}

    # ----------------------------------------------------------------- fit
    def fit(self, train: Ratings) -> "LowRankDPSGD":
        """Release r~ (Gaussian), then T DP-SGD steps on U (module docstring)."""
        if len(train) == 0:
            raise DataError("lowrank_dpsgd: the training set is empty; check the data split")
        train = self._prepare(train)
        dev, m, n_users = train.device, train.n_items, train.n_users
        self.features_ = resolve_item_features(self.item_features, train, "lowrank_dpsgd")  # public metadata
        gen = noise_generator(self.seed, dev, private=math.isfinite(self.epsilon))
        if self.private:
            mu_m = math.sqrt(self.mean_fraction) * rdp_total_mu(self.epsilon, self.delta, self.accountant)
            self.mean_multiplier_ = 1.0 / mu_m
            self.noise_multiplier_ = sgd_noise_multiplier(self.epsilon, self.delta, self.mean_multiplier_, self.sampling_ratio,
                                                          self.steps, self.accountant)
        else:
            mu_m, self.mean_multiplier_, self.noise_multiplier_ = math.inf, 0.0, 0.0
        rel = release_item_means(train, "user", mu_m, self.mean_prior_std, gen, "gaussian", self.count_weight,
                                 self.mean_popularity_alpha, self.mean_popularity_share)
        self.means_release_ = rel
        self.item_avg_, self.global_avg_ = rel.means.to(dev), rel.global_mean
        install_private_fallback(self, self.item_avg_, self.global_avg_)
        _, y, _ = self._residuals(train)
        # float32 training (the clip and the noise are applied in the same precision; accounting is exact in sigma)
        y = y.float()
        u = (torch.randn(m, self.dim, generator=gen, device=gen.device, dtype=torch.float64) * self.init_scale).float().to(dev)
        batch = self.sampling_ratio * n_users  # expected batch size (Opacus's convention)
        std = self.noise_multiplier_ * self.clip
        velocity = torch.zeros_like(u)
        for _ in range(self.steps):  # steps are sequential; each one is batched over the sampled users' ratings
            chosen = torch.rand(n_users, generator=gen, device=gen.device).to(dev) < self.sampling_ratio
            sel = chosen[train.users]
            su, si, sy = train.users[sel], train.items[sel], y[sel]
            rows, norms = per_user_gradients(su, si, sy, u, n_users)
            g = clipped_sum(su, si, rows, norms, self.clip, m)
            if std > 0:
                g = g + torch.randn(m, self.dim, generator=gen, device=gen.device).to(dev) * std
            velocity = self.momentum * velocity + g / batch + self.weight_decay * u
            u = u - self.lr * velocity
        self.item_factors_ = u
        self._index_users(train)
        log.info("lowrank_dpsgd(eps=%g): d=%d T=%d q=%g C=%g sigma=%.4g, item-mean multiplier %.4g",
                 self.epsilon, self.dim, self.steps, self.sampling_ratio, self.clip, self.noise_multiplier_, self.mean_multiplier_)
        return self

    # ------------------------------------------------------------ release
    def released_state(self) -> dict[str, Any]:
        """What epsilon covers: r~, g and the item factors U after the T DP-SGD steps; whether the public item
        features were read. Never b_u, p_u or q_u (each user's own)."""
        fb = self._check_fitted()
        return {"n_items": int(self.item_avg_.numel()), "fallback": fallback_release(fb), "item_means": self.item_avg_,
                "global_mean": float(self.global_avg_), "item_factors": self.item_factors_,
                "item_features": self.features_ is not None}

    def restore(self, train: Ratings, state: dict[str, Any]) -> "LowRankDPSGD":
        """r~, g and U from ``state``; each user's b_u, p_u (and q_u) from their own ratings in ``train``."""
        train = self._prepare_restored(train, state)
        self.item_avg_, self.global_avg_ = state["item_means"].to(train.device), float(state["global_mean"])
        self.item_factors_ = state["item_factors"].to(train.device)
        self.features_ = resolve_item_features(bool(state["item_features"]), train, "lowrank_dpsgd")
        self._index_users(train)
        return self

    def personalise(self, ratings: Ratings) -> "LowRankDPSGD":
        """Recompute b_u and p_u from ``ratings`` and the released r~, U only (billboard model; used by the audit)."""
        self._index_users(ratings.to(self.device))
        return self

    def _residuals(self, train: Ratings) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """b_u, the clamped residuals U learns from and the weights q_u (None without item features): with features,
        y is what the user's own weights on them leave (a function of u's ratings and public data only, so the
        per-user clip still bounds u)."""
        offset, y = user_residuals(train, self.item_avg_, self.beta_p, self.clamp_r)
        if self.features_ is None:
            return offset, y, None
        q, y = feature_weights(train, y, self.features_, self.feature_reg)
        return offset, y.clamp(-self.clamp_r, self.clamp_r), q

    def _index_users(self, train: Ratings) -> None:
        offset, y, self.content_factors_ = self._residuals(train)
        self.user_offset_ = offset
        p, _ = user_aggregates(train.users, train.items, y.to(self.item_factors_.dtype), self.item_factors_, train.n_users)
        self.user_factors_ = p.float()
        self.user_counts_ = train.user_counts()
        self.train_ = train

    # ------------------------------------------------------------- predict
    def predict(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """r^_ui = clip(r~_i + b_u + u_i . p_u) for an unrated i; unknown users get r~_i, unknown item ids g."""
        if self.fallback_ is None:
            raise RuntimeError("LowRankDPSGD.predict called before fit()")
        uc, ic, ok_i, known = query_pairs(users, items, self.train_, self.user_counts_, self.device, "lowrank_dpsgd")
        term = (self.user_factors_[uc] * self.item_factors_[ic].float()).sum(1)
        if self.content_factors_ is not None:
            term = term + (self.content_factors_[uc].float() * self.features_.matrix.to(uc.device)[ic]).sum(1)
        base = torch.where(ok_i, self.item_avg_[ic], torch.full_like(term, self.global_avg_))
        return self.train_.scale.clip(torch.where(known, base + self.user_offset_[uc] + term, base))

    # ------------------------------------------------------------- privacy
    def privacy_report(self) -> dict[str, Any]:
        released = "DP item means r~ and global mean g, and the item factors U of S = U U^T after T DP-SGD steps (item side)"
        joint = ("joint DP (billboard model): b_u and p_u are computed by each user from the released U and their own "
                 "ratings and never released; a prediction for u reads u's own ratings")
        public = public_features_text(self.features_, self.feature_reg, "; U learns from what they leave")
        joint += JOINT_DP_SUFFIX if public else ""
        if not self.private:
            return {"mechanism": "lowrank_dpsgd at epsilon=inf (no noise)", "relation": None, "epsilon": math.inf,
                    "delta": 0.0, "released": released, "analysis": "non-private", "public_item_features": public}
        acc = OpacusAccountant(self.accountant)
        acc.step(self.mean_multiplier_, 1.0)
        acc.step(self.noise_multiplier_, self.sampling_ratio, steps=self.steps)
        eps = acc.get_epsilon(self.delta)
        return {
            "mechanism": "lowrank_dpsgd: DP-SGD with per-user clipping on S = U U^T (M x d parameters)",
            "relation": "user",
            "relation_text": RELATION_TEXT["user"],
            "sensitivity": {"item_stats_l2": self.means_release_.sensitivity, "sgd_step_l2": self.clip,
                            "rule": "per-user Frobenius clip C of the user's whole gradient"},
            "item_means_release": self.means_release_.describe(),
            "noise": (f"item means: N(0, {self.means_release_.noise_std:.4g}^2) on each of the 2M statistics; DP-SGD: "
                      f"N(0, ({self.noise_multiplier_:.4g} x {self.clip:g})^2) on each of the {self.dim}M entries, "
                      f"{self.steps} steps, Poisson rate q = {self.sampling_ratio:g}; the noisy sum is divided by the expected "
                      "batch size q N (N = the number of user ids, treated as public, Opacus's convention)"),
            "epsilon": self.epsilon,
            "delta": self.delta,
            "epsilon_accountant": eps,
            "accountant": (f"Opacus {ACCOUNTANT_TEXT[self.accountant]} over the item-mean release "
                           f"(multiplier {self.mean_multiplier_:.4g}, q = 1) and {self.steps} DP-SGD steps"),
            "released": released,
            "joint_dp": joint,
            "public_item_features": public,
            "analysis": f"(eps, delta) = ({self.epsilon:g}, {self.delta:g}) under '{RELATION_TEXT['user']}'. " + joint,
            "not_private": "metrics.json's baselines (PCC/COS) and test metrics read the data without noise",
        }
