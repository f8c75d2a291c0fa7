"""``mechanism=dpsgd_paper`` (model=pnbm): clipped-Laplace DPSGD, Wang & Tang Algorithm 1 (paper-faithful).

Neighbouring relation claimed by the paper: rating-level.
Per step t (1-based):
  line 4: e_max(t) = 0.5 + (phi - 1)/(t + 1),   Delta F(t) = 2 e_max(t) phi / C
  line 5: e_ui <- clamp(e_ui, -e_max(t), e_max(t))
  line 6: G <- sum e_ui d r_hat_ui/dS + Lap(gamma K Delta F(t) / eps)   (Laplace *scale*)
  line 7: S <- S - eta (beta G + lambda S)
Theorem 1: each step is eps/(K gamma)-DP; subsampling with ratio gamma is taken to give gamma * eps/(K gamma) = eps/K
per step; K steps compose to eps.

CAVEAT (stated in every log line and privacy report): Delta F bounds one gradient *entry* |G_ij(u)|. One rating r_ui
moves row i of G (one entry per item u rated) and the row of every other item u rated, because r_ui enters their
predictions. The L1 sensitivity of the whole released update is therefore far larger than Delta F, and the paper's
eps is a per-entry figure, not a rating-level guarantee for the released S. The linear amplification gamma * eps is
also looser than the exact ln(1 + gamma (e^eps - 1)) for large eps.

This key's MF form, DPSGD-MF (Berlioz et al. 2015, the MF baseline of Fig. 1), is its own class,
:class:`dprec_torch.mechanisms.dpsgd_mf.DPSGDMF` (:data:`dprec_torch.forms.FORMS`); Alg. 1 refuses its keys
(``e_max``, ``delta``).
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch

from dprec_torch.errors import ConfigError
from dprec_torch.mechanisms.base import add_laplace_noise_
from dprec_torch.mechanisms.context import TrainingContext
from dprec_torch.mechanisms.dpsgd_mf import perturbs_residuals
from dprec_torch.mechanisms.sgd import MapSGD
from dprec_torch.privacy.accountants import PureDPAccountant, amplified_epsilon
from dprec_torch.privacy.budget import check_epsilon

PER_ENTRY_CAVEAT = (
    "Wang & Tang's Delta F bounds one gradient ENTRY; one rating moves row i of G and the row of every "
    "other item the same user rated, so the whole update's L1 sensitivity is far larger. The printed "
    "epsilon is the paper's per-entry figure, NOT a rating-level guarantee for the released S. "
    "PNBM also releases the exact training item means r_bar_i, which no noise covers (an audit at nominal "
    "eps=1 finds a lower bound of 6.17; see docs/privacy.md)."
)


class DPSGDLaplace(MapSGD):
    """Algorithm 1 of Wang & Tang (see module docstring for the exact privacy statement)."""

    private = True  # draws noise (MapSGD's subclass, not its non-private default)

    name = "dpsgd"
    relation = "rating"

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        context: TrainingContext,
        epsilon: float,
        lr: float = 0.4,
        weight_decay: float = 0.005,
        beta: float = 10.0,
        sampling_ratio: float = 1.0,
        seed: int | None = None,
    ) -> None:
        epsilon = check_epsilon(epsilon, "mechanism")
        if context.entry_bound is None:
            raise ConfigError("mechanism=dpsgd needs a model that bounds its per-example gradient entries")
        self._check_model(context.model)
        super().__init__(params, context, lr=lr, weight_decay=weight_decay, beta=beta, seed=seed)
        self.epsilon, self.sampling_ratio = epsilon, float(sampling_ratio)
        self.phi = context.scale.span
        self.accountant = PureDPAccountant()

    @staticmethod
    def _check_model(model: Any) -> None:
        if model is not None and perturbs_residuals(model):
            raise ConfigError(f"{type(model).__name__} declares dpsgd_perturb_residuals: its DPSGD is DPSGD-MF, "
                              "mechanism=dpsgd_mf (mechanism=dpsgd_paper model=mf builds it)")

    # Alg. 1 line 4
    def residual_bound(self, t: int | None = None) -> float:
        """e_max(t) = 0.5 + (phi - 1)/(t + 1)."""
        t = self.t if t is None else t
        return 0.5 + (self.phi - 1.0) / (t + 1.0)

    def sensitivity(self, t: int | None = None) -> float:
        """Delta F(t) = 2 max|G_ij(u)| = 2 e_max(t) phi / C (per gradient entry)."""
        return 2.0 * float(self.context.entry_bound(self.residual_bound(t)))  # type: ignore[operator]

    def noise_scale(self, t: int | None = None) -> float:
        """Laplace scale gamma K Delta F(t) / eps (Alg. 1 line 6)."""
        return 0.0 if math.isinf(self.epsilon) else self.sampling_ratio * self.context.total_steps * self.sensitivity(t) / self.epsilon

    # Alg. 1 line 5
    def clip_residuals(self, residuals: torch.Tensor, batch: Any = None, model: Any = None) -> torch.Tensor:
        self._check_model(model)
        bound = self.residual_bound()
        self.state["mechanism"]["residual_bound"] = bound
        return residuals.clamp(-bound, bound)

    def elementwise_residual_clip(self) -> float | None:
        """Line 5 is the clamp to [-e_max(t), e_max(t)] of this step (None in a subclass that clips otherwise)."""
        return self.residual_bound() if type(self).clip_residuals is DPSGDLaplace.clip_residuals else None

    # Alg. 1 line 6
    def add_noise(self) -> None:
        scale = self.noise_scale()
        self.state["mechanism"]["noise_scale"] = scale
        if scale == 0.0:
            return
        for g in self.grads():
            add_laplace_noise_(g, scale, self.generator)

    def account(self) -> None:
        """Theorem 1: eps_t = eps / (K gamma) per noisy step, subsampled with ratio gamma."""
        if self.state["mechanism"]["noise_scale"] > 0:
            self.accountant.step(self.epsilon / (self.context.total_steps * self.sampling_ratio), self.sampling_ratio)

    def epsilon_spent(self) -> float:
        """Theorem 1's running total (per gradient entry; see the caveat)."""
        return self.epsilon if math.isinf(self.epsilon) else self.accountant.get_linear_epsilon()

    def privacy_report(self) -> dict[str, Any]:
        k, q = self.context.total_steps, self.sampling_ratio
        eps_t = self.epsilon / (k * q)
        return {
            "mechanism": "dpsgd (Wang & Tang Alg. 1, paper-faithful)",
            "relation": "rating",
            "guarantee": "per-gradient-entry (paper); NOT a proven rating-level guarantee for the released S",
            "sensitivity": {"per_entry_delta_f_first_step": self.sensitivity(1), "per_entry_delta_f_last_step": self.sensitivity(k),
                            "formula": "2 e_max(t) phi / C"},
            "noise": f"Laplace, scale gamma*K*DeltaF(t)/eps per entry (first step {self.noise_scale(1):.4g}, last step {self.noise_scale(k):.4g})",
            "steps": k,
            "sampling_ratio": q,
            "epsilon_per_step": eps_t,
            "epsilon_nominal": self.epsilon,
            "epsilon_claimed_by_paper": self.epsilon,
            "epsilon": None,
            "epsilon_exact_amplification_per_entry": k * amplified_epsilon(eps_t, q) if math.isfinite(eps_t) else float("inf"),
            "delta": 0.0,
            "accountant": "pure-DP basic composition (Theorem 1, linear subsampling amplification)",
            "analysis": "Theorem 1: eps/(K gamma) per step, amplified to eps/K by sampling ratio gamma, K steps composed. " + PER_ENTRY_CAVEAT,
        }
