"""``mechanism=dpsgd_mf``: DPSGD-MF, Berlioz et al. (RecSys 2015) "private SGD" for matrix factorisation.

The baseline of Wang & Tang's Fig. 1. ``conf/mechanism/dpsgd_mf.yaml`` names :class:`DPSGDMF`;
``mechanism=dpsgd_paper model=mf`` trains by it too, as Alg. 1's MF form (:data:`dprec_torch.forms.FORMS`, with the
same numbers in ``conf/tuned/dpsgd_paper_mf.yaml``). The noise goes on each visited rating's prediction error, not on
the gradient:
    e'_ui = clamp(e_ui + Lap(K Delta r / eps), -e_max, e_max),   Delta r = r_max - r_min,
then G = sum e'_ui d r_hat_ui / d theta, divided by the expected batch size q n (MF's mean reduction, base.py:
``lr`` = Berlioz's per-rating step x q n), and the MapSGD update. K bounds how often one rating is visited: K = the
number of passes (steps) when sampling_ratio = 1 (Berlioz's K passes over the data), else the smallest K with
P[Binomial(T, q) > K] <= delta.

Relation: one rating's VALUE changes (who rated what is public). Changing r_ui moves e_ui by at most Delta r while
r_hat_ui depends only on earlier noisy errors, so each visit is (eps/K)-DP for that rating and at most K visits
compose to eps (delta = the chance of more than K visits; 0 for full passes). The model must declare
``dpsgd_perturb_residuals`` (``BaseModel.dpsgd_perturb_residuals``; MF does): its residual is the whole per-rating
release. PNBM's DPSGD is Wang & Tang's Alg. 1, :mod:`dprec_torch.mechanisms.dpsgd_paper`.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch

from dprec_torch.errors import ConfigError
from dprec_torch.mechanisms.base import laplace_noise
from dprec_torch.mechanisms.context import TrainingContext
from dprec_torch.mechanisms.sgd import MapSGD
from dprec_torch.privacy.budget import check_epsilon


def perturbs_residuals(model: Any) -> bool:
    """Whether ``model`` declares that DPSGD perturbs its residuals (DPSGD-MF) rather than its gradient."""
    return bool(model.dpsgd_perturb_residuals)  # BaseModel's default: False


class DPSGDMF(MapSGD):
    """Berlioz et al.'s private SGD on the prediction errors (see the module docstring for the exact statement)."""

    private = True  # draws noise (MapSGD's subclass, not its non-private default)

    name = "dpsgd_mf"
    relation = "rating"
    perturb_residuals = True  # the noise is on each rating's error, never on G

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        context: TrainingContext,
        epsilon: float,
        lr: float = 0.4,
        weight_decay: float = 0.005,
        beta: float = 1.0,
        sampling_ratio: float = 1.0,
        seed: int | None = None,
        e_max: float | None = None,
        delta: float = 0.0,
    ) -> None:
        epsilon = check_epsilon(epsilon, "mechanism")
        self._check_model(context.model)
        super().__init__(params, context, lr=lr, weight_decay=weight_decay, beta=beta, seed=seed)
        self.epsilon, self.sampling_ratio = epsilon, float(sampling_ratio)
        self.phi = context.scale.span
        self._init_visits(e_max, float(delta))

    @staticmethod
    def _check_model(model: Any) -> None:
        if model is not None and not perturbs_residuals(model):
            raise ConfigError(f"mechanism=dpsgd_mf (DPSGD-MF) perturbs each rating's error and needs a model that "
                              f"declares dpsgd_perturb_residuals (MF); {type(model).__name__} does not: use "
                              "mechanism=dpsgd_paper")

    def _init_visits(self, e_max: float | None, delta: float) -> None:
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

    def clip_residuals(self, residuals: torch.Tensor, batch: Any = None, model: Any = None) -> torch.Tensor:
        """The noise goes here, on the errors; ``add_noise`` (on G) is the base's no-op."""
        self._check_model(model)
        return self.perturb_residuals_(residuals)

    def epsilon_spent(self) -> float:
        """After t steps a rating was visited at most min(t, K) times: min(t, K) eps/K (from the saved step count)."""
        return self.epsilon if math.isinf(self.epsilon) else min(self.t - 1, self.max_visits) * self.epsilon / self.max_visits

    def privacy_report(self) -> dict[str, Any]:
        k, steps, q = self.max_visits, self.context.total_steps, self.sampling_ratio
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
            "epsilon_per_visit": self.epsilon / k,
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
