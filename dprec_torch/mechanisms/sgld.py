"""``mechanism=sgld``: scaled-posterior sampling by SGLD, Wang & Tang Algorithm 2.

Neighbouring relation: user-level (add/remove one user's whole profile).
Alg. 2, line 5:
    S <- S - (eps / 4B) (eta_t / 2) (L g_bar + lambda S o H^-1) + z_t,   z_t ~ N(0, rho eta_t)
with eta_t = eta_1 t^(-xi), B = (r_max - r_min)^2 tau (each user capped at tau ratings),
L g_bar = (1/gamma) sum over the mini-batch (the unbiased estimate of the full-data sum),
and H the prior correction of Sec. 4.2 (Eq. (11)).

Privacy (Wang et al. 2015, used by Theorem 2): one exact sample from the posterior
scaled by eps/(4B) is eps-DP when every user's log-likelihood is bounded by B.
SGLD with noise N(0, rho eta_t) instead of N(0, eta_t) samples the posterior raised
to 1/rho, i.e. scaled by eps/(4B rho): the epsilon actually delivered is eps/rho
(the paper's rho = 0.004 multiplies eps by 250). That is the epsilon we log and save.
The guarantee is (eps/rho, (1 + e^(eps/rho)) delta) where delta is the unquantified
total-variation distance between the SGLD iterate's law and the target posterior.
Releasing the mean of m thinned samples costs m times the per-sample epsilon.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch

from dprec_torch.errors import ConfigError
from dprec_torch.mechanisms.base import MechanismOptimizer
from dprec_torch.mechanisms.context import TrainingContext


class ScaledPosteriorSGLD(MechanismOptimizer):
    """Algorithm 2 of Wang & Tang (see the module docstring for the privacy statement)."""

    name = "sgld"
    uses_prior_precision = True
    relation = "user"

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        context: TrainingContext,
        epsilon: float,
        lr: float = 1e-3,
        decay: float = 0.3,
        temperature: float = 0.004,
        weight_decay: float = 0.02,
        sampling_ratio: float = 1.0,
        max_user_ratings: int = 200,
        burn_in_epochs: int = 0,
        average_samples: bool = False,
        init_scale: float = 1.0,
        seed: int = 0,
        **unused: Any,
    ) -> None:
        epsilon = float(epsilon)
        if not epsilon > 0:
            raise ConfigError(f"epsilon must be > 0 (epsilon=inf samples the unscaled posterior), got {epsilon}")
        if not 0 < temperature <= 1:
            raise ConfigError(f"mechanism.temperature (rho) must be in (0, 1], got {temperature}")
        params = list(params)
        super().__init__(params, dict(lr=float(lr), weight_decay=float(weight_decay)), seed=seed)
        with torch.no_grad():  # starting point of the chain only; not part of the privacy analysis
            for p in params:
                p.mul_(float(init_scale))
        self.context, self.epsilon = context, epsilon
        self.eta1, self.decay, self.rho = float(lr), float(decay), float(temperature)
        self.sampling_ratio, self.tau = float(sampling_ratio), int(max_user_ratings)
        self.burn_in_epochs, self.average_samples = int(burn_in_epochs), bool(average_samples)
        self.B = context.scale.span**2 * self.tau
        self.prior_precision = list(context.prior_precision) or [None] * len(params)
        self.state["mechanism"]["samples_averaged"] = 0

    # ------------------------------------------------------------------ pieces
    @property
    def posterior_scale(self) -> float:
        """eps / (4B); 1 (the unscaled posterior) when epsilon = inf."""
        return 1.0 if math.isinf(self.epsilon) else self.epsilon / (4.0 * self.B)

    def step_size(self, t: int | None = None) -> float:
        """eta_t = eta_1 t^(-xi)."""
        t = self.t if t is None else t
        return self.eta1 * t ** (-self.decay)

    def noise_std(self, t: int | None = None) -> float:
        """z_t ~ N(0, rho eta_t): std sqrt(rho eta_t) (Alg. 2 line 4)."""
        return math.sqrt(self.rho * self.step_size(t))

    def scale_grad(self) -> None:
        """L g_bar = (1/gamma) sum over the batch (unbiased for the full-data gradient sum)."""
        if self.sampling_ratio < 1:
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.div_(self.sampling_ratio)

    def apply_update(self) -> None:
        """Alg. 2 line 5."""
        eta, lam = self.step_size(), self.param_groups[0]["weight_decay"]
        std = self.noise_std()
        self.state["mechanism"]["noise_scale"] = std
        for p, h in zip(self.param_groups[0]["params"], self.prior_precision):
            if p.grad is None:
                continue
            g = p.grad  # in place on the gradient buffer: no M x M temporaries
            if h is None:
                g.add_(p, alpha=lam)
            else:
                g.addcdiv_(p, h, value=lam)
            p.add_(g, alpha=-self.posterior_scale * eta / 2)
            p.add_(torch.randn(p.shape, generator=self.generator, device=p.device), alpha=std)

    # --------------------------------------------------------------- reporting
    def delivered_epsilon(self) -> float:
        """eps / rho per released sample (unscaled posterior: 4B / rho)."""
        base = 4.0 * self.B if math.isinf(self.epsilon) else self.epsilon
        return base / self.rho

    def epsilon_spent(self) -> float:
        """The delivered eps/rho of the current sample (one release)."""
        return self.delivered_epsilon()

    def releases_exact_statistics(self) -> bool:
        """True when the model also releases non-private training statistics (PNBM's exact item means)."""
        model = self.context.model
        return model is not None and hasattr(model, "item_means") and not getattr(model, "dp_item_means", False)

    def privacy_report(self) -> dict[str, Any]:
        k = self.context.total_steps
        m = max(1, int(self.state["mechanism"]["samples_averaged"])) if self.average_samples else 1
        eps_sample = self.delivered_epsilon() * m
        exact_means = self.releases_exact_statistics()
        eps = None if exact_means else eps_sample
        return {
            "mechanism": "sgld (Wang & Tang Alg. 2, scaled-posterior sampling)",
            "relation": "user",
            "guarantee": "user-level, (eps, (1+e^eps) delta) with delta the unquantified distance of SGLD from the target posterior",
            "sensitivity": {"log_likelihood_bound_B": self.B, "formula": "B = (r_max - r_min)^2 tau", "tau": self.tau},
            "noise": f"Gaussian z_t ~ N(0, rho eta_t), rho={self.rho}, eta_1={self.eta1}, xi={self.decay}",
            "steps": k,
            "sampling_ratio": self.sampling_ratio,
            "temperature": self.rho,
            "posterior_scale": self.posterior_scale,
            "samples_released": m,
            "epsilon_nominal": self.epsilon,
            "epsilon_for_sample_only": eps_sample,
            "epsilon": eps,
            "delta": None,
            "accountant": "one exact posterior sample is eps-DP (Wang et al. 2015); temperature rho delivers eps/rho; m averaged samples compose to m*eps/rho",
            "analysis": (
                f"Sampling the posterior scaled by eps/(4B) is eps-DP at user level; SGLD at temperature rho={self.rho} "
                f"samples it raised to 1/rho, so the delivered epsilon is eps/rho = {self.delivered_epsilon():.4g}, not the "
                f"nominal {self.epsilon:g}. Delta is unquantified (SGLD is only asymptotically exact)."
                + (" The model also releases exact training item means r_bar_i (Eq. (2)), which no noise covers, "
                   "so the released model as a whole has NO defended epsilon; the figure above covers the sample "
                   "of S alone (see mechanism=dpsgd_l1/gaussian for DP item means)." if exact_means else "")
            ),
        }
