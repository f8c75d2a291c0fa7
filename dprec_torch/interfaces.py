"""The public seams: what a user implements to add a model, a predictor or a mechanism (typing Protocols).

Only the seams are Protocols. An optional capability is a member with a neutral default on the base class the
implementers share (LensKit style), read directly: :class:`dprec_torch.models.base.BaseModel` (trained models),
:class:`dprec_torch.mechanisms.base.MechanismOptimizer` (training mechanisms). (``isinstance`` on a runtime Protocol
checks that the members exist, not their signatures.) Three families:

* a **trainable model** (:class:`TrainableModel`: PNBM, PNBM-topk, MF) is an ``nn.Module`` learned under a training
  mechanism, a subclass of ``BaseModel``. Set-up has two paths with one job each (:mod:`dprec_torch.models.release`):
  ``attach(train)`` BUILDS from data before training, ``restore(train, state)`` RESTORES what was released;
* a **fitted predictor** (:class:`FittedPredictor`: kNN, Slope One, PNCF, ...) learns in ``fit(train)`` and answers
  ``predict(users, items)`` (:class:`Predictor`) and/or ``recommend(users, n)`` (:class:`Recommender`); unknown
  users/items fall back to :class:`MeanFallback`;
* a **mechanism**: a :class:`TrainingMechanism` (an optimizer whose ``step`` is private) or an :class:`OutputMechanism`
  (``wrap(predictor)`` returns a private predictor; it takes any :class:`Predictor` or :class:`Scorer`). Both report
  what they defend through :class:`ReportsPrivacy`; the accountant is :class:`dprec_torch.privacy.accountants.Accountant`,
  saved with the optimizer's ``state_dict``.

This module sits below ``models/``, ``predictors/`` and ``mechanisms/`` (it imports only ``data``). Every member of
these Protocols is a method or a plain class/instance attribute (none an ``nn.Module`` parameter or buffer), so
Python >= 3.12's static ``isinstance`` check sees them as 3.11's ``hasattr`` did.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Protocol, runtime_checkable

import torch

from dprec_torch.data.ratings import Ratings, RatingScale

if TYPE_CHECKING:  # typing only: the accountants module is above this one
    from dprec_torch.privacy.accountants import Accountant

__all__ = [
    "FittedPredictor", "LeavesPredictorAsFitted", "MeanFallback", "OutputMechanism", "Predictor", "Recommender",
    "ReportsPrivacy", "Scorer", "TrainableModel", "TrainingMechanism",
]


# ============================================================================ privacy reports
@runtime_checkable
class ReportsPrivacy(Protocol):
    """Anything that states what it defends: ``privacy_report()`` returns a dict with at least
    ``mechanism``, ``relation`` (the neighbouring relation, None when non-private), ``epsilon`` (the
    defended figure; None/inf when nothing is defended) and ``analysis`` (one readable paragraph)."""

    def privacy_report(self) -> dict[str, Any]: ...


# ============================================================================ trainable models
@runtime_checkable
class TrainableModel(Protocol):
    """A model learned under a :class:`TrainingMechanism` (an ``nn.Module``: PNBM, PNBM-topk, MF).

    ``attach(train)`` builds from data (once, before training); ``restore(train, state)`` restores a release's state
    exactly, computing nothing from ``train`` (it only binds the users' histories a neighbourhood model reads).
    ``batch_predict`` / ``surrogate_loss`` are the training forward and the scalar whose gradient is
    sum e_ui d r_hat_ui / d theta; ``gradient_entry_bound`` bounds one example's gradient entry for a residual bound (the
    paper's Delta F); ``predict`` is clipped to the rating scale with the documented fallback for unknown ids. The
    optional capabilities and their defaults are :class:`~dprec_torch.models.base.BaseModel`'s.
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


# ============================================================================ fitted predictors
@runtime_checkable
class FittedPredictor(Protocol):
    """A predictor that learns in ``fit(train) -> self`` (no mechanism steps): kNN, Slope One, PNCF, ... ``task`` is
    ``rating`` (it predicts: :class:`Predictor`), ``topn`` (it recommends: :class:`Recommender`) or ``both``."""

    name: str
    task: str

    def fit(self, train: Ratings) -> Any: ...


@runtime_checkable
class Predictor(Protocol):
    """Anything the evaluator can score on ratings: ``predict`` returns a float tensor clipped to the scale."""

    def fit(self, train: Ratings) -> Any: ...

    def predict(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class Recommender(Protocol):
    """Anything that returns ``[len(users), n]`` item indices (``-1`` padded), unrated items only."""

    def recommend(self, users: torch.Tensor, n: int) -> torch.Tensor: ...


@runtime_checkable
class Scorer(Protocol):
    """A predictor with a score for every item: ``score(users) -> [len(users), M]`` (unclipped)."""

    def score(self, users: torch.Tensor) -> torch.Tensor: ...


class MeanFallback:
    """Learned state for the documented fallback: item mean, then global mean. An item is *known* if it has a training
    rating; a user is *known* if they have one. Shared by the trainable models and the fitted predictors."""

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

    def finish(self, users: torch.Tensor, items: torch.Tensor, raw: torch.Tensor, usable: torch.Tensor | None = None) -> torch.Tensor:
        """Replace predictions for unknown users/items (and, where given, pairs with ``usable`` False: no neighbour
        carried weight) with the fallback, then clip to the scale."""
        return self.scale.clip(torch.where(self.answered(users, items, usable), raw, self.fallback(items)))

    def answered(self, users: torch.Tensor, items: torch.Tensor, usable: torch.Tensor | None = None) -> torch.Tensor:
        """True where the model's own prediction is served (known ids, and ``usable`` where given)."""
        known = self.known(users, items)
        return known if usable is None else known & usable


# ============================================================================ mechanisms
@runtime_checkable
class TrainingMechanism(ReportsPrivacy, Protocol):
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
class OutputMechanism(Protocol):
    """A mechanism that privatises a fitted predictor's outputs: ``wrap(predictor)`` returns a
    :class:`FittedPredictor` that also :class:`ReportsPrivacy` (``laplace_output``, ``exponential_topk``)."""

    def wrap(self, predictor: Any) -> Any: ...
