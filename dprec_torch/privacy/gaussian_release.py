"""One-shot Gaussian releases of item-side statistics, composed exactly in Gaussian DP.

Used by :mod:`dprec_torch.predictors.noisy_gram` and :mod:`dprec_torch.predictors.dpals`.

Composition (Dong, Roth & Su, "Gaussian differential privacy", JRSS-B 2022):

* a Gaussian mechanism with L2 sensitivity Delta and noise std s is mu-GDP with mu = Delta / s (Thm. 2.7);
* k adaptively chosen Gaussian mechanisms on the same neighbouring relation are exactly
  sqrt(sum_k mu_k^2)-GDP (Cor. 3.3), no slack;
* mu-GDP is (eps, delta(eps))-DP for every eps with
  delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (Cor. 2.13), which is the analytic
  Gaussian mechanism's curve (Balle & Wang 2018, Thm. 8) with sigma/Delta = 1/mu.

So a target (eps, delta) fixes one total mu = 1 / analytic_gaussian_sigma(1, eps, delta), and a release plan
splits mu^2 between its releases (:func:`split_mu`). :func:`rdp_epsilon` re-derives the epsilon of the same
plan with Opacus's RDP accountant (q = 1), a looser cross-check printed beside the exact figure.

Item statistics (step 1 of both predictors), z_ui = (r_ui - mid) / half in [-1, 1] (mid, half: the public
scale's midpoint and half-span):

* user level (add/remove one user): w_u = 1 / sqrt(sum_{i in R_u} (z_ui^2 + 1)), released
  (S_i, C_i) = sum_u w_u (z_ui, 1): user u's contribution has L2 norm exactly 1 -> Delta = 1;
* rating level (add/remove one rating, or change its value): (S_i, C_i) = sum (z_ui, sqrt(3)):
  add/remove moves one (S_i, C_i) by sqrt(z^2 + 3) <= 2, a change of value moves S_i by |z - z'| <= 2 -> Delta = 2.
  The sqrt(3) weight on counts costs nothing extra (both cases reach 2) and makes counts less noisy.

``count_weight`` gamma (optional, :func:`item_stats_sensitivity`): the released pair is (S_i, gamma C_i) and
C~ = released / gamma. User level: w_u = 1 / sqrt(sum_{i in R_u} (z_ui^2 + gamma^2)), so the user's contribution
still has L2 norm exactly 1 (Delta = 1) while a gamma < 1 moves weight from the counts to the sums (each S_i
carries more signal; each C_i more noise in count units). Rating level: add/remove moves (S_i, gamma C_i) by
sqrt(z^2 + gamma^2) <= sqrt(1 + gamma^2), a change of value by |z - z'| <= 2 -> Delta = max(2, sqrt(1 + gamma^2)).

``noise=laplace`` (pure eps_m, composed with the Gaussian releases by basic composition): L1 versions,
user level w_u = 1 / sum_{i in R_u} (1 + |z_ui|) (L1 norm exactly 1 -> Delta_1 = 1, as in
:mod:`dprec_torch.privacy.item_means`); rating level (z, 1): add/remove |z| + 1 <= 2, change |z - z'| <= 2 -> Delta_1 = 2.
With gamma: user w_u = 1 / sum (gamma + |z_ui|) (Delta_1 = 1); rating (z, gamma): Delta_1 = max(2, 1 + gamma).

Post-processing (no privacy cost): g = mid + half sum S~ / max(sum C~, 1), and with C+ = max(C~, 0),
S'_i = S~_i - C+_i (g - mid) / half (the item's deviation from g, times its count, in z units) and a
N(0, tau_z^2) prior on each item's deviation (tau_z = ``prior_std`` / half), the posterior mean given
S' = C d + N(0, s^2) (s = the noise std of a sum) is
    r_bar_i = clip(g + half C+_i tau_z^2 S'_i / (C+_i^2 tau_z^2 + s^2))     (-> S'_i / C_i as s -> 0),
so an item whose count is lost in the noise falls back to g instead of amplifying the noise.

Popularity re-weighting (``popularity_alpha`` > 0, Gaussian only, :func:`release_item_means`): stage 0 releases
the counts K (:func:`popularity_counts`, sensitivity 1) with mu_0 = sqrt(share) mu; stage 1 releases (S, gamma C) with
each rating weighted by a_i = (K~_i / floor)^-alpha in (0, 1] before the user's normalisation (same sensitivity) with
mu_1 = sqrt(1 - share) mu, so mu_0^2 + mu_1^2 = mu^2. The posterior above then runs per item on S_i / a_i, C_i / a_i
(noise std s / a_i), with C pooled with kappa K~ (:func:`pooled_counts`, post-processing).

Per-user sampling: :func:`per_user_sample` keeps at most m ratings of each user, chosen by a pseudo-random
key of (seed, user id, item id) only, so one user's selection never depends on anybody else's data
(issue 15, defect 2); :func:`per_user_sample_of` keys by the RAW ids, so it also survives a rebuilt id map (issue 24, 6).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import torch
from scipy.optimize import brentq
from scipy.special import log_ndtr

from dprec_torch.errors import ConfigError

RELATIONS = ("user", "rating")
RELATION_TEXT = {
    "user": "add/remove one user's whole profile",
    "rating": "add/remove one rating, or change one rating's value",
}
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


# ------------------------------------------------------------------ GDP calibration
def gdp_delta(mu: float, epsilon: float) -> float:
    """delta(eps) of mu-GDP (Dong, Roth & Su Cor. 2.13)."""
    if mu <= 0:
        return 0.0
    return float(math.exp(log_ndtr(-epsilon / mu + mu / 2)) - math.exp(epsilon + log_ndtr(-epsilon / mu - mu / 2)))


@lru_cache(maxsize=512)
def total_mu(epsilon: float, delta: float) -> float:
    """The largest mu with mu-GDP implying (epsilon, delta)-DP (bisection on the monotone delta(mu)); inf for eps = inf."""
    epsilon, delta = float(epsilon), float(delta)
    if math.isinf(epsilon):
        return math.inf
    if not epsilon > 0 or not 0 < delta < 1:
        raise ConfigError(f"Gaussian release needs epsilon > 0 and delta in (0, 1), got epsilon={epsilon}, delta={delta}")
    hi = 1.0
    while gdp_delta(hi, epsilon) < delta:
        hi *= 2.0
    mu = brentq(lambda m: gdp_delta(m, epsilon) - delta, 1e-9, hi, xtol=1e-14, rtol=1e-12)
    while gdp_delta(mu, epsilon) > delta:  # brentq may land a hair above: step down until it holds
        mu *= 1.0 - 1e-10
    return float(mu)


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest eps with delta(eps) <= delta for mu-GDP (inverse of :func:`total_mu`)."""
    if math.isinf(mu):
        return math.inf
    if mu <= 0:
        return 0.0
    hi = 1.0
    while gdp_delta(mu, hi) > delta:
        hi *= 2.0
    return float(brentq(lambda e: gdp_delta(mu, e) - delta, 0.0, hi, xtol=1e-12))


def split_mu(mu: float, plan: dict[str, tuple[float, int]]) -> dict[str, float]:
    """Per-step mu of each release: ``plan[name] = (fraction of mu^2, steps)``; fractions sum to 1.

    sum_name steps * mu_name^2 = mu^2, so the composition is exactly mu-GDP.
    """
    total = sum(f for f, _ in plan.values())
    if any(not f > 0 or n < 1 for f, n in plan.values()) or abs(total - 1.0) > 1e-9:
        raise ConfigError(f"release plan fractions must be > 0 and sum to 1, got {plan}")
    return {k: mu * math.sqrt(f / n) for k, (f, n) in plan.items()}


def rdp_epsilon(mus: dict[str, tuple[float, int]], delta: float) -> float:
    """Opacus RDP epsilon for releases ``name -> (mu per step, steps)`` (noise multiplier 1/mu, q = 1)."""
    from dprec_torch.privacy.opacus_accounting import OpacusAccountant

    if any(math.isinf(m) for m, _ in mus.values()):
        return math.inf
    acc = OpacusAccountant("rdp")
    for mu, steps in mus.values():
        acc.step(1.0 / mu, 1.0, steps=int(steps))
    return acc.get_epsilon(delta)


# ------------------------------------------------------------------ item statistics
def _per_user(train: Any, v: torch.Tensor) -> torch.Tensor:
    return torch.zeros(train.n_users, dtype=torch.float64, device=v.device).index_add_(0, train.users, v)


def _per_item(train: Any, v: torch.Tensor) -> torch.Tensor:
    return torch.zeros(train.n_items, dtype=torch.float64, device=v.device).index_add_(0, train.items, v)


def item_stat_terms(train: Any, relation: str, noise: str = "gaussian", count_weight: float | None = None,
                    item_weight: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-rating terms (a_ui, b_ui) with S_i = sum a_ui and gamma C_i = sum b_ui (module docstring).

    ``item_weight`` a_i in (0, 1] (Gaussian only; :func:`popularity_weights`): rating (u, i) enters as a_i (z, gamma)
    before the user's normalisation, so the sensitivity is unchanged (user level: unit norm; rating level: a_i <= 1).
    """
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


@dataclass
class ItemMeansRelease:
    """The DP item means and what was released to get them."""

    means: torch.Tensor  # float32 [M]
    global_mean: float
    sensitivity: float
    noise_std: float
    details: dict[str, Any] = field(default_factory=dict)
    counts: torch.Tensor | None = None  # the noisy counts C~ (count units), public after the release

    def describe(self) -> str:
        """What was released, for a privacy report."""
        text = (f"(S, gamma C) + N(0, {self.noise_std:.4g}^2) on each of the 2M item statistics "
                f"(L2 sensitivity {self.sensitivity:g})")
        if self.details.get("popularity_alpha", 0) > 0:
            text = (f"the item counts K + N(0, {self.details['popularity_noise_std']:.4g}^2) (L2 sensitivity 1, "
                    f"share {self.details['popularity_share']:g} of mu^2), then " + text +
                    f" with each rating re-weighted by a_i = (K~_i / floor)^-{self.details['popularity_alpha']:g}; "
                    "the two Gaussian releases are together exactly the item means' mu-GDP")
        return text


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


def release_item_means(train: Any, relation: str, budget: float, prior_std: float, gen: torch.Generator,
                       noise: str = "gaussian", count_weight: float | None = None, popularity_alpha: float = 0.0,
                       popularity_share: float = 0.1) -> ItemMeansRelease:
    """Step 1: (S, gamma C) + noise on all 2M entries, then the shrunk means (module docstring).

    ``budget`` is mu (GDP) for ``noise=gaussian`` and the pure epsilon for ``noise=laplace``; inf = no noise.
    ``count_weight``: gamma (None: the default of (relation, noise)).
    ``popularity_alpha`` > 0 (Gaussian only): first release the counts K (:func:`popularity_counts`) with
    mu_0 = sqrt(share) mu, then (S, gamma C) re-weighted by a_i = (K~_i / floor)^(-alpha) (:func:`popularity_weights`,
    floor = 2 x K~'s noise std) with mu_1 = sqrt(1 - share) mu: mu_0^2 + mu_1^2 = mu^2, so the two releases are
    together exactly the caller's mu-GDP (one Gaussian mechanism of multiplier 1/mu for an RDP/PRV accountant).
    Each user's unit norm then leans towards rare items, whose means have the fewest contributions, and the
    counts C~ are pooled with the stage-0 counts (:func:`pooled_counts`).
    """
    if not prior_std > 0:
        raise ConfigError(f"mean_prior_std must be > 0, got {prior_std}")
    check_popularity(popularity_alpha, popularity_share, noise)
    m = train.n_items
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
            k = k + torch.randn(m, generator=gen, device=gen.device, dtype=torch.float64).to(k.device) * std0
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
        u = torch.rand(2 * m, generator=gen, device=gen.device, dtype=torch.float64).to(stats.device) - 0.5
        stats = stats - b * torch.sign(u) * torch.log1p(-2.0 * u.abs())
    else:
        std = delta / budget
        stats = stats + torch.randn(2 * m, generator=gen, device=gen.device, dtype=torch.float64).to(stats.device) * std
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
    means = torch.where(den > 0, g + half * cp * tau2 * dev / den.clamp_min(1e-300), torch.full_like(s, g)).clamp(lo, hi)
    return ItemMeansRelease(means.float(), float(g), delta, std, {"count_noise_std": count_std, "prior_std": prior_std,
                                                                  "count_weight": gamma, **details},
                            counts=c.float())


# ------------------------------------------------------------------ per-user sampling
_P = 2147483647  # 2^31 - 1 (Park-Miller modulus): every product below fits in int64


def rating_keys(users: torch.Tensor, items: torch.Tensor, seed: int) -> torch.Tensor:
    """A pseudo-random key in [0, 2^31 - 1) that depends on (seed, user id, item id) only."""
    x = (users.long() * 1000003 + items.long() * 7919 + (int(seed) % _P) * 104729 + 12345) % _P  # a 63-bit secret seed fits
    for mult in (48271, 69621, 16807):  # three Lehmer rounds with an xor of the item id between them
        x = (x * mult) % _P
        x = (x ^ (items.long() % 65536)) % _P
    return x


def per_user_sample(users: torch.Tensor, items: torch.Tensor, max_per_user: int | None, seed: int,
                    user_keys: torch.Tensor | None = None, item_keys: torch.Tensor | None = None) -> torch.Tensor:
    """Bool mask keeping at most ``max_per_user`` ratings of each user (the smallest keys); all if None.

    ``user_keys`` / ``item_keys``: a raw-id key per contiguous id (the loader's ``Ratings.meta``); the keys then
    stay the same when the id map is rebuilt without another user (else the contiguous ids are used)."""
    if max_per_user is None:
        return torch.ones_like(users, dtype=torch.bool)
    if int(max_per_user) < 1:
        raise ConfigError(f"max_ratings_per_user must be >= 1 or null, got {max_per_user}")
    u_ids = users if user_keys is None else user_keys.to(users.device)[users] % _P
    i_ids = items if item_keys is None else item_keys.to(items.device)[items] % _P
    keys = rating_keys(u_ids, i_ids, seed)
    order = torch.argsort(users * (_P + 1) + keys)  # by user, then key
    su = users[order]
    counts = torch.bincount(su, minlength=int(users.max()) + 1 if users.numel() else 0)
    start = torch.cumsum(counts, 0) - counts
    rank = torch.arange(users.numel(), device=users.device) - start[su]
    keep = torch.zeros_like(users, dtype=torch.bool)
    keep[order] = rank < int(max_per_user)
    return keep


def per_user_sample_of(train: Any, max_per_user: int | None, seed: int) -> torch.Tensor:
    """:func:`per_user_sample` of ``train`` keyed by the raw ids the loader stored in ``train.meta`` (issue 24, 6)."""
    from dprec_torch.data.preprocess import ITEM_KEYS, USER_KEYS

    return per_user_sample(train.users, train.items, max_per_user, seed, train.meta.get(USER_KEYS), train.meta.get(ITEM_KEYS))


def install_private_fallback(predictor: Any, means: torch.Tensor, global_mean: float) -> None:
    """Replace a fitted predictor's :class:`MeanFallback` statistics (exact training means, set up by ``_prepare``)
    with the released ones, so the object holds no non-private item statistic."""
    fb = predictor.fallback_
    fb.item_means_, fb.global_mean = means.to(fb.item_means_.device), float(global_mean)
    fb.item_counts_ = torch.ones_like(fb.item_counts_)  # "known item" must not depend on who rated what
