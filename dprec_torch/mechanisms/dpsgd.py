"""``mechanism=dpsgd``: clipped-Laplace DPSGD, Wang & Tang Algorithm 1 (paper-faithful).

Neighbouring relation claimed by the paper: rating-level.
Per step t (1-based):
  line 4: e_max(t) = 0.5 + (phi - 1)/(t + 1),   Delta F(t) = 2 e_max(t) phi / C
  line 5: e_ui <- clamp(e_ui, -e_max(t), e_max(t))
  line 6: G <- sum e_ui d r_hat_ui/dS + Lap(gamma K Delta F(t) / eps)   (Laplace *scale*)
  line 7: S <- S - eta (beta G + lambda S)
Theorem 1: each step is eps/(K gamma)-DP; subsampling with ratio gamma is taken to
give gamma * eps/(K gamma) = eps/K per step; K steps compose to eps.

CAVEAT (stated in every log line and privacy report): Delta F bounds one gradient
*entry* |G_ij(u)|. One rating r_ui moves row i of G (one entry per item u rated)
and the row of every other item u rated, because r_ui enters their predictions.
The L1 sensitivity of the whole released update is therefore far larger than
Delta F, and the paper's eps is a per-entry figure, not a rating-level guarantee
for the released S. The linear amplification gamma * eps is also looser than the
exact ln(1 + gamma (e^eps - 1)) for large eps.

DPSGD-MF (Berlioz et al., RecSys 2015, "private SGD"), selected when the model declares
``dpsgd_perturb_residuals = True`` (``model=mf``): the noise goes on each rating's
prediction error instead of on G (see :meth:`DPSGDLaplace.perturb_residuals_`):
    e'_ui = clamp(e_ui + Lap(K Delta r / eps), -e_max, e_max),   Delta r = r_max - r_min,
then G = sum e'_ui d r_hat_ui / d theta, divided by the expected batch size q n (MF's mean
reduction, base.py: ``lr`` = Berlioz's per-rating step x q n), and the MapSGD update. K bounds how often one
rating is visited: K = the number of passes (steps) when sampling_ratio = 1 (Berlioz's K
passes over the data), else the smallest K with P[Binomial(T, q) > K] <= delta.
Relation: one rating's VALUE changes (who rated what is public). Changing r_ui moves
e_ui by at most Delta r while r_hat_ui depends only on earlier noisy errors, so each visit
is (eps/K)-DP for that rating and at most K visits compose to eps (delta = the chance of
more than K visits; 0 for full passes).
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch

from dprec_torch.errors import ConfigError
from dprec_torch.interfaces import PerturbsResiduals
from dprec_torch.mechanisms.base import add_laplace_noise_, laplace_noise
from dprec_torch.mechanisms.context import TrainingContext
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
        seed: int = 0,
        perturb_residuals: bool | None = None,
        e_max: float | None = None,
        delta: float = 0.0,
    ) -> None:
        epsilon = check_epsilon(epsilon, "mechanism")
        if context.entry_bound is None:
            raise ConfigError("mechanism=dpsgd needs a model that bounds its per-example gradient entries")
        super().__init__(params, context, lr=lr, weight_decay=weight_decay, beta=beta, seed=seed)
        self.epsilon, self.sampling_ratio = epsilon, float(sampling_ratio)
        self.phi = context.scale.span
        self.accountant = PureDPAccountant()
        if perturb_residuals is None:  # the model being trained declares its variant (interfaces.PerturbsResiduals)
            perturb_residuals = isinstance(context.model, PerturbsResiduals) and context.model.dpsgd_perturb_residuals
        self.perturb_residuals = bool(perturb_residuals)
        if self.perturb_residuals:
            self._init_residual_perturbation(e_max, float(delta))

    # ------------------------------------------------ DPSGD-MF (Berlioz et al. 2015)
    def _init_residual_perturbation(self, e_max: float | None, delta: float) -> None:
        """Fix Delta r, e_max, the visit bound K and the Laplace scale K Delta r / eps."""
        q, steps = self.sampling_ratio, int(self.context.total_steps)
        self.e_max = self.phi if e_max is None else float(e_max)
        if not self.e_max > 0:
            raise ConfigError(f"mechanism.e_max must be > 0, got {e_max}")
        if q >= 1:
            self.max_visits, self.visit_delta = steps, 0.0
        else:
            if not 0 < delta < 1:
                raise ConfigError(f"DPSGD-MF with sampling_ratio < 1 needs delta in (0, 1) to bound the visits per "
                                  f"rating, got {delta} (or use sampling_ratio=1: K full passes, delta = 0)")
            from scipy.stats import binom  # ~1.4 s to import; only sampled DPSGD-MF needs it

            k = int(binom.isf(delta, steps, q))
            while k < steps and binom.sf(k, steps, q) > delta:
                k += 1
            while k > 1 and binom.sf(k - 1, steps, q) <= delta:
                k -= 1
            self.max_visits, self.visit_delta = max(k, 1), float(binom.sf(k, steps, q))
        self.residual_noise_scale = 0.0 if math.isinf(self.epsilon) else self.max_visits * self.phi / self.epsilon

    def perturb_residuals_(self, residuals: torch.Tensor) -> torch.Tensor:
        """e'_ui = clamp(e_ui + Lap(K Delta r / eps), -e_max, e_max) (Berlioz et al. 2015, private SGD)."""
        b = self.residual_noise_scale
        self.state["mechanism"]["residual_bound"] = self.e_max
        self.state["mechanism"]["noise_scale"] = b
        if b > 0:
            residuals = residuals + laplace_noise(residuals.shape, b, self.generator, residuals.device)
        return residuals.clamp(-self.e_max, self.e_max)

    def _residual_privacy_report(self) -> dict[str, Any]:
        k, steps, q = self.max_visits, self.context.total_steps, self.sampling_ratio
        eps_visit = self.epsilon / k
        visits = (f"K = {k} full passes (sampling_ratio = 1)" if q >= 1 else
                  f"K = {k}: P[Binomial(T={steps}, q={q:g}) > K] = {self.visit_delta:.3g} <= delta")
        return {
            "mechanism": "dpsgd-mf (Berlioz et al. 2015 private SGD: Laplace noise on each rating's prediction error)",
            "relation": "rating (value change: neighbouring datasets differ in ONE rating's value; who rated what is public)",
            "guarantee": "eps-DP per rating value" + ("" if q >= 1 else f", with delta = {self.visit_delta:.3g}"),
            "sensitivity": {"delta_r": self.phi, "of": "the prediction error e_ui of one rating, per visit",
                            "formula": "Delta r = r_max - r_min"},
            "noise": f"Laplace, scale K Delta r / eps = {self.residual_noise_scale:.4g} on each visited rating's error, "
                     f"then clamped to +-e_max = {self.e_max:g}",
            "steps": steps,
            "sampling_ratio": q,
            "max_visits_per_rating": k,
            "epsilon_per_visit": eps_visit,
            "epsilon_nominal": self.epsilon,
            "epsilon": self.epsilon,
            "delta": self.visit_delta,
            "accountant": "pure-DP basic composition over at most K visits per rating",
            "analysis": (
                f"Each visit releases e_ui + Lap(K Delta r / eps) with sensitivity Delta r = {self.phi:g} (r_hat_ui depends "
                f"only on earlier noisy errors), i.e. eps/K per visit; {visits}; composed: eps = {self.epsilon:g}. "
                "Caveats: the existence of ratings (who rated what) is not protected; mu_0 and the rating scale are "
                "public; weight decay is data-independent; model.fallback=mean predicts unknown users/items from "
                "NON-private training means (fallback=model does not)."
            ),
        }

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
        if math.isinf(self.epsilon):
            return 0.0
        return self.sampling_ratio * self.context.total_steps * self.sensitivity(t) / self.epsilon

    # Alg. 1 line 5
    def clip_residuals(self, residuals: torch.Tensor, batch: Any = None, model: Any = None) -> torch.Tensor:
        declared = isinstance(model, PerturbsResiduals) and model.dpsgd_perturb_residuals
        if model is not None and bool(declared) != self.perturb_residuals:
            raise ConfigError(f"mechanism.perturb_residuals={self.perturb_residuals} does not match model "
                              f"{type(model).__name__} (dpsgd_perturb_residuals)")
        if self.perturb_residuals:
            return self.perturb_residuals_(residuals)
        bound = self.residual_bound()
        self.state["mechanism"]["residual_bound"] = bound
        return residuals.clamp(-bound, bound)

    # Alg. 1 line 6
    def add_noise(self) -> None:
        if self.perturb_residuals:  # DPSGD-MF: the noise is already in the residuals
            return
        scale = self.noise_scale()
        self.state["mechanism"]["noise_scale"] = scale
        if scale == 0.0:
            return
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    add_laplace_noise_(p.grad, scale, self.generator)

    def account(self) -> None:
        """Theorem 1: eps_t = eps / (K gamma) per noisy step, subsampled with ratio gamma."""
        if not self.perturb_residuals and self.state["mechanism"]["noise_scale"] > 0:
            self.accountant.step(self.epsilon / (self.context.total_steps * self.sampling_ratio), self.sampling_ratio)

    def epsilon_spent(self) -> float:
        """Theorem 1's running total (per gradient entry; see the caveat).

        DPSGD-MF: after t steps a rating was visited at most min(t, K) times: min(t, K) eps/K.
        """
        if self.perturb_residuals:
            return self.epsilon if math.isinf(self.epsilon) else min(self.t - 1, self.max_visits) * self.epsilon / self.max_visits
        return self.epsilon if math.isinf(self.epsilon) else self.accountant.get_linear_epsilon()

    def privacy_report(self) -> dict[str, Any]:
        if self.perturb_residuals:
            return self._residual_privacy_report()
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
