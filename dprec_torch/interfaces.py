"""What a model, a predictor and a mechanism ARE: the typing Protocols the runner and the mechanisms check.

Code that needs a capability asks ``isinstance(obj, Protocol)`` of one of these runtime-checkable
Protocols instead of probing with ``hasattr``/``getattr``: the Protocol names the capability, lists
what it consists of, and is the one place a new model or mechanism looks up what to implement.
(``isinstance`` on a runtime Protocol checks that the members exist, not their signatures.)

Three families:

* a **trainable model** (:class:`TrainableModel`: PNBM, PNBM-topk, MF) is an ``nn.Module`` learned under a
  training mechanism. Set-up has two paths with one job each (:mod:`dprec_torch.models.release`):
  ``attach(train)`` BUILDS from data before training, ``restore(train, state)`` RESTORES what was
  released. Optional capabilities: :class:`SupportsProjection`, :class:`HasItemMeans`,
  :class:`ItemSimilarityModel`, :class:`FactorModel`, :class:`SupportsPerExampleNorms`,
  :class:`ClipsTrainingPredictions`, :class:`SupportsPriorPrecision`;
* a **fitted predictor** (:class:`FittedPredictor`: kNN, Slope One, PNCF, ...) learns in ``fit(train)``
  and answers ``predict(users, items)`` (:class:`Predictor`) and/or ``recommend(users, n)``
  (:class:`Recommender`); unknown users/items fall back to :class:`MeanFallback`;
* a **mechanism**: a :class:`TrainingMechanism` (an optimizer whose ``step`` is private; base class
  :class:`dprec_torch.mechanisms.base.MechanismOptimizer` provides every default) or an
  :class:`OutputMechanism` (``wrap(predictor)`` returns a private predictor). Both report what they
  defend through :class:`ReportsPrivacy`; the accountant is
  :class:`dprec_torch.privacy.accountants.Accountant`, saved with the optimizer's ``state_dict``.

This module sits below ``models/``, ``predictors/`` and ``mechanisms/`` (it imports only ``data``).
"""

from __future__ import annotations

import typing
from typing import TYPE_CHECKING, Any, Iterator, Protocol, runtime_checkable

import torch

from dprec_torch.data.ratings import Ratings, RatingScale

if TYPE_CHECKING:  # typing only: the accountants module is above this one
    from dprec_torch.privacy.accountants import Accountant

__all__ = [
    "ClipsTrainingPredictions", "DeclaresFallback", "DeclaresGradientReduction", "DeclaresPrivacyCaveat", "HasMeanFallback",
    "HasTrainingTargets", "ClipsResidualsElementwise", "FusesTrainingStep",
    "ReadsUserHistory", "FactorModel", "PenalisesVisits", "CountsBatchVisits", "FittedPredictor", "HasItemMeans", "HasOutputSensitivity", "HasRatingScale",
    "HasScoreRange", "ItemSimilarityModel", "LeavesPredictorAsFitted", "MeanFallback", "OutputMechanism", "PerturbsResiduals", "Predictor", "Recommender",
    "ReportsFallback", "ReportsPrivacy", "ReportsSensitivity", "Scorer", "SupportsPerExampleNorms",
    "SupportsPriorPrecision", "SupportsProjection", "SupportsRawPredict", "TrainableModel", "TrainingMechanism",
]


class _AttributeProtocolMeta(type(Protocol)):  # type: ignore[misc]
    """``isinstance(obj, P)`` for a runtime protocol P by ``hasattr`` on each member, on every Python.

    Since Python 3.12 the stock check reads data members with ``inspect.getattr_static``, which does not
    see an ``nn.Module``'s parameters, buffers and submodules (they live in ``_parameters``/``_buffers``/
    ``_modules`` and are served by ``__getattr__``): PNBM's ``S`` and ``item_means`` and MF's embeddings
    would make every model fail ``isinstance(model, ItemSimilarityModel)`` there (seen on the GPU image's
    Python). ``hasattr`` is what Python 3.11 did.
    """

    def __instancecheck__(cls, obj: object) -> bool:
        if not (cls.__dict__.get("_is_protocol") and getattr(cls, "_is_runtime_protocol", False)):
            return super().__instancecheck__(obj)
        return all(hasattr(obj, name) for name in protocol_members(cls))


def protocol_members(cls: type) -> frozenset[str]:
    """The attribute and method names a protocol class declares (with those of its protocol bases)."""
    members = getattr(cls, "__protocol_attrs__", None)  # Python >= 3.12
    return frozenset(members if members is not None else typing._get_protocol_attrs(cls))  # type: ignore[attr-defined]


# ============================================================================ privacy reports
@runtime_checkable
class ReportsPrivacy(Protocol, metaclass=_AttributeProtocolMeta):
    """Anything that states what it defends: ``privacy_report()`` returns a dict with at least
    ``mechanism``, ``relation`` (the neighbouring relation, None when non-private), ``epsilon`` (the
    defended figure; None/inf when nothing is defended) and ``analysis`` (one readable paragraph)."""

    def privacy_report(self) -> dict[str, Any]: ...


# ============================================================================ trainable models
@runtime_checkable
class TrainableModel(Protocol, metaclass=_AttributeProtocolMeta):
    """A model learned under a :class:`TrainingMechanism` (an ``nn.Module``: PNBM, PNBM-topk, MF).

    ``attach(train)`` builds from data (once, before training); ``restore(train, state)`` restores a
    checkpoint's ``model`` entry exactly, computing nothing from ``train`` (it only binds the users'
    histories a neighbourhood model reads). ``batch_predict`` / ``surrogate_loss`` are the training
    forward and the scalar whose gradient is sum e_ui d r_hat_ui / d theta; ``gradient_entry_bound``
    bounds one example's gradient entry for a residual bound (the paper's Delta F); ``predict`` is
    clipped to the rating scale with the documented fallback for unknown ids.
    """

    task: str
    name: str

    def attach(self, train: Ratings) -> Any: ...

    def restore(self, train: Ratings, state: dict[str, Any]) -> Any: ...

    def batch_predict(self, batch: Any) -> torch.Tensor: ...

    def surrogate_loss(self, batch: Any, residuals: torch.Tensor) -> torch.Tensor: ...

    def gradient_entry_bound(self, residual_bound: float) -> float: ...

    def predict(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor: ...

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]: ...

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]: ...


@runtime_checkable
class SupportsProjection(Protocol, metaclass=_AttributeProtocolMeta):
    """A model with a constraint set re-imposed after every step (PNBM: S symmetric, zero diagonal);
    post-processing of the released parameters, so privacy is unaffected."""

    def project_(self) -> None: ...


@runtime_checkable
class HasItemMeans(Protocol, metaclass=_AttributeProtocolMeta):
    """A model that centres on, and releases, item means r_bar (PNBM's Eq. (2) baseline): a buffer a
    mechanism may replace by a DP release (:func:`dprec_torch.privacy.item_means.install_item_means`)."""

    item_means: torch.Tensor


@runtime_checkable
class ItemSimilarityModel(Protocol, metaclass=_AttributeProtocolMeta):
    """Dense item-item PNBM: the M x M similarity ``S``, the denominator floor ``floor_c`` (C), the bound
    training histories, the item means, the gradient form (``exact`` | ``paper_eq5``) and the CPU pair
    kernels' backend (``auto`` | ``numba`` | ``torch``); what the per-user clipping norms of
    :mod:`dprec_torch.privacy.pnbm_clipping` read."""

    S: torch.nn.Parameter
    floor_c: float
    history: Ratings | None
    item_means: torch.Tensor
    gradient: str
    pair_backend: str


@runtime_checkable
class FactorModel(Protocol, metaclass=_AttributeProtocolMeta):
    """Biased matrix factorisation: the tables whose per-example gradient norms are closed-form
    (:mod:`dprec_torch.privacy.mf_clipping`)."""

    user_factors: torch.nn.Embedding
    item_factors: torch.nn.Embedding
    user_bias: torch.nn.Embedding
    item_bias: torch.nn.Embedding


@runtime_checkable
class PenalisesVisits(Protocol, metaclass=_AttributeProtocolMeta):
    """A model with per-rating parameters whose classic SGD-MF penalty lambda_r (b_u, b_i, p_u, q_i) per visited
    rating (Koren 2009, Eq. 5) it can state for a batch (MF; non-private ``mechanism.rating_reg``)."""

    def visit_penalty(self, batch: Any) -> torch.Tensor: ...


@runtime_checkable
class CountsBatchVisits(Protocol, metaclass=_AttributeProtocolMeta):
    """A model that states, per parameter row, how strongly one batch's targets pull on it (MF: how many targets
    read the row; non-private ``mechanism.per_rating_step`` caps each row's step with it, mechanisms/sgd.py)."""

    def batch_visits(self, batch: Any) -> list[tuple[torch.Tensor, torch.Tensor]]: ...


@runtime_checkable
class SupportsPerExampleNorms(Protocol, metaclass=_AttributeProtocolMeta):
    """A model that computes per-example (``unit`` = rating | user) L2 gradient norms without
    materialising the gradients (Gaussian DP-SGD clips with them)."""

    def per_example_grad_norms(self, batch: Any, residuals: torch.Tensor, unit: str) -> torch.Tensor: ...


@runtime_checkable
class ClipsTrainingPredictions(Protocol, metaclass=_AttributeProtocolMeta):
    """A model whose training predictions may be clipped to the rating scale (then |e_ui| <= phi)."""

    clip_training_predictions: bool


@runtime_checkable
class SupportsPriorPrecision(Protocol, metaclass=_AttributeProtocolMeta):
    """A model that computes SGLD's prior correction H (Wang & Tang Eq. (11))."""

    def sgld_prior_precision(self, train: Ratings, batch_ratings: float) -> list[torch.Tensor | None]: ...


@runtime_checkable
class ReadsUserHistory(Protocol, metaclass=_AttributeProtocolMeta):
    """A model whose prediction for u reads u's own training ratings (PNBM's Eq. (2)): joint DP only."""

    history: Ratings | None


@runtime_checkable
class HasMeanFallback(Protocol, metaclass=_AttributeProtocolMeta):
    """A model whose unknown users/items get a :class:`MeanFallback` built from its item means."""

    fallback_: "MeanFallback | None"


@runtime_checkable
class DeclaresFallback(Protocol, metaclass=_AttributeProtocolMeta):
    """A model whose fallback for ids without training ratings is chosen by config (MF: ``mean`` | ``model``)."""

    fallback: str


@runtime_checkable
class DeclaresPrivacyCaveat(Protocol, metaclass=_AttributeProtocolMeta):
    """A model with a released part that no mechanism covers (top-k PNBM: its data-chosen support)."""

    privacy_caveat: str | None


@runtime_checkable
class DeclaresGradientReduction(Protocol, metaclass=_AttributeProtocolMeta):
    """A model that declares what ``lr`` is a step on: ``sum`` (PNBM, the paper's summed G) or ``mean`` (MF:
    the mechanisms divide the clipped, noised sum by the expected batch size; mechanisms/base.py)."""

    gradient_reduction: str


@runtime_checkable
class ReadsTargetsOnly(Protocol, metaclass=_AttributeProtocolMeta):
    """A model whose training step reads a batch's targets (users, items, values) and never the history
    blocks ``x``/``ind`` (MF): with ``reads_history = False`` the rating-level sampler skips building them,
    an O(#ratings of the batch's users) CSR build per step (models/batching.py)."""

    reads_history: bool


@runtime_checkable
class HasTrainingTargets(Protocol, metaclass=_AttributeProtocolMeta):
    """A model whose loss compares its training prediction with a transformed target, not the raw rating (low-rank
    PNBM: the clamped residual r_bar_i + b_u + y_ui): the Trainer's residual is ``batch_predict - training_targets``."""

    def training_targets(self, batch: Any) -> torch.Tensor: ...


@runtime_checkable
class ClipsResidualsElementwise(Protocol, metaclass=_AttributeProtocolMeta):
    """A mechanism that says up front whether this step's ``clip_residuals`` is a pure element-wise clamp,
    e' = min(max(e, -b), b): ``elementwise_residual_clip()`` returns b (inf: the identity), or None when the
    clipping is anything else (per-user norms, side effects on the gradient). The Trainer then lets a
    :class:`FusesTrainingStep` model clamp inside its fused forward and backward."""

    def elementwise_residual_clip(self) -> float | None: ...


@runtime_checkable
class FusesTrainingStep(Protocol, metaclass=_AttributeProtocolMeta):
    """A model that can run a step's forward, residuals, element-wise clamp and backward in one pass (full PNBM on
    the CPU): ``fused_step(batch, target, bound)`` fills the parameters' ``.grad`` and returns (pred, residuals,
    clamped residuals), the same numbers as the separate path, or None where it does not apply."""

    def fused_step(self, batch: Any, target: torch.Tensor, bound: float
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None: ...


@runtime_checkable
class PerturbsResiduals(Protocol, metaclass=_AttributeProtocolMeta):
    """A model that ``mechanism=dpsgd_paper`` trains by perturbing each rating's error (Berlioz et al. 2015:
    DPSGD-MF) rather than the gradient; read ``dpsgd_perturb_residuals``."""

    dpsgd_perturb_residuals: bool


# ============================================================================ fitted predictors
@runtime_checkable
class FittedPredictor(Protocol, metaclass=_AttributeProtocolMeta):
    """A predictor that learns in ``fit(train) -> self`` (no mechanism steps): kNN, Slope One, PNCF, ...

    ``task`` is ``rating`` (it predicts: :class:`Predictor`), ``topn`` (it recommends:
    :class:`Recommender`) or ``both``; ``name`` labels it in tables.
    """

    name: str
    task: str

    def fit(self, train: Ratings) -> Any: ...


@runtime_checkable
class Predictor(Protocol, metaclass=_AttributeProtocolMeta):
    """Anything the evaluator can score on ratings: ``predict`` returns a float tensor clipped to the scale."""

    def fit(self, train: Ratings) -> Any: ...

    def predict(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class Recommender(Protocol, metaclass=_AttributeProtocolMeta):
    """Anything that returns ``[len(users), n]`` item indices (``-1`` padded), unrated items only."""

    def recommend(self, users: torch.Tensor, n: int) -> torch.Tensor: ...


@runtime_checkable
class Scorer(Protocol, metaclass=_AttributeProtocolMeta):
    """A predictor with a score for every item: ``score(users) -> [len(users), M]`` (unclipped)."""

    def score(self, users: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class HasRatingScale(Protocol, metaclass=_AttributeProtocolMeta):
    """A fitted predictor whose outputs are ratings on ``scale`` (clipped to it after any noise)."""

    scale: RatingScale


@runtime_checkable
class HasScoreRange(Protocol, metaclass=_AttributeProtocolMeta):
    """A scorer whose scores lie in a declared range (not the rating scale), e.g. cosine in [0, 1]."""

    def score_range(self) -> tuple[float, float]: ...


@runtime_checkable
class SupportsRawPredict(Protocol, metaclass=_AttributeProtocolMeta):
    """A predictor whose unclipped output (the function a sensitivity theorem bounds) is available."""

    def raw_predict(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class HasOutputSensitivity(Protocol, metaclass=_AttributeProtocolMeta):
    """A predictor that declares Delta f, the sensitivity of one released output (Park & Acharya
    Theorems 3.1/3.2), which ``mechanism=laplace_output`` calibrates its noise to."""

    def output_sensitivity(self) -> float: ...


@runtime_checkable
class ReportsSensitivity(Protocol, metaclass=_AttributeProtocolMeta):
    """A predictor that documents its sensitivity: relation, unit, theorem, guaranteed vs paper figure."""

    def sensitivity_report(self) -> dict[str, Any]: ...


@runtime_checkable
class ReportsFallback(Protocol, metaclass=_AttributeProtocolMeta):
    """A predictor that counts how many pairs of its last ``predict`` call got the fallback
    (unknown ids, or no usable neighbour) instead of its own prediction; the evaluator records it
    as ``fallback_rate`` in ``metrics.json``."""

    fallback_rate_: float | None


class MeanFallback:
    """Learned state for the documented fallback: item mean, then global mean.

    An item is *known* if it has a training rating; a user is *known* if they have one. Shared by
    the trainable models and the fitted predictors (it lives here, below both).
    """

    def __init__(self, train: Ratings) -> None:
        self.scale: RatingScale = train.scale
        self.global_mean = train.global_mean
        self.item_counts_ = train.item_counts()
        self.user_counts_ = train.user_counts()
        self.item_means_ = train.item_means()  # global mean where the item is unseen

    def known(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """True where both the user and the item have training ratings (ids out of range are unknown)."""
        ok_u = (users >= 0) & (users < self.user_counts_.numel())
        ok_i = (items >= 0) & (items < self.item_counts_.numel())
        u = users.clamp(0, self.user_counts_.numel() - 1)
        i = items.clamp(0, self.item_counts_.numel() - 1)
        return ok_u & ok_i & (self.user_counts_[u] > 0) & (self.item_counts_[i] > 0)

    def fallback(self, items: torch.Tensor) -> torch.Tensor:
        """Item mean for known items, global mean otherwise."""
        ok_i = (items >= 0) & (items < self.item_means_.numel())
        i = items.clamp(0, self.item_means_.numel() - 1)
        return torch.where(ok_i, self.item_means_[i], torch.full_like(self.item_means_[i], self.global_mean))

    def finish(self, users: torch.Tensor, items: torch.Tensor, raw: torch.Tensor,
               usable: torch.Tensor | None = None) -> torch.Tensor:
        """Replace predictions for unknown users/items (and, where given, pairs with ``usable`` False:
        no neighbour carried weight) with the fallback, then clip to the scale."""
        out = torch.where(self.answered(users, items, usable), raw, self.fallback(items))
        return self.scale.clip(out)

    def answered(self, users: torch.Tensor, items: torch.Tensor, usable: torch.Tensor | None = None) -> torch.Tensor:
        """True where the model's own prediction is served (known ids, and ``usable`` where given)."""
        known = self.known(users, items)
        return known if usable is None else known & usable


# ============================================================================ mechanisms
@runtime_checkable
class TrainingMechanism(ReportsPrivacy, Protocol, metaclass=_AttributeProtocolMeta):
    """An optimizer whose ``step`` is the private update (Opacus's DPOptimizer shape).

    Class attributes (defaults in :class:`~dprec_torch.mechanisms.base.MechanismOptimizer`): ``name``;
    ``relation``, the NEIGHBOURING RELATION the mechanism defends (``user`` | ``rating``; where the config
    chooses it, the class value is the default and the instance holds the configured one; None: the config's
    ``mechanism.unit`` decides, as for Gaussian DP-SGD's add/remove-one-unit). The runner caps users at tau for a
    user-level relation. The SAMPLING unit (Poisson over users or ratings, and the clipping unit) is always
    ``unit``: ``mechanism.unit``, else the relation's unit. ``uses_prior_precision`` (reads SGLD's H);
    ``accountant``, the one place the spent budget lives, saved by ``state_dict`` so a resumed run keeps it.
    The constructor calibrates; ``prepare(model)`` makes the data-dependent set-up (DP item means, S's start) once,
    after the model is attached and before any batch is built (a resumed run restores it from the checkpoint instead).
    """

    name: str
    relation: str | None
    uses_prior_precision: bool
    accountant: "Accountant | None"

    def prepare(self, model: Any) -> None: ...

    def clip_residuals(self, residuals: torch.Tensor, batch: Any = None, model: Any = None) -> torch.Tensor: ...

    def step(self, closure: Any = None) -> Any: ...

    def epsilon_spent(self) -> float: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


class LeavesPredictorAsFitted:
    """Marker base of a mechanism under which a fitted predictor is fitted and released as it is, wrapped by nothing:
    ``mechanism=none`` (no mechanism at all: :class:`~dprec_torch.mechanisms.none.NoMechanism`, which trains a model
    without noise) and ``mechanism=builtin`` (the predictor's own: :class:`~dprec_torch.mechanisms.builtin.BuiltIn`).
    The runner asks ``issubclass(<the mechanism's class>, LeavesPredictorAsFitted)``, never the key's name; any other
    mechanism wraps a fitted predictor (:class:`OutputMechanism`) or trains a model (:class:`TrainingMechanism`)."""


@runtime_checkable
class OutputMechanism(Protocol, metaclass=_AttributeProtocolMeta):
    """A mechanism that privatises a fitted predictor's outputs: ``wrap(predictor)`` returns a
    :class:`FittedPredictor` that also :class:`ReportsPrivacy` (``laplace_output``, ``exponential_topk``)."""

    def wrap(self, predictor: Any) -> Any: ...
