"""``mechanism=dpsgd_l1``: clipped-Laplace DP-SGD whose noise is calibrated to the WHOLE update.

Wang & Tang's Alg. 1 calibrates Laplace noise to one gradient entry (see ``dpsgd_paper.py``). Here each unit's whole
gradient contribution is clipped in L1 and the noise is calibrated to that bound:

    1. G_x   = sum_{(u,i) in x} e_ui d r_hat_ui / d theta          unit x = a user (PNBM: rows and
                                                                   columns R_u of S) or a rating (MF)
    2. G_x  <- G_x min(1, c / ||G_x||_1)                           on the residuals of x
    3. G     = sum_{x in batch} G_x + Lap(c / eps_s) on every entry (PNBM: diag(G) := 0 first)
    4. theta <- theta - lr (beta G + lambda theta)                 (MapSGD, Alg. 1 line 7)

Privacy (:func:`dprec_torch.privacy.analysis.analyse_dpsgd_l1`). Adding or removing one unit moves sum_x G_x by at
most c in L1, so step 3 is eps_s-DP on its sample; Poisson(q) sampling of units amplifies it to
ln(1 + q(e^{eps_s} - 1)); T steps compose. For PNBM the item means r_bar that centre every gradient and form the
prediction baseline are released first by the Laplace mechanism (:mod:`dprec_torch.privacy.item_means`,
eps_0 = ``mean_fraction`` x eps). In total

    eps = eps_0 + g T ln(1 + q (e^{eps_s} - 1)),      g = 2 if relation=rating, else 1,

and eps_s is solved from the configured eps. ``relation=user`` defends add/remove of one user's profile (g = 1);
``relation=rating`` defends add/remove/change of one rating, g = 2 for either unit: changing a rating's value replaces
one clipped contribution (the rating's own with unit=rating, its user's G_u with unit=user) by another, which moves
the clipped sum by up to 2c, not c (:func:`~dprec_torch.privacy.analysis.dpsgd_l1_group_factor`; the item means then
use rating-level sensitivity). ``epsilon`` in ``privacy_report()`` is the defended figure.

PNBM-specific choices: ``init=constant`` starts from S = s0 (1 - I) (data-independent): Eq. (2) is then r_bar_i + the
user's mean centred rating (shrunk by the floor C), a strong baseline that a noisy update must not destroy. Gradient
norms come from :mod:`dprec_torch.privacy.pnbm_clipping` (per-user pair enumeration, never an M x M matrix per user).
Prediction for user u also reads u's own training ratings: the guarantee protects u against anyone who sees the model
(S, r_bar) and other users' predictions, not against someone who sees u's own predictions (joint DP).

The low-rank PNBM (``model.similarity=lowrank``, S = U U^T): step 2 clips each sampled user's whole gradient of U to
L1 norm c (the explicit per-user rows of :mod:`dprec_torch.models.pnbm_lowrank`), step 3 puts Lap(c/eps_s) on each of
the M d entries of U's summed gradient, which is then divided by the expected batch size q N (the model's
``gradient_reduction = "mean"``) before step 4 (use ``beta=1``). The item means are the Laplace form of
:mod:`dprec_torch.mechanisms.lowrank_pnbm`'s release (pure eps_0 = ``mean_fraction`` x eps, L1 sensitivity 1,
``mean_prior_std``, ``count_weight``); the composition is the one above (g = 1, user level only).
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch

from dprec_torch.errors import ConfigError
from dprec_torch.mechanisms.base import add_laplace_noise_, check_choices
from dprec_torch.mechanisms.context import TrainingContext, bound_model
from dprec_torch.mechanisms.lowrank_pnbm import clip_lowrank, is_lowrank, release_means
from dprec_torch.mechanisms.sgd import MapSGD
from dprec_torch.models.mf import MF
from dprec_torch.models.pnbm import PNBM
from dprec_torch.privacy.accountants import PureDPAccountant
from dprec_torch.privacy.analysis import analyse_dpsgd_l1, composed_epsilon, dpsgd_l1_group_factor, laplace_step_epsilon
from dprec_torch.privacy.budget import check_epsilon
from dprec_torch.privacy.item_means import ItemMeansSpec, install_item_means, release_item_means
from dprec_torch.privacy.pnbm_clipping import per_user_grad_norms, zero_diagonal_

UNITS = ("user", "rating")
INITS = ("constant", "random")


def is_pnbm(model: Any) -> bool:
    """Dense item-item PNBM (the M x M ``S``; not the low-rank or top-k form): clipped per user over R_u."""
    return isinstance(model, PNBM)


def release_pnbm_means(mechanism: Any, model: Any, relation: str, noise: str, **budget: float) -> None:
    """PNBM's centred DP item means (:func:`release_item_means`, the mechanism's ``mean_global_fraction`` and
    ``mean_shrinkage``, from its generator) into the model and its fallback, kept as ``mechanism.mean_release``."""
    spec = ItemMeansSpec("centred", relation, noise, global_fraction=mechanism.mean_global_fraction, shrinkage=mechanism.mean_shrinkage)
    mechanism.mean_release = release_item_means(model.history, spec, mechanism.generator, **budget)
    install_item_means(model, mechanism.mean_release)


class ClippedLaplaceDPSGD(MapSGD):
    """Whole-update clipped-Laplace DP-SGD (see the module docstring).

    ``relation`` is the neighbouring relation: the class attribute is the default (``user``: the runner caps users at
    tau), the instance's ``relation`` (= ``defended_relation``) the configured one; ``unit`` samples and clips.
    """

    private = True  # draws noise (MapSGD's subclass, not its non-private default)

    name = "dpsgd_l1"
    relation = "user"

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        context: TrainingContext,
        epsilon: float,
        clip_norm: float = 1.0,
        lr: float = 0.01,
        weight_decay: float = 0.0,
        beta: float = 1.0,
        sampling_ratio: float = 1.0,
        unit: str = "user",
        relation: str = "user",
        mean_fraction: float = 0.5,
        mean_global_fraction: float = 0.25,
        mean_shrinkage: float = 8.0,
        init: str = "constant",
        init_value: float = 1.0,
        chunk_pairs: int | None = None,
        seed: int | None = None,
        model: Any = None,
        mean_prior_std: float = 0.5,
        count_weight: float | None = 0.5,
        mean_feature_prior: bool = False,
    ) -> None:
        epsilon, clip_norm, q = check_epsilon(epsilon, "mechanism"), float(clip_norm), float(sampling_ratio)
        if not clip_norm > 0 or math.isinf(clip_norm):
            raise ConfigError(f"mechanism.clip_norm (c, L1) must be a finite number > 0, got {clip_norm}")
        if not 0 < q <= 1:
            raise ConfigError(f"mechanism.sampling_ratio (q) must be in (0, 1], got {sampling_ratio}")
        check_choices(("unit", unit, UNITS), ("relation", relation, UNITS), ("init", init, INITS))
        if not 0 <= float(mean_fraction) < 1:
            raise ConfigError(f"mechanism.mean_fraction must be in [0, 1), got {mean_fraction}")
        params = list(params)
        super().__init__(params, context, lr=lr, weight_decay=weight_decay, beta=beta, seed=seed)
        model = model if model is not None else bound_model(context)
        self.pnbm = is_pnbm(model)
        self.lowrank = is_lowrank(model)
        if self.lowrank and (unit != "user" or relation != "user"):
            raise ConfigError("mechanism=dpsgd on the low-rank PNBM clips per user at user level: set mechanism.unit=user "
                              "mechanism.relation=user")
        if self.pnbm and unit != "user":
            raise ConfigError("mechanism=dpsgd_l1 with PNBM needs unit=user: a rating r_uj enters the gradient of every "
                              "other rating of u through the history, so only a user's whole contribution can be clipped")
        if unit == "rating" and relation == "user":
            raise ConfigError("mechanism=dpsgd_l1 unit=rating clips per rating, which cannot defend relation=user")
        self.epsilon, self.clip_norm, self.sampling_ratio = epsilon, clip_norm, q
        self.unit, self.defended_relation, self.relation = unit, relation, relation  # the class's relation is the default
        self.chunk_pairs = None if chunk_pairs is None else int(chunk_pairs)
        self.group = dpsgd_l1_group_factor(relation, unit)  # 2 for relation=rating: a changed rating moves 2c
        self.mean_epsilon = 0.0
        self.init, self.init_value = init, float(init_value)
        self.mean_global_fraction, self.mean_shrinkage = float(mean_global_fraction), float(mean_shrinkage)
        self.mean_options = None
        if (self.pnbm or self.lowrank) and math.isfinite(epsilon):
            if not float(mean_fraction) > 0:
                whose = "PNBM's" if self.pnbm else "the"
                raise ConfigError(f"mechanism.mean_fraction=0 would keep {whose} exact (non-private) item means")
            self.mean_epsilon = float(mean_fraction) * epsilon
            if self.lowrank:
                self.mean_options = ItemMeansSpec(prior_std=float(mean_prior_std), feature_prior=bool(mean_feature_prior),
                                                  count_weight=None if count_weight is None else float(count_weight))
            elif mean_feature_prior:
                raise ConfigError("mechanism.mean_feature_prior applies to the low-rank PNBM's item means only: set it false")
        self.releases_item_means = self.mean_epsilon > 0  # by prepare(), at eps_0
        self.step_epsilon = (math.inf if math.isinf(epsilon)
                             else laplace_step_epsilon(epsilon, int(context.total_steps), q, self.mean_epsilon, self.group))
        self.accountant = PureDPAccountant()
        self.state["mechanism"].update(clipped_fraction=0.0, max_clipped_norm=0.0)

    def prepare(self, model: Any) -> None:
        """Step 0: the DP item means at eps_0 (PNBM: centred, Laplace, under the configured relation; the low-rank PNBM:
        :func:`release_means`), then PNBM's data-independent start S = s0 (1 - I) (``init=constant``)."""
        super().prepare(model)
        if self.pnbm and self.releases_item_means:
            if model.history is None:
                raise ConfigError("mechanism=dpsgd_l1 needs the PNBM attached to its training data before the mechanism")
            release_pnbm_means(self, model, self.defended_relation, "laplace", epsilon=self.mean_epsilon)
        if self.pnbm and self.init == "constant":
            with torch.no_grad():
                model.S.fill_(self.init_value)
                model.S.fill_diagonal_(0.0)
        if self.lowrank and self.releases_item_means:
            self.mean_release = release_means(model, self.mean_epsilon, "laplace", self.mean_options, self.generator)

    # ------------------------------------------------------------- pieces
    @property
    def noise_scale(self) -> float:
        """Laplace scale c / eps_s (0 without noise)."""
        return 0.0 if math.isinf(self.step_epsilon) else self.clip_norm / self.step_epsilon

    def clip_residuals(self, residuals: torch.Tensor, batch: Any = None, model: Any = None) -> torch.Tensor:
        """Step 2: e_ui <- e_ui min(1, c / ||G_x||_1) for the unit x holding (u, i) (||G_x||_1 per batch row for
        unit=user, per target for unit=rating)."""
        if batch is None or model is None:
            raise ConfigError("mechanism=dpsgd_l1 needs the batch and the model to clip per unit")
        if self.unit == "user" and not batch.is_user_level():
            raise ConfigError("mechanism=dpsgd_l1 unit=user needs user-level batches (every rating of each sampled user); "
                              "the runner must sample users (mechanism.unit=user)")
        if self.lowrank:
            return clip_lowrank(self, residuals, batch, model, p=1)
        if self.pnbm:
            norms = per_user_grad_norms(model, batch, residuals, p=1, chunk_pairs=self.chunk_pairs)
        elif isinstance(model, MF):  # closed-form L1 norms of its factor tables
            from dprec_torch.privacy.mf_clipping import mf_grad_norms_l1

            norms = mf_grad_norms_l1(model, batch, residuals, self.unit)
        else:
            raise ConfigError(f"mechanism=dpsgd_l1 has no per-example L1 norm for model {type(model).__name__}")
        return self.clip_by_norm(residuals, norms, batch.rows if self.unit == "user" else None)

    def add_noise(self) -> None:
        """Step 3: diag(G) := 0 (PNBM), then Lap(c/eps_s) on every entry (:meth:`account` records it)."""
        b = self.noise_scale
        self.state["mechanism"]["noise_scale"] = b
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                if self.pnbm and p.dim() == 2 and p.shape[0] == p.shape[1]:
                    zero_diagonal_(p.grad)
                if b > 0:
                    add_laplace_noise_(p.grad, b, self.generator)

    def account(self) -> None:
        """The step's (eps_s, q) in the accountant's history (a noiseless step releases nothing private: none)."""
        if self.noise_scale > 0:
            self.accountant.step(self.step_epsilon, self.sampling_ratio)

    def graph_constants(self) -> tuple | None:
        """(this step's eta_t, beta, weight decay, Laplace scale, c, q): a captured step is replayed while they hold (an
        ``lr_decay`` changes eta_t once an epoch: the step is captured again). None with ``per_rating_step`` or
        ``rating_reg`` (their host work reads each batch)."""
        if self.per_rating_step or self.rating_reg:
            return None
        group = self.param_groups[0]
        return (self.current_lr(float(group["lr"])), float(group["beta"]), float(group.get("weight_decay", 0.0)),
                float(self.noise_scale), self.clip_norm, self.sampling_ratio)

    # ---------------------------------------------------------- reporting
    def epsilon_spent(self) -> float:
        """eps_0 + g * sum_t ln(1 + q(e^{eps_s} - 1)) over the steps taken so far."""
        return math.inf if math.isinf(self.epsilon) else self.mean_epsilon + self.group * self.accountant.get_epsilon()

    def planned_epsilon(self) -> float:
        return math.inf if math.isinf(self.epsilon) else composed_epsilon(self.step_epsilon, self.sampling_ratio,
                                                                          self.context.total_steps, self.mean_epsilon, self.group)

    def privacy_report(self) -> dict[str, Any]:
        steps, q = self.context.total_steps, self.sampling_ratio
        if math.isinf(self.epsilon):
            return {"mechanism": "dpsgd_l1 (clipping only, epsilon=inf)", "relation": None, "epsilon": math.inf,
                    "epsilon_nominal": math.inf, "delta": 0.0, "clip_norm": self.clip_norm, "steps": steps,
                    "sampling_ratio": q, "analysis": "no noise: not private"}
        report = analyse_dpsgd_l1(self.epsilon, steps, q, self.clip_norm, self.mean_epsilon, self.defended_relation, self.unit).as_dict()
        report.update(
            epsilon=self.planned_epsilon(),
            epsilon_nominal=self.epsilon,
            epsilon_spent=self.epsilon_spent(),
            epsilon_user_level=(self.planned_epsilon() if self.defended_relation == "user" else None),
            steps=steps,
            steps_taken=self.accountant.steps,
            noise_scale=self.noise_scale,
            accountant="pure-DP: exact Poisson amplification ln(1 + q(e^eps_s - 1)) + basic composition",
            item_means=None if self.mean_release is None else self.mean_release.report(),
            analysis=(
                f"Each {self.unit}'s whole gradient is clipped to L1 norm c={self.clip_norm:g}; Lap(c/eps_s) with "
                f"eps_s={self.step_epsilon:.4g} on every entry; Poisson rate q={q:g} over {self.unit}s; "
                f"{steps} steps" + (f" + item means eps_0={self.mean_epsilon:.4g}" if self.mean_release else "")
                + f" compose to eps={self.planned_epsilon():.4g} ({self.defended_relation} level)."
                + (" Predictions for u also read u's own ratings (joint DP)." if self.pnbm or self.lowrank else
                   " MF with fallback=mean predicts unknown users/items from NON-private means (use fallback=model).")
            ),
        )
        return report
