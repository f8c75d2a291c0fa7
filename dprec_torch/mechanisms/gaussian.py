"""``mechanism=gaussian``: DP-SGD with per-example clipping and Gaussian noise (Abadi et al. 2016).

One step t, on a Poisson sample of units (each unit -- a rating, or a user with all of their ratings -- is included
independently with probability q = ``sampling_ratio``):

    1. g_x  = sum_{(u,i) in x} e_ui d r_hat_ui / d theta        per-example gradient of unit x
    2. g_x <- g_x min(1, c / ||g_x||_2)                        clip (c = ``clip_norm``)
    3. G    = sum_x g_x + N(0, sigma^2 c^2 I)                   noise on EVERY parameter entry
    4. theta <- theta - lr (G + weight_decay theta)

Step 2 is done on the residuals: g_x is linear in the e_ui of x, so scaling x's residuals by min(1, c/||g_x||) scales
g_x (``clip_residuals``). The norms ||g_x|| come from the model (``model.per_example_grad_norms``; closed form for
MF), so no per-example gradient is ever materialised. Under ``gradient_reduction = "mean"`` (MF) the template's
``scale_grad`` then divides G by the expected batch size q n and step 4's decay by n, as Opacus does (base.py).

Privacy. Neighbouring relation: add/remove one unit -- one rating (``unit=rating``) or one user's whole profile
(``unit=user``). The L2 sensitivity of sum_x g_x is c, so each step is the Poisson-subsampled Gaussian mechanism with
noise multiplier sigma and rate q; T = epochs x round(1/q) steps compose under Opacus's RDP (default) or PRV
accountant to (eps, delta), ``delta`` the top-level key. Given ``epsilon``, sigma is
``calibrate_gaussian(epsilon, delta, q, T, accountant, search="opacus")`` (Opacus's ``get_noise_multiplier``); given
``noise_multiplier`` instead, the reported epsilon is the accountant's for that sigma. The weight decay, the model
initialisation and the public rating scale are data-independent.

The PNBM form, :class:`GaussianPNBM`, trains PNBM (full and low-rank) under ``mechanism=gaussian`` (the table
:data:`dprec_torch.forms.FORMS`) and by name under ``mechanism=gaussian_pnbm``. Its keys (``mean_fraction`` ...
``count_weight``) are its own (numbers in ``conf/tuned/gaussian_pnbm.yaml`` and ``conf/tuned/gaussian_pnbm_lowrank.yaml``;
any other model refuses them). It is steps 1-4 above plus what PNBM needs for the guarantee to cover the released model:

* per-user L2 clipping of G_u (rows and columns R_u of S) from
  :func:`dprec_torch.privacy.pnbm_clipping.per_user_grad_norms` (closed form, no M x M per user), and diag(G) := 0
  before the noise (the diagonal is discarded by ``project_``);
* the item means r_bar are released first by two Gaussian mechanisms with noise multiplier sigma_0
  (:func:`dprec_torch.privacy.item_means.release_item_means`, ``centred``; L2 sensitivity 1 after per-user weights),
  recorded in the same Opacus accountant as (sigma_0, q = 1, 2 steps). sigma_0 is chosen so that the means alone would
  cost ``mean_fraction`` x eps; the SGD's sigma is then calibrated so that the composition of everything is eps
  (:func:`dprec_torch.privacy.calibration.calibrate_gaussian`);
* ``init=constant`` starts from S = s0 (1 - I) (data-independent; Eq. (2) is then the item mean plus the user's mean
  centred rating).

Relation: add/remove one user (Poisson over users). Predictions for u also read u's own ratings.

The low-rank form (``model=pnbm_lowrank``, S = U U^T, :mod:`dprec_torch.models.pnbm_lowrank`): each sampled user's
whole gradient of U is clipped to Frobenius norm C (the explicit per-user rows), N(0, (sigma C)^2) goes on each of the
M d entries of U's summed gradient, which is then divided by the expected batch size q N (the model's
``gradient_reduction = "mean"``), and U <- U - lr (G~ / (q N) + (weight_decay / N) U). The item means are the Gaussian
release of :mod:`dprec_torch.mechanisms.lowrank_pnbm` (``mean_prior_std``, ``mean_popularity_*``, ``count_weight``;
share ``mean_fraction`` of mu^2), one entry (1 / mu_m, q = 1, 1 step) of the same Opacus accountant; sigma is the
smallest that meets eps for [means, T steps]. ``init``, ``init_value``, ``mean_global_fraction`` and
``mean_shrinkage`` are the full form's and are not read.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Iterable

import torch

from dprec_torch.errors import ConfigError
from dprec_torch.mechanisms.base import MechanismOptimizer, check_choices
from dprec_torch.mechanisms.context import TrainingContext, bound_model
from dprec_torch.mechanisms.dpsgd import INITS, is_pnbm, release_pnbm_means
from dprec_torch.mechanisms.lowrank_pnbm import clip_lowrank, gaussian_mean_multiplier, is_lowrank, release_means
from dprec_torch.privacy.budget import check_epsilon
from dprec_torch.privacy.calibration import calibrate_gaussian, gaussian_epsilon
from dprec_torch.privacy.item_means import ItemMeansSpec
from dprec_torch.privacy.opacus_accounting import ACCOUNTANTS, OpacusAccountant
from dprec_torch.privacy.pnbm_clipping import per_user_grad_norms, zero_diagonal_

log = logging.getLogger(__name__)

UNITS = ("rating", "user")


class GaussianDPSGD(MechanismOptimizer):
    """Gaussian DP-SGD; the neighbouring relation is add/remove one ``unit``, so ``relation`` is per instance (= the
    configured ``unit``); the class attribute is ``None``: the runner reads ``cfg.mechanism.unit`` to pick the sampler."""

    name = "gaussian"
    relation: str | None = None

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        context: TrainingContext,
        epsilon: float,
        delta: float = 1e-6,
        unit: str = "rating",
        clip_norm: float = 1.0,
        noise_multiplier: float | None = None,
        accountant: str = "rdp",
        lr: float = 0.01,
        weight_decay: float = 0.0,
        sampling_ratio: float = 0.01,
        seed: int | None = None,
    ) -> None:
        epsilon, delta, clip_norm = check_epsilon(epsilon, "mechanism"), float(delta), float(clip_norm)
        check_choices(("unit", unit, UNITS), ("accountant", accountant, ACCOUNTANTS))
        if not clip_norm > 0 or math.isinf(clip_norm):
            raise ConfigError(f"mechanism.clip_norm (c) must be a finite number > 0, got {clip_norm}")
        if not 0 < float(sampling_ratio) <= 1:
            raise ConfigError(f"mechanism.sampling_ratio (q) must be in (0, 1], got {sampling_ratio}")
        if noise_multiplier is not None and not float(noise_multiplier) >= 0:
            raise ConfigError(f"mechanism.noise_multiplier (sigma) must be >= 0, got {noise_multiplier}")
        private = math.isfinite(epsilon) or (noise_multiplier is not None and float(noise_multiplier) > 0)
        if private and not 0 < delta < 1:
            raise ConfigError(f"mechanism=gaussian needs delta in (0, 1), got {delta}")
        super().__init__(params, dict(lr=float(lr), weight_decay=float(weight_decay)), seed=seed)
        self.context, self.unit, self.relation = context, unit, unit
        self.epsilon, self.delta, self.clip_norm = epsilon, delta, clip_norm
        self.sampling_ratio = min(1.0, float(sampling_ratio))
        self.accountant_name = accountant
        n_units = context.n_ratings if unit == "rating" else context.n_users
        if private and delta >= 1.0 / max(n_units, 1):
            log.warning("delta=%g is not below 1/#%ss = %g: the (eps, delta) guarantee is weak", delta, unit, 1 / n_units)
        self.noise_multiplier = (float(noise_multiplier) if noise_multiplier is not None
                                 else calibrate_gaussian(epsilon, delta, self.sampling_ratio, context.total_steps, accountant,
                                                         search="opacus").sigma if math.isfinite(epsilon) else 0.0)
        self.accountant = OpacusAccountant(accountant)
        self.state["mechanism"]["clipped_fraction"] = 0.0

    @classmethod
    def model_lacks(cls, model: type) -> str | None:
        return "per_example_grad_norms" if model.per_example_grad_norms is None else None

    # ------------------------------------------------------------- pieces
    @property
    def noise_std(self) -> float:
        """sigma c, the std of the noise added to every entry of the summed gradient."""
        return self.noise_multiplier * self.clip_norm

    def clip_residuals(self, residuals: torch.Tensor, batch: Any = None, model: Any = None) -> torch.Tensor:
        """Step 2: e_ui <- e_ui min(1, c / ||g_x||) for the unit x holding (u, i)."""
        if model is None or model.per_example_grad_norms is None:  # BaseModel's default: none
            raise ConfigError(f"mechanism=gaussian needs a model with per_example_grad_norms(); {type(model).__name__} has none")
        if self.unit == "user" and not batch.is_user_level():
            raise ConfigError("mechanism=gaussian unit=user needs user-level batches (every rating of each sampled "
                              "user), but the runner sampled ratings: it must pick the sampler from mechanism.unit")
        norms = model.per_example_grad_norms(batch, residuals, self.unit)
        return self.clip_by_norm(residuals, norms, batch.rows if self.unit == "user" else None)

    def add_noise(self) -> None:
        """Step 3: G += N(0, (sigma c)^2) on every parameter entry (:meth:`account` records it)."""
        std = self.noise_std
        self.state["mechanism"]["noise_scale"] = std
        self.add_gaussian_noise_(std)

    def account(self) -> None:
        """The step's (sigma, q) in the accountant's history."""
        self.accountant.step(noise_multiplier=self.noise_multiplier, sample_rate=self.sampling_ratio)

    def graph_constants(self) -> tuple | None:
        """(lr, weight decay, noise std, c, q): fixed for the run, so a captured step may be replayed."""
        group = self.param_groups[0]
        return (float(group["lr"]), float(group.get("weight_decay", 0.0)), float(self.noise_std), self.clip_norm,
                self.sampling_ratio)

    # ---------------------------------------------------------- reporting
    def planned_epsilon(self) -> float:
        """The accountant's epsilon after the whole :meth:`planned_history` (inf when sigma = 0)."""
        return gaussian_epsilon(self.planned_history(), self.delta, self.accountant_name)

    def epsilon_spent(self) -> float:
        """The Opacus accountant's epsilon for the steps taken so far (at ``delta``)."""
        return self.accountant.get_epsilon(self.delta)

    def planned_history(self) -> list[list[float]]:
        """The whole run's accountant history, [sigma, q, steps] entries (the report's ``accountant_history``, which
        :func:`~dprec_torch.privacy.ledger.joint_epsilon` composes over several releases of the same people)."""
        return [[self.noise_multiplier, self.sampling_ratio, int(self.context.total_steps)]]

    def privacy_report(self) -> dict[str, Any]:
        eps = self.planned_epsilon()
        unit_words = "one rating" if self.unit == "rating" else "one user's whole profile"
        return {
            "mechanism": f"gaussian DP-SGD (per-example clipping + Gaussian noise, unit={self.unit})",
            "relation": self.unit,
            "guarantee": f"(eps, delta)-DP for add/remove of {unit_words}",
            # Opacus's accounting is add/remove: a CHANGED one is the group-of-2 guarantee (the harness checks sensitivity c)
            "neighbouring": f"add/remove {unit_words} (changing one is 2 add/remove steps: not covered at this epsilon)",
            "sensitivity": {"clip_norm": self.clip_norm, "norm": "L2", "of": f"the summed clipped gradients, per {self.unit}"},
            "noise": {"distribution": "Gaussian", "noise_multiplier": self.noise_multiplier, "std": self.noise_std},
            "steps": self.context.total_steps,
            "steps_taken": self.accountant.steps,
            "sampling_ratio": self.sampling_ratio,
            "sampling": f"Poisson over {self.unit}s",
            "epsilon_nominal": self.epsilon,
            "epsilon": eps,
            "epsilon_spent": self.epsilon_spent(),
            "delta": self.delta if math.isfinite(eps) else None,
            "accountant": f"opacus {self.accountant_name}",
            "accountant_name": self.accountant_name,
            "accountant_history": self.planned_history(),
            "analysis": (
                f"Each step releases sum of per-{self.unit} gradients clipped to L2 norm c={self.clip_norm:g} plus "
                f"N(0, (sigma c)^2) on every parameter, sigma={self.noise_multiplier:.4g}; Poisson sampling rate "
                f"q={self.sampling_ratio:g}; {self.context.total_steps} steps composed by Opacus's "
                f"{self.accountant_name.upper()} accountant give eps={eps:.4g} at delta={self.delta:g}."
                + ("" if math.isfinite(eps) else " sigma = 0: NOT private (clipping only).")
            ),
        }


# ---------------------------------------------------------------------------------------------- the PNBM form
MEAN_RELEASES = 2  # global mean, then the item statistics


class GaussianPNBM(GaussianDPSGD):
    """User-level Gaussian DP-SGD for PNBM (see the module docstring)."""

    relation = "user"

    @classmethod
    def model_lacks(cls, model: type) -> str | None:
        return None  # clips with the model's own per-user rows

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
        noise_multiplier: float | None = None,
    ) -> None:
        epsilon, delta = float(epsilon), float(delta)
        if noise_multiplier is not None:
            raise ConfigError(f"mechanism.noise_multiplier={noise_multiplier} is not supported with PNBM (sigma is calibrated "
                              "from epsilon, after the item means' share): set it to null and choose epsilon")
        if unit != "user":
            raise ConfigError("mechanism=gaussian with PNBM needs unit=user (a rating enters every other target of its user)")
        check_choices(("init", init, INITS))
        if not 0 < float(mean_fraction) < 1:
            raise ConfigError(f"mechanism.mean_fraction must be in (0, 1), got {mean_fraction}")
        model = model if model is not None else bound_model(context)
        self.lowrank = is_lowrank(model)
        if not (is_pnbm(model) or self.lowrank):  # the PNBM form trains PNBM, full or low-rank
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
            release_pnbm_means(self, model, "user", "gaussian", noise_multiplier=self.mean_sigma)
            self.accountant.step(self.mean_sigma, 1.0, steps=MEAN_RELEASES)
        if self.init == "constant" and not self.lowrank:
            with torch.no_grad():
                model.S.fill_(self.init_value)
                model.S.fill_diagonal_(0.0)

    def clip_residuals(self, residuals: torch.Tensor, batch: Any = None, model: Any = None) -> torch.Tensor:
        """e_ui <- e_ui min(1, c / ||G_u||_2), ||G_u|| from the PNBM closed form (off-diagonal)."""
        if batch is None or model is None:
            raise ConfigError("mechanism=gaussian needs the batch and the model to clip per user")
        if not batch.is_user_level():
            raise ConfigError("mechanism=gaussian with PNBM needs user-level batches (every rating of each sampled user)")
        if self.lowrank:
            return clip_lowrank(self, residuals, batch, model)
        return self.clip_by_norm(residuals, per_user_grad_norms(model, batch, residuals, p=2), batch.rows)

    def add_noise(self) -> None:
        """diag(G) := 0, then the parent's N(0, (sigma c)^2) on every entry."""
        for g in self.grads():
            if not self.lowrank and g.dim() == 2 and g.shape[0] == g.shape[1]:
                zero_diagonal_(g)
        super().add_noise()

    def planned_history(self) -> list[list[float]]:
        """The item means' entry, then the T steps (what :meth:`planned_epsilon` composes)."""
        return ([[self.mean_sigma, 1.0, self.mean_releases]] if self.mean_sigma > 0 else []) + super().planned_history()

    def privacy_report(self) -> dict[str, Any]:
        report = super().privacy_report()
        report["item_means"] = self.mean_release.report() if self.mean_release is not None else None
        if self.lowrank:
            report["mechanism"] = ("gaussian DP-SGD for the low-rank PNBM S = U U^T (per-user Frobenius clipping of "
                                   "dL_u/dU, DP item means)")
            report["analysis"] += (f" Item means: one Gaussian release with noise multiplier {self.mean_sigma:.4g} (L2 "
                                   "sensitivity 1) in the same accountant. The noisy sum is divided by the expected batch "
                                   "size q N (N = the number of user ids, treated as public). b_u and p_u are computed by "
                                   "each user from the released U and r_bar and their own ratings (joint DP).")
        else:
            report["mechanism"] = "gaussian DP-SGD for PNBM (per-user L2 clipping of G_u, DP item means)"
            report["analysis"] += (f" Item means: 2 Gaussian releases with sigma_0={self.mean_sigma:.4g} in the same "
                                   "accountant. Predictions for u also read u's own ratings (joint DP).")
        return report
