"""McSherry & Mironov (KDD 2009): noisy global effects + noisy item-item covariance, then item-kNN.

Source: ``shared/papers/datta-2016-lecture-mcsherry-mironov-dp-covariance.txt`` (Datta's lecture on the paper), read
step by step (slide titles in quotes):

1. "Global Averages": ``GSum = sum r_ui + Noise``, ``GCnt = sum e_ui + Noise``, ``G = GSum/GCnt``; per item
   ``MSum = sum_u r_u + Noise^d``, ``MCnt = sum_u e_u + Noise^d`` and the beta_m-damped average
   ``MAvg_i = (MSum_i + beta_m G) / (MCnt_i + beta_m)``. We sum ``r - mid`` (mid = the public scale midpoint) instead
   of ``r``, which halves the sensitivity of the sums; ``mid`` is added back. Noise: Laplace, pure eps, L1
   sensitivity ``span/2`` (sums) and 1 (counts) per added/removed rating.
2. "Covariance Matrix Trick I": residuals ``r'_ui = r_ui - MAvg_i`` are centred by a damped user offset
   ``rbar_u = sum_i r'_ui / (|R_u| + beta_p)`` and clamped: ``r_hat_ui = clamp(r'_ui - rbar_u, -B, B)``. User offsets
   are never published.
3. "Covariance Matrix Trick II": ``Cov = sum_u w_u r_hat_u r_hat_u^T + Noise^{d x d}`` with
   ``w_u = 1/||e_u||_2 = 1/sqrt(|R_u|)``, Gaussian noise on every entry, then symmetrised.
4. Sensitivity ("Publishing the Covariance Matrix" + "Theorem 4"): for one added rating,
   ``||w_a x x^T - w_b y y^T||_F <= |w_a - w_b| ||x||^2 + w_b ||x - y|| (||x|| + ||y||)`` where
   ``||x - y||_2^2 <= c alpha^2 / (c + 1 + beta_p)^2 + B^2`` (Theorem 4's L2 line, which we read as a bound on the
   *squared* norm) and ``c`` is the user's count before the addition. Here ``alpha = 2 span``: after subtracting MAvg
   the residuals lie in ``[-span, span]`` (MAvg is clamped to the scale), so two residuals differ by up to
   ``2 span``; the slides' alpha = r_max - r_min only covers raw ratings. We take the max of the bound over
   ``c = 0..n_items-1`` (:func:`covariance_sensitivity`). With ``beta_p >= alpha^2 / (4 B^2)`` this is <= (1/2 + 2
   sqrt 2) B^2 < (1 + 2 sqrt 2) B^2, the slide's value.
5. Gaussian mechanism ("Multivariate Gaussian Mechanism"): ``calibration="classic"`` uses the slide's
   ``sigma = sqrt(2 ln(2/delta)) Delta_2 / eps`` (proved for eps < 1 only); the default ``"analytic"`` is the exact
   calibration of Balle & Wang (2018, Thm. 8), valid for every eps.
6. Prediction (post-processing, ours; the slides stop at the covariance): item-kNN on the noisy covariance normalised
   to a correlation, ``s_ij = Cov_ij / sqrt((Cov_ii^+ + tau)(Cov_jj^+ + tau))`` with ``tau = variance_floor * sigma``
   (0 at eps = inf; it keeps noise-only pairs of rare items from reaching |s| ~ 1), and
   ``r_ui = MAvg_i + rbar_u + sum_{j in N_k(i; u)} s_ij (r_uj - MAvg_j - rbar_u) / (lambda + sum s_ij)`` over the k
   rated items with the largest positive similarity, with ``lambda = knn_shrinkage * sigma / Delta_2`` (0 at eps =
   inf): the neighbour term fades towards the noisy baseline as the noise grows. The paper's Wgt matrix and its
   factor models are not implemented.

Privacy: relation = one rating added or removed. The four Laplace releases are pure eps_t each and the covariance is
(eps_cov, delta); basic sequential composition gives (sum eps_t, delta) = (eps, delta) for the published (G, MAvg,
Cov). :meth:`McSherryMironov.release_sensitivities` is the one source of every noise scale; the sensitivity harness
(case ``mcsherry`` in :mod:`dprec_torch.privacy_harness.sensitivity_cases`) checks each figure on adversarial
neighbours, and a private fit refuses ratings outside the scale (every bound assumes ``lo <= r <= hi``). Predictions
for user u also read u's own ratings, which is not a release about anybody else. ``epsilon=inf`` runs the same
pipeline without noise.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Mapping

import torch

from dprec_torch.data.ratings import Ratings
from dprec_torch.errors import ConfigError, DataError
from dprec_torch.predictors.base import BasePredictor, query_pairs, user_offsets
from dprec_torch.predictors.pncf import laplace as _laplace  # the name tests patch
from dprec_torch.predictors.release import fallback_release
from dprec_torch.privacy.budget import check_epsilon_delta
from dprec_torch.privacy.calibration import analytic_gaussian_sigma, classic_gaussian_sigma
from dprec_torch.privacy.item_means import install_private_fallback
from dprec_torch.seeding import noise_generator

log = logging.getLogger(__name__)

#: default split of epsilon across the five releases (fractions summing to 1)
DEFAULT_BUDGET = {"gsum": 0.01, "gcnt": 0.01, "msum": 0.24, "mcnt": 0.24, "cov": 0.50}


# ----------------------------------------------------------------- sensitivity
def covariance_sensitivity(clamp_b: float, alpha: float, beta_p: float, max_count: int) -> float:
    """L2 (Frobenius) sensitivity of ``sum_u w_u r_hat_u r_hat_u^T`` to one added/removed rating (step 4);
    ``max_count`` is the largest possible count before the addition (``n_items - 1``)."""
    c = torch.arange(0, max(int(max_count), 0) + 1, dtype=torch.float64)
    b = float(clamp_b)
    w_b = 1.0 / torch.sqrt(c + 1)
    # |w_a - w_b| ||x||^2 with ||x||^2 <= c B^2 (zero when c = 0: x is empty)
    weight_term = torch.where(c > 0, (1.0 / torch.sqrt(c.clamp_min(1)) - w_b) * c * b * b, torch.zeros_like(c))
    shift = torch.sqrt(c * alpha**2 / (c + 1 + beta_p) ** 2 + b * b)  # Theorem 4, L2 line
    outer_term = w_b * shift * b * (torch.sqrt(c) + torch.sqrt(c + 1))
    return float((weight_term + outer_term).max())


def global_effect_sums(train: Ratings, mid: float) -> dict[str, torch.Tensor]:
    """Step 1 before its noise: ``GSum``/``MSum`` of ``r - mid`` and the counts ``GCnt``/``MCnt``. One added/removed
    rating moves each sum by ``|r - mid| <= span/2`` and each count by 1 (L1, one item)."""
    shifted = train.values - mid
    return {
        "gsum": shifted.sum().reshape(1),
        "gcnt": torch.tensor([float(len(train))], device=train.device),
        "msum": torch.zeros(train.n_items, device=train.device).index_add_(0, train.items, shifted),
        "mcnt": train.item_counts().to(torch.float32),
    }


def weighted_covariance(train: Ratings, item_avg: torch.Tensor, clamp_b: float, beta_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 2-3: ``Cov = sum_u w_u r_hat_u r_hat_u^T`` (dense items x items, sparse Gram) and the user offsets, with
    ``r'_ui = r_ui - item_avg_i``, ``rbar_u = sum_i r'_ui / (|R_u| + beta_p)``, ``r_hat = clamp(r' - rbar_u, -B, B)``,
    ``w_u = |R_u|^{-1/2}``."""
    resid = train.values - item_avg[train.items]
    counts = train.user_counts().to(torch.float32)
    offset = user_offsets(train, item_avg, beta_p)  # step 2's rbar_u
    r_hat = (resid - offset[train.users]).clamp(-clamp_b, clamp_b)
    root_w = counts.clamp_min(1).rsqrt().sqrt()[train.users]  # sqrt(w_u), so x^T x carries w_u once
    x = torch.sparse_coo_tensor(torch.stack([train.users, train.items]), r_hat * root_w, (train.n_users, train.n_items), check_invariants=False).coalesce()
    return torch.sparse.mm(x.t().coalesce(), x).to_dense(), offset


def paper_covariance_bound(clamp_b: float) -> float:
    """The slide's bound ``(1 + 2 sqrt 2) B^2`` (valid when beta_p >= alpha^2 / (4 B^2))."""
    return (1.0 + 2.0 * math.sqrt(2.0)) * clamp_b**2


# ------------------------------------------------------------------ predictor
class McSherryMironov(BasePredictor):
    """Differentially private global effects + covariance (McSherry & Mironov 2009) with an item-kNN on top.

    Args:
        epsilon: total budget (``inf`` = same pipeline without noise).
        delta: delta of the covariance's Gaussian mechanism (the only approximate part).
        k: neighbours per prediction (rated items with the largest positive similarity).
        clamp_b: B, the clamp of centred ratings.
        beta_m: damping of item averages towards G. beta_p: damping of user offsets towards 0.
        budget: fractions of epsilon for gsum, gcnt, msum, mcnt, cov (must sum to 1).
        calibration: ``"analytic"`` (Balle & Wang) or ``"classic"`` (the slide's formula; eps_cov < 1).
        variance_floor: tau / sigma added to the noisy variances before normalising (step 6).
        knn_shrinkage: lambda / (sigma / Delta_2) added to the kNN weight sum (step 6; 0 = plain weighted average).
        seed: seeds the noise generator (None: secret, drawn from the OS entropy source).
    """

    name = "mcsherry"
    task = "both"

    def __init__(self, epsilon: float = 1.0, delta: float = 1e-6, k: int = 30, clamp_b: float = 1.0, beta_m: float = 15.0,
                 beta_p: float = 20.0, budget: Mapping[str, float] | None = None, calibration: str = "analytic",
                 variance_floor: float = 10.0, knn_shrinkage: float = 3.0, seed: int | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__(device)
        self.epsilon, self.delta = check_epsilon_delta(epsilon, delta, "mcsherry")
        if int(k) != k or k < 1:
            raise ConfigError(f"mcsherry: k={k} must be a positive integer")
        if not (clamp_b > 0 and beta_m >= 0 and beta_p >= 0):
            raise ConfigError(f"mcsherry: need clamp_b > 0, beta_m >= 0, beta_p >= 0 (got {clamp_b}, {beta_m}, {beta_p})")
        if calibration not in ("analytic", "classic"):
            raise ConfigError(f"mcsherry: calibration={calibration!r} is unknown; use analytic or classic")
        budget = dict(DEFAULT_BUDGET if budget is None else budget)
        if set(budget) != set(DEFAULT_BUDGET) or any(not v > 0 for v in budget.values()) or abs(sum(budget.values()) - 1) > 1e-6:
            raise ConfigError(f"mcsherry: budget must give positive fractions for {sorted(DEFAULT_BUDGET)} summing to 1 (got {budget})")
        self.k, self.clamp_b, self.beta_m, self.beta_p = int(k), float(clamp_b), float(beta_m), float(beta_p)
        if not (variance_floor >= 0 and knn_shrinkage >= 0):
            raise ConfigError(f"mcsherry: variance_floor={variance_floor} and knn_shrinkage={knn_shrinkage} must be >= 0")
        self.budget, self.calibration, self.seed = budget, calibration, None if seed is None else int(seed)  # None: secret noise (seeding.py)
        self.variance_floor, self.knn_shrinkage = float(variance_floor), float(knn_shrinkage)
        # learned in fit: each release's sensitivity, the covariance's L2 sensitivity and its Gaussian sigma
        self.sensitivities_: dict[str, float] | None = None
        self.sensitivity_: float | None = None
        self.sigma_: float | None = None

    def release_sensitivities(self, scale: Any, n_items: int) -> dict[str, float]:
        """What :meth:`fit` calibrates each release's noise to (one rating added/removed; the rating scale and
        ``n_items`` are public): L1 of the Laplace releases (steps 1) and L2 (Frobenius) of the covariance (step 4,
        ``alpha = 2 span``, max over the counts ``c = 0..n_items-1``)."""
        half = float(scale.span) / 2.0
        cov = covariance_sensitivity(self.clamp_b, 2.0 * float(scale.span), self.beta_p, int(n_items) - 1)
        return {"gsum": half, "gcnt": 1.0, "msum": half, "mcnt": 1.0, "cov": cov}

    # ----------------------------------------------------------------- fit
    def fit(self, train: Ratings) -> "McSherryMironov":
        """Steps 1-5: noisy G and MAvg, centred/clamped ratings, weighted covariance + Gaussian noise."""
        train = self._prepare(train, require_ratings=True)
        dev = train.device
        gen = noise_generator(self.seed, dev, private=self.private)
        scale = train.scale
        if self.private and bool(((train.values < scale.lo) | (train.values > scale.hi)).any()):
            # every sensitivity below assumes lo <= r <= hi
            raise DataError(f"mcsherry: ratings lie outside the rating scale [{scale.lo:g}, {scale.hi:g}]; "
                            "declare the true scale (data.rating_scale) or clean the data")
        mid = (scale.lo + scale.hi) / 2.0
        eps = {key: self.epsilon * frac for key, frac in self.budget.items()}
        noisy = self.private

        # step 1: global and per-item effects (Laplace, pure eps each)
        sens = self.release_sensitivities(scale, train.n_items)
        self.sensitivities_ = sens
        stats = global_effect_sums(train, mid)
        gsum = float(stats["gsum"]) + (float(_laplace((1,), sens["gsum"] / eps["gsum"], gen, dev)) if noisy else 0.0)
        gcnt = float(stats["gcnt"]) + (float(_laplace((1,), sens["gcnt"] / eps["gcnt"], gen, dev)) if noisy else 0.0)
        g = mid + gsum / max(gcnt, 1.0)
        msum, mcnt = stats["msum"], stats["mcnt"]
        if noisy:
            msum = msum + _laplace((train.n_items,), sens["msum"] / eps["msum"], gen, dev)
            mcnt = mcnt + _laplace((train.n_items,), sens["mcnt"] / eps["mcnt"], gen, dev)
        mcnt = mcnt.clamp_min(0.0)  # post-processing: a count is never negative
        m_avg = mid + (msum + self.beta_m * (g - mid)) / (mcnt + self.beta_m).clamp_min(1e-6)
        self.global_avg_ = float(scale.clip(torch.tensor(g)))
        self.item_avg_ = scale.clip(m_avg)
        install_private_fallback(self, self.item_avg_, self.global_avg_)  # the object holds no exact item statistic

        # steps 2-3: damped user offsets, centred + clamped ratings, weighted covariance
        cov, self.user_offset_ = weighted_covariance(train, self.item_avg_, self.clamp_b, self.beta_p)

        # steps 4-5: Gaussian noise calibrated to the L2 sensitivity
        self.sensitivity_ = sens["cov"]
        if noisy:
            calib = analytic_gaussian_sigma if self.calibration == "analytic" else classic_gaussian_sigma
            if self.calibration == "classic" and eps["cov"] >= 1:
                raise ConfigError(f"mcsherry: calibration=classic needs eps_cov < 1 (got {eps['cov']:.3g}); use calibration=analytic")
            self.sigma_ = calib(self.sensitivity_, eps["cov"], self.delta)
            cov = cov + gen.randn(cov.shape, device=dev, dtype=torch.float32) * self.sigma_
            cov = (cov + cov.t()) / 2.0  # post-processing
        else:
            self.sigma_ = 0.0
        self.cov_ = cov
        # noisy variances can be <= 0; adding tau = variance_floor * sigma shrinks noise-only correlations
        diag = cov.diagonal().clamp_min(0.0) + max(self.variance_floor * self.sigma_, 1e-6)
        sim = cov / torch.sqrt(diag[:, None] * diag[None, :])
        sim.fill_diagonal_(0.0)
        self.sim_ = sim
        self.train_ = train
        self._index_user_rows(train)
        log.info("mcsherry(eps=%g, delta=%g): Delta_2=%.4g sigma=%.4g", self.epsilon, self.delta, self.sensitivity_, self.sigma_)
        return self

    # ------------------------------------------------------------ release
    def released_state(self) -> dict[str, Any]:
        """The noisy G and MAvg, the similarity learned from the noisy covariance (post-processing) and the public
        noise scale the kNN's shrinkage reads; never the user offsets (each user's own)."""
        fb = self._check_fitted()
        return {"n_items": int(self.item_avg_.numel()), "fallback": fallback_release(fb), "item_avg": self.item_avg_,
                "global_avg": float(self.global_avg_), "similarity": self.sim_, "sigma": float(self.sigma_),
                "sensitivity": float(self.sensitivity_)}

    def restore(self, train: Ratings, state: dict[str, Any]) -> "McSherryMironov":
        """G, MAvg and the similarity from ``state``; each user's offset and residuals from their own ratings."""
        train = self._prepare(train, state)
        self.item_avg_, self.global_avg_ = state["item_avg"].to(train.device), float(state["global_avg"])
        self.sim_ = state["similarity"].to(train.device)
        self.sigma_, self.sensitivity_ = float(state["sigma"]), float(state["sensitivity"])
        self.user_offset_ = user_offsets(train, self.item_avg_, self.beta_p)
        self.train_ = train
        self._index_user_rows(train)
        return self

    def _index_user_rows(self, train: Ratings) -> None:
        srt = train.sorted_by_user()
        counts = train.user_counts()
        crow = torch.zeros(train.n_users + 1, dtype=torch.long, device=train.device)
        crow[1:] = torch.cumsum(counts, 0)
        self.crow_, self.row_items_ = crow, srt.items
        self.row_resid_ = srt.values - self.item_avg_[srt.items] - self.user_offset_[srt.users]
        self.user_counts_ = counts

    # ------------------------------------------------------------- predict
    def _padded_rows(self, users: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rated items ``[B, L]``, their residuals and a validity mask for distinct users (L = max count)."""
        lens = self.user_counts_[users]
        width = max(int(lens.max()) if lens.numel() else 0, 1)
        ar = torch.arange(width, device=users.device)
        valid = ar[None, :] < lens[:, None]
        pos = (self.crow_[users][:, None] + ar[None, :]).clamp_max(max(self.row_items_.numel() - 1, 0))
        return self.row_items_[pos], self.row_resid_[pos], valid

    def _knn_scores(self, items: torch.Tensor, rated: torch.Tensor, resid: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Step 6 for ``items [B, Q]`` against each user's rated list ``[B, L]``: the neighbour term."""
        s = self.sim_[items[:, :, None], rated[:, None, :]]  # [B, Q, L]
        s = s.masked_fill(~valid[:, None, :], 0.0).clamp_min(0.0)  # positive neighbours only
        kk = min(self.k, s.shape[2])
        top = torch.topk(s, kk, dim=2)
        r = resid[:, None, :].expand_as(s).gather(2, top.indices)
        wsum = top.values.sum(2) + self.knn_shrinkage * self.sigma_ / self.sensitivity_  # 0 at eps = inf
        self.last_usable_ = top.values.sum(2) > 0  # some rated neighbour has a positive similarity
        return torch.where(wsum > 0, (top.values * r).sum(2) / wsum.clamp_min(1e-12), torch.zeros_like(wsum))

    def predict(self, users: torch.Tensor, items: torch.Tensor, batch: int = 64) -> torch.Tensor:
        """Predicted ratings for (user, item) pairs, queries grouped by user and scored in batches: the noisy baselines
        (MAvg_i + rbar_u) plus the neighbour term; unknown users get MAvg_i, unknown item ids G (private fallback)."""
        self._check_fitted()
        uc, ic, ok_i, known = query_pairs(users, items, self.train_, self.user_counts_, self.device, self.name)
        # group queries by user: [distinct users, max queries per user] grid, padded
        uniq, inv, cnt = torch.unique(uc, return_inverse=True, return_counts=True)
        order = torch.argsort(inv, stable=True)
        slot = torch.empty_like(order)
        slot[order] = torch.arange(order.numel(), device=order.device) - torch.repeat_interleave(torch.cumsum(cnt, 0) - cnt, cnt)
        width = int(cnt.max()) if cnt.numel() else 1
        grid = torch.zeros(uniq.numel(), width, dtype=torch.long, device=uc.device)
        grid[inv, slot] = ic
        out = torch.zeros(uniq.numel(), width, device=uc.device)
        usable = torch.zeros(uniq.numel(), width, dtype=torch.bool, device=uc.device)
        for start in range(0, uniq.numel(), batch):  # batches of users
            u = uniq[start:start + batch]
            rated, resid, valid = self._padded_rows(u)
            out[start:start + batch] = self._knn_scores(grid[start:start + batch], rated, resid, valid)
            usable[start:start + batch] = self.last_usable_
        # fallback rate: unknown user or item, or no rated neighbour with a positive similarity (baselines only)
        answered = known & usable[inv, slot]
        self.fallback_rate_ = float((~answered).float().mean()) if answered.numel() else 0.0
        return self._offset_predict(uc, ic, ok_i, known, out[inv, slot])

    def recommend(self, users: torch.Tensor, n: int, batch: int = 8) -> torch.Tensor:
        """Top-n items by predicted rating, excluding the user's training items; -1 pads."""
        self._check_fitted("recommend")
        if int(n) != n or n < 1:
            raise ConfigError(f"recommend: n={n} must be a positive integer")
        users = torch.as_tensor(users, dtype=torch.long, device=self.device)
        n_u, n_i = self.train_.n_users, self.train_.n_items
        n = min(int(n), n_i)
        all_items = torch.arange(n_i, device=users.device)
        out = []
        for start in range(0, users.numel(), batch):  # batches of users, vectorised over all items
            u = users[start:start + batch]
            rated, resid, valid = self._padded_rows(u.clamp(0, n_u - 1))
            nb = self._knn_scores(all_items.expand(u.numel(), n_i), rated, resid, valid)
            pairs = query_pairs(u[:, None].expand(-1, n_i).reshape(-1), all_items.repeat(u.numel()), self.train_, self.user_counts_,
                                self.device, self.name)
            scores = self._offset_predict(*pairs, nb.reshape(-1)).reshape(u.numel(), n_i).double()
            own = valid & ((u >= 0) & (u < n_u))[:, None]
            rows = torch.arange(u.numel(), device=u.device)[:, None].expand_as(rated)
            scores[rows[own], rated[own]] = float("-inf")
            top = torch.topk(scores, n, dim=1)
            out.append(torch.where(torch.isfinite(top.values), top.indices, torch.full_like(top.indices, -1)))
        return torch.cat(out) if out else torch.empty(0, n, dtype=torch.long, device=users.device)

    # ------------------------------------------------------------- privacy
    def privacy_report(self) -> dict[str, Any]:
        """Relation, per-release sensitivity (with its norm), noise and accountant; the harness case
        ``mcsherry`` in :mod:`dprec_torch.privacy_harness.sensitivity_cases` checks every sensitivity stated here."""
        if not self.private:
            return {"mechanism": "none (McSherry-Mironov pipeline at epsilon=inf)", "relation": None, "sensitivity": None,
                    "noise": "none", "accountant": "none", "epsilon": float("inf"), "delta": 0.0, "analysis": "non-private"}
        sens = self.sensitivities_ or {}
        eps = {key: self.epsilon * frac for key, frac in self.budget.items()}
        sigma = float("nan") if self.sigma_ is None else self.sigma_
        return {
            "mechanism": "McSherry-Mironov: Laplace global/item effects + Gaussian item-item covariance", "relation": "rating",
            "neighbouring": "one rating added or removed (a changed value is two such steps); scale and n_items public",
            "sensitivity": {
                "gsum": sens.get("gsum"), "gcnt": sens.get("gcnt"), "msum_l1": sens.get("msum"), "mcnt_l1": sens.get("mcnt"),
                "cov_l2": self.sensitivity_, "cov_l2_paper": paper_covariance_bound(self.clamp_b),
                "norms": "gsum, gcnt: |.|; msum, mcnt: L1 over items (one rating touches one item); cov: L2 (Frobenius)",
            },
            "noise": ("Laplace(sensitivity/eps_t) on gsum, gcnt and every entry of msum, mcnt with eps_t = "
                      f"{', '.join(f'{k}={v:.4g}' for k, v in eps.items() if k != 'cov')}; "
                      f"N(0, sigma^2) on every covariance entry, sigma={sigma:.4g} "
                      f"({self.calibration} Gaussian mechanism at eps_cov={eps['cov']:.4g}, delta={self.delta:g}), then symmetrised"),
            "accountant": (f"basic sequential composition of five releases on the same ratings: four pure Laplace (eps_t each) and one "
                           f"({eps['cov']:.4g}, {self.delta:g}) Gaussian -> (sum eps_t, delta) = ({self.epsilon:g}, {self.delta:g}); "
                           "one fit = one release (predictions are post-processing)"),
            "epsilon": self.epsilon, "delta": self.delta, "budget": dict(self.budget),
            "analysis": ("Basic sequential composition of four pure-eps Laplace releases and one (eps_cov, delta) Gaussian release "
                         "(Balle & Wang 2018 Thm. 8 when analytic); covariance L2 sensitivity from the weight change plus Theorem 4's "
                         "shift bound with alpha = 2*span for movie-centred residuals (the slides use alpha = span). Per-user offsets "
                         "and each user's own ratings are used only for that user's predictions."),
        }
