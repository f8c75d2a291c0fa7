"""What every private mechanism does alike for the low-rank PNBM (``model.similarity=lowrank``; the model is
:class:`~dprec_torch.models.pnbm_lowrank.LowRankPNBM`): the DP item means, their share of the budget, and the
per-user clip of U's gradient. The mechanisms (``gaussian_pnbm``, ``sgld``, ``dpsgd_l1``) call these and keep
their own step.

Item means (the former ``lowrank_dpsgd``'s release, :func:`dprec_torch.privacy.gaussian_release.release_item_means`,
user level, L2 sensitivity 1 of the weighted item statistics (S, gamma C)):

* Gaussian mechanisms (``gaussian``, ``sgld``): the means get mu_m = sqrt(``mean_fraction``) x mu_total, where
  mu_total is the mu of ONE unsampled Gaussian release that the accountant puts at exactly (eps, delta)
  (noise multiplier 1 / mu_total = :func:`~dprec_torch.privacy.analysis.calibrate_sigma` at q = 1, one step); i.e. the
  means take the share ``mean_fraction`` of mu^2 and enter the accountant as (1 / mu_m, q = 1, 1 step) before the
  steps. The steps' noise is then calibrated so that the whole history meets eps.
* the Laplace mechanism (``dpsgd``): the means are a pure eps_0 = ``mean_fraction`` x eps release (L1 sensitivity 1),
  composed with the steps by basic composition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

from dprec_torch.errors import ConfigError
from dprec_torch.models.pnbm_lowrank import LowRankPNBM
from dprec_torch.privacy.analysis import calibrate_sigma, gaussian_epsilon
from dprec_torch.privacy.gaussian_release import ItemMeansRelease, check_popularity, item_stats_sensitivity, release_item_means
from dprec_torch.privacy.item_means import install_item_means
from dprec_torch.privacy.opacus_accounting import RDP_ORDERS


@lru_cache(maxsize=4096)
def _rdp_of_one_step(q: float, sigma: float) -> np.ndarray:
    return np.asarray(compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=RDP_ORDERS))


@lru_cache(maxsize=4096)
def history_epsilon(history: tuple[tuple[float, float, int], ...], delta: float, accountant: str) -> float:
    """Opacus's epsilon at ``delta`` for a history of (sigma, q, steps) entries, memoised (a mechanism asks for the same
    figure every epoch). ``rdp``: Opacus's own functions, with the RDP of one step of each (q, sigma) computed once and
    composed by multiplication (what ``RDPAccountant`` computes for each history from scratch); ``prv``: Opacus's PRV
    accountant on the history (:class:`~dprec_torch.privacy.opacus_accounting.OpacusAccountant`)."""
    if not history:
        return 0.0
    if any(sigma <= 0 for sigma, _, _ in history):
        return math.inf
    if accountant == "rdp":
        rdp = sum(steps * _rdp_of_one_step(float(q), float(sigma)) for sigma, q, steps in history)
        return float(get_privacy_spent(orders=RDP_ORDERS, rdp=rdp, delta=delta)[0])
    return gaussian_epsilon([tuple(h) for h in history], delta, accountant)


def is_lowrank(model: Any) -> bool:
    """The low-rank PNBM (S = U U^T)."""
    return isinstance(model, LowRankPNBM)


@dataclass(frozen=True)
class MeanOptions:
    """The options of the item-means release (:func:`release_item_means`'s; the mechanism's ``mean_*`` keys)."""

    prior_std: float = 0.5
    popularity_alpha: float = 0.0
    popularity_share: float = 0.1
    count_weight: float | None = 0.5

    def __post_init__(self) -> None:
        if not self.prior_std > 0:
            raise ConfigError(f"mechanism.mean_prior_std must be > 0, got {self.prior_std}")
        check_popularity(float(self.popularity_alpha), float(self.popularity_share))
        item_stats_sensitivity("user", "gaussian", self.count_weight)  # validates gamma


def gaussian_mean_multiplier(epsilon: float, delta: float, mean_fraction: float, accountant: str) -> float:
    """1 / mu_m with mu_m = sqrt(mean_fraction) mu_total (module docstring)."""
    if not 0 < mean_fraction < 1:
        raise ConfigError(f"mechanism.mean_fraction must be in (0, 1), got {mean_fraction}")
    return calibrate_sigma(epsilon, delta, 1.0, 1, accountant) / math.sqrt(mean_fraction)


def release_means(model: LowRankPNBM, budget: float, noise: str, options: MeanOptions, generator: torch.Generator
                  ) -> ItemMeansRelease:
    """Release the item means from the model's bound training data (budget: mu for ``gaussian``, the pure eps_0 for
    ``laplace``) and install them in the model and its fallback; returns the release (for the privacy report)."""
    if model.history is None:
        raise ConfigError("the low-rank PNBM must be attached to its training data before the mechanism")
    alpha = options.popularity_alpha if noise == "gaussian" else 0.0
    rel = release_item_means(model.history, "user", budget, options.prior_std, generator, noise, options.count_weight,
                             alpha, options.popularity_share)
    install_item_means(model, rel)
    return rel


def means_report(rel: ItemMeansRelease, noise: str, budget: float) -> dict[str, Any]:
    """The item-mean release as the privacy report states it."""
    budget_key = "mu" if noise == "gaussian" else "epsilon"
    return {"relation": "user", "noise": noise, budget_key: budget, "noise_std": rel.noise_std,
            "sensitivity": rel.sensitivity, "global_mean": rel.global_mean, "released": rel.describe(), **rel.details}


def clip_lowrank(mechanism: Any, residuals: torch.Tensor, batch: Any, model: LowRankPNBM, p: float = 2) -> torch.Tensor:
    """e'_ui <- e'_ui min(1, c / ||g_u||_p) per user (c = ``mechanism.clip_norm``): clips each sampled user's whole
    gradient of U (:meth:`LowRankPNBM.per_user_gradient_rows`, the explicit rows; L2 = Frobenius or L1)."""
    rows, norms2 = model.per_user_gradient_rows(batch, residuals)
    if p == 2:
        norms = norms2
    else:
        norms = torch.zeros_like(norms2).index_add_(0, batch.rows, rows.abs().sum(1))
    return mechanism.clip_by_norm(residuals, norms, batch.rows)
