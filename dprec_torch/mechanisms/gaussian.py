"""``mechanism=gaussian``: DP-SGD with per-example clipping and Gaussian noise (Abadi et al. 2016).

One step t, on a Poisson sample of units (each unit -- a rating, or a user with all of
their ratings -- is included independently with probability q = ``sampling_ratio``):

    1. g_x  = sum_{(u,i) in x} e_ui d r_hat_ui / d theta        per-example gradient of unit x
    2. g_x <- g_x min(1, c / ||g_x||_2)                        clip (c = ``clip_norm``)
    3. G    = sum_x g_x + N(0, sigma^2 c^2 I)                   noise on EVERY parameter entry
    4. theta <- theta - lr (G + weight_decay theta)

Step 2 is done on the residuals: g_x is linear in the e_ui of x, so scaling x's
residuals by min(1, c/||g_x||) scales g_x (``clip_residuals``). The norms ||g_x|| come
from the model (``model.per_example_grad_norms(batch, residuals, unit)``; closed form
for MF), so no per-example gradient is ever materialised. For a model that declares
``gradient_reduction = "mean"`` (MF) the template's ``scale_grad`` then divides G by the expected
batch size q n and step 4's decay by n, as Opacus does (``lr`` is a per-example step; base.py).

Privacy. Neighbouring relation: add/remove one unit -- one rating (``unit=rating``) or
one user's whole profile (``unit=user``). The L2 sensitivity of sum_x g_x is c, so each
step is the Poisson-subsampled Gaussian mechanism with noise multiplier sigma and rate
q; T = epochs x round(1/q) steps compose under Opacus's RDP (default) or PRV accountant
to (eps, delta), ``delta`` the top-level key. Given ``epsilon``, sigma is
``calibrate_gaussian(epsilon, delta, q, T, accountant, search="opacus")`` (Opacus's ``get_noise_multiplier``);
given ``noise_multiplier`` instead, the reported epsilon is the accountant's for that sigma. The weight decay is
data-independent; model initialisation and the public rating scale are data-independent.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Iterable

import torch

from dprec_torch.errors import ConfigError
from dprec_torch.interfaces import SupportsPerExampleNorms
from dprec_torch.mechanisms.base import MechanismOptimizer
from dprec_torch.mechanisms.context import TrainingContext
from dprec_torch.privacy.budget import check_epsilon
from dprec_torch.privacy.calibration import calibrate_gaussian, gaussian_epsilon
from dprec_torch.privacy.opacus_accounting import ACCOUNTANTS, OpacusAccountant

log = logging.getLogger(__name__)

UNITS = ("rating", "user")


class GaussianDPSGD(MechanismOptimizer):
    """Gaussian DP-SGD; the neighbouring relation is add/remove one ``unit``, so ``relation`` is per
    instance (= the configured ``unit``).

    The class attribute is ``None`` because the unit is only known from the config: the
    runner must read ``cfg.mechanism.unit`` (not the class) to pick the batch sampler.
    """

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
        if unit not in UNITS:
            raise ConfigError(f"mechanism.unit must be one of {UNITS}, got '{unit}'")
        if not clip_norm > 0 or math.isinf(clip_norm):
            raise ConfigError(f"mechanism.clip_norm (c) must be a finite number > 0, got {clip_norm}")
        if accountant not in ACCOUNTANTS:
            raise ConfigError(f"mechanism.accountant must be one of {ACCOUNTANTS}, got '{accountant}'")
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
        if noise_multiplier is not None:
            self.noise_multiplier = float(noise_multiplier)
        elif math.isfinite(epsilon):
            self.noise_multiplier = calibrate_gaussian(epsilon, delta, self.sampling_ratio, context.total_steps, accountant,
                                              search="opacus").sigma
        else:
            self.noise_multiplier = 0.0
        self.accountant = OpacusAccountant(accountant)
        self.state["mechanism"]["clipped_fraction"] = 0.0

    # ------------------------------------------------------------- pieces
    @property
    def noise_std(self) -> float:
        """sigma c, the std of the noise added to every entry of the summed gradient."""
        return self.noise_multiplier * self.clip_norm

    def clip_residuals(self, residuals: torch.Tensor, batch: Any = None, model: Any = None) -> torch.Tensor:
        """Step 2: e_ui <- e_ui min(1, c / ||g_x||) for the unit x holding (u, i)."""
        if not isinstance(model, SupportsPerExampleNorms):
            raise ConfigError(f"mechanism=gaussian needs a model with per_example_grad_norms(); "
                              f"{type(model).__name__} has none")
        if self.unit == "user" and batch.n_targets != batch.ind.values().numel():
            raise ConfigError("mechanism=gaussian unit=user needs user-level batches (every rating of each sampled "
                              "user), but the runner sampled ratings: it must pick the sampler from mechanism.unit")
        norms = model.per_example_grad_norms(batch, residuals, self.unit)
        return self.clip_by_norm(residuals, norms, batch.rows if self.unit == "user" else None)

    def add_noise(self) -> None:
        """Step 3: G += N(0, (sigma c)^2) on every parameter entry; then notify the accountant."""
        std = self.noise_std
        self.state["mechanism"]["noise_scale"] = std
        self.add_gaussian_noise_(std)
        self.accountant.step(noise_multiplier=self.noise_multiplier, sample_rate=self.sampling_ratio)

    # ---------------------------------------------------------- reporting
    def planned_epsilon(self) -> float:
        """The accountant's epsilon after all T = context.total_steps steps."""
        return gaussian_epsilon([(self.noise_multiplier, self.sampling_ratio, self.context.total_steps)], self.delta,
                                self.accountant_name)

    def epsilon_spent(self) -> float:
        """The Opacus accountant's epsilon for the steps taken so far (at ``delta``)."""
        return self.accountant.get_epsilon(self.delta)

    def privacy_report(self) -> dict[str, Any]:
        eps = self.planned_epsilon()
        unit_words = "one rating" if self.unit == "rating" else "one user's whole profile"
        return {
            "mechanism": f"gaussian DP-SGD (per-example clipping + Gaussian noise, unit={self.unit})",
            "relation": self.unit,
            "guarantee": f"(eps, delta)-DP for add/remove of {unit_words}",
            # Opacus's accounting is add/remove: a CHANGED rating (or profile) is two such steps, i.e. the
            # group-of-2 guarantee, not this epsilon (the harness checks the add/remove sensitivity c)
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
            "analysis": (
                f"Each step releases sum of per-{self.unit} gradients clipped to L2 norm c={self.clip_norm:g} plus "
                f"N(0, (sigma c)^2) on every parameter, sigma={self.noise_multiplier:.4g}; Poisson sampling rate "
                f"q={self.sampling_ratio:g}; {self.context.total_steps} steps composed by Opacus's "
                f"{self.accountant_name.upper()} accountant give eps={eps:.4g} at delta={self.delta:g}."
                + ("" if math.isfinite(eps) else " sigma = 0: NOT private (clipping only).")
            ),
        }
