"""Differentially private item means r_bar_i (and global mean) for PNBM's centring and baseline.

PNBM (Eq. (2)) centres every rating by r_bar_j and predicts r_bar_i + ...; the committed model
takes r_bar from the training data with no noise, so it is released exactly (it is a model
buffer) and it moves every user's gradient. A provable mechanism must replace it with a DP
release and add its epsilon. Two steps (basic composition of their epsilons):

1. Global mean mu (fraction ``global_fraction`` of the budget), centred at the public scale
   midpoint m0 with a0 = span/2 so z = (r - m0)/a0 is in [-1, 1]:
     * user level: each user adds (mean_{i in R_u} z_ui, 1)  -> L1 sensitivity 2 (add/remove a user);
     * rating level: each rating adds (z_ui, 1)               -> L1 sensitivity 2 (add/remove/change a rating);
   mu = m0 + a0 (S_g + Lap(2/eps_g)) / max(C_g + Lap(2/eps_g), 1).
2. Item statistics (the rest of the budget, eps_i), centred at mu with a = max(mu - lo, hi - mu):
   z_ui = (r_ui - mu)/a in [-1, 1], per-item sums S_i = sum_u w_u z_ui and counts C_i = sum_u w_u I_ui:
     * user level, Laplace: w_u = 1 / sum_{i in R_u} (1 + |z_ui|), so the user's (S, C) vector has L1 norm
       exactly 1 -> sensitivity 1, noise Lap(1/eps_i) on each of the 2M entries;
     * user level, Gaussian: w_u = 1 / sqrt(sum_{i in R_u} (z_ui^2 + 1)) -> L2 sensitivity 1, noise N(0, sigma^2);
     * rating level, Laplace: w = 1 -> sensitivity 2 (one rating touches one item), Lap(2/eps_i).
   Post-processing with shrinkage towards mu (kappa = ``shrinkage`` x the noise std of C_i):
       r_bar_i = clip(mu + a S~_i / (max(C~_i, 0) + kappa), lo, hi).
Every weight depends on one user's own data only, so the sensitivities hold for any dataset.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from dprec_torch.errors import ConfigError
from dprec_torch.interfaces import HasMeanFallback

RELATIONS = ("user", "rating")


@dataclass
class DPItemMeans:
    """A DP release of (mu, r_bar) and how it was made."""

    means: torch.Tensor
    global_mean: float
    relation: str
    noise: str
    epsilon: float | None = None  # pure-DP epsilon (Laplace); None for Gaussian
    noise_multiplier: float | None = None  # Gaussian sigma (sensitivity 1), for the RDP/PRV accountant
    details: dict[str, Any] = field(default_factory=dict)

    def report(self) -> dict[str, Any]:
        return {"relation": self.relation, "noise": self.noise, "epsilon": self.epsilon,
                "noise_multiplier": self.noise_multiplier, "global_mean": self.global_mean, **self.details}


def _laplace(n: int, scale: float, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    u = torch.rand(n, generator=gen, device=gen.device, dtype=torch.float64).to(device) - 0.5
    return -scale * torch.sign(u) * torch.log1p(-2 * u.abs())


def _gauss(n: int, std: float, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    return torch.randn(n, generator=gen, device=gen.device, dtype=torch.float64).to(device) * std


def _user_sum(train: Any, v: torch.Tensor) -> torch.Tensor:
    return torch.zeros(train.n_users, dtype=torch.float64, device=v.device).index_add_(0, train.users, v)


def _item_sum(train: Any, v: torch.Tensor) -> torch.Tensor:
    return torch.zeros(train.n_items, dtype=torch.float64, device=v.device).index_add_(0, train.items, v)


def _global_stats(train: Any, relation: str) -> tuple[float, float, float, float]:
    """(S_g, C_g) and the public centre/half-width (m0, a0) of step 1."""
    lo, hi = train.scale.lo, train.scale.hi
    m0, a0 = (lo + hi) / 2, (hi - lo) / 2
    z = (train.values.double() - m0) / a0
    if relation == "user":
        n_u = _user_sum(train, torch.ones_like(z))
        s_u = _user_sum(train, z)
        has = n_u > 0
        return float((s_u[has] / n_u[has]).sum()), float(has.sum()), m0, a0
    return float(z.sum()), float(len(train)), m0, a0


def dp_global_mean(train: Any, relation: str, noise: str, budget: float, gen: torch.Generator) -> tuple[float, dict]:
    """Step 1. ``budget`` is eps_g (Laplace) or the noise multiplier sigma_g (Gaussian, L2 sensitivity sqrt(2))."""
    s, c, m0, a0 = _global_stats(train, relation)
    dev = train.values.device
    if noise == "laplace":
        b = 2.0 / budget
        s_n, c_n = s + float(_laplace(1, b, gen, dev)), c + float(_laplace(1, b, gen, dev))
        info = {"global_laplace_scale": b}
    else:
        std = budget * math.sqrt(2.0)
        s_n, c_n = s + float(_gauss(1, std, gen, dev)), c + float(_gauss(1, std, gen, dev))
        info = {"global_gaussian_std": std}
    mu = min(max(m0 + a0 * s_n / max(c_n, 1.0), train.scale.lo), train.scale.hi)
    return mu, info


def dp_item_means(train: Any, *, relation: str = "user", noise: str = "laplace", epsilon: float | None = None,
                  noise_multiplier: float | None = None, global_fraction: float = 0.1, shrinkage: float = 8.0,
                  generator: torch.Generator) -> DPItemMeans:
    """Release (mu, r_bar) under ``relation`` (see the module docstring for the equations).

    Laplace: ``epsilon`` is the total pure-DP budget of both steps (eps_g = global_fraction * epsilon).
    Gaussian (user level only): ``noise_multiplier`` sigma is used for both steps (sensitivity 1 after
    the weights; the global step scales its sqrt(2) sensitivity into the std), i.e. the release is two
    Gaussian mechanisms with noise multiplier sigma, to be composed by the caller's RDP/PRV accountant.
    """
    if relation not in RELATIONS:
        raise ConfigError(f"item-mean relation must be one of {RELATIONS}, got '{relation}'")
    if noise not in ("laplace", "gaussian"):
        raise ConfigError(f"item-mean noise must be laplace or gaussian, got '{noise}'")
    if not 0 < global_fraction < 1:
        raise ConfigError(f"mechanism.mean_global_fraction must be in (0, 1), got {global_fraction}")
    if not shrinkage >= 0:
        raise ConfigError(f"mechanism.mean_shrinkage must be >= 0, got {shrinkage}")
    if noise == "laplace":
        if epsilon is None or not epsilon > 0:
            raise ConfigError(f"DP item means need an epsilon > 0, got {epsilon}")
        eps_g, eps_i = global_fraction * epsilon, (1 - global_fraction) * epsilon
        mu, info = dp_global_mean(train, relation, noise, eps_g, generator)
    else:
        if relation != "user":
            raise ConfigError("Gaussian DP item means are implemented at user level only")
        if noise_multiplier is None or not noise_multiplier > 0:
            raise ConfigError(f"Gaussian DP item means need a noise multiplier > 0, got {noise_multiplier}")
        mu, info = dp_global_mean(train, relation, noise, noise_multiplier, generator)
    lo, hi = train.scale.lo, train.scale.hi
    a = max(mu - lo, hi - mu)
    z = (train.values.double() - mu) / a
    dev = train.values.device
    m = train.n_items
    if relation == "rating":
        w = torch.ones_like(z)
        b = 2.0 / eps_i
        count_std = math.sqrt(2) * b
        s_n = _item_sum(train, w * z) + _laplace(m, b, generator, dev)
        c_n = _item_sum(train, w) + _laplace(m, b, generator, dev)
        info.update(item_laplace_scale=b, item_sensitivity_l1=2.0)
    elif noise == "laplace":
        w = (1.0 / _user_sum(train, 1.0 + z.abs()).clamp_min(1e-12))[train.users]
        b = 1.0 / eps_i
        count_std = math.sqrt(2) * b
        s_n = _item_sum(train, w * z) + _laplace(m, b, generator, dev)
        c_n = _item_sum(train, w) + _laplace(m, b, generator, dev)
        info.update(item_laplace_scale=b, item_sensitivity_l1=1.0)
    else:
        w = (1.0 / _user_sum(train, 1.0 + z * z).clamp_min(1e-12).sqrt())[train.users]
        count_std = float(noise_multiplier)
        s_n = _item_sum(train, w * z) + _gauss(m, count_std, generator, dev)
        c_n = _item_sum(train, w) + _gauss(m, count_std, generator, dev)
        info.update(item_gaussian_std=count_std, item_sensitivity_l2=1.0)
    kappa = shrinkage * count_std
    means = (mu + a * s_n / (c_n.clamp_min(0) + kappa).clamp_min(1e-12)).clamp(lo, hi)
    info.update(shrinkage_kappa=kappa, centre=mu, half_width=a)
    return DPItemMeans(means.to(torch.float32), float(mu), relation, noise,
                       epsilon=float(epsilon) if noise == "laplace" else None,
                       noise_multiplier=float(noise_multiplier) if noise == "gaussian" else None, details=info)


def install_item_means(model: Any, release: DPItemMeans) -> None:
    """Put the DP means into a PNBM in place (the batch sampler holds the same tensor) and make its
    fallback use them: every user/item is then predicted by the model from DP quantities + u's own history.
    """
    with torch.no_grad():
        model.item_means.copy_(release.means.to(model.item_means.device))
    fb = model.fallback_ if isinstance(model, HasMeanFallback) else None
    if fb is not None:
        fb.item_means_ = release.means.to(fb.item_means_.device)
        fb.global_mean = release.global_mean
        fb.item_counts_ = torch.ones_like(fb.item_counts_)  # "known" must not depend on who rated what
        fb.user_counts_ = torch.ones_like(fb.user_counts_)
