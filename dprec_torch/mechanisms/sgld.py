"""``mechanism=sgld`` / ``mechanism=sgld_paper``: scaled-posterior sampling by SGLD, Wang & Tang Algorithm 2.

Neighbouring relation: user-level (add/remove one user's whole profile, each user capped at tau ratings).
Alg. 2, line 5:
    S <- S - (eps_s / 4B) (eta_t / 2) (L g_bar + lambda (S - S_0) o H^-1) + z_t,   z_t ~ N(0, rho eta_t)
with eta_t = eta_1 t^(-xi), L g_bar = (1/gamma) sum over the mini-batch (the unbiased estimate of the
full-data gradient of sum_{(u,i)} e_ui^2 / 2), H the prior correction of Sec. 4.2 (Eq. (11)) and S_0
the centre of the Gaussian prior (the paper: 0).

Privacy (Wang et al. 2015, used by Theorem 2). One EXACT sample from the posterior scaled by
eps_s/(4B) is eps_s-DP when every user's log-likelihood sum_{i in R_u} e_ui^2 / 2 is bounded by B
and the prior does not depend on the data. SGLD with noise N(0, rho eta_t) instead of N(0, eta_t)
samples the posterior raised to 1/rho: the epsilon of an exact sample is eps_s/rho. SGLD after
finitely many steps only APPROXIMATES that sample, so the released parameters are
(eps, (1 + e^eps) delta)-DP with delta the total-variation distance of the chain's law from the
target posterior, which nobody quantifies here. That delta is not small: after 20 steps at q = 1 the
chain's per-coordinate variance is 1.12x the target's, so over ~20K coordinates the two laws are
essentially disjoint (delta ~ 1). No epsilon is therefore defended: every form reports
``epsilon: null`` and puts the exact-sample figure beside it as ``epsilon_if_exact_sample`` (labelled);
the ledger books the missing delta as "not established", never as 0.

The bound B (``likelihood_bound``):
  * ``paper``: B = phi^2 tau, phi = r_max - r_min (Wang & Tang). It holds when |e_ui| <= phi, i.e. for
    a model whose training predictions are clipped to the scale (MF, ``clip_training_predictions``).
    PNBM's Eq. (2) gives r_hat in [r_bar_i - phi, r_bar_i + phi], so |e_ui| <= 2 phi and the true bound
    is 4 phi^2 tau: the epsilon REPORTED is then (e_max/phi)^2 x eps_s/rho, not eps_s/rho.
  * ``model``: B = e_max^2 tau with e_max the model's own error bound (phi for clipped predictions,
    2 phi for PNBM), used in the update itself, so the reported epsilon is eps_s/rho.

Two forms (conf/mechanism/):
  * ``mechanism=sgld`` (default; provable): rho = 1, ``likelihood_bound: model``, no data-dependent H,
    and for PNBM the item means r_bar are released first by the Laplace mechanism
    (:mod:`dprec_torch.privacy.item_means`, eps_0 = ``mean_fraction`` x eps, user level); the sample
    gets eps_s = eps - eps_0, so eps_0 + eps_s, the typed epsilon, is what an EXACT sample would cost.
    ``prior_kappa`` keeps the stationary law's prior precision kappa = (eps_s/4B) lambda
    fixed across epsilons (lambda = kappa 4B / eps_s), and ``prior_mean`` centres the prior at the
    data-independent start S_0 = s_0 (1 - I) of ``init: constant``.
  * ``mechanism=sgld_paper`` (paper-faithful): rho = 0.004 (the paper's code), B = phi^2 tau, H, a
    prior at 0, and PNBM's EXACT training item means, which no noise covers: no epsilon is defended
    for the released model (``epsilon`` null); ``epsilon_for_sample_only`` is what the sample of S
    alone would cost. Releasing the mean of m thinned samples costs m times the per-sample epsilon.

Clipped chain (the low-rank PNBM, ``model.similarity=lowrank``; ``mechanism.clip_norm`` = C set). Alg. 2 line 5 with
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
(:func:`~dprec_torch.privacy.calibration.calibrate_gaussian`) and rho = eta (sigma C / (q N))^2 (``temperature`` is not read).
At a constant step the chain is therefore Gaussian DP-SGD with step ``lr`` and weight decay lambda / N, and the
settings validated for one serve the other. The posterior-sampling argument is stated beside the accountant's figure
and does not apply here: L_u = sum_i (y_ui - f_ui)^2 is unbounded in U, so no B bounds it.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch

from dprec_torch.errors import ConfigError
from dprec_torch.mechanisms.base import MechanismOptimizer
from dprec_torch.mechanisms.context import TrainingContext, bound_model
from dprec_torch.mechanisms.dpsgd import is_pnbm
from dprec_torch.mechanisms.lowrank_pnbm import clip_lowrank, gaussian_mean_multiplier, is_lowrank, release_means
from dprec_torch.privacy.calibration import calibrate_gaussian, gaussian_epsilon
from dprec_torch.privacy.opacus_accounting import ACCOUNTANT_TEXT, ACCOUNTANTS, OpacusAccountant
from dprec_torch.privacy.budget import check_epsilon
from dprec_torch.privacy.item_means import ItemMeansSpec, install_item_means, release_item_means

BOUNDS = ("paper", "model")
INITS = ("random", "constant")


def error_bound(model: Any, span: float) -> float | None:
    """Largest |e_ui| = |r_hat_ui - r_ui| the model can produce while training (None: not bounded).

    MF with ``clip_training_predictions``: clip(r_hat) and r both lie in the scale, so phi. PNBM
    (Eq. (2)): r_hat - r_bar_i is a weighted average (weights s_ij / max(C, sum |s_ij|), absolute sum
    <= 1) of centred ratings in [-phi, phi], and r_bar_i, r lie in the scale, so 2 phi.
    """
    if model is None:
        return None
    if model.clip_training_predictions:
        return span
    if is_pnbm(model):
        return 2.0 * span
    return None


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
        clip_norm: float | None = None,
        delta: float = 1e-6,
        accountant: str = "rdp",
        mean_prior_std: float = 0.5,
        mean_popularity_alpha: float = 0.0,
        mean_popularity_share: float = 0.1,
        count_weight: float | None = 0.5,
    ) -> None:
        epsilon = check_epsilon(epsilon, "mechanism")
        if not 0 < temperature <= 1:
            raise ConfigError(f"mechanism.temperature (rho) must be in (0, 1], got {temperature}")
        if likelihood_bound not in BOUNDS:
            raise ConfigError(f"mechanism.likelihood_bound must be one of {BOUNDS}, got '{likelihood_bound}'")
        if init not in INITS:
            raise ConfigError(f"mechanism.init must be one of {INITS}, got '{init}'")
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
        self.clipped = clip_norm is not None
        if self.clipped or is_lowrank(model):  # the accounted chain (module docstring, "Clipped chain")
            self._init_clipped(model, context, epsilon, float(lr), float(decay), float(sampling_ratio), clip_norm, float(delta),
                               accountant, float(mean_fraction), prior_kappa, float(prior_mean),
                               ItemMeansSpec(prior_std=float(mean_prior_std), popularity_alpha=float(mean_popularity_alpha),
                                             popularity_share=float(mean_popularity_share),
                                             count_weight=None if count_weight is None else float(count_weight)))
            return
        self.pnbm = is_pnbm(model)
        if float(prior_mean) != 0.0 and not self.pnbm:
            raise ConfigError("mechanism.prior_mean != 0 centres PNBM's S at s_0 (1 - I); other models need prior_mean=0")
        self.context, self.epsilon = context, epsilon
        self.eta1, self.decay, self.rho = float(lr), float(decay), float(temperature)
        if max_user_ratings is None:
            raise ConfigError("mechanism.max_user_ratings=null: the posterior-sampling chain needs the tau cap (B = e_max^2 tau "
                              "bounds a user's log-likelihood); only the clipped chain (mechanism.clip_norm) needs none")
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
        self.mean_release, self.mean_epsilon = None, 0.0
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
        else the parameters scaled by ``init_scale``). The clipped chain: the Gaussian item means (one accountant entry)."""
        super().prepare(model)
        if self.clipped:
            if self.releases_item_means:
                self.mean_release = release_means(model, 1.0 / self.mean_sigma, "gaussian", self.mean_options, self.generator)
                self.accountant.step(self.mean_sigma, 1.0)
            return
        if self.releases_item_means:
            if model.history is None:
                raise ConfigError("mechanism=sgld needs the PNBM attached to its training data before the mechanism")
            self.mean_release = release_item_means(model.history, ItemMeansSpec("centred", "user", "laplace",
                                                                                global_fraction=self.mean_global_fraction,
                                                                                shrinkage=self.mean_shrinkage),
                                                   self.generator, epsilon=self.mean_epsilon)
            install_item_means(model, self.mean_release)
        with torch.no_grad():  # starting point of the chain only (data-independent)
            for p in self.param_groups[0]["params"]:
                if self.init == "constant" and self.pnbm and p.dim() == 2 and p.shape[0] == p.shape[1]:
                    p.fill_(self.init_value).fill_diagonal_(0.0)
                else:
                    p.mul_(self.init_scale)

    def _init_clipped(self, model: Any, context: TrainingContext, epsilon: float, eta: float, decay: float, q: float,
                      clip_norm: float | None, delta: float, accountant: str, mean_fraction: float, prior_kappa: float | None,
                      prior_mean: float, options: ItemMeansSpec) -> None:
        """The clipped chain on the low-rank PNBM: calibrate the temperature rho to (eps, delta) and release the means."""
        if not is_lowrank(model):
            raise ConfigError("mechanism.clip_norm (the accounted, clipped SGLD chain) is implemented for the low-rank PNBM "
                              "(model.similarity=lowrank); the full M x M form keeps the posterior-sampling chain, "
                              "whose epsilon is null: set mechanism.clip_norm=null")
        if clip_norm is None:
            raise ConfigError("mechanism=sgld on the low-rank PNBM (the default model) is the accounted chain: set "
                              "mechanism.clip_norm (C, the per-user Frobenius clip of dL_u/dU); the paper's chain on the full "
                              "M x M S (mechanism=sgld_paper, or sgld with the posterior-sampling form) needs model=pnbm")
        if not (float(clip_norm) > 0 and math.isfinite(float(clip_norm))):
            raise ConfigError(f"mechanism.clip_norm (C) must be a finite number > 0, got {clip_norm}")
        if decay != 0:
            raise ConfigError(f"mechanism.decay={decay}: the clipped chain takes a constant step (one noise multiplier for "
                              "every step, so the accountant composes one Gaussian mechanism T times): set mechanism.decay=0")
        if prior_kappa is not None or prior_mean != 0:
            raise ConfigError("mechanism.prior_kappa / prior_mean belong to the posterior-sampling form; the clipped chain's "
                              "prior is N(0, 1/lambda) with lambda = mechanism.weight_decay: set prior_kappa=null, prior_mean=0")
        if not 0 < q <= 1:
            raise ConfigError(f"mechanism.sampling_ratio (q) must be in (0, 1], got {q}")
        if accountant not in ACCOUNTANTS:
            raise ConfigError(f"mechanism.accountant must be one of {ACCOUNTANTS}, got '{accountant}'")
        private = math.isfinite(epsilon)
        if private and not 0 < delta < 1:
            raise ConfigError(f"mechanism=sgld (clipped chain) needs delta in (0, 1), got {delta}")
        self.context, self.epsilon, self.delta = context, epsilon, delta
        self.eta1, self.decay, self.sampling_ratio, self.clip_norm = eta, 0.0, q, float(clip_norm)
        self.accountant_name, self.mean_options = accountant, options
        self.mean_fraction = mean_fraction
        self.mean_sigma, self.noise_multiplier = 0.0, 0.0
        if private:
            self.mean_sigma = gaussian_mean_multiplier(epsilon, delta, mean_fraction, accountant)
            self.noise_multiplier = calibrate_gaussian(epsilon, delta, q, int(context.total_steps), accountant,
                                              prior=[(self.mean_sigma, 1.0, 1)]).sigma
        # rho from sigma: the step's noise std sqrt(rho eta) against its sensitivity eta C / (q N)
        self.rho = eta * (self.noise_multiplier * self.clip_norm / context.grad_divisor) ** 2
        self.accountant = OpacusAccountant(accountant)
        self.mean_release = None
        self.releases_item_means = private  # by prepare(): one Gaussian release, (sigma_m, q = 1, 1 step)
        self.state["mechanism"].update(clipped_fraction=0.0, max_clipped_norm=0.0)

    # ------------------------------------------------------------------ pieces
    @property
    def posterior_scale(self) -> float:
        """eps_s / (4B); 1 (the unscaled posterior) when epsilon = inf."""
        return 1.0 if math.isinf(self.epsilon) else self.sample_epsilon / (4.0 * self.B)

    def step_size(self, t: int | None = None) -> float:
        """eta_t = eta_1 t^(-xi) / N_eta, N_eta = #training ratings when the model declares ``gradient_reduction =
        "mean"`` (MF: ``lr`` is then a step on the MEAN posterior gradient, so the same ``lr`` suits any dataset size;
        drift and noise N(0, rho eta_t) share eta_t, so the target posterior is unchanged), else 1 (PNBM, the paper)."""
        if self.clipped:
            return self.eta1
        t = self.t if t is None else t
        n = self.context.n_ratings if self.context.gradient_reduction == "mean" else 1
        return self.eta1 * t ** (-self.decay) / n

    def noise_std(self, t: int | None = None) -> float:
        """z_t ~ N(0, rho eta_t): std sqrt(rho eta_t) (Alg. 2 line 4)."""
        return math.sqrt(self.rho * self.step_size(t))

    def clip_residuals(self, residuals: torch.Tensor, batch: Any = None, model: Any = None) -> torch.Tensor:
        """No clipping (B bounds the log-likelihood). The clipped chain: each sampled user's whole gradient of U
        clipped to Frobenius norm C."""
        if self.clipped:
            if batch is None or model is None or batch.n_targets != batch.ind.values().numel():
                raise ConfigError("mechanism=sgld (clipped chain) needs user-level batches and the model to clip per user")
            return clip_lowrank(self, residuals, batch, model)
        return residuals

    def elementwise_residual_clip(self) -> float | None:
        """The posterior-sampling form does not clip (inf); the clipped chain clips per user (None)."""
        plain = type(self).clip_residuals is ScaledPosteriorSGLD.clip_residuals and not self.clipped
        return math.inf if plain else None

    def add_noise(self) -> None:
        """The clipped chain only: N(0, (sigma C)^2) on every entry of the clipped sum G, i.e. after the step's scaling
        eta / (q N), the chain's own z_t ~ N(0, rho eta) on U (the posterior-sampling form draws z_t in ``apply_update``)."""
        if not self.clipped:
            return
        self.state["mechanism"]["noise_scale"] = math.sqrt(self.rho * self.eta1)
        self.add_gaussian_noise_(self.noise_multiplier * self.clip_norm)

    def account(self) -> None:
        """The clipped chain: record the step (sigma, q) in the Opacus accountant."""
        if self.clipped and self.noise_multiplier > 0:
            self.accountant.step(self.noise_multiplier, self.sampling_ratio)

    def scale_grad(self) -> None:
        """L g_bar = (1/gamma) sum over the batch (unbiased for the full-data gradient sum). The clipped chain divides by
        q N instead (the posterior scale a = 2 / N of the mean loss, module docstring)."""
        if self.clipped:
            MechanismOptimizer.scale_grad(self)
            return
        if self.sampling_ratio < 1:
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.div_(self.sampling_ratio)

    def apply_update(self) -> None:
        """Alg. 2 line 5 (prior centred at ``prior_mean`` off the diagonal; PNBM's diagonal is projected to 0). The
        clipped chain: U <- U - eta (G~ / (q N) + (lambda / N) U), its noise already in G~ (``add_noise``)."""
        if self.clipped:
            MechanismOptimizer.apply_update(self)
            return
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
        an exact sample would cost). The clipped chain: the accountant's epsilon at ``delta`` for the steps so far."""
        if self.clipped:
            if self.noise_multiplier <= 0:
                return math.inf
            return gaussian_epsilon(self.accountant.history, self.delta, self.accountant_name)
        return math.inf

    def planned_epsilon(self) -> float:
        """The clipped chain: the accountant's epsilon after the item means and all T = context.total_steps steps."""
        if not (self.clipped and self.noise_multiplier > 0):
            return math.inf
        return gaussian_epsilon(((self.mean_sigma, 1.0, 1), (self.noise_multiplier, self.sampling_ratio, self.context.total_steps)),
                                self.delta, self.accountant_name)

    def releases_exact_statistics(self) -> bool:
        """True when the model also releases non-private training statistics (PNBM's exact item means)."""
        model = self.context.model
        return model is not None and model.centres_on_item_means and self.mean_release is None

    def privacy_report(self) -> dict[str, Any]:
        if self.clipped:
            return self._clipped_report()
        k = self.context.total_steps
        sample = self.sample_epsilon_delivered()
        eps_sample = sample  # one sample is released (the last state of the chain)
        exact_means = self.releases_exact_statistics()
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
            "sensitivity": {"log_likelihood_bound_B": self.B_true if self.B_true is not None else None,
                            "B_in_update": self.B, "error_bound_e_max": self.e_max,
                            "formula": "B = e_max^2 tau (paper: phi^2 tau, phi = r_max - r_min)", "tau": self.tau},
            "noise": f"Gaussian z_t ~ N(0, rho eta_t), rho={self.rho}, eta_1={self.eta1}, xi={self.decay}",
            "steps": k,
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

    def _clipped_report(self) -> dict[str, Any]:
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
