"""What every private mechanism does alike for the low-rank PNBM (``model.similarity=lowrank``; the model is
:class:`~dprec_torch.models.pnbm_lowrank.LowRankPNBM`): the DP item means, their share of the budget, and the per-user
clip of U's gradient. The mechanisms (``gaussian``, ``sgld``, ``dpsgd``) call these and keep their own step.

Item means (:func:`dprec_torch.privacy.item_means.release_item_means`'s ``posterior`` estimator, user level, L2
sensitivity 1 of the weighted item statistics (S, gamma C)):

* Gaussian mechanisms (``gaussian``, ``sgld``): the means get mu_m = sqrt(``mean_fraction``) x mu_total, where
  mu_total is the mu of ONE unsampled Gaussian release that the accountant puts at exactly (eps, delta) (noise
  multiplier 1 / mu_total = :func:`~dprec_torch.privacy.calibration.calibrate_gaussian` at q = 1, one step); i.e. the
  means take the share ``mean_fraction`` of mu^2 and enter the accountant as (1 / mu_m, q = 1, 1 step) before the
  steps. The steps' noise is then calibrated so that the whole history meets eps.
* the Laplace mechanism (``dpsgd``): the means are a pure eps_0 = ``mean_fraction`` x eps release (L1 sensitivity 1),
  composed with the steps by basic composition.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch

from dprec_torch.errors import ConfigError
from dprec_torch.mechanisms.base import scale_residuals
from dprec_torch.models.pnbm_lowrank import LowRankPNBM
from dprec_torch.privacy.calibration import calibrate_gaussian
from dprec_torch.privacy.item_means import ItemMeansRelease, ItemMeansSpec, install_item_means, release_item_means
from dprec_torch.seeding import SecretGenerator


def is_lowrank(model: Any) -> bool:
    """The low-rank PNBM (S = U U^T)."""
    return isinstance(model, LowRankPNBM)


def gaussian_mean_multiplier(epsilon: float, delta: float, mean_fraction: float, accountant: str) -> float:
    """1 / mu_m with mu_m = sqrt(mean_fraction) mu_total (module docstring)."""
    if not 0 < mean_fraction < 1:
        raise ConfigError(f"mechanism.mean_fraction must be in (0, 1), got {mean_fraction}")
    return calibrate_gaussian(epsilon, delta, 1.0, 1, accountant).sigma / math.sqrt(mean_fraction)


def release_means(model: LowRankPNBM, budget: float, noise: str, options: ItemMeansSpec, generator: SecretGenerator
                  ) -> ItemMeansRelease:
    """Release the item means from the model's bound training data (``options``: the mechanism's ``mean_*`` keys as a
    posterior :class:`ItemMeansSpec`; budget: mu for ``gaussian``, the pure eps_0 for ``laplace``) and install them
    in the model and its fallback; returns the release (for the privacy report)."""
    if model.history is None:
        raise ConfigError("the low-rank PNBM must be attached to its training data before the mechanism")
    spec = replace(options, relation="user", noise=noise,
                   popularity_alpha=options.popularity_alpha if noise == "gaussian" else 0.0)
    features = model.features_.matrix if spec.feature_prior and model.features_ is not None else None  # public
    rel = (release_item_means(model.history, spec, generator, mu=budget, features=features) if noise == "gaussian"
           else release_item_means(model.history, spec, generator, epsilon=budget, features=features))
    install_item_means(model, rel)
    return rel


def clip_lowrank(mechanism: Any, residuals: torch.Tensor, batch: Any, model: LowRankPNBM, p: float = 2) -> torch.Tensor:
    """e'_ui <- e'_ui min(1, c / ||g_u||_p) per user (c = ``mechanism.clip_norm``): clips each sampled user's whole
    gradient of U (:meth:`LowRankPNBM.per_user_gradient_rows`, the explicit rows; L2 = Frobenius or L1)."""
    rows, norms = model.per_user_gradient_rows(batch, residuals, p=int(p), deferred=True)
    factor = mechanism.unit_clip_factors(norms, batch.row_mask)
    clipped = scale_residuals(residuals, factor, batch.rows)
    # the released gradient is these rows times each user's factor (float64): its user parts have norm <= c exactly
    model.stash_clipped_rows(batch, clipped, rows, factor)
    return clipped
