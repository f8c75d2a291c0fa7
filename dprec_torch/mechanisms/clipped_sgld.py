"""``mechanism=sgld`` on the low-rank PNBM (``model=pnbm_lowrank``, the default model): the clipped SGLD chain.

The class that trains the low-rank PNBM under ``mechanism=sgld`` (:data:`dprec_torch.forms.FORMS`); the full PNBM and
MF keep the posterior-sampling chain, :class:`~dprec_torch.mechanisms.sgld.ScaledPosteriorSGLD`. Alg. 2 line 5 with
each sampled user's whole gradient of U clipped to Frobenius norm C, the posterior scale a = 2 / N of the mean loss
(N = the number of user ids, public) in place of eps_s / 4B, H = 1 and a constant step eta = ``lr``:

    U <- U - (a eta / 2) (G / q + lambda U) + z_t = U - eta (G / (q N) + (lambda / N) U) + z_t,   z_t ~ N(0, rho eta),
    G = sum_{u in the Poisson(q) sample} clip_C(dL_u / dU).

Step by step this is a Poisson-subsampled Gaussian mechanism: G has L2 sensitivity C under add/remove of one user,
the step moves U by eta G / (q N), and z_t has std sqrt(rho eta), so its noise multiplier is
sigma = sqrt(rho eta) / (eta C / (q N)). The DP item means (:mod:`dprec_torch.mechanisms.lowrank_pnbm`, one Gaussian
release, multiplier sigma_m) and the T steps are one history [(sigma_m, 1, 1), (sigma, q, T)] for Opacus's RDP or PRV
accountant (``accountant``), which gives (eps, delta) with delta = the typed ``delta``: an SGLD whose delta is a number.
The typed eps calibrates the chain's temperature: sigma is the smallest multiplier whose history meets (eps, delta)
(:func:`~dprec_torch.privacy.calibration.calibrate_gaussian`) and rho = eta (sigma C / (q N))^2.
At a constant step the chain is therefore Gaussian DP-SGD with step ``lr`` and weight decay lambda / N (the numbers of
:class:`~dprec_torch.mechanisms.gaussian.GaussianPNBM`'s low-rank form; not its subclass, because the step's logged
noise scale is the chain's sqrt(rho eta) and the report is the chain's). The posterior-sampling argument is stated
beside the accountant's figure and does not apply here: L_u = sum_i (y_ui - f_ui)^2 is unbounded in U, so no B bounds it.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch

from dprec_torch.errors import ConfigError
from dprec_torch.mechanisms.base import MechanismOptimizer, check_choices
from dprec_torch.mechanisms.context import TrainingContext, bound_model
from dprec_torch.mechanisms.lowrank_pnbm import clip_lowrank, gaussian_mean_multiplier, is_lowrank, release_means
from dprec_torch.privacy.budget import check_epsilon
from dprec_torch.privacy.calibration import calibrate_gaussian, gaussian_epsilon
from dprec_torch.privacy.item_means import ItemMeansSpec
from dprec_torch.privacy.opacus_accounting import ACCOUNTANT_TEXT, ACCOUNTANTS, OpacusAccountant


class ClippedSGLD(MechanismOptimizer):
    """The clipped, accounted SGLD chain on the low-rank PNBM (module docstring)."""

    name = "sgld"
    relation = "user"

    def __init__(self, params: Iterable[torch.Tensor], context: TrainingContext, epsilon: float, clip_norm: float,
                 lr: float = 1e-3, weight_decay: float = 0.0, sampling_ratio: float = 1.0, delta: float = 1e-6,
                 accountant: str = "rdp", mean_fraction: float = 0.5, mean_prior_std: float = 0.5,
                 mean_popularity_alpha: float = 0.0, mean_popularity_share: float = 0.1, count_weight: float | None = 0.5,
                 seed: int | None = None) -> None:
        """Calibrate the temperature rho to (eps, delta); :meth:`prepare` releases the means."""
        epsilon = check_epsilon(epsilon, "mechanism")
        super().__init__(list(params), dict(lr=float(lr), weight_decay=float(weight_decay)), seed=seed)
        eta, q, delta, mean_fraction = float(lr), float(sampling_ratio), float(delta), float(mean_fraction)
        options = ItemMeansSpec(prior_std=float(mean_prior_std), popularity_alpha=float(mean_popularity_alpha),
                                popularity_share=float(mean_popularity_share),
                                count_weight=None if count_weight is None else float(count_weight))
        if not is_lowrank(bound_model(context)):
            raise ConfigError("mechanism=sgld's clipped chain trains the low-rank PNBM (model=pnbm_lowrank); the full "
                              "M x M PNBM keeps the posterior-sampling chain (mechanism=sgld model=pnbm)")
        if not (float(clip_norm) > 0 and math.isfinite(float(clip_norm))):
            raise ConfigError(f"mechanism.clip_norm (C) must be a finite number > 0, got {clip_norm}")
        if not 0 < q <= 1:
            raise ConfigError(f"mechanism.sampling_ratio (q) must be in (0, 1], got {q}")
        check_choices(("accountant", accountant, ACCOUNTANTS))
        private = math.isfinite(epsilon)
        if private and not 0 < delta < 1:
            raise ConfigError(f"mechanism=sgld (clipped chain) needs delta in (0, 1), got {delta}")
        self.context, self.epsilon, self.delta = context, epsilon, delta
        self.eta1, self.sampling_ratio, self.clip_norm = eta, q, float(clip_norm)
        self.accountant_name, self.mean_options, self.mean_fraction = accountant, options, mean_fraction
        self.mean_sigma, self.noise_multiplier = 0.0, 0.0
        if private:
            self.mean_sigma = gaussian_mean_multiplier(epsilon, delta, mean_fraction, accountant)
            self.noise_multiplier = calibrate_gaussian(epsilon, delta, q, int(context.total_steps), accountant,
                                              prior=[(self.mean_sigma, 1.0, 1)]).sigma
        # rho from sigma: the step's noise std sqrt(rho eta) against its sensitivity eta C / (q N)
        self.rho = eta * (self.noise_multiplier * self.clip_norm / context.grad_divisor) ** 2
        self.accountant = OpacusAccountant(accountant)
        self.mean_release, self.releases_item_means = None, private  # by prepare(): one Gaussian release, (sigma_m, 1, 1)
        self.state["mechanism"].update(clipped_fraction=0.0, max_clipped_norm=0.0)

    def prepare(self, model: Any) -> None:
        """Before the chain's first step: the Gaussian item means (one accountant entry)."""
        super().prepare(model)
        if self.releases_item_means:
            self.mean_release = release_means(model, 1.0 / self.mean_sigma, "gaussian", self.mean_options, self.generator)
            self.accountant.step(self.mean_sigma, 1.0)

    def clip_residuals(self, residuals: torch.Tensor, batch: Any = None, model: Any = None) -> torch.Tensor:
        """Each sampled user's whole gradient of U clipped to Frobenius norm C."""
        if batch is None or model is None or not batch.is_user_level():
            raise ConfigError("mechanism=sgld (clipped chain) needs user-level batches and the model to clip per user")
        return clip_lowrank(self, residuals, batch, model)

    def add_noise(self) -> None:
        """N(0, (sigma C)^2) on every entry of the clipped sum G, i.e. after the step's scaling eta / (q N), the chain's
        own z_t ~ N(0, rho eta) on U."""
        self.state["mechanism"]["noise_scale"] = math.sqrt(self.rho * self.eta1)
        self.add_gaussian_noise_(self.noise_multiplier * self.clip_norm)

    def account(self) -> None:
        """Record the step (sigma, q) in the Opacus accountant."""
        if self.noise_multiplier > 0:
            self.accountant.step(self.noise_multiplier, self.sampling_ratio)

    # --------------------------------------------------------------- reporting
    def epsilon_spent(self) -> float:
        """The accountant's epsilon at ``delta`` for the steps so far."""
        return math.inf if self.noise_multiplier <= 0 else self.accountant.get_epsilon(self.delta)

    def planned_epsilon(self) -> float:
        """The accountant's epsilon after the item means and all T = context.total_steps steps."""
        if not self.noise_multiplier > 0:
            return math.inf
        return gaussian_epsilon(((self.mean_sigma, 1.0, 1), (self.noise_multiplier, self.sampling_ratio, self.context.total_steps)),
                                self.delta, self.accountant_name)

    def privacy_report(self) -> dict[str, Any]:
        """The clipped chain's report: (eps, delta) from the Opacus accountant, named; the posterior-sampling argument
        as a second, labelled statement (it does not apply here)."""
        k, q, c = self.context.total_steps, self.sampling_ratio, self.clip_norm
        n = self.context.grad_divisor / q if q > 0 else float("nan")
        step_noise = math.sqrt(self.rho * self.eta1)
        posterior = ("does not apply: a user's log-likelihood L_u = sum_i (y_ui - f_ui)^2 is unbounded in U (f_ui = "
                     "u_i . p_u), so no B bounds it and an exact sample of the scaled posterior has no epsilon")
        if not math.isfinite(self.epsilon):
            return {"mechanism": "sgld, clipped chain on the low-rank PNBM at epsilon=inf (clipping only, no noise)",
                    "relation": None, "epsilon": math.inf, "delta": 0.0, "clip_norm": c, "steps": k, "sampling_ratio": q,
                    "analysis": "no noise: not private"}
        eps = self.planned_epsilon()
        acc_text = ACCOUNTANT_TEXT[self.accountant_name]
        return {
            "mechanism": ("sgld, clipped chain on the low-rank PNBM S = U U^T (Wang & Tang Alg. 2 with each user's gradient "
                          "clipped to C, accounted step by step as a Poisson-subsampled Gaussian mechanism)"),
            "relation": "user",
            "guarantee": "(eps, delta)-DP for add/remove of one user's whole profile",
            "neighbouring": "add/remove one user's whole profile",
            "sensitivity": {"clip_norm": c, "norm": "L2 (Frobenius of dL_u/dU)",
                            "of": "the sum of the sampled users' clipped gradients; one step moves U by at most eta C / (q N)"},
            "noise": {"distribution": "Gaussian", "chain_noise": "z_t ~ N(0, rho eta) on each of the M d entries of U",
                      "temperature_rho": self.rho, "eta": self.eta1, "step_noise_std": step_noise,
                      "noise_multiplier": self.noise_multiplier,
                      "relation": "sigma = sqrt(rho eta) / (eta C / (q N)): the step's noise std over its sensitivity"},
            "step": (f"U <- U - eta (G~ / (q N) + (lambda / N) U), eta = {self.eta1:g}, lambda = "
                     f"{self.param_groups[0]['weight_decay']:g}, N = {n:g} user ids (public), G~ = the clipped sum + noise: "
                     "Alg. 2 line 5 with the posterior scale a = 2 / N (the mean loss) in place of eps / 4B"),
            "steps": k,
            "steps_taken": max(0, self.accountant.steps - 1),
            "sampling_ratio": q,
            "sampling": "Poisson over users",
            "epsilon_nominal": self.epsilon,
            "epsilon": eps,
            "epsilon_spent": self.epsilon_spent(),
            "delta": self.delta,
            "accountant": (f"Opacus {acc_text} over the item-mean release (noise multiplier {self.mean_sigma:.4g}, q = 1, "
                           f"1 step) and {k} chain steps (noise multiplier {self.noise_multiplier:.4g}, q = {q:g})"),
            "accountant_history": [[self.mean_sigma, 1.0, 1], [self.noise_multiplier, q, k]],
            "accountant_name": self.accountant_name,
            "calibration": ("the typed epsilon sets the temperature rho: sigma is the smallest noise multiplier whose "
                            "history meets (epsilon, delta) (privacy/calibration.calibrate_gaussian), rho = eta (sigma C / (q N))^2"),
            "item_means": self.mean_release.report() if self.mean_release else None,
            "posterior_sampling": posterior,
            "epsilon_if_exact_sample": None,
            "analysis": (
                f"Each step releases the sum of the sampled users' gradients of U clipped to Frobenius norm C={c:g} plus "
                f"N(0, (sigma C)^2), sigma={self.noise_multiplier:.4g}, scaled by eta / (q N): the chain's own N(0, rho eta) "
                f"noise at temperature rho={self.rho:.4g}. Poisson rate q={q:g}; the item means and {k} steps compose by "
                f"Opacus's {self.accountant_name.upper()} accountant to eps={eps:.4g} at delta={self.delta:g} (user level). "
                f"Posterior-sampling argument (Wang et al. 2015): {posterior}. b_u and p_u are computed by each user from "
                "the released U and r_bar and their own ratings (joint DP)."
            ),
        }
