"""DP-ALS: private alternating least squares (Chien, Jain, Krichene, Rendle, Song, Thakurta & Zhang, ICML 2021).

A fitted predictor (``model=dpals``, the runner's ``fit_fold`` path): ALS is not a gradient method, so it does not fit
the Trainer/optimizer interface of ``model=mf mechanism=...``.

Joint DP (billboard model): only item-side quantities are released -- the DP item means and, every round, noisy per-item
sufficient statistics from which the item factors V are solved. Each user solves their own factor p_u from V and their
own ratings; p_u is never released, and u's predictions read u's ratings.

Algorithm (numbers refer to the steps in the code):

0. DP item means r~ (:func:`dprec_torch.privacy.item_means.release_item_means`, the ``posterior`` estimator with the
   ``mean_*`` options, :attr:`DPALS.means_spec`); residuals y_ui = clamp(r_ui - r~_i - b_u, -Gamma_r, Gamma_r) with
   the user's own damped offset b_u. Per-user sampling (the paper's "at most m ratings per user"): the item-side
   statistics read only the ratings kept by :func:`~dprec_torch.data.preprocess.per_user_sample` (``hash="lehmer"``;
   a function of the seed and the user's own raw ids).
1. Noisy power iteration (initialisation, ``power_iters`` rounds, Hardt & Roth / the paper's Alg. 2): W = sum_u x_u
   (x_u^T Q) + N(0, s_0^2)^{M x d}, Q = qr(W), with x_u the sampled residuals scaled to ||x_u|| <= c_0 = Gamma_r
   sqrt(m): one user moves W by ||x x^T Q||_F <= ||x||^2 <= c_0^2 (Q orthonormal).
2. For t = 1..T: each user solves p_u = (V_Ru^T V_Ru + lambda I)^-1 V_Ru^T y_u on all their ratings and clips p~_u =
   p_u min(1, Gamma_u / ||p_u||); the released statistics are, for every item j, A_j = sum_{u: j in S_u} p~_u p~_u^T
   (upper triangle) + N(0, s^2), b_j = sum_{u: j in S_u} p~_u y_uj + N(0, s^2); one user touches at most m items,
   each by ||tri(p p^T)||^2 + ||p y||^2 <= Gamma_u^4 + Gamma_u^2 Gamma_r^2, so Delta = sqrt(m) Gamma_u sqrt(Gamma_u^2
   + Gamma_r^2). Then v_j = (PSD(A~_j) + lambda_v I)^-1 b~_j (PSD: negative eigenvalues set to 0; post-processing).
3. Final: each user solves p_u from the released V; r^_ui = clip(r~_i + b_u + p_u . v_i).

Relation: ``user`` = add/remove one user (Delta as above). ``rating`` = add/remove/change one rating: such a change
can move the user's whole contribution (p_u, the sample, b_u) anywhere in its ball, so the sensitivities of steps 1-2
double (replace-one-user); the item means use their rating-level bound. Accounting: every Gaussian release is a
Gaussian mechanism on the same relation; they compose exactly in Gaussian DP (mu^2 = mu_means^2 + power_iters mu_0^2
+ T mu_als^2, Dong, Roth & Su 2022), with Laplace item means (``mean_noise=laplace``) added by basic composition.
Opacus's RDP figure is reported as a cross-check. ``epsilon=inf`` runs the same algorithm without noise; with
``max_ratings_per_user=null`` and infinite clips it is plain (non-private) ALS.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from dprec_torch.data.preprocess import per_user_sample
from dprec_torch.data.ratings import Ratings, _to_csr
from dprec_torch.errors import ConfigError
from dprec_torch.predictors.base import BasePredictor, query_pairs, user_residuals
from dprec_torch.predictors.release import fallback_release
from dprec_torch.privacy.budget import check_epsilon_delta
from dprec_torch.privacy.calibration import calibrate_gaussian, gaussian_epsilon, gdp_epsilon, split_mu
from dprec_torch.privacy.item_means import NOISES, RELATION_TEXT, RELATIONS, ItemMeansSpec, item_stats_sensitivity
from dprec_torch.seeding import SecretGenerator, noise_generator

log = logging.getLogger(__name__)


def _outer_flat(f: torch.Tensor) -> torch.Tensor:
    """Row-wise f f^T flattened: ``[N, d*d]``."""
    return (f[:, :, None] * f[:, None, :]).reshape(f.shape[0], f.shape[1] * f.shape[1])


def symmetric_noise(m: int, std: float, gen: SecretGenerator, device: torch.device, batch: tuple[int, ...] = ()) -> torch.Tensor:
    """A (``batch`` of) M x M symmetric matrix whose upper triangle (incl. diagonal) is iid N(0, std^2)."""
    z = gen.randn(*batch, m, m, device=gen.device, dtype=torch.float64).to(device) * std
    return torch.triu(z) + torch.triu(z, 1).transpose(-2, -1)


def clip_rows(f: torch.Tensor, bound: float) -> torch.Tensor:
    """Scale each row to L2 norm <= ``bound`` (inf: unchanged)."""
    if math.isinf(bound):
        return f
    norm = f.norm(dim=1, keepdim=True)
    return f * torch.clamp(bound / norm.clamp_min(1e-30), max=1.0)


def solve_rows(mask_csr: torch.Tensor, resid_csr: torch.Tensor, other: torch.Tensor, reg: float | torch.Tensor) -> torch.Tensor:
    """Ridge solve for every row r: (sum_{c in row r} o_c o_c^T + reg I)^-1 sum_c y_rc o_c (batched; a tensor ``reg``:
    the ridge's diagonal)."""
    d = other.shape[1]
    ridge = torch.diag(reg) if torch.is_tensor(reg) else reg * torch.eye(d, device=other.device, dtype=other.dtype)
    a = (mask_csr @ _outer_flat(other)).reshape(-1, d, d) + ridge
    b = resid_csr @ other
    return torch.linalg.solve(a, b.unsqueeze(-1)).squeeze(-1)


def power_statistics(train: Ratings, y: torch.Tensor, keep: torch.Tensor, q: torch.Tensor, c0: float) -> torch.Tensor:
    """Step 1's pre-noise W = sum_u x_u (x_u^T Q), x_u = sampled residuals scaled to ||x_u|| <= c0."""
    su, si, sy = train.users[keep], train.items[keep], y[keep]
    norm = torch.zeros(train.n_users, dtype=torch.float64, device=y.device).index_add_(0, su, sy * sy).sqrt()
    x = sy * torch.clamp(c0 / norm.clamp_min(1e-30), max=1.0)[su]
    xs = _to_csr(su, si, x, train.n_users, train.n_items)
    xt = _to_csr(si, su, x, train.n_items, train.n_users)
    return xt @ (xs @ q)


def als_round_statistics(train: Ratings, y: torch.Tensor, keep: torch.Tensor, v: torch.Tensor, reg: float, clip_factor: float,
                         mask: torch.Tensor | None = None, resid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 2's pre-noise (A_j, b_j): users solve p_u on all their ratings and clip it; the sampled ratings add their terms."""
    mask = train.csr(torch.ones_like(y)) if mask is None else mask
    resid = train.csr(y) if resid is None else resid
    p = clip_rows(solve_rows(mask, resid, v, reg), clip_factor)
    n_items, d, items, pu = train.n_items, p.shape[1], train.items[keep], p[train.users[keep]]
    a = torch.zeros(n_items, d * d, dtype=p.dtype, device=p.device).index_add_(0, items, _outer_flat(pu))
    b = torch.zeros(n_items, d, dtype=p.dtype, device=p.device).index_add_(0, items, pu * y[keep][:, None])
    return a.reshape(n_items, d, d), b


def als_sensitivity(max_ratings: int, clip_factor: float, clamp_r: float, relation: str) -> float:
    """Delta of step 2 (module docstring); doubled at rating level (replace-one-user)."""
    base = math.sqrt(max_ratings) * clip_factor * math.sqrt(clip_factor**2 + clamp_r**2)
    return base * (2.0 if relation == "rating" else 1.0)


def power_sensitivity(max_ratings: int, clamp_r: float, relation: str) -> float:
    """Delta of step 1: c_0^2 with c_0 = Gamma_r sqrt(m); doubled at rating level."""
    return max_ratings * clamp_r**2 * (2.0 if relation == "rating" else 1.0)


class DPALS(BasePredictor):
    """Private ALS with noisy item-side statistics and per-user factor solves (see the module docstring).

    Args:
        epsilon, delta: target of the whole run (``inf``: no noise). relation: ``user`` | ``rating``.
        dim: factor dimension d. iterations: ALS rounds T. power_iters: noisy power-iteration rounds.
        max_ratings_per_user: m (null: no sampling; only with epsilon=inf).
        clip_factor: Gamma_u. clamp_r: Gamma_r. reg: lambda (user solve). item_reg: lambda_v (item solve).
        mean_fraction: the item-mean release's share of mu^2 (or of epsilon for laplace).
        mean_noise, mean_prior_std, mean_popularity_alpha, mean_popularity_share, count_weight: its noise, prior std,
            popularity re-weighting (Gaussian only, inside the same mu) and gamma of the item statistics (null: the
            default); kept as one posterior :class:`~dprec_torch.privacy.item_means.ItemMeansSpec`, :attr:`means_spec`.
        init_fraction: share of the Gaussian budget (mu^2) spent on the power iteration. beta_p: user-offset damping.
        init_scale: RMS entry of the initial item factors. seed: noise and sampling seed (None: secret, drawn from the OS entropy source).
    """

    name = "dpals"
    task = "rating"

    def __init__(self, epsilon: float = 1.0, delta: float = 1e-6, relation: str = "user", dim: int = 8, iterations: int = 3,
                 power_iters: int = 2, max_ratings_per_user: int | None = 50, clip_factor: float = 1.0,
                 clamp_r: float = 1.0, reg: float = 5.0, item_reg: float = 50.0, noise_reg: float = 1.0,
                 mean_fraction: float = 0.3, mean_noise: str = "laplace", mean_prior_std: float = 0.5,
                 mean_popularity_alpha: float = 0.0, mean_popularity_share: float = 0.1, count_weight: float | None = None,
                 init_fraction: float = 0.2, beta_p: float = 5.0, init_scale: float = 0.3, seed: int | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__(device)
        self.epsilon, self.delta = check_epsilon_delta(epsilon, delta, "dpals")
        for key, value, allowed in (("relation", relation, RELATIONS), ("mean_noise", mean_noise, NOISES)):
            if value not in allowed:
                raise ConfigError(f"dpals: {key}={value!r}; use one of {allowed}")
        #: the item-mean release's estimator and options (the mean_* keys; validated here)
        self.means_spec = ItemMeansSpec("posterior", relation, mean_noise, float(mean_prior_std), None if count_weight is None
                                        else float(count_weight), float(mean_popularity_alpha), float(mean_popularity_share))
        if int(dim) < 1 or int(iterations) < 1 or int(power_iters) < 0:
            raise ConfigError(f"dpals: need dim >= 1, iterations >= 1, power_iters >= 0 (got {dim}, {iterations}, {power_iters})")
        if math.isfinite(self.epsilon) and (max_ratings_per_user is None or math.isinf(clip_factor) or math.isinf(clamp_r)):
            raise ConfigError("dpals: a private run needs max_ratings_per_user, clip_factor and clamp_r finite (they set the sensitivity)")
        if not (clip_factor > 0 and clamp_r > 0 and reg > 0 and item_reg > 0 and noise_reg >= 0 and beta_p >= 0 and init_scale > 0):
            raise ConfigError("dpals: need clip_factor, clamp_r, reg, item_reg, init_scale > 0 and noise_reg, beta_p >= 0")
        if not (0 < mean_fraction < 1 and 0 <= init_fraction < 1) or (mean_noise == "gaussian" and mean_fraction + init_fraction >= 1):
            raise ConfigError("dpals: need 0 < mean_fraction < 1, 0 <= init_fraction < 1 (and their sum < 1 with gaussian means)")
        if int(power_iters) > 0 and init_fraction == 0 and math.isfinite(self.epsilon):
            raise ConfigError("dpals: power_iters > 0 needs init_fraction > 0")
        self.relation, self.dim, self.iterations, self.power_iters = relation, int(dim), int(iterations), int(power_iters)
        self.max_ratings_per_user = None if max_ratings_per_user is None else int(max_ratings_per_user)
        self.clip_factor, self.clamp_r, self.reg, self.item_reg = float(clip_factor), float(clamp_r), float(reg), float(item_reg)
        self.noise_reg, self.mean_fraction = float(noise_reg), float(mean_fraction)
        self.init_fraction, self.beta_p, self.init_scale = float(init_fraction), float(beta_p), float(init_scale)
        self.seed = None if seed is None else int(seed)  # None: secret noise (seeding.py)

    def release_sensitivities(self) -> dict[str, float]:
        """What ``fit`` calibrates its noise to: item statistics, one power-iteration round, one ALS round."""
        m = self.max_ratings_per_user
        spec = self.means_spec
        return {"item_stats": item_stats_sensitivity(spec.relation, spec.noise, spec.count_weight),
                "power": power_sensitivity(m, self.clamp_r, self.relation) if m is not None else math.inf,
                "als": als_sensitivity(m, self.clip_factor, self.clamp_r, self.relation) if m is not None else math.inf}

    # ----------------------------------------------------------------- budget
    def _plan(self) -> None:
        """Per-release mu (and eps of Laplace means) so that the whole run is (epsilon, delta)."""
        power_share = self.init_fraction if self.power_iters > 0 else 0.0
        if self.means_spec.noise == "laplace":
            self.mean_epsilon_ = self.mean_fraction * self.epsilon
            gauss_eps, plan = self.epsilon - self.mean_epsilon_, {"als": (1.0 - power_share, self.iterations)}
        else:
            self.mean_epsilon_ = None
            gauss_eps = self.epsilon
            plan = {"item_stats": (self.mean_fraction, 1), "als": (1.0 - self.mean_fraction - power_share, self.iterations)}
        if power_share > 0:
            plan["power"] = (power_share, self.power_iters)
        self.plan_ = plan
        self.mu_ = (split_mu(calibrate_gaussian(gauss_eps, self.delta, accountant="gdp").mu, plan) if self.private
                    else {k: math.inf for k in plan})

    # ----------------------------------------------------------------- fit
    def fit(self, train: Ratings) -> "DPALS":
        """Steps 0-3 of the module docstring."""
        train = self._prepare(train, require_ratings=True)
        dev, n_i, d = train.device, train.n_items, self.dim
        gen = noise_generator(self.seed, dev, private=self.private)
        self._plan()
        # step 0: item means (the private fallback), offsets, residuals, per-user sample
        self._release_means(train, gen)
        self.user_offset_, y = user_residuals(train, self.item_avg_, self.beta_p, self.clamp_r)
        # a per-user function of u's own ratings for ANY key (so bounded); the key is drawn from the secret stream anyway
        keep = per_user_sample(train, self.max_ratings_per_user, gen.randbits(63), hash="lehmer")  # keyed by the raw ids in train.meta
        mask, resid = train.csr(torch.ones_like(y)), train.csr(y)
        m_cap = self.max_ratings_per_user
        # step 1: noisy power iteration
        q = torch.linalg.qr(gen.randn(n_i, d, device=gen.device, dtype=torch.float64).to(dev))[0]
        self.power_std_ = 0.0
        if self.power_iters > 0:
            c0 = self.clamp_r * math.sqrt(m_cap) if m_cap is not None else math.inf
            if self.private:
                self.power_std_ = self.release_sensitivities()["power"] / self.mu_["power"]
            for _ in range(self.power_iters):
                w = power_statistics(train, y, keep, q, c0)
                if self.power_std_ > 0:
                    w = w + gen.randn(n_i, d, device=gen.device, dtype=torch.float64).to(dev) * self.power_std_
                q = torch.linalg.qr(w)[0]
        v = q * (self.init_scale * math.sqrt(n_i))
        # step 2: ALS rounds with noisy item statistics
        self.als_sensitivity_ = self.release_sensitivities()["als"]
        self.als_std_ = self.als_sensitivity_ / self.mu_["als"] if self.private else 0.0
        eye = torch.eye(d, dtype=torch.float64, device=dev)
        for _ in range(self.iterations):
            a, b = als_round_statistics(train, y, keep, v, self.reg, self.clip_factor, mask, resid)
            if self.als_std_ > 0:
                a = a + symmetric_noise(d, self.als_std_, gen, dev, batch=(n_i,))
                b = b + gen.randn(n_i, d, device=gen.device, dtype=torch.float64).to(dev) * self.als_std_
            evals, evecs = torch.linalg.eigh(a)
            a_psd = (evecs * evals.clamp_min(0.0)[:, None, :]) @ evecs.transpose(1, 2)
            # lambda_v = item_reg + noise_reg x s sqrt(d): the ridge grows with the noise's spectral scale
            lam_v = self.item_reg + self.noise_reg * self.als_std_ * math.sqrt(d)
            v = torch.linalg.solve(a_psd + lam_v * eye, b.unsqueeze(-1)).squeeze(-1)
        # step 3: users solve their own factors from the released V
        self.item_factors_ = v.float()
        self._index_users(train)
        log.info("dpals(%s, eps=%g): d=%d T=%d m=%s, ALS noise std %.4g (Delta %.4g), power std %.4g",
                 self.relation, self.epsilon, d, self.iterations, m_cap, self.als_std_, self.als_sensitivity_, self.power_std_)
        return self

    # ------------------------------------------------------------ release
    def released_state(self) -> dict[str, Any]:
        """What epsilon covers and prediction reads: r~, g and the last round's item factors V (solved from the noisy
        statistics). Never the user offsets or factors (each user's own)."""
        fb = self._check_fitted()
        return {"n_items": int(self.item_avg_.numel()), "fallback": fallback_release(fb), "item_means": self.item_avg_,
                "global_mean": float(self.global_avg_), "item_factors": self.item_factors_}

    def restore(self, train: Ratings, state: dict[str, Any]) -> "DPALS":
        """r~, g and V from ``state``; each user's b_u and p_u from their own ratings in ``train`` (step 3)."""
        train = self._prepare(train, state)
        self.item_avg_, self.global_avg_ = state["item_means"].to(train.device), float(state["global_mean"])
        self.item_factors_ = state["item_factors"].to(train.device)
        self._index_users(train)
        return self

    def personalise(self, ratings: Ratings) -> "DPALS":
        """Recompute every user-side quantity (b_u, p_u) from ``ratings`` and the released r~, V only (the billboard
        model: what each user does on their own device; the audit uses it with the auditor's known histories)."""
        self._index_users(ratings.to(self.device))
        return self

    def _index_users(self, train: Ratings) -> None:
        """Step 3: b_u and p_u = (V_Ru^T V_Ru + lambda I)^-1 V_Ru^T y_u from the user's own ratings."""
        self.user_offset_, y = user_residuals(train, self.item_avg_, self.beta_p, self.clamp_r)
        self.user_factors_ = solve_rows(train.csr(torch.ones_like(y)), train.csr(y), self.item_factors_.double(), self.reg).float()
        self.user_counts_, self.train_ = train.user_counts(), train

    # ------------------------------------------------------------- predict
    def predict(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """r^_ui = clip(r~_i + b_u + p_u . v_i); unknown users get r~_i, unknown item ids g (private fallback)."""
        self._check_fitted()
        uc, ic, ok_i, known = query_pairs(users, items, self.train_, self.user_counts_, self.device, "dpals")
        return self._offset_predict(uc, ic, ok_i, known, (self.user_factors_[uc] * self.item_factors_[ic]).sum(1))

    # ------------------------------------------------------------- privacy
    def privacy_report(self) -> dict[str, Any]:
        released = ("DP item means r~ and global mean g; per round the noisy item statistics (A~_j, b~_j) and the item "
                    "factors V solved from them (item-side only); the noisy power-iteration matrices")
        joint = ("joint DP (billboard model): user factors p_u and offsets b_u are solved by each user from the released V "
                 "and their own ratings and are never released; a prediction for u reads u's own ratings")
        if not self.private:
            return {"mechanism": "dpals at epsilon=inf (no noise)", "relation": None, "epsilon": math.inf, "delta": 0.0,
                    "released": released, "analysis": "non-private"}
        eps_gauss = gdp_epsilon(math.sqrt(sum(self.mu_[k] ** 2 * n for k, (_, n) in self.plan_.items())), self.delta)
        mean_eps = self.mean_epsilon_ or 0.0
        return {
            "mechanism": "dpals: private ALS (Chien et al. ICML 2021), noisy item-side sufficient statistics",
            "relation": self.relation, "relation_text": RELATION_TEXT[self.relation],
            "sensitivity": {"item_means": self.means_release_.sensitivity,
                            "item_means_norm": "L1" if self.means_spec.noise == "laplace" else "L2", "als_round_l2": self.als_sensitivity_,
                            "power_round_l2": power_sensitivity(self.max_ratings_per_user, self.clamp_r, self.relation),
                            "rule": "sqrt(m) Gamma_u sqrt(Gamma_u^2 + Gamma_r^2) and m Gamma_r^2, x2 at rating level"},
            "item_means_release": self.means_release_.describe(),
            "noise": (f"item means: {self.means_spec.noise} (std {self.means_release_.noise_std:.4g}); ALS rounds: N(0, {self.als_std_:.4g}^2) "
                      f"on every (A_j triangle, b_j) entry x {self.iterations}; power iteration: N(0, {self.power_std_:.4g}^2) "
                      f"on every entry of W x {self.power_iters}"),
            "epsilon": self.epsilon, "delta": self.delta, "mu_gdp_per_release": dict(self.mu_),
            "epsilon_exact": mean_eps + eps_gauss,
            "epsilon_rdp_crosscheck": mean_eps + gaussian_epsilon([(1.0 / self.mu_[k], 1.0, n) for k, (_, n) in self.plan_.items()],
                                                                  self.delta),
            "accountant": ("Gaussian DP: exact composition of all Gaussian releases (Dong, Roth & Su 2022, Cor. 3.3, 2.13)"
                           + ("; Laplace item means (pure eps) by basic composition" if self.means_spec.noise == "laplace" else "")
                           + "; Opacus RDP figure as a looser cross-check"),
            "released": released, "joint_dp": joint,
            "analysis": f"(eps, delta) = ({self.epsilon:g}, {self.delta:g}) under '{RELATION_TEXT[self.relation]}'. " + joint,
            "not_private": "metrics.json's baselines (PCC/COS) and test metrics read the data without noise",
        }
