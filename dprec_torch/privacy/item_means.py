"""Differentially private item means r~_i and global mean g: the one release.

:func:`release_item_means`, the package's one entry point, takes an :class:`ItemMeansSpec` (estimator, relation,
noise, options) and the budget, draws the noise from the caller's generator and returns an :class:`ItemMeansRelease`.
Two published estimators: ``estimator="posterior"`` (``noisy_gram``, ``dpals``, the low-rank PNBM mechanisms, the
DP-means baseline) releases the item statistics (S, gamma C) once, then shrinks to the posterior mean towards their
global mean; ``estimator="centred"`` (the full PNBM mechanisms ``gaussian``, ``dpsgd_l1``, ``sgld``) releases a DP
global mean first, then item statistics centred at it, shrunk by a constant. Every weight below depends on one user's
own data only, so the sensitivities hold for any dataset.

**posterior.** Item statistics, z_ui = (r_ui - mid) / half in [-1, 1] (the public scale's midpoint and half-span):

* user level (add/remove one user): w_u = 1 / sqrt(sum_{i in R_u} (z_ui^2 + 1)), released
  (S_i, C_i) = sum_u w_u (z_ui, 1): user u's contribution has L2 norm exactly 1 -> Delta = 1;
* rating level (add/remove one rating, or change its value): (S_i, C_i) = sum (z_ui, sqrt(3)): add/remove moves one
  (S_i, C_i) by sqrt(z^2 + 3) <= 2, a change of value moves S_i by |z - z'| <= 2 -> Delta = 2 (so the sqrt(3) weight,
  which makes counts less noisy, costs nothing extra).

``count_weight`` gamma (optional, :func:`item_stats_sensitivity`): the released pair is (S_i, gamma C_i), C~ =
released / gamma. User level: w_u = 1 / sqrt(sum_{i in R_u} (z_ui^2 + gamma^2)), still L2 norm exactly 1 (Delta = 1);
a gamma < 1 moves weight from the counts to the sums (more signal in each S_i, more noise in each C_i in count
units). Rating level: add/remove moves (S_i, gamma C_i) by sqrt(z^2 + gamma^2) <= sqrt(1 + gamma^2), a change of
value by |z - z'| <= 2 -> Delta = max(2, sqrt(1 + gamma^2)).

``noise=laplace`` (pure eps_m, composed with the Gaussian releases by basic composition), L1 versions: user level
w_u = 1 / sum_{i in R_u} (1 + |z_ui|) (L1 norm exactly 1 -> Delta_1 = 1, as in the centred estimator); rating level
(z, 1): add/remove |z| + 1 <= 2, change |z - z'| <= 2 -> Delta_1 = 2. With gamma: user w_u = 1 / sum (gamma + |z_ui|)
(Delta_1 = 1); rating (z, gamma): Delta_1 = max(2, 1 + gamma).

Post-processing (no privacy cost): g = mid + half sum S~ / max(sum C~, 1); with C+ = max(C~, 0),
S'_i = S~_i - C+_i (g - mid) / half (the item's deviation from g times its count, in z units) and a N(0, tau_z^2)
prior on each item's deviation (tau_z = ``prior_std`` / half), the posterior mean given S' = C d + N(0, s^2) (s: the
noise std of a sum) is
    r_bar_i = clip(g + half C+_i tau_z^2 S'_i / (C+_i^2 tau_z^2 + s^2))     (-> S'_i / C_i as s -> 0),
so an item whose count is lost in the noise falls back to g instead of amplifying the noise.

Popularity re-weighting (``popularity_alpha`` > 0, Gaussian only): stage 0 releases the counts K
(:func:`popularity_counts`, sensitivity 1) with mu_0 = sqrt(share) mu; stage 1 releases (S, gamma C) with each rating
weighted by a_i = (K~_i / floor)^-alpha in (0, 1] before the user's normalisation (same sensitivity) with
mu_1 = sqrt(1 - share) mu, so mu_0^2 + mu_1^2 = mu^2. The posterior above then runs per item on S_i / a_i, C_i / a_i
(noise std s / a_i), with C pooled with kappa K~ (:func:`pooled_counts`, post-processing).

**centred.** Two steps (basic composition of their epsilons, or two Gaussian mechanisms of one multiplier):

1. Global mean mu (fraction ``global_fraction`` of the budget), centred at the public scale midpoint m0 with
   a0 = span/2, so z = (r - m0)/a0 is in [-1, 1]; each user adds (mean_{i in R_u} z_ui, 1) (user level) or each
   rating (z_ui, 1) (rating level): L1 sensitivity 2 (add/remove a user; add/remove/change a rating);
   mu = m0 + a0 (S_g + Lap(2/eps_g)) / max(C_g + Lap(2/eps_g), 1).
2. Item statistics (the rest of the budget, eps_i), centred at mu with a = max(mu - lo, hi - mu):
   z_ui = (r_ui - mu)/a in [-1, 1], per-item sums S_i = sum_u w_u z_ui and counts C_i = sum_u w_u I_ui:
     * user level, Laplace: w_u = 1 / sum_{i in R_u} (1 + |z_ui|): the user's (S, C) has L1 norm exactly 1 ->
       sensitivity 1, noise Lap(1/eps_i) on each of the 2M entries;
     * user level, Gaussian: w_u = 1 / sqrt(sum_{i in R_u} (z_ui^2 + 1)) -> L2 sensitivity 1, noise N(0, sigma^2);
     * rating level, Laplace: w = 1 -> sensitivity 2 (one rating touches one item), Lap(2/eps_i).
   Post-processing with shrinkage towards mu (kappa = ``shrinkage`` x the noise std of C_i):
       r_bar_i = clip(mu + a S~_i / (max(C~_i, 0) + kappa), lo, hi).

Installing a release: :func:`install_item_means` (a PNBM model and its fallback), :func:`install_private_fallback`
(a fitted predictor's fallback).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from dprec_torch.errors import ConfigError
from dprec_torch.seeding import SecretGenerator

RELATIONS = ("user", "rating")
RELATION_TEXT = {"user": "add/remove one user's whole profile", "rating": "add/remove one rating, or change one rating's value"}
COUNT_WEIGHT = {("user", "gaussian"): 1.0, ("rating", "gaussian"): math.sqrt(3.0),
                ("user", "laplace"): 1.0, ("rating", "laplace"): 1.0}
#: L2 (gaussian) or L1 (laplace) sensitivity of (S, C)
ITEM_STATS_SENSITIVITY = {("user", "gaussian"): 1.0, ("rating", "gaussian"): 2.0,
                          ("user", "laplace"): 1.0, ("rating", "laplace"): 2.0}
NOISES = ("gaussian", "laplace")


def resolve_count_weight(relation: str, noise: str, count_weight: float | None) -> float:
    """gamma: the given count weight, or the default :data:`COUNT_WEIGHT` of (relation, noise) when None."""
    if count_weight is None:
        return COUNT_WEIGHT[(relation, noise)]
    gamma = float(count_weight)
    if not (gamma > 0 and math.isfinite(gamma)):
        raise ConfigError(f"count_weight must be a finite number > 0 (or null for the default), got {count_weight}")
    return gamma


def item_stats_sensitivity(relation: str, noise: str, count_weight: float | None = None) -> float:
    """L2 (gaussian) or L1 (laplace) sensitivity of (S, gamma C) under ``relation`` (module docstring)."""
    if count_weight is None:
        return ITEM_STATS_SENSITIVITY[(relation, noise)]
    gamma = resolve_count_weight(relation, noise, count_weight)
    if relation == "user":
        return 1.0
    return max(2.0, math.sqrt(1.0 + gamma * gamma)) if noise == "gaussian" else max(2.0, 1.0 + gamma)


# ------------------------------------------------------------------ item statistics (posterior)
def _per_user(train: Any, v: torch.Tensor) -> torch.Tensor:
    return torch.zeros(train.n_users, dtype=torch.float64, device=v.device).index_add_(0, train.users, v)


def _per_item(train: Any, v: torch.Tensor) -> torch.Tensor:
    return torch.zeros(train.n_items, dtype=torch.float64, device=v.device).index_add_(0, train.items, v)


def item_stat_terms(train: Any, relation: str, noise: str = "gaussian", count_weight: float | None = None,
                    item_weight: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-rating terms (a_ui, b_ui) with S_i = sum a_ui and gamma C_i = sum b_ui (module docstring). ``item_weight``
    a_i in (0, 1] (Gaussian only; :func:`popularity_weights`): rating (u, i) enters as a_i (z, gamma) before the user's
    normalisation, so the sensitivity is unchanged (user level: unit norm; rating level: a_i <= 1)."""
    if relation not in RELATIONS:
        raise ConfigError(f"relation must be one of {RELATIONS}, got '{relation}'")
    if noise not in NOISES:
        raise ConfigError(f"item-statistics noise must be one of {NOISES}, got '{noise}'")
    gamma = resolve_count_weight(relation, noise, count_weight)
    lo, hi = train.scale.lo, train.scale.hi
    z = ((train.values.double() - (lo + hi) / 2) / ((hi - lo) / 2)).clamp(-1.0, 1.0)
    if item_weight is not None:
        if noise != "gaussian":
            raise ConfigError("popularity re-weighting of the item statistics needs mean_noise=gaussian")
        a = item_weight.to(z.device, torch.float64)[train.items]
        if relation == "user":
            w = a * _per_user(train, a * a * (z * z + gamma * gamma)).clamp_min(1e-12).rsqrt()[train.users]
            return w * z, w * gamma
        return a * z, a * gamma
    if relation == "user":
        if noise == "laplace":
            w = 1.0 / _per_user(train, z.abs() + gamma).clamp_min(1e-12)[train.users]
        else:
            w = _per_user(train, z * z + gamma * gamma).clamp_min(1e-12).rsqrt()[train.users]
        return w * z, w * gamma
    return z, torch.full_like(z, gamma)


def item_stats(train: Any, relation: str, noise: str = "gaussian", count_weight: float | None = None,
               item_weight: torch.Tensor | None = None) -> torch.Tensor:
    """The pre-noise released vector (S_1..S_M, gamma C_1..gamma C_M), float64."""
    a, b = item_stat_terms(train, relation, noise, count_weight, item_weight)
    return torch.cat([_per_item(train, a), _per_item(train, b)])


def popularity_counts(train: Any, relation: str) -> torch.Tensor:
    """Stage 0 of a popularity re-weighted release: K_i = sum_u n_u^(-1/2) [i in R_u] (user level: each user's
    vector has L2 norm exactly 1) or K_i = |{u : i in R_u}| (rating level: one rating moves one K_i by 1); L2
    sensitivity 1 either way (a change of value moves nothing)."""
    ones = torch.ones_like(train.values, dtype=torch.float64)
    if relation == "user":
        ones = _per_user(train, ones).clamp_min(1.0).rsqrt()[train.users]
    return _per_item(train, ones)


#: relative spread of C_i / K_i across items assumed by :func:`pooled_counts` (a public constant; 3.5 % on ML-1M)
COUNT_RATIO_CV = 0.05


def pooled_counts(c: torch.Tensor, c_std: torch.Tensor, k: torch.Tensor, k_std: float, cv: float = COUNT_RATIO_CV) -> torch.Tensor:
    """Inverse-variance pool of the stage-1 counts C~ (std ``c_std`` per item, per-item units) with kappa K~, the
    stage-0 counts times kappa = sum C~ / sum K~ (std kappa sqrt(k_std^2 + (cv K~)^2): noise plus how far C / K
    strays from one ratio). Post-processing of the two releases: no privacy cost."""
    kappa = float(c.sum()) / max(float(k.sum()), 1e-12)
    pred = kappa * k
    v1 = c_std * c_std
    v2 = kappa * kappa * (k_std * k_std + (cv * k.clamp_min(0.0)) ** 2)
    return (c / v1 + pred / v2) / (1.0 / v1 + 1.0 / v2)


def check_popularity(alpha: float, share: float, noise: str = "gaussian") -> None:
    """One-line errors for the popularity re-weighting options of :func:`release_item_means`."""
    if not (math.isfinite(alpha) and alpha >= 0 and 0 < share < 1):
        raise ConfigError(f"need mean_popularity_alpha >= 0 and 0 < mean_popularity_share < 1, got {alpha}, {share}")
    if alpha > 0 and noise != "gaussian":
        raise ConfigError("mean_popularity_alpha > 0 needs Gaussian item means (mean_noise=gaussian)")


def popularity_weights(noisy_counts: torch.Tensor, alpha: float, floor: float) -> torch.Tensor:
    """a_i = (max(K~_i, floor) / floor)^(-alpha) in (0, 1]: rarer items get more of each user's unit norm
    (post-processing of the stage-0 release)."""
    return (noisy_counts.double().clamp_min(floor) / floor).pow(-float(alpha))


# ------------------------------------------------------------------ the spec and the release
ESTIMATORS = ("posterior", "centred")


@dataclass(frozen=True)
class ItemMeansSpec:
    """Which DP item-means estimator, and its options (the ``mean_*`` keys of the predictors and mechanisms):
    ``estimator`` ``posterior`` | ``centred`` (module docstring); ``relation`` ``user`` | ``rating``; ``noise``
    ``gaussian`` | ``laplace``. Posterior: ``prior_std`` (rating units), ``count_weight`` gamma (None: the default of
    (relation, noise)), ``popularity_alpha`` and ``popularity_share`` (Gaussian only), ``feature_prior`` (the prior's
    mean from public item features, :func:`feature_prior_mean`). Centred: ``global_fraction`` (the global mean's share
    of a Laplace epsilon) and ``shrinkage`` (kappa / the counts' noise std)."""

    estimator: str = "posterior"
    relation: str = "user"
    noise: str = "gaussian"
    prior_std: float = 0.5
    count_weight: float | None = None
    popularity_alpha: float = 0.0
    popularity_share: float = 0.1
    global_fraction: float = 0.1
    shrinkage: float = 8.0
    feature_prior: bool = False

    def __post_init__(self) -> None:
        for key, allowed in (("estimator", ESTIMATORS), ("relation", RELATIONS), ("noise", NOISES)):
            if getattr(self, key) not in allowed:
                raise ConfigError(f"item-mean {key} must be one of {allowed}, got '{getattr(self, key)}'")
        if self.estimator == "posterior":
            if not self.prior_std > 0:
                raise ConfigError(f"mean_prior_std must be > 0, got {self.prior_std}")
            check_popularity(float(self.popularity_alpha), float(self.popularity_share), self.noise)
            item_stats_sensitivity(self.relation, self.noise, self.count_weight)  # validates gamma
            return
        if not 0 < self.global_fraction < 1:
            raise ConfigError(f"mechanism.mean_global_fraction must be in (0, 1), got {self.global_fraction}")
        if not self.shrinkage >= 0:
            raise ConfigError(f"mechanism.mean_shrinkage must be >= 0, got {self.shrinkage}")
        if self.noise == "gaussian" and self.relation != "user":
            raise ConfigError("Gaussian DP item means are implemented at user level only")


@dataclass
class ItemMeansRelease:
    """The DP item means, the global mean and what was released to get them."""

    means: torch.Tensor  # float32 [M]
    global_mean: float
    spec: ItemMeansSpec
    epsilon: float | None = None  # the pure epsilon (laplace)
    mu: float | None = None  # the Gaussian-DP mu (posterior, gaussian)
    noise_multiplier: float | None = None  # sigma of each Gaussian step (centred, gaussian; sensitivity 1)
    sensitivity: float | None = None  # of the item statistics (L2, or L1 for laplace; posterior)
    noise_std: float | None = None  # of each released item statistic (posterior)
    details: dict[str, Any] = field(default_factory=dict)
    counts: torch.Tensor | None = None  # the noisy counts C~ (count units; posterior), public after the release

    def describe(self) -> str:
        """What was released, for a privacy report."""
        if self.spec.estimator == "centred":
            return (f"the global mean's (S_g, C_g) + {self.spec.noise} noise, then the item statistics (S, C) centred at "
                    "it + the same noise on each of the 2M entries")
        text = (f"(S, gamma C) + N(0, {self.noise_std:.4g}^2) on each of the 2M item statistics "
                f"(L2 sensitivity {self.sensitivity:g})")
        if self.details.get("popularity_alpha", 0) > 0:
            text = (f"the item counts K + N(0, {self.details['popularity_noise_std']:.4g}^2) (L2 sensitivity 1, "
                    f"share {self.details['popularity_share']:g} of mu^2), then " + text +
                    f" with each rating re-weighted by a_i = (K~_i / floor)^-{self.details['popularity_alpha']:g}; "
                    "the two Gaussian releases are together exactly the item means' mu-GDP")
        return text

    def report(self) -> dict[str, Any]:
        """The release as a privacy report states it."""
        s = self.spec
        if s.estimator == "centred":
            return {"relation": s.relation, "noise": s.noise, "epsilon": self.epsilon,
                    "noise_multiplier": self.noise_multiplier, "global_mean": self.global_mean, **self.details}
        budget = {"mu": self.mu} if s.noise == "gaussian" else {"epsilon": self.epsilon}
        return {"relation": s.relation, "noise": s.noise, **budget, "noise_std": self.noise_std,
                "sensitivity": self.sensitivity, "global_mean": self.global_mean, "released": self.describe(),
                **self.details}


def release_item_means(train: Any, spec: ItemMeansSpec, generator: SecretGenerator, *, epsilon: float | None = None,
                       mu: float | None = None, noise_multiplier: float | None = None,
                       features: torch.Tensor | None = None) -> ItemMeansRelease:
    """Release DP item means of ``train`` with the estimator and options of ``spec`` (module docstring), the noise
    drawn from ``generator`` in the estimator's fixed order. The budget, exactly one of: ``epsilon``, the pure epsilon
    (``noise=laplace``; ``inf``: no noise, whatever the noise); ``mu``, the Gaussian-DP mu (``noise=gaussian``);
    ``noise_multiplier`` sigma (``noise=gaussian``). The posterior estimator adds N(0, (Delta / mu)^2) and takes
    mu = 1 / sigma when given sigma; the centred one runs two Gaussian mechanisms of multiplier sigma (sigma = 1 / mu
    when given mu), for the caller's RDP/PRV accountant. ``features`` (public, ``[M, F]``): the prior of the posterior
    estimator's ``feature_prior``."""
    given = [k for k, v in (("epsilon", epsilon), ("mu", mu), ("noise_multiplier", noise_multiplier)) if v is not None]
    if len(given) != 1:
        raise ConfigError(f"release_item_means takes exactly one of epsilon, mu, noise_multiplier; got {given or 'none'}")
    no_noise = epsilon is not None and math.isinf(epsilon)
    if not no_noise and (spec.noise == "laplace") != (epsilon is not None):
        raise ConfigError(f"{spec.noise} item means take " + ("epsilon" if spec.noise == "laplace" else "mu or noise_multiplier")
                          + f", got {given[0]}")
    if spec.estimator == "posterior":
        budget = epsilon if epsilon is not None else mu if mu is not None else math.inf if noise_multiplier == 0 else 1.0 / noise_multiplier
        return _posterior(train, spec, budget, generator, features)
    if no_noise:
        raise ConfigError("the centred item-mean estimator needs a finite budget")
    sigma = noise_multiplier if noise_multiplier is not None or mu is None else 1.0 / mu
    return _centred(train, spec, epsilon, sigma, generator)


# ------------------------------------------------------------------ the posterior estimator
FEATURE_PRIOR_RIDGE = 1.0


def feature_prior_mean(cp: torch.Tensor, dev: torch.Tensor, std: torch.Tensor | float, tau2: float,
                       features: torch.Tensor) -> torch.Tensor:
    """The prior mean of the item deviations (z units) from public item features phi_i: with x_i = (1, phi_i), the
    noisy deviations d~_i = S'_i / C+_i weighted by their precision w_i = C+_i^2 / (C+_i^2 tau^2 + s_i^2),
    beta = (X^T W X + FEATURE_PRIOR_RIDGE I)^-1 X^T W d~ and m_i = x_i . beta. The posterior mean then shrinks towards
    m_i instead of 0: d_i = (m_i s_i^2 + C+_i tau^2 S'_i) / (C+_i^2 tau^2 + s_i^2) (-> S'_i / C_i as s -> 0). It reads
    the released (S~, C~) and public data only: post-processing, no privacy cost."""
    x = torch.cat([torch.ones(len(cp), 1, dtype=torch.float64, device=cp.device), features], 1)
    w = cp * cp / (cp * cp * tau2 + std * std)
    est = torch.where(cp > 0, dev / cp.clamp_min(1e-12), torch.zeros_like(dev))
    ridge = FEATURE_PRIOR_RIDGE * torch.eye(x.shape[1], dtype=torch.float64, device=cp.device)
    return x @ torch.linalg.solve(x.t() @ (x * w[:, None]) + ridge, x.t() @ (w * est))
def _laplace(n: int, scale: float, gen: SecretGenerator, device: torch.device) -> torch.Tensor:
    u = gen.rand(n, device=gen.device, dtype=torch.float64).to(device) - 0.5
    return -scale * torch.sign(u) * torch.log1p(-2 * u.abs())


def _gauss(n: int, std: float, gen: SecretGenerator, device: torch.device) -> torch.Tensor:
    return gen.randn(n, device=gen.device, dtype=torch.float64).to(device) * std


def _posterior(train: Any, spec: ItemMeansSpec, budget: float, gen: SecretGenerator,
               features: torch.Tensor | None = None) -> ItemMeansRelease:
    """(S, gamma C) + noise on all 2M entries, then the shrunk means (module docstring). ``budget`` is mu (GDP) for
    ``noise=gaussian``, the pure epsilon for ``noise=laplace``; inf = no noise. ``popularity_alpha`` > 0 (module
    docstring): the two stages (floor = 2 x K~'s noise std) are together exactly the caller's mu-GDP (one Gaussian
    mechanism of multiplier 1/mu for an RDP/PRV accountant); each user's unit norm then leans towards rare items, whose
    means have the fewest contributions."""
    relation, noise, prior_std, count_weight = spec.relation, spec.noise, spec.prior_std, spec.count_weight
    popularity_alpha, popularity_share = spec.popularity_alpha, spec.popularity_share
    given, m = budget, train.n_items
    lo, hi = train.scale.lo, train.scale.hi
    mid, half = (lo + hi) / 2, (hi - lo) / 2
    delta = item_stats_sensitivity(relation, noise, count_weight)
    weight = torch.ones(m, dtype=torch.float64, device=train.values.device)
    details: dict[str, Any] = {}
    if popularity_alpha > 0:
        mu0 = math.sqrt(popularity_share) * budget
        std0 = 0.0 if math.isinf(budget) else 1.0 / mu0
        k = popularity_counts(train, relation)
        if std0 > 0:
            k = k + _gauss(m, std0, gen, k.device)
        floor = 2.0 * std0 if std0 > 0 else 1.0
        weight = popularity_weights(k, popularity_alpha, floor).to(train.values.device)
        budget = math.sqrt(1.0 - popularity_share) * budget
        details = {"popularity_alpha": popularity_alpha, "popularity_share": popularity_share, "popularity_noise_std": std0}
    stats = item_stats(train, relation, noise, count_weight, weight if popularity_alpha > 0 else None)
    if math.isinf(budget):
        std = 0.0
    elif noise == "laplace":
        b = delta / budget
        std = math.sqrt(2.0) * b
        stats = stats + _laplace(2 * m, b, gen, stats.device)
    else:
        std = delta / budget
        stats = stats + _gauss(2 * m, std, gen, stats.device)
    gamma = resolve_count_weight(relation, noise, count_weight)
    # back to per-item units: S_i / a_i and C_i / a_i carry noise std / a_i (a = 1 without re-weighting)
    s, c, std_i = stats[:m] / weight, stats[m:] / (gamma * weight), std / weight
    if popularity_alpha > 0 and std > 0:  # stage 0's counts are a second, independent measurement of C
        c = pooled_counts(c, (std / gamma) / weight, k, std0)
    count_std = std / gamma
    # the global mean from the released sums as they are (each item's noise std is then the same)
    g = min(max(mid + half * float(stats[:m].sum()) / max(float(stats[m:].sum()) / gamma, 1.0), lo), hi)
    cp = c.clamp_min(0.0)
    dev = s - cp * (g - mid) / half
    tau2 = (prior_std / half) ** 2
    den = cp * cp * tau2 + std_i * std_i
    if spec.feature_prior and features is not None and std > 0:  # post-processing of (S~, C~) and public features
        prior = feature_prior_mean(cp, dev, std_i, tau2, features.to(cp.device, torch.float64))
        means = (g + half * (prior * std_i * std_i + cp * tau2 * dev) / den).clamp(lo, hi)
        details["feature_prior"] = f"ridge ({FEATURE_PRIOR_RIDGE:g}) on {features.shape[1]} public item features"
    else:
        means = torch.where(den > 0, g + half * cp * tau2 * dev / den.clamp_min(1e-300), torch.full_like(s, g)).clamp(lo, hi)
    return ItemMeansRelease(means.float(), float(g), spec, epsilon=given if noise == "laplace" else None,
                            mu=given if noise == "gaussian" else None, sensitivity=delta, noise_std=std,
                            details={"count_noise_std": count_std, "prior_std": prior_std, "count_weight": gamma, **details},
                            counts=c.float())


# ------------------------------------------------------------------ the centred estimator
def _centred_global_mean(train: Any, relation: str, noise: str, budget: float, gen: SecretGenerator) -> tuple[float, dict]:
    """Step 1: (S_g, C_g) about the public centre/half-width (m0, a0), plus noise. ``budget`` is eps_g (Laplace) or the
    noise multiplier sigma_g (Gaussian, L2 sensitivity sqrt(2))."""
    lo, hi = train.scale.lo, train.scale.hi
    m0, a0 = (lo + hi) / 2, (hi - lo) / 2
    z = (train.values.double() - m0) / a0
    if relation == "user":
        n_u = _per_user(train, torch.ones_like(z))
        s_u = _per_user(train, z)
        has = n_u > 0
        s, c = float((s_u[has] / n_u[has]).sum()), float(has.sum())
    else:
        s, c = float(z.sum()), float(len(train))
    dev, laplace = train.values.device, noise == "laplace"
    scale, draw = (2.0 / budget, _laplace) if laplace else (budget * math.sqrt(2.0), _gauss)
    s_n, c_n = s + float(draw(1, scale, gen, dev)), c + float(draw(1, scale, gen, dev))
    info = {"global_laplace_scale" if laplace else "global_gaussian_std": scale}
    return min(max(m0 + a0 * s_n / max(c_n, 1.0), lo), hi), info


def _centred(train: Any, spec: ItemMeansSpec, epsilon: float | None, noise_multiplier: float | None,
             generator: SecretGenerator) -> ItemMeansRelease:
    """Both steps (module docstring). Laplace: ``epsilon`` is the total pure-DP budget of both steps (eps_g =
    global_fraction * epsilon). Gaussian (user level only): ``noise_multiplier`` sigma for both steps (sensitivity 1
    after the weights; the global step scales its sqrt(2) sensitivity into the std): two Gaussian mechanisms of noise
    multiplier sigma, to be composed by the caller's RDP/PRV accountant."""
    relation, noise, global_fraction, shrinkage = spec.relation, spec.noise, spec.global_fraction, spec.shrinkage
    laplace = noise == "laplace"
    if laplace and (epsilon is None or not epsilon > 0):
        raise ConfigError(f"DP item means need an epsilon > 0, got {epsilon}")
    if not laplace and (noise_multiplier is None or not noise_multiplier > 0):
        raise ConfigError(f"Gaussian DP item means need a noise multiplier > 0, got {noise_multiplier}")
    mu, info = _centred_global_mean(train, relation, noise, global_fraction * epsilon if laplace else noise_multiplier, generator)
    lo, hi = train.scale.lo, train.scale.hi
    a = max(mu - lo, hi - mu)
    z = (train.values.double() - mu) / a
    if laplace:  # rating level: w = 1, sensitivity 2; user level: L1-normalised, sensitivity 1 (module docstring)
        sens = 2.0 if relation == "rating" else 1.0
        w = torch.ones_like(z) if relation == "rating" else (1.0 / _per_user(train, 1.0 + z.abs()).clamp_min(1e-12))[train.users]
        scale = sens / ((1 - global_fraction) * epsilon)
        count_std = math.sqrt(2) * scale
        info.update(item_laplace_scale=scale, item_sensitivity_l1=sens)
    else:
        w = (1.0 / _per_user(train, 1.0 + z * z).clamp_min(1e-12).sqrt())[train.users]
        scale = count_std = float(noise_multiplier)
        info.update(item_gaussian_std=count_std, item_sensitivity_l2=1.0)
    draw = _laplace if laplace else _gauss
    s_n = _per_item(train, w * z) + draw(train.n_items, scale, generator, train.values.device)
    c_n = _per_item(train, w) + draw(train.n_items, scale, generator, train.values.device)
    kappa = shrinkage * count_std
    means = (mu + a * s_n / (c_n.clamp_min(0) + kappa).clamp_min(1e-12)).clamp(lo, hi)
    info.update(shrinkage_kappa=kappa, centre=mu, half_width=a)
    return ItemMeansRelease(means.to(torch.float32), float(mu), spec, epsilon=float(epsilon) if laplace else None,
                            noise_multiplier=None if laplace else float(noise_multiplier), details=info)


# ------------------------------------------------------------------ installing a release
def install_item_means(model: Any, release: ItemMeansRelease) -> None:
    """Put the DP means into a PNBM in place (the batch sampler holds the same tensor) and make its fallback use them:
    every user/item is then predicted by the model from DP quantities + u's own history."""
    with torch.no_grad():
        model.item_means.copy_(release.means.to(model.item_means.device))
    fb = model.fallback_  # BaseModel's default: None
    if fb is not None:
        install_private_fallback(model, release.means, release.global_mean)
        fb.user_counts_ = torch.ones_like(fb.user_counts_)  # "known" must not depend on who rated what


def install_private_fallback(predictor: Any, means: torch.Tensor, global_mean: float) -> None:
    """Replace a fitted predictor's :class:`MeanFallback` statistics (exact training means, set up by ``_prepare``)
    with the released ones, so the object holds no non-private item statistic."""
    fb = predictor.fallback_
    fb.item_means_, fb.global_mean = means.to(fb.item_means_.device), float(global_mean)
    fb.item_counts_ = torch.ones_like(fb.item_counts_)  # "known item" must not depend on who rated what
