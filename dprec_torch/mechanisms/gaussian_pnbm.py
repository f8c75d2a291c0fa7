"""``mechanism=gaussian_pnbm`` (``conf/mechanism/gaussian_pnbm.yaml``; ``mechanism=gaussian model=pnbm`` points there): user-level DP-SGD.

Builds on :class:`dprec_torch.mechanisms.gaussian.GaussianDPSGD` (steps 1-4 there) and adds what PNBM
needs for the guarantee to cover the released model:

* per-user L2 clipping of G_u (rows and columns R_u of S) from
  :func:`dprec_torch.privacy.pnbm_clipping.per_user_grad_norms` (closed form, no M x M per user),
  and diag(G) := 0 before the noise (the diagonal is discarded by ``project_``);
* the item means r_bar are released first by two Gaussian mechanisms with noise multiplier sigma_0
  (:func:`dprec_torch.privacy.item_means.release_item_means`, ``centred``; L2 sensitivity 1 after per-user weights),
  recorded in the same Opacus accountant as (sigma_0, q = 1, 2 steps). sigma_0 is chosen so that the
  means alone would cost ``mean_fraction`` x eps; the SGD's sigma is then calibrated so that the
  composition of everything is eps (:func:`dprec_torch.privacy.calibration.calibrate_gaussian`);
* ``init=constant`` starts from S = s0 (1 - I) (data-independent; Eq. (2) is then the item mean plus
  the user's mean centred rating).

Relation: add/remove one user (Poisson over users). Predictions for u also read u's own ratings.

The low-rank form (``model.similarity=lowrank``, S = U U^T, :mod:`dprec_torch.models.pnbm_lowrank`): each sampled
user's whole gradient of U is clipped to Frobenius norm C (the explicit per-user rows), N(0, (sigma C)^2) goes on
each of the M d entries of U's summed gradient, which is then divided by the expected batch size q N (the model's
``gradient_reduction = "mean"``), and U <- U - lr (G~ / (q N) + (weight_decay / N) U). The item means are the Gaussian
release of :mod:`dprec_torch.mechanisms.lowrank_pnbm` (``mean_prior_std``, ``mean_popularity_*``, ``count_weight``;
share ``mean_fraction`` of mu^2), one entry (1 / mu_m, q = 1, 1 step) of the same Opacus accountant; sigma is the
smallest that meets eps for [means, T steps]. ``init``, ``init_value``, ``mean_global_fraction`` and
``mean_shrinkage`` are the full form's and are not read. These are the equations, clip, noise, step and accountant
of the former ``lowrank_dpsgd`` predictor (without momentum).
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch

from dprec_torch.errors import ConfigError
from dprec_torch.mechanisms.context import TrainingContext
from dprec_torch.mechanisms.dpsgd_l1 import INITS, bound_model, is_pnbm
from dprec_torch.mechanisms.gaussian import GaussianDPSGD
from dprec_torch.mechanisms.lowrank_pnbm import clip_lowrank, gaussian_mean_multiplier, is_lowrank, means_report, release_means
from dprec_torch.privacy.calibration import calibrate_gaussian, gaussian_epsilon
from dprec_torch.privacy.item_means import ItemMeansSpec, install_item_means, release_item_means
from dprec_torch.privacy.pnbm_clipping import per_user_grad_norms, zero_diagonal_

MEAN_RELEASES = 2  # global mean, then the item statistics


class GaussianPNBM(GaussianDPSGD):
    """User-level Gaussian DP-SGD for PNBM (see the module docstring)."""

    relation = "user"

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        context: TrainingContext,
        epsilon: float,
        delta: float = 1e-6,
        clip_norm: float = 1.0,
        accountant: str = "rdp",
        lr: float = 0.01,
        weight_decay: float = 0.0,
        sampling_ratio: float = 0.1,
        mean_fraction: float = 0.5,
        mean_global_fraction: float = 0.25,
        mean_shrinkage: float = 8.0,
        init: str = "constant",
        init_value: float = 1.0,
        unit: str = "user",
        seed: int | None = None,
        model: Any = None,
        mean_prior_std: float = 0.5,
        mean_popularity_alpha: float = 0.0,
        mean_popularity_share: float = 0.1,
        count_weight: float | None = 0.5,
    ) -> None:
        epsilon, delta = float(epsilon), float(delta)
        if unit != "user":
            raise ConfigError("mechanism=gaussian with PNBM needs unit=user (a rating enters every other target of its user)")
        if init not in INITS:
            raise ConfigError(f"mechanism.init must be one of {INITS}, got '{init}'")
        if not 0 < float(mean_fraction) < 1:
            raise ConfigError(f"mechanism.mean_fraction must be in (0, 1), got {mean_fraction}")
        model = model if model is not None else bound_model(context)
        self.lowrank = is_lowrank(model)
        if not (is_pnbm(model) or self.lowrank):
            raise ConfigError(f"GaussianPNBM trains PNBM only, got {type(model).__name__}")
        q, steps = min(1.0, float(sampling_ratio)), int(context.total_steps)
        self.mean_releases = 1 if self.lowrank else MEAN_RELEASES
        self.mean_options = ItemMeansSpec(prior_std=float(mean_prior_std), popularity_alpha=float(mean_popularity_alpha),
                                          popularity_share=float(mean_popularity_share),
                                          count_weight=None if count_weight is None else float(count_weight)) if self.lowrank else None
        self.mean_sigma, sigma = 0.0, None
        if math.isfinite(epsilon):
            if not 0 < delta < 1:
                raise ConfigError(f"mechanism=gaussian needs delta in (0, 1), got {delta}")
            if self.lowrank:
                self.mean_sigma = gaussian_mean_multiplier(epsilon, delta, float(mean_fraction), accountant)
            else:
                self.mean_sigma = calibrate_gaussian(float(mean_fraction) * epsilon, delta, 1.0, MEAN_RELEASES, accountant).sigma
            sigma = calibrate_gaussian(epsilon, delta, q, steps, accountant, prior=[(self.mean_sigma, 1.0, self.mean_releases)]).sigma
        super().__init__(params, context, epsilon, delta=delta, unit="user", clip_norm=clip_norm, noise_multiplier=sigma,
                         accountant=accountant, lr=lr, weight_decay=weight_decay, sampling_ratio=q, seed=seed)
        self.model_ref = model
        self.mean_release = None
        self.releases_item_means = self.mean_sigma > 0  # by prepare(), recorded in the accountant as (sigma_0, 1, releases)
        self.mean_global_fraction, self.mean_shrinkage = float(mean_global_fraction), float(mean_shrinkage)
        self.init, self.init_value = init, float(init_value)

    def prepare(self, model: Any) -> None:
        """Before any batch: the item means released by the Gaussian mechanism(s) with multiplier sigma_0 from
        ``self.generator`` into the model and its fallback (one accountant entry), then S = s0 (1 - I) (``init=constant``,
        full form)."""
        super().prepare(model)
        if self.releases_item_means and self.lowrank:
            self.mean_release = release_means(model, 1.0 / self.mean_sigma, "gaussian", self.mean_options, self.generator)
            self.accountant.step(self.mean_sigma, 1.0, steps=1)
        elif self.releases_item_means:
            self.mean_release = release_item_means(model.history, ItemMeansSpec("centred", "user", "gaussian",
                                                                                global_fraction=self.mean_global_fraction,
                                                                                shrinkage=self.mean_shrinkage),
                                                   self.generator, noise_multiplier=self.mean_sigma)
            install_item_means(model, self.mean_release)
            self.accountant.step(self.mean_sigma, 1.0, steps=MEAN_RELEASES)
        if self.init == "constant" and not self.lowrank:
            with torch.no_grad():
                model.S.fill_(self.init_value)
                model.S.fill_diagonal_(0.0)

    def clip_residuals(self, residuals: torch.Tensor, batch: Any = None, model: Any = None) -> torch.Tensor:
        """e_ui <- e_ui min(1, c / ||G_u||_2), ||G_u|| from the PNBM closed form (off-diagonal)."""
        if batch is None or model is None:
            raise ConfigError("mechanism=gaussian needs the batch and the model to clip per user")
        if batch.n_targets != batch.ind.values().numel():
            raise ConfigError("mechanism=gaussian with PNBM needs user-level batches (every rating of each sampled user)")
        if self.lowrank:
            return clip_lowrank(self, residuals, batch, model)
        return self.clip_by_norm(residuals, per_user_grad_norms(model, batch, residuals, p=2), batch.rows)

    def add_noise(self) -> None:
        """diag(G) := 0, then the parent's N(0, (sigma c)^2) on every entry and the accountant step."""
        for group in self.param_groups:
            for p in group["params"]:
                if not self.lowrank and p.grad is not None and p.dim() == 2 and p.shape[0] == p.shape[1]:
                    zero_diagonal_(p.grad)
        super().add_noise()

    def planned_epsilon(self) -> float:
        hist = [(self.mean_sigma, 1.0, self.mean_releases)] if self.mean_sigma > 0 else []
        if self.noise_multiplier <= 0:
            return math.inf
        if self.lowrank:  # memoised (asked every epoch)
            return gaussian_epsilon((*hist, (self.noise_multiplier, self.sampling_ratio, self.context.total_steps)),
                                    self.delta, self.accountant_name)
        return gaussian_epsilon(hist + [(self.noise_multiplier, self.sampling_ratio, self.context.total_steps)],
                                self.delta, self.accountant_name)

    def epsilon_spent(self) -> float:
        if self.lowrank:  # the same accountant's figure, memoised per history
            return gaussian_epsilon(self.accountant.history, self.delta, self.accountant_name)
        return super().epsilon_spent()

    def privacy_report(self) -> dict[str, Any]:
        report = super().privacy_report()
        if self.lowrank:
            report["mechanism"] = ("gaussian DP-SGD for the low-rank PNBM S = U U^T (per-user Frobenius clipping of "
                                   "dL_u/dU, DP item means)")
            report["item_means"] = (means_report(self.mean_release, "gaussian", 1.0 / self.mean_sigma)
                                    if self.mean_release is not None else None)
            report["analysis"] += (f" Item means: one Gaussian release with noise multiplier {self.mean_sigma:.4g} (L2 "
                                   "sensitivity 1) in the same accountant. The noisy sum is divided by the expected batch "
                                   "size q N (N = the number of user ids, treated as public). b_u and p_u are computed by "
                                   "each user from the released U and r_bar and their own ratings (joint DP).")
            return report
        report["mechanism"] = "gaussian DP-SGD for PNBM (per-user L2 clipping of G_u, DP item means)"
        report["item_means"] = self.mean_release.report() if self.mean_release is not None else None
        report["analysis"] += (f" Item means: 2 Gaussian releases with sigma_0={self.mean_sigma:.4g} in the same accountant."
                               " Predictions for u also read u's own ratings (joint DP).")
        return report
