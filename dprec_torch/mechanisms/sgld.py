"""``mechanism=sgld`` / ``mechanism=sgld_paper``: scaled-posterior sampling by SGLD, Wang & Tang Algorithm 2.

Neighbouring relation: user-level (add/remove one user's whole profile, each user capped at tau ratings).
Alg. 2, line 5:
    S <- S - (eps_s / 4B) (eta_t / 2) (L g_bar + lambda (S - S_0) o H^-1) + z_t,   z_t ~ N(0, rho eta_t)
with eta_t = eta_1 t^(-xi), L g_bar = (1/gamma) sum over the mini-batch (the unbiased estimate of the full-data
gradient of sum_{(u,i)} e_ui^2 / 2), H the prior correction of Sec. 4.2 (Eq. (11)) and S_0 the centre of the Gaussian
prior (the paper: 0).

Privacy (Wang et al. 2015, used by Theorem 2). One EXACT sample from the posterior scaled by eps_s/(4B) is eps_s-DP
when every user's log-likelihood sum_{i in R_u} e_ui^2 / 2 is bounded by B and the prior does not depend on the data.
SGLD with noise N(0, rho eta_t) instead of N(0, eta_t) samples the posterior raised to 1/rho: the epsilon of an exact
sample is eps_s/rho. SGLD after finitely many steps only APPROXIMATES that sample, so the released parameters are
(eps, (1 + e^eps) delta)-DP with delta the total-variation distance of the chain's law from the target posterior,
which nobody quantifies here. That delta is not small: after 20 steps at q = 1 the chain's per-coordinate variance is
1.12x the target's, so over ~20K coordinates the two laws are essentially disjoint (delta ~ 1). No epsilon is
therefore defended: every form reports ``epsilon: null`` and puts the exact-sample figure beside it as
``epsilon_if_exact_sample`` (labelled); the ledger books the missing delta as "not established", never as 0.

The bound B (``likelihood_bound``):
  * ``paper``: B = phi^2 tau, phi = r_max - r_min (Wang & Tang). It holds when |e_ui| <= phi, i.e. for a model whose
    training predictions are clipped to the scale (MF, ``clip_training_predictions``). PNBM's Eq. (2) gives r_hat in
    [r_bar_i - phi, r_bar_i + phi], so |e_ui| <= 2 phi and the true bound is 4 phi^2 tau: the epsilon REPORTED is then
    (e_max/phi)^2 x eps_s/rho, not eps_s/rho.
  * ``model``: B = e_max^2 tau with e_max the model's own error bound (phi for clipped predictions, 2 phi for PNBM),
    used in the update itself, so the reported epsilon is eps_s/rho.

Two forms (conf/mechanism/):
  * ``mechanism=sgld`` (default; provable): rho = 1, ``likelihood_bound: model``, no data-dependent H, and for PNBM
    the item means r_bar are released first by the Laplace mechanism (:mod:`dprec_torch.privacy.item_means`, eps_0 =
    ``mean_fraction`` x eps, user level); the sample gets eps_s = eps - eps_0, so eps_0 + eps_s, the typed epsilon, is
    what an EXACT sample would cost. ``prior_kappa`` keeps the stationary law's prior precision kappa = (eps_s/4B)
    lambda fixed across epsilons (lambda = kappa 4B / eps_s), and ``prior_mean`` centres the prior at the
    data-independent start S_0 = s_0 (1 - I) of ``init: constant``.
  * ``mechanism=sgld_paper`` (paper-faithful): rho = 0.004 (the paper's code), B = phi^2 tau, H, a prior at 0, and
    PNBM's EXACT training item means, which no noise covers: no epsilon is defended for the released model
    (``epsilon`` null); ``epsilon_for_sample_only`` is what the sample of S alone would cost. Releasing the mean of m
    thinned samples costs m times the per-sample epsilon.

This is the posterior chain; the low-rank PNBM (``model=pnbm_lowrank``) is trained under ``mechanism=sgld`` by the
clipped, accounted chain :class:`~dprec_torch.mechanisms.clipped_sgld.ClippedSGLD` (:data:`dprec_torch.forms.FORMS`).
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch

from dprec_torch.errors import ConfigError
from dprec_torch.mechanisms.base import MechanismOptimizer, check_choices
from dprec_torch.mechanisms.context import TrainingContext, bound_model
from dprec_torch.mechanisms.dpsgd import is_pnbm, release_pnbm_means
from dprec_torch.privacy.budget import check_epsilon

BOUNDS = ("paper", "model")
INITS = ("random", "constant")


def error_bound(model: Any, span: float) -> float | None:
    """Largest |e_ui| = |r_hat_ui - r_ui| the model can produce while training (None: not bounded).

    MF with ``clip_training_predictions``: clip(r_hat) and r both lie in the scale, so phi. PNBM (Eq. (2)): r_hat - r_bar_i
    is a weighted average (weights s_ij / max(C, sum |s_ij|), absolute sum <= 1) of centred ratings in [-phi, phi], and
    r_bar_i, r lie in the scale, so 2 phi.
    """
    if model is not None and model.clip_training_predictions:
        return span
    return 2.0 * span if is_pnbm(model) else None


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
        max_user_ratings: int | None = 200,
        init_scale: float = 1.0,
        seed: int | None = None,
        likelihood_bound: str = "paper",
        prior_correction: bool = True,
        prior_kappa: float | None = None,
        prior_mean: float = 0.0,
        init: str = "random",
        init_value: float = 1.0,
        mean_fraction: float = 0.0,
        mean_global_fraction: float = 0.25,
        mean_shrinkage: float = 8.0,
    ) -> None:
        epsilon = check_epsilon(epsilon, "mechanism")
        if not 0 < temperature <= 1:
            raise ConfigError(f"mechanism.temperature (rho) must be in (0, 1], got {temperature}")
        check_choices(("likelihood_bound", likelihood_bound, BOUNDS), ("init", init, INITS))
        if not 0 <= float(mean_fraction) < 1:
            raise ConfigError(f"mechanism.mean_fraction must be in [0, 1), got {mean_fraction}")
        if prior_kappa is not None and not float(prior_kappa) > 0:
            raise ConfigError(f"mechanism.prior_kappa must be > 0 or null, got {prior_kappa}")
        if prior_kappa is not None and float(weight_decay) != 0:
            raise ConfigError(f"mechanism.weight_decay={weight_decay} and mechanism.prior_kappa={prior_kappa} both set lambda: "
                              "give one (mechanism.prior_kappa=null to set lambda directly)")
        params = list(params)
        super().__init__(params, dict(lr=float(lr), weight_decay=float(weight_decay)), seed=seed)
        model = bound_model(context)
        self.pnbm = is_pnbm(model)
        if float(prior_mean) != 0.0 and not self.pnbm:
            raise ConfigError("mechanism.prior_mean != 0 centres PNBM's S at s_0 (1 - I); other models need prior_mean=0")
        self.context, self.epsilon = context, epsilon
        self.eta1, self.decay, self.rho = float(lr), float(decay), float(temperature)
        if max_user_ratings is None:
            raise ConfigError("mechanism.max_user_ratings=null: the posterior-sampling chain needs the tau cap (B = e_max^2 tau "
                              "bounds a user's log-likelihood)")
        self.sampling_ratio, self.tau = float(sampling_ratio), int(max_user_ratings)
        self.bound_mode, self.prior_mean = likelihood_bound, float(prior_mean)
        span = context.scale.span
        self.e_max = error_bound(model, span)
        if likelihood_bound == "model" and self.e_max is None:
            raise ConfigError(f"mechanism.likelihood_bound=model: {type(model).__name__} does not bound its training "
                              "error |r_hat - r| (clip its training predictions), so no B bounds a user's log-likelihood")
        # B used in the update (Alg. 2's eps/4B) and the B that truly bounds a user's log-likelihood
        self.B = (span**2 if likelihood_bound == "paper" else self.e_max**2) * self.tau
        self.B_true = None if self.e_max is None else self.e_max**2 * self.tau
        # DP item means first (PNBM, released by prepare()): the rest of the budget goes to the sample
        self.mean_epsilon = 0.0
        if self.pnbm and float(mean_fraction) > 0 and math.isfinite(epsilon):
            self.mean_epsilon = float(mean_fraction) * epsilon
        self.releases_item_means = self.mean_epsilon > 0
        self.mean_global_fraction, self.mean_shrinkage = float(mean_global_fraction), float(mean_shrinkage)
        self.init, self.init_value, self.init_scale = init, float(init_value), float(init_scale)
        self.sample_epsilon = epsilon - self.mean_epsilon  # eps_s
        if prior_kappa is not None:  # lambda = kappa 4B / eps_s (kappa itself for the unscaled posterior, epsilon = inf)
            self.param_groups[0]["weight_decay"] = float(prior_kappa) / self.posterior_scale
        self.prior_kappa = None if prior_kappa is None else float(prior_kappa)
        pp = list(context.prior_precision) if prior_correction else []
        self.prior_correction = bool(prior_correction)
        self.prior_precision = pp or [None] * len(params)
        if self.prior_mean != 0.0 and any(h is not None for h in self.prior_precision):
            raise ConfigError("mechanism.prior_mean != 0 needs prior_correction=false (H is data-dependent anyway)")

    def prepare(self, model: Any) -> None:
        """Before the chain's first step: PNBM's DP item means (Laplace at eps_0, user level) from ``self.generator``
        into the model and its fallback, then the chain's data-independent start (S = s0 (1 - I) for ``init=constant``,
        else the parameters scaled by ``init_scale``)."""
        super().prepare(model)
        if self.releases_item_means:
            if model.history is None:
                raise ConfigError("mechanism=sgld needs the PNBM attached to its training data before the mechanism")
            release_pnbm_means(self, model, "user", "laplace", epsilon=self.mean_epsilon)
        with torch.no_grad():  # starting point of the chain only (data-independent)
            for p in self.param_groups[0]["params"]:
                if self.init == "constant" and self.pnbm and p.dim() == 2 and p.shape[0] == p.shape[1]:
                    p.fill_(self.init_value).fill_diagonal_(0.0)
                else:
                    p.mul_(self.init_scale)

    # ------------------------------------------------------------------ pieces
    @property
    def posterior_scale(self) -> float:
        """eps_s / (4B); 1 (the unscaled posterior) when epsilon = inf."""
        return 1.0 if math.isinf(self.epsilon) else self.sample_epsilon / (4.0 * self.B)

    def step_size(self, t: int | None = None) -> float:
        """eta_t = eta_1 t^(-xi) / N_eta, N_eta = #training ratings when the model declares ``gradient_reduction =
        "mean"`` (MF: ``lr`` is then a step on the MEAN posterior gradient, so the same ``lr`` suits any dataset size;
        drift and noise N(0, rho eta_t) share eta_t, so the target posterior is unchanged), else 1 (PNBM, the paper)."""
        t = self.t if t is None else t
        n = self.context.n_ratings if self.context.gradient_reduction == "mean" else 1
        return self.eta1 * t ** (-self.decay) / n

    def noise_std(self, t: int | None = None) -> float:
        """z_t ~ N(0, rho eta_t): std sqrt(rho eta_t) (Alg. 2 line 4)."""
        return math.sqrt(self.rho * self.step_size(t))

    def clip_residuals(self, residuals: torch.Tensor, batch: Any = None, model: Any = None) -> torch.Tensor:
        """No clipping (B bounds the log-likelihood)."""
        return residuals

    def elementwise_residual_clip(self) -> float | None:
        """The posterior-sampling chain does not clip (inf)."""
        return math.inf if type(self).clip_residuals is ScaledPosteriorSGLD.clip_residuals else None

    def scale_grad(self) -> None:
        """L g_bar = (1/gamma) sum over the batch (unbiased for the full-data gradient sum)."""
        if self.sampling_ratio < 1:
            for g in self.grads():
                g.div_(self.sampling_ratio)

    def apply_update(self) -> None:
        """Alg. 2 line 5 (prior centred at ``prior_mean`` off the diagonal; PNBM's diagonal is projected to 0)."""
        eta, lam = self.step_size(), self.param_groups[0]["weight_decay"]
        std = self.noise_std()
        self.state["mechanism"]["noise_scale"] = std
        for p, h in zip(self.param_groups[0]["params"], self.prior_precision):
            if p.grad is None:
                continue
            g = p.grad  # in place on the gradient buffer: no M x M temporaries
            if h is None:
                g.add_(p, alpha=lam)
                if self.prior_mean:
                    g.sub_(lam * self.prior_mean)
            else:
                g.addcdiv_(p, h, value=lam)
            p.add_(g, alpha=-self.posterior_scale * eta / 2)
            self.generator.add_gaussian_(p, std)  # M^2 draws a step for the full S: the parallel ChaCha20 kernel

    # --------------------------------------------------------------- reporting
    def sample_epsilon_delivered(self) -> float | None:
        """The epsilon of one exact sample of S: (eps_s / rho) (B_true / B); None if B_true is unknown."""
        if self.B_true is None:
            return None
        base = 4.0 * self.B if math.isinf(self.epsilon) else self.sample_epsilon
        return base / self.rho * (self.B_true / self.B)

    def delivered_epsilon(self) -> float:
        """eps_0 (DP item means) + the sample's epsilon (inf when it is not bounded)."""
        s = self.sample_epsilon_delivered()
        return math.inf if s is None else self.mean_epsilon + s

    def epsilon_spent(self) -> float:
        """inf: no epsilon is defended while the chain's delta is not established (``delivered_epsilon`` is what
        an exact sample would cost)."""
        return math.inf

    def privacy_report(self) -> dict[str, Any]:
        eps_sample = self.sample_epsilon_delivered()  # one sample is released (the last state of the chain)
        model = self.context.model  # does it also release non-private training statistics (PNBM's exact item means)?
        exact_means = model is not None and model.centres_on_item_means and self.mean_release is None
        # what an EXACT posterior sample would cost; the chain's delta is unknown (~1), so nothing is defended
        eps_exact = None if (exact_means or eps_sample is None) else self.mean_epsilon + eps_sample
        provable = self.bound_mode == "model" and not exact_means
        form = ("provable form: rho = %g, B = e_max^2 tau from the model's error bound" % self.rho if provable
                else "paper-faithful form (Wang & Tang Alg. 2)")
        notes = []
        if self.B_true is not None and self.B_true != self.B:
            notes.append(f"The update uses the paper's B = phi^2 tau = {self.B:g}, but this model's training error reaches "
                         f"e_max = {self.e_max:g}, so a user's log-likelihood is bounded only by e_max^2 tau = {self.B_true:g}: "
                         f"the sample's epsilon is (eps_s/rho) x {self.B_true / self.B:g}.")
        if self.rho != 1:
            notes.append(f"SGLD at temperature rho={self.rho} samples the posterior raised to 1/rho, so the sample's "
                         f"epsilon is eps_s/rho, not the nominal {self.epsilon:g}.")
        if exact_means:
            notes.append("The model also releases exact training item means r_bar_i (Eq. (2)), which no noise covers, "
                         "so the released model as a whole has NO defended epsilon; epsilon_for_sample_only covers the "
                         "sample of S alone (mechanism=sgld releases DP item means instead).")
        if self.mean_release is not None:
            notes.append(f"Item means released first by the Laplace mechanism at user level, eps_0 = {self.mean_epsilon:.4g}; "
                         f"the sample gets eps_s = {self.sample_epsilon:.4g}. Predictions for u also read u's own "
                         "ratings (joint DP).")
        return {
            "mechanism": f"sgld (scaled-posterior sampling by SGLD, Wang & Tang Alg. 2; {form})",
            "relation": "user",
            "guarantee": ("none defended: an EXACT sample of the scaled posterior would be user-level eps-DP "
                          "(Wang et al. 2015), but SGLD only approximates it, giving (eps, (1 + e^eps) delta) with delta "
                          "the chain's total-variation distance from the posterior, which is not established (after "
                          "finitely many steps it can be ~1)"),
            "sensitivity": {"log_likelihood_bound_B": self.B_true,
                            "B_in_update": self.B, "error_bound_e_max": self.e_max,
                            "formula": "B = e_max^2 tau (paper: phi^2 tau, phi = r_max - r_min)", "tau": self.tau},
            "noise": f"Gaussian z_t ~ N(0, rho eta_t), rho={self.rho}, eta_1={self.eta1}, xi={self.decay}",
            "steps": self.context.total_steps,
            "sampling_ratio": self.sampling_ratio,
            "temperature": self.rho,
            "posterior_scale": self.posterior_scale,
            "prior": {"weight_decay_lambda": self.param_groups[0]["weight_decay"], "kappa": self.prior_kappa,
                      "centre": self.prior_mean, "H_correction": self.prior_correction},
            "samples_released": 1,
            "epsilon_nominal": self.epsilon,
            "epsilon_item_means": self.mean_epsilon,
            "epsilon_sample": self.sample_epsilon,
            "epsilon_for_sample_only": eps_sample,
            "epsilon_if_exact_sample": eps_exact,
            "epsilon": None,
            "delta": None,
            "delta_note": ("not established: the chain's distance from the scaled posterior is not bounded (never "
                           "reported as 0), so epsilon is null; epsilon_if_exact_sample is what an exact sample would cost"),
            "item_means": self.mean_release.report() if self.mean_release is not None else None,
            "accountant": ("basic composition of the DP item means (eps_0) and one exact posterior sample "
                           "(eps_s/rho x B_true/B); m averaged samples compose to m times the sample's epsilon"),
            "analysis": (
                "Sampling the posterior scaled by eps_s/(4B) is eps_s-DP at user level when every user's "
                "log-likelihood is bounded by B; " + " ".join(notes)
                + (f" An exact sample would give epsilon = {eps_exact:.4g} (user level); the chain's delta is not "
                   "established, so NO epsilon is defended for the released model." if eps_exact is not None else "")
            ),
        }
