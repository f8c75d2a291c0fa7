"""``mechanism=laplace_output``: Laplace output perturbation (Park & Acharya 2011, Sec. 3.2; Theorem 2.1).

Every released prediction ``f_ij`` gets independent ``Lap(b)`` noise with scale ``b = Delta f / epsilon`` (scale, not
std: std = ``b * sqrt(2)``), where ``Delta f`` is the wrapped predictor's :meth:`output_sensitivity` (Theorem 3.1 for
Slope One, Theorem 3.2 for cosine). The noise is added to the *unclipped* output the theorem bounds
(``raw_predict``/``score`` when the predictor has them); clipping afterwards is post-processing.

What epsilon covers. The configured epsilon (as in the paper) calibrates the noise of ONE released prediction (per
query). One rating reaches every prediction through the item-item matrix, so the released values do not depend on
disjoint data and parallel composition does not apply: releasing q predictions is ``q * epsilon_query``-DP by basic
composition, and a top-N list ranked from M noised scores costs ``M * epsilon_query`` for that user.
:meth:`LaplaceOutputPredictor.privacy_report` counts the values released so far and headlines that composed total as
``epsilon``, with the per-query figure beside it (``epsilon_per_query``: above the configured epsilon where the
predictor's ``sensitivity_report`` finds the paper's sensitivity loose).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from dprec_torch.data.ratings import Ratings
from dprec_torch.errors import ConfigError
from dprec_torch.interfaces import FittedPredictor, Scorer
from dprec_torch.predictors.release import ReleasesState
from dprec_torch.predictors.slope_one import top_n_unrated
from dprec_torch.privacy.budget import check_epsilon
from dprec_torch.seeding import SecretGenerator, noise_generator, secret

log = logging.getLogger(__name__)


def laplace_noise(shape: tuple[int, ...], scale: float, generator: SecretGenerator, device: torch.device) -> torch.Tensor:
    """``Lap(0, scale)`` draws as the difference of two ``Exp(1)`` draws times ``scale`` (float64)."""
    e1 = secret(generator).exponential(shape, dtype=torch.float64, device=device)
    e2 = generator.exponential(shape, dtype=torch.float64, device=device)
    return scale * (e1 - e2)


class LaplaceOutput:
    """Config object for ``mechanism=laplace_output``; :meth:`wrap` returns the private predictor."""

    def __init__(self, epsilon: float, seed: int | None = None) -> None:
        self.epsilon = check_epsilon(epsilon, "laplace_output")
        self.seed = None if seed is None else int(seed)  # None: secret noise (seeding.py)

    def wrap(self, predictor: Any) -> "LaplaceOutputPredictor":
        if not hasattr(predictor, "output_sensitivity"):  # Delta f (any predictor: no shared base to default it)
            raise ConfigError(f"mechanism=laplace_output needs a model with output_sensitivity() (Delta f); "
                              f"{type(predictor).__name__} has none -- use model=slope_one or model=cosine_implicit")
        return LaplaceOutputPredictor(predictor, self.epsilon, self.seed)


class LaplaceOutputPredictor:
    """A fitted predictor whose every released value carries ``Lap(Delta f / epsilon)`` noise."""

    def __init__(self, predictor: Any, epsilon: float, seed: int | None = None) -> None:
        self.predictor = predictor
        self.epsilon = check_epsilon(epsilon, "laplace_output")
        self.seed = None if seed is None else int(seed)  # None: secret noise (seeding.py)
        fitted = isinstance(predictor, FittedPredictor)  # declares name and task
        self.name = f"{predictor.name if fitted else type(predictor).__name__}+laplace_output"
        self.task = predictor.task if fitted else "rating"
        self.generator_: SecretGenerator | None = None
        self.n_released_ = 0

    # -------------------------------------------------------------- setup
    def fit(self, train: Ratings) -> "LaplaceOutputPredictor":
        self.predictor.fit(train)
        delta_f = self.sensitivity
        if math.isinf(delta_f) and math.isfinite(self.epsilon):
            raise ConfigError("laplace_output: the model's Delta f is infinite (Slope One with phi_m=0); set model.phi_m >= 1")
        log.info("laplace_output: Delta f = %.4g, epsilon = %g, noise scale b = %.4g", delta_f, self.epsilon, self.noise_scale)
        return self

    # -------------------------------------------------------------- release
    def released_state(self) -> dict[str, Any]:
        """The curator's state: the wrapped predictor's fitted state (not covered by epsilon: keep it private) and the
        count of values released so far (the accountant). Never the noise generator."""
        if not isinstance(self.predictor, ReleasesState):
            raise ConfigError(f"laplace_output: {type(self.predictor).__name__} cannot be written as a release")
        return {"predictor": self.predictor.released_state(), "n_released": int(self.n_released_)}

    def restore(self, train: Ratings, state: dict[str, Any]) -> "LaplaceOutputPredictor":
        """The wrapped predictor from ``state["predictor"]`` and the count of released values (so the reported epsilon
        keeps composing); every later answer draws fresh noise (secret, or from the explicit seed's start)."""
        if not isinstance(self.predictor, ReleasesState):
            raise ConfigError(f"laplace_output: {type(self.predictor).__name__} cannot be restored from a release")
        self.predictor.restore(train, state["predictor"])
        self.n_released_ = int(state["n_released"])
        self.generator_ = None
        return self

    @property
    def sensitivity(self) -> float:
        """``Delta f`` as the wrapped predictor declares it (Theorem 3.1 / 3.2)."""
        return float(self.predictor.output_sensitivity())

    @property
    def noise_scale(self) -> float:
        """Laplace scale ``b = Delta f / epsilon`` (0 when epsilon = inf)."""
        return 0.0 if math.isinf(self.epsilon) else self.sensitivity / self.epsilon

    def perturb(self, values: torch.Tensor) -> torch.Tensor:
        """Release precomputed outputs ``f``: ``f + Lap(b)`` elementwise, counted (:meth:`release`, :meth:`release_scores`;
        studies that reuse ``f`` across many noise draws call it directly)."""
        values = values.double()
        self.n_released_ += values.numel()
        if self.noise_scale == 0.0:
            return values
        if self.generator_ is None:
            self.generator_ = noise_generator(self.seed, values.device)
        return values + laplace_noise(tuple(values.shape), self.noise_scale, self.generator_, values.device)

    # ------------------------------------------------------------ releases
    def release(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """``A_ij = f_ij + Lap(b)`` for each pair: the unclipped output of Theorem 2.1 (float64)."""
        base = self.predictor
        raw = (base.raw_predict if hasattr(base, "raw_predict") else base.predict)(users, items)  # unclipped where it can
        return self.perturb(raw)

    def release_scores(self, users: torch.Tensor) -> torch.Tensor:
        """Noised outputs for every item, ``[len(users), M]`` (float64); M released values per user."""
        if not isinstance(self.predictor, Scorer):
            raise ConfigError(f"laplace_output: {type(self.predictor).__name__} has no score(users); it cannot recommend")
        return self.perturb(self.predictor.score(users))

    def predict(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """Released predictions clipped to the predictor's scale (post-processing), float32."""
        out = self.release(users, items)
        if hasattr(self.predictor, "scale"):  # ratings on its scale
            out = self.predictor.scale.clip(out)
        elif hasattr(self.predictor, "score_range"):  # scores in a declared range (cosine: [0, 1])
            lo, hi = self.predictor.score_range()
            out = out.clamp(lo, hi)
        return out.float()

    def recommend(self, users: torch.Tensor, n: int) -> torch.Tensor:
        """Top-``n`` unrated items ranked by noised scores (post-processing of M releases per user)."""
        return top_n_unrated(self.release_scores(users), self.predictor.rated_mask(users), n)

    # ------------------------------------------------------------- privacy
    def privacy_report(self) -> dict[str, Any]:
        """Unit, Delta f, noise scale; ``epsilon`` = the composed total over every value released so far."""
        delta_f = self.sensitivity
        sr = self.predictor.sensitivity_report() if hasattr(self.predictor, "sensitivity_report") else {}
        eps = self.epsilon
        guaranteed = sr.get("sensitivity_guaranteed", delta_f)
        add_remove = sr.get("sensitivity_add_remove", guaranteed)
        # noise calibrated to delta_f protects a query of true sensitivity s at level eps * s / delta_f
        eps_query = eps * max(1.0, guaranteed / delta_f) if delta_f > 0 else math.inf
        eps_add_remove = eps * max(1.0, add_remove / delta_f) if delta_f > 0 else math.inf
        n = self.n_released_
        total = eps_query * n if n else 0.0  # basic composition; nothing released yet costs nothing
        theorem = sr.get("theorem", f"{type(self.predictor).__name__}.output_sensitivity()")
        neighbouring = sr.get("neighbouring", "as declared by the predictor")
        return {
            "mechanism": "laplace_output",
            "relation": sr.get("relation", "rating"),
            "unit": sr.get("unit", "one rating"),
            "neighbouring": neighbouring,
            "sensitivity": delta_f,
            "sensitivity_source": theorem,
            "noise": f"Lap(b) on every released prediction, b = Delta f / epsilon = {self.noise_scale:.4g} "
                     "(scale, std = b*sqrt(2))",
            "noise_scale": self.noise_scale,
            "epsilon": total,
            "epsilon_scope": (f"total over the {n} values released so far, by basic composition of the per-query "
                              "epsilon (every released value reads the same ratings, so parallel composition does not apply)"),
            "epsilon_per_query": eps_query,
            "epsilon_nominal": eps,
            "epsilon_nominal_scope": "per released prediction (per query), as in Park & Acharya",
            "epsilon_add_remove_per_query": eps_add_remove,
            "released_values": n,
            "epsilon_total_basic_composition": total,
            "delta": 0.0,
            "details": sr,
            "analysis": (
                f"Theorem 2.1 with Delta f = {delta_f:.4g} from {theorem}: each released prediction is "
                f"{eps_query:g}-DP under {neighbouring}. One rating reaches every prediction through the "
                f"item-item matrix, so the {n} values released so far are {total:g}-DP together "
                f"(basic composition; this is the epsilon reported); a top-N list ranked from M noised scores costs "
                f"M*{eps_query:g} per user. " + sr.get("caveats", "")
            ),
        }
