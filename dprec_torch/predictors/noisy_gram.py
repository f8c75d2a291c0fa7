"""Noisy item Gram released once, then a similarity *learned* from it by post-processing.

Release (two Gaussian mechanisms, composed exactly as one mu-GDP mechanism, :mod:`dprec_torch.privacy.calibration`):

1. item statistics (S_i, C_i) -> DP item means r~_i and global mean g (``mean_fraction`` of mu^2; the ``posterior``
   estimator of :func:`dprec_torch.privacy.item_means.release_item_means`, options ``mean_*`` -> :attr:`means_spec`);
2. the item Gram G = sum_u x_u x_u^T of clipped centred rating vectors, upper triangle incl. diagonal, plus N(0,
   (Delta_G / mu_G)^2) per entry, mirrored (the rest of mu^2). The unit vectors x_u:

   * ``relation=user``: e_ui = r_ui - r~_i, b_u = sum_i e_ui / (|R_u| + beta_p) (the user's own damped offset), y_ui =
     clamp(e_ui - b_u, -B, B), and x_u = y_u min(1, c / ||y_u||) (``weighting=clip``) or x_u = c y_u / ||y_u||
     (``weighting=normalize``, McSherry-Mironov's 1/||.|| weighting): ||x_u|| <= c, so adding/removing a user moves the
     triangle of G by ||tri(x x^T)|| <= ||x||^2 <= c^2 = Delta_G.
   * ``relation=rating``: x_ui = clamp(r_ui - r~_i, -B, B) |R_u|^(-1/4) (the outer product carries w_u = |R_u|^(-1/2));
     no user offset (it would tie every entry to every rating of u). Changing r_ui moves row/column i:
     ||tri||^2 <= (4 B^2 (n-1) B^2 + B^4) / n < 4 B^4; adding a rating to a user with n: ||tri||^2 <= B^4 ((sqrt(n+1) -
     sqrt n)^2 / 2 + 1) < 1.09 B^4. So Delta_G = 2 B^2.

Learning S from (r~, g, G~) only (post-processing); for user u the prediction adds the user's own term (joint DP /
billboard model: u's ratings are read only for u's predictions):

    r^_ui = clip(r~_i + b_u + f_i(y_u)),  y_uj = r_uj - r~_j - b_u on u's rated items,

with ``estimator``:

* ``knn`` (a): PCC/COS on noisy statistics. s_ij = G~_ij / sqrt((G~_ii^+ + tau)(G~_jj^+ + tau)) with tau =
  variance_floor x noise std (the statistics are centred by r~, so this is a Pearson-type correlation of residuals; with
  ``centre=false`` at user level it is a cosine), the k largest positive s_ij per row kept; f_i = sum_j s_ij y_uj /
  (lambda + sum_j s_ij [j in R_u]).
* ``ease`` (b): closed-form item-item ridge regression (EASE, Steck 2019) on the denoised Gram: P = (G~_+ + lambda I)^-1
  (G~_+ = G~ with negative eigenvalues set to 0), W = I - P diag(P)^-1, f = y_u W.
* ``lowrank`` (c): G~ = V L V^T; keep the eigen-directions with L_k > eig_threshold x 2 s sqrt(M) (the spectral edge of
  the symmetric Gaussian noise, s = its entry std), at most ``rank``; each user fits p_u = argmin ||y_u - V_Ru p||^2 +
  lambda sum_k (L'_1 / L'_k)^prior_power p_k^2 (L' = L - edge, a per-direction prior from the denoised spectrum), f_i =
  v_i . p_u.
* ``pnbm`` (c): PNBM's Eq. (2), r^_ui = r~_i + b_u + sum_{j in R_u} s_ij y_uj / (lambda + sum_{j in R_u} |s_ij|), with S
  fitted to the noisy statistics by the quadratic surrogate of Eq. (2)'s squared error with the denominator frozen at a
  per-item constant D_i: then s_i / D_i = w_i solves the ridge regression of item i's clipped residual on those of its k
  neighbours N_i (the k largest noisy-PCC s_ij, as ``knn``),
      w_i = argmin_w sum_u (x_ui - sum_{j in N_i} w_j x_uj)^2 + rho ||w||^2 = (G~_{N_i N_i} + rho I)^-1 G~_{N_i i},
  rho = ``reg`` + 2 s sqrt(k) (the k x k noise block's spectral edge, so the system stays positive definite), batched
  over items in closed form. Eq. (2) is invariant to the row scale D_i except through lambda, so the prediction uses s =
  w (``knn_shrinkage`` = lambda in w units). Pure post-processing of G~: no extra privacy cost.
* ``none``: f = 0 (DP item means + the user's own offset; the reference every learned S must beat).

``epsilon=inf`` runs the same pipeline with sigma = 0 (the estimator's bias without noise). ``item_features=true``
(public catalogue metadata, :mod:`dprec_torch.data.item_features`: genres and release decade): each user also fits their
own weights q_u = (Phi_Ru^T Phi_Ru + feature_reg I)^-1 Phi_Ru^T y_u on the public features phi_i, the estimator's f then
reads the residuals y_u - Phi q_u, and r^_ui gains q_u . phi_i. No rating enters Phi and q_u is never released, so the
releases -- and the privacy claim -- are exactly those without it. The privacy report states what is released (r~, g,
G~: item-side only) and that predictions for u read u's ratings.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from dprec_torch.data.ratings import Ratings, dense_rows
from dprec_torch.errors import ConfigError
from dprec_torch.models.content import JOINT_DP_SUFFIX, check_item_features, feature_weights, public_features_text, resolve_item_features
from dprec_torch.predictors.base import BasePredictor, gather_pair_scores, query_pairs, user_offsets, user_residuals
from dprec_torch.predictors.dpals import solve_rows, symmetric_noise
from dprec_torch.predictors.release import fallback_release
from dprec_torch.privacy.budget import check_epsilon_delta
from dprec_torch.privacy.calibration import calibrate_gaussian, gaussian_epsilon, gdp_epsilon, split_mu
from dprec_torch.privacy.item_means import NOISES, RELATION_TEXT, RELATIONS, ItemMeansSpec, item_stats_sensitivity
from dprec_torch.seeding import SecretGenerator, noise_generator

log = logging.getLogger(__name__)

ESTIMATORS = ("knn", "ease", "lowrank", "pnbm", "none")
PNBM_CHUNK = 256  # items per batched k x k solve (memory: chunk x k x k doubles)
WEIGHTINGS = ("clip", "normalize")


# ------------------------------------------------------------------ released statistic
def unit_vectors(train: Ratings, means: torch.Tensor, relation: str, clamp_b: float, clip_norm: float,
                 weighting: str = "clip", beta_p: float = 0.0) -> torch.Tensor:
    """Per-rating entries x_ui of each unit's clipped vector (module docstring), aligned with ``train``."""
    if relation == "rating":
        n = torch.bincount(train.users, minlength=train.n_users).double()
        return (train.values.double() - means.double()[train.items]).clamp(-clamp_b, clamp_b) * n.clamp_min(1)[train.users].pow(-0.25)
    _, y = user_residuals(train, means, beta_p, clamp_b)
    norm = torch.zeros(train.n_users, dtype=torch.float64, device=y.device).index_add_(0, train.users, y * y).sqrt()
    if weighting == "normalize":
        scale = torch.where(norm > 0, clip_norm / norm.clamp_min(1e-300), torch.zeros_like(norm))
    else:
        scale = torch.clamp(clip_norm / norm.clamp_min(1e-300), max=1.0)
    return y * scale[train.users]


def restrict_to_support(train: Ratings, noisy_counts: torch.Tensor, support: int | None) -> tuple[Ratings, torch.Tensor]:
    """The ratings of the ``support`` items with the largest released (noisy) counts, re-indexed 0..N-1. The support is
    a function of the released item statistics only (post-processing); each unit's vector is then that unit's ratings
    on the support, so every sensitivity bound holds unchanged."""
    m = train.n_items
    if support is None or int(support) >= m:
        return train, torch.arange(m, device=train.device)
    idx = torch.sort(torch.topk(noisy_counts, int(support)).indices).values
    remap = torch.full((m,), -1, dtype=torch.long, device=train.device)
    remap[idx] = torch.arange(idx.numel(), device=train.device)
    keep = remap[train.items] >= 0
    sub = Ratings(train.users[keep], remap[train.items[keep]], train.values[keep], train.n_users, idx.numel(), train.scale)
    return sub, idx


def gram(train: Ratings, x: torch.Tensor) -> torch.Tensor:
    """G = sum_u x_u x_u^T (dense M x M, float64) from per-rating entries ``x``."""
    idx = torch.stack([train.users, train.items])
    xs = torch.sparse_coo_tensor(idx, x.double(), (train.n_users, train.n_items), check_invariants=False).coalesce()
    return torch.sparse.mm(xs.t().coalesce(), xs).to_dense()


def gram_sensitivity(relation: str, clamp_b: float, clip_norm: float) -> float:
    """L2 sensitivity of the released upper triangle of G (module docstring)."""
    return 2.0 * clamp_b**2 if relation == "rating" else clip_norm**2


def triangle(g: torch.Tensor) -> torch.Tensor:
    """The released coordinates: the upper triangle of ``g`` including the diagonal."""
    r, c = torch.triu_indices(g.shape[0], g.shape[1], device=g.device)
    return g[r, c]


def top_eigen(g: torch.Tensor, k: int, shift: float, gen: SecretGenerator, iters: int = 30) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest eigenpairs of symmetric ``g`` (descending) by subspace iteration on g + shift I (post-processing
    only); ``shift`` (the noise edge) keeps the negative half of the noise spectrum away from the top. ``gen`` seeds the
    start, so the result is deterministic."""
    m = g.shape[0]
    width = min(m, k + 10)
    q = gen.randn(m, width, device=gen.device, dtype=g.dtype).to(g.device)
    for _ in range(iters):
        q, _ = torch.linalg.qr(g @ q + shift * q)
    small = q.t() @ g @ q
    evals, vecs = torch.linalg.eigh((small + small.t()) / 2)
    order = torch.argsort(evals, descending=True)[:k]
    return evals[order], q @ vecs[:, order]


def symmetric_solve(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """x = a^-1 b for a batch of symmetric systems ``a [n, k, k]``, ``b [n, k]``: Cholesky where a is positive definite
    (the usual case: rho sits above the noise's spectral edge), an eigen-solve for the rest. Not batched LU
    (``torch.linalg.solve``): with torch 2.13's CPU MKL it was seen to hang on k ~ 300 batches."""
    chol, info = torch.linalg.cholesky_ex(a)
    x = torch.cholesky_solve(b.unsqueeze(-1), chol).squeeze(-1)
    bad = info != 0
    if bool(bad.any()):
        evals, evecs = torch.linalg.eigh(a[bad])
        evals = torch.where(evals.abs() < 1e-12, torch.full_like(evals, 1e-12), evals)
        x[bad] = (evecs @ ((evecs.transpose(1, 2) @ b[bad].unsqueeze(-1)).squeeze(-1) / evals).unsqueeze(-1)).squeeze(-1)
    return x


# ------------------------------------------------------------------ predictor
class NoisyGram(BasePredictor):
    """DP item means + noisy item Gram (one GDP budget), then kNN / EASE / low-rank learned from them.

    Args:
        epsilon, delta: the target (epsilon, delta) of the whole release (``inf`` = same pipeline, no noise).
        relation: ``user`` or ``rating`` (see the module docstring for each unit's vector).
        estimator: ``knn`` | ``ease`` | ``lowrank``.
        clamp_b: B, clamp of each centred entry. clip_norm: c, user-level L2 clip of x_u.
        weighting: ``clip`` | ``normalize`` (user level).
        mean_fraction: share of mu^2 spent on the item statistics.
        mean_noise, mean_prior_std, mean_popularity_alpha, mean_popularity_share, count_weight: the item-mean release's
            noise, prior std of item deviations (posterior-mean shrinkage), popularity re-weighting (Gaussian only,
            inside the same mu) and gamma, the weight of the counts beside the sums (null: the default); kept as one
            posterior :class:`~dprec_torch.privacy.item_means.ItemMeansSpec`, :attr:`means_spec`.
        beta_p: damping of the user's own offset b_u.
        k, variance_floor, knn_shrinkage: kNN neighbours per item, tau / s, lambda (knn).
        reg: ridge lambda (ease, lowrank). rank, eig_threshold, prior_power: low-rank options.
        support: keep the Gram on the ``support`` items with the largest DP counts (null: all items); a smaller
            support lowers the noise edge 2 s sqrt(N) and drops noise-only pairs (post-processing of step 1).
        seed: seeds the noise generator (None: secret, drawn from the OS entropy source).
    """

    name = "noisy_gram"
    task = "rating"

    def __init__(self, epsilon: float = 1.0, delta: float = 1e-6, relation: str = "rating", estimator: str = "lowrank",
                 clamp_b: float = 1.0, clip_norm: float = 1.0, weighting: str = "clip", mean_fraction: float = 0.2,
                 mean_noise: str = "gaussian", mean_prior_std: float = 0.5, mean_popularity_alpha: float = 0.0,
                 mean_popularity_share: float = 0.1, count_weight: float | None = None, beta_p: float = 5.0, k: int = 100,
                 variance_floor: float = 3.0, knn_shrinkage: float = 1.0, reg: float = 5.0, rank: int = 20,
                 eig_threshold: float = 1.0, prior_power: float = 1.0, support: int | None = None,
                 item_features: bool | str = False, feature_reg: float = 10.0, block: int = 1024, seed: int | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__(device)
        self.epsilon, self.delta = check_epsilon_delta(epsilon, delta, "noisy_gram")
        for key, value, allowed in (("relation", relation, RELATIONS), ("estimator", estimator, ESTIMATORS),
                                    ("mean_noise", mean_noise, NOISES), ("weighting", weighting, WEIGHTINGS)):
            if value not in allowed:
                raise ConfigError(f"noisy_gram: {key}={value!r}; use one of {allowed}")
        #: the item-mean release's estimator and options (the mean_* keys; validated here)
        self.means_spec = ItemMeansSpec("posterior", relation, mean_noise, float(mean_prior_std), None if count_weight is None
                                        else float(count_weight), float(mean_popularity_alpha), float(mean_popularity_share))
        if not (clamp_b > 0 and clip_norm > 0 and 0 < mean_fraction < 1 and beta_p >= 0 and reg >= 0):
            raise ConfigError("noisy_gram: need clamp_b > 0, clip_norm > 0, 0 < mean_fraction < 1, beta_p >= 0, reg >= 0")
        if relation == "rating" and math.isinf(clamp_b):
            raise ConfigError("noisy_gram: relation=rating needs a finite clamp_b (Delta_G = 2 B^2)")
        if estimator == "pnbm" and not reg > 0:
            raise ConfigError(f"noisy_gram: estimator=pnbm needs reg > 0 (the surrogate's ridge), got reg={reg}")
        if int(k) < 1 or int(rank) < 1 or int(block) < 1:
            raise ConfigError(f"noisy_gram: k={k}, rank={rank}, block={block} must be positive integers")
        self.relation, self.estimator, self.weighting = relation, estimator, weighting
        self.clamp_b, self.clip_norm = float(clamp_b), float(clip_norm)
        self.mean_fraction, self.beta_p = float(mean_fraction), float(beta_p)
        self.k, self.variance_floor, self.knn_shrinkage = int(k), float(variance_floor), float(knn_shrinkage)
        self.reg, self.rank, self.eig_threshold, self.prior_power = float(reg), int(rank), float(eig_threshold), float(prior_power)
        if support is not None and int(support) < 2:
            raise ConfigError(f"noisy_gram: support={support} must be >= 2 items or null (all items)")
        self.support = None if support is None else int(support)
        if not feature_reg > 0:
            raise ConfigError(f"noisy_gram: feature_reg={feature_reg} must be > 0 (the ridge of each user's feature weights)")
        self.item_features, self.feature_reg = check_item_features(item_features, "noisy_gram"), float(feature_reg)
        self.block, self.seed = int(block), None if seed is None else int(seed)  # None: secret noise (seeding.py)

    def release_sensitivities(self) -> dict[str, float]:
        """What ``fit`` calibrates its noise to: item statistics (L2, or L1 for Laplace) and the Gram triangle (L2)."""
        spec = self.means_spec
        return {"item_stats": item_stats_sensitivity(spec.relation, spec.noise, spec.count_weight),
                "gram": gram_sensitivity(self.relation, self.clamp_b, self.clip_norm)}

    # ----------------------------------------------------------------- fit
    def fit(self, train: Ratings) -> "NoisyGram":
        """Release (r~, g, G~) once, then learn the estimator from them and index each user's own residuals."""
        train = self._prepare(train, require_ratings=True)
        dev, m = train.device, train.n_items
        # public catalogue metadata (no rating enters it): read first, so a missing file fails before any release
        self.features_ = resolve_item_features(self.item_features, train, "noisy_gram")
        gen = noise_generator(self.seed, dev, private=self.private)
        self.mean_epsilon_ = None
        if not self.private:
            self.mu_ = {"item_stats": math.inf, "gram": math.inf}
        elif self.means_spec.noise == "laplace":  # pure eps_m + (eps - eps_m, delta) Gaussian, basic composition
            self.mean_epsilon_ = self.mean_fraction * self.epsilon
            self.mu_ = {"gram": calibrate_gaussian(self.epsilon - self.mean_epsilon_, self.delta, accountant="gdp").mu}
        else:  # one GDP budget split between the two Gaussian releases
            self.mu_ = split_mu(calibrate_gaussian(self.epsilon, self.delta, accountant="gdp").mu,
                                {"item_stats": (self.mean_fraction, 1), "gram": (1.0 - self.mean_fraction, 1)})
        rel = self._release_means(train, gen)  # r~, g: also the private fallback
        sub, idx = restrict_to_support(train, rel.counts.to(dev), self.support)
        x = unit_vectors(sub, self.item_avg_[idx], self.relation, self.clamp_b, self.clip_norm, self.weighting, self.beta_p)
        g = gram(sub, x)
        self.sensitivity_ = self.release_sensitivities()["gram"]
        self.noise_std_ = 0.0 if not self.private else self.sensitivity_ / self.mu_["gram"]
        if self.noise_std_ > 0:
            g = g + symmetric_noise(sub.n_items, self.noise_std_, gen, dev)
        self.support_items_ = idx
        self._learn(g)
        self._expand(idx, m)
        self._index_users(train)
        log.info("noisy_gram(%s, %s, eps=%g): Delta_G=%.4g, gram noise std=%.4g, mean noise std=%.4g",
                 self.relation, self.estimator, self.epsilon, self.sensitivity_, self.noise_std_, rel.noise_std)
        return self

    def _learn(self, g: torch.Tensor) -> None:
        """Post-processing of G~ only: the estimator's item-side matrices."""
        m = g.shape[0]
        edge = 2.0 * self.noise_std_ * math.sqrt(m)
        self.noise_edge_ = edge
        if self.estimator == "none":
            return
        if self.estimator in ("knn", "pnbm"):
            d = g.diagonal().clamp_min(0.0) + max(self.variance_floor * self.noise_std_, 1e-9)
            s = (g / torch.sqrt(d[:, None] * d[None, :])).clamp_min(0.0)
            s.fill_diagonal_(0.0)
            kk = min(self.k, m - 1) if m > 1 else 1
            top = torch.topk(s, kk, dim=1)
            if self.estimator == "pnbm":
                keep = self._pnbm_surrogate(g, top.indices)
                self.item_abs_ = keep.abs().t().float().contiguous()
            else:
                keep = torch.zeros_like(s).scatter_(1, top.indices, top.values)
            self.item_matrix_ = keep.t().float().contiguous()  # f = y_u @ S^T
            return
        if self.estimator == "ease":
            # (G~ + (edge + lambda) I) is positive definite whenever the noise's spectral norm is below its edge;
            # if not, the Cholesky fails and we add the edge again (a choice made from G~ only: post-processing)
            eye = torch.eye(m, dtype=g.dtype, device=g.device)
            shift = edge + self.reg
            chol, info = torch.linalg.cholesky_ex(g + shift * eye)
            while int(info) != 0:
                shift += max(edge, 1.0)
                chol, info = torch.linalg.cholesky_ex(g + shift * eye)
            p = torch.cholesky_inverse(chol)
            w = -p / p.diagonal()[None, :]
            w.fill_diagonal_(0.0)
            self.item_matrix_ = w.float().contiguous()
            self.ease_shift_ = shift
            return
        evals, evecs = top_eigen(g, self.rank, edge, noise_generator(self.seed, g.device, stream=1, private=math.isfinite(self.epsilon)))
        keep = int(((evals > self.eig_threshold * edge) & (evals > 0)).sum())
        keep = max(1, min(self.rank, keep))
        # a spike theta shows up at lambda = theta + (edge/2)^2 / theta (BBP): invert for the denoised strength
        lam = (evals[:keep] + torch.sqrt((evals[:keep] ** 2 - edge**2).clamp_min(0.0))) / 2 if edge > 0 else evals[:keep]
        lam = lam.clamp_min(1e-9)
        # unit eigenvectors scaled to RMS entry 1, so ``reg`` is in units of ratings (pseudo-observations)
        self.components_ = (evecs[:, :keep] * math.sqrt(m)).float().contiguous()
        self.component_reg_ = (self.reg * (lam[0] / lam) ** self.prior_power).float()
        self.n_components_ = keep

    def _pnbm_surrogate(self, g: torch.Tensor, nb: torch.Tensor) -> torch.Tensor:
        """Eq. (2) with the denominator frozen (module docstring, ``pnbm``): row i of S holds
        w_i = (G~_{N_i N_i} + rho I)^-1 G~_{N_i i} on the neighbours N_i = ``nb[i]``; batched solves over items."""
        m, kk = nb.shape
        rho = self.reg + 2.0 * self.noise_std_ * math.sqrt(kk)
        eye = torch.eye(kk, dtype=g.dtype, device=g.device)
        rows = torch.arange(m, device=g.device)
        out = torch.zeros_like(g)
        for start in range(0, m, PNBM_CHUNK):  # chunks of items bound the [chunk, k, k] systems' memory
            n = nb[start:start + PNBM_CHUNK]
            a = g[n[:, :, None], n[:, None, :]] + rho * eye
            b = g[n, rows[start:start + PNBM_CHUNK, None]]
            w = symmetric_solve(a, b)
            out[start:start + n.shape[0]].scatter_(1, n, w)
        self.pnbm_ridge_ = rho
        return out

    def _expand(self, idx: torch.Tensor, m: int) -> None:
        """Embed low-rank components into the M-item space (zero rows outside the support); kNN/EASE matrices stay in
        the support space and :meth:`_user_term` scatters their output."""
        if idx.numel() == m or self.estimator != "lowrank":
            return
        full = torch.zeros(m, self.components_.shape[1], device=idx.device)
        full[idx] = self.components_
        self.components_ = full

    # ------------------------------------------------------------ release
    #: the learned item-side matrices of each estimator (post-processing of G~ only)
    LEARNED = {"knn": ("item_matrix_",), "pnbm": ("item_matrix_", "item_abs_"), "ease": ("item_matrix_",),
               "lowrank": ("components_", "component_reg_"), "none": ()}

    def released_state(self) -> dict[str, Any]:
        """What epsilon covers: r~ and g, and what the estimator learned from G~ alone (module docstring); whether
        the public item features were read. Never the user offsets, residuals or factors (each user's own)."""
        fb = self._check_fitted()
        state: dict[str, Any] = {"n_items": int(self.item_avg_.numel()), "fallback": fallback_release(fb),
                                 "item_means": self.item_avg_, "global_mean": float(self.global_avg_),
                                 "support_items": self.support_items_, "item_features": self.features_ is not None,
                                 "noise_std": float(self.noise_std_), "estimator": self.estimator}
        state.update({name.rstrip("_"): getattr(self, name) for name in self.LEARNED[self.estimator]})
        return state

    def restore(self, train: Ratings, state: dict[str, Any]) -> "NoisyGram":
        """r~, g and the learned item-side matrices from ``state``; each user's offset b_u, residuals y_u (and, for
        lowrank, factors p_u; with item features, weights q_u) from their own ratings in ``train``."""
        if state["estimator"] != self.estimator:
            raise ConfigError(f"noisy_gram: the release was learned by estimator={state['estimator']}, the config says "
                              f"{self.estimator}; load it with the run's own config")
        train = self._prepare(train, state)
        dev = train.device
        self.item_avg_, self.global_avg_ = state["item_means"].to(dev), float(state["global_mean"])
        self.support_items_, self.noise_std_ = state["support_items"].to(dev), float(state["noise_std"])
        for name in self.LEARNED[self.estimator]:
            setattr(self, name, state[name.rstrip("_")].to(dev))
        self.features_ = resolve_item_features(bool(state["item_features"]), train, "noisy_gram")
        self._index_users(train)
        return self

    def personalise(self, ratings: Ratings) -> "NoisyGram":
        """Recompute every user-side quantity from ``ratings`` and the released item-side state only (each user's own
        device in the billboard model; the audit uses it with the auditor's known histories)."""
        self._index_users(ratings.to(self.device))
        return self

    def _index_users(self, train: Ratings) -> None:
        """Each user's own residuals y_u (CSR rows) and offset b_u; for lowrank, the user factors p_u."""
        self.user_offset_ = user_offsets(train, self.item_avg_, self.beta_p)
        y = train.values - self.item_avg_[train.items] - self.user_offset_[train.users]
        self.content_factors_ = None
        if self.features_ is not None:  # the user's own weights on the public features; f then reads what they leave
            self.content_factors_, y = feature_weights(train, y, self.features_, self.feature_reg)
        self.resid_csr_ = train.csr(y)
        self.mask_csr_ = train.indicator_csr()
        self.user_counts_ = train.user_counts()
        self.train_ = train
        if self.estimator == "lowrank":  # p_u = (V_Ru^T V_Ru + diag(component_reg))^-1 V_Ru^T y_u
            self.user_factors_ = solve_rows(self.mask_csr_, self.resid_csr_, self.components_, self.component_reg_)

    def _content_term(self, users: torch.Tensor) -> torch.Tensor:
        """q_u . phi_i over all items for distinct known users (0 without item features), ``[B, M]``."""
        if self.content_factors_ is None:
            return torch.zeros(users.numel(), self.train_.n_items, device=users.device)
        return self.content_factors_[users] @ self.features_.matrix.to(users.device).t()

    # ------------------------------------------------------------- predict
    def _user_term(self, users: torch.Tensor) -> torch.Tensor:
        """f(y_u) for distinct known users ``users`` over all items, ``[B, M]``."""
        if self.estimator == "lowrank":
            return self.user_factors_[users] @ self.components_.t()
        out = torch.zeros(users.numel(), self.train_.n_items, device=users.device)
        if self.estimator == "none":
            return out
        idx = self.support_items_
        y = dense_rows(self.resid_csr_, users)[:, idx]
        num = y @ self.item_matrix_  # support space only: the matrix is zero elsewhere
        if self.estimator == "ease":
            out[:, idx] = num
            return out
        absolute = self.item_abs_ if self.estimator == "pnbm" else self.item_matrix_  # knn's S is >= 0
        den = dense_rows(self.mask_csr_, users)[:, idx] @ absolute + self.knn_shrinkage
        out[:, idx] = num / den
        return out

    def predict(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """r^_ui = clip(r~_i + b_u + f_i(y_u)); unknown users get r~_i, unknown item ids g (private fallback)."""
        self._check_fitted()
        uc, ic, ok_i, known = query_pairs(users, items, self.train_, self.user_counts_, self.device, "noisy_gram")
        term = torch.zeros(uc.numel(), device=uc.device)
        term[known] = gather_pair_scores(lambda block: self._user_term(block) + self._content_term(block), uc[known], ic[known],
                                         self.train_.n_items, self.block, dtype=term.dtype)  # blocks of distinct known users
        return self._offset_predict(uc, ic, ok_i, known, term)

    # ------------------------------------------------------------- privacy
    def privacy_report(self) -> dict[str, Any]:
        released = "DP item means r~ and global mean g, and the noisy item Gram G~ (item-side statistics only)"
        joint = ("joint DP (billboard model): a prediction for user u also reads u's own ratings (offset b_u and "
                 "residuals y_u); those predictions are not released to anybody else")
        public = public_features_text(self.features_, self.feature_reg)
        joint += JOINT_DP_SUFFIX if public else ""
        if not self.private:
            return {"mechanism": f"noisy_gram/{self.estimator} at epsilon=inf (no noise)", "relation": None, "epsilon": math.inf,
                    "delta": 0.0, "released": released, "analysis": "non-private", "public_item_features": public}
        mean_eps = self.mean_epsilon_ or 0.0
        return {
            "mechanism": f"noisy_gram/{self.estimator}: one-shot Gaussian release of item statistics + item Gram",
            "relation": self.relation, "relation_text": RELATION_TEXT[self.relation],
            "sensitivity": {"item_stats_l2": self.means_release_.sensitivity, "gram_triangle_l2": self.sensitivity_,
                            "gram_rule": ("2 B^2, B = %g" % self.clamp_b) if self.relation == "rating" else ("c^2, c = %g" % self.clip_norm)},
            "item_means_release": self.means_release_.describe(),
            "noise": (f"N(0, {self.means_release_.noise_std:.4g}^2) on each of the 2M item statistics; "
                      f"N(0, {self.noise_std_:.4g}^2) on each upper-triangle entry of G (mirrored)"),
            "epsilon": self.epsilon, "delta": self.delta, "mu_gdp": {k: v for k, v in self.mu_.items()},
            "epsilon_exact": mean_eps + gdp_epsilon(math.sqrt(sum(v * v for v in self.mu_.values())), self.delta),
            "epsilon_rdp_crosscheck": mean_eps + gaussian_epsilon([(1.0 / v, 1.0, 1) for v in self.mu_.values()], self.delta),
            "accountant": ("Gaussian DP, exact composition of the Gaussian releases (Dong, Roth & Su 2022, Cor. 3.3 and 2.13)"
                           + (f"; Laplace item means at pure eps = {mean_eps:.4g} by basic composition" if self.mean_epsilon_ else "")
                           + "; Opacus RDP figure given as a looser cross-check"),
            "released": released,
            "learned_from_release": (f"estimator={self.estimator}: S is learned from (r~, g, G~) only (post-processing, "
                                     "zero extra privacy cost; no further access to the data)"),
            "joint_dp": joint, "public_item_features": public,
            "analysis": (f"(eps, delta) = ({self.epsilon:g}, {self.delta:g}) under '{RELATION_TEXT[self.relation]}'. "
                         "Everything after the two releases is post-processing. " + joint),
            "not_private": "metrics.json's baselines (PCC/COS) and test metrics read the data without noise",
        }
