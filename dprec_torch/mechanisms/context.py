"""What a training mechanism needs to know about the run it protects."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MethodType
from typing import Any

import torch

from dprec_torch.data.ratings import RatingScale
from dprec_torch.errors import ConfigError


@dataclass
class TrainingContext:
    """Facts fixed before training starts, handed to the mechanism's constructor.

    total_steps: K, the number of noisy updates (epochs x steps per epoch).
    n_ratings: |R^{>0}| (the paper's script-L). max_user_ratings: tau, the per-user cap.
    entry_bound: callable e_max -> bound on |G_ij(u)| for one example (model-specific).
    prior_precision: per-parameter H (SGLD's prior correction, Eq. (11)), or None.
    n_units: how many sampling units the data holds (ratings, or users for user-level sampling).
    expected_batch_size: E|batch| = sampling_ratio x n_units (Opacus's expected batch size).
    gradient_reduction: what the model's ``lr`` is a step on -- ``sum`` (PNBM: the paper's summed G, with
        beta) or ``mean`` (MF: the summed gradient + noise divided by ``expected_batch_size``, so ``lr`` is a
        per-example step and one setting serves any batch or dataset size; see :meth:`grad_divisor`).
    """

    total_steps: int
    steps_per_epoch: int
    n_ratings: int
    n_users: int
    scale: RatingScale
    max_user_ratings: int | None = None
    entry_bound: object = None
    prior_precision: list[torch.Tensor | None] = field(default_factory=list)
    model: object = None  # the module being trained (for per-example norms and what it releases)
    n_units: int | None = None
    expected_batch_size: float | None = None
    gradient_reduction: str = "sum"

    def __post_init__(self) -> None:
        if self.gradient_reduction not in REDUCTIONS:
            raise ConfigError(f"gradient_reduction must be one of {REDUCTIONS}, got '{self.gradient_reduction}'")
        if self.gradient_reduction == "mean" and not (self.expected_batch_size or 0) > 0:
            raise ConfigError("gradient_reduction=mean needs expected_batch_size > 0 (sampling_ratio x #units)")

    @property
    def grad_divisor(self) -> float:
        """B = E|batch| under ``mean`` (Opacus's ``scale_grad``), 1 under ``sum``: G <- G / B."""
        return float(self.expected_batch_size) if self.gradient_reduction == "mean" else 1.0

    @property
    def decay_divisor(self) -> float:
        """n_units under ``mean``, 1 under ``sum``: a Poisson batch estimates the MEAN objective's gradient by
        (1/B)(sum_batch grad l_x + q lambda theta), so the dense decay is lambda / n (n = B / q; base.py's module doc)."""
        return float(self.n_units or 1) if self.gradient_reduction == "mean" else 1.0


REDUCTIONS = ("sum", "mean")


def gradient_reduction_of(model: Any) -> str:
    """The model's declared reduction (``BaseModel.gradient_reduction``: ``sum`` unless the model says otherwise)."""
    return str(model.gradient_reduction)


def prior_precision_for(mechanism_cls: type, model: Any, train: Any, batch_ratings: float) -> list[torch.Tensor | None]:
    """The model's SGLD prior correction H (Eq. (11)) when ``mechanism_cls`` declares ``uses_prior_precision``, else []
    (H is M x M for dense PNBM, 2.9 GB at 27K items; BaseModel's default is [], no correction)."""
    return model.sgld_prior_precision(train, batch_ratings) if mechanism_cls.uses_prior_precision is True else []


def bound_model(context: TrainingContext | None) -> Any:
    """The model being trained: ``context.model`` if the runner provides it, else the owner of
    ``context.entry_bound`` when that is a bound method of the model (contexts built by hand); None if neither."""
    if context is None:
        return None
    if context.model is not None:
        return context.model
    return context.entry_bound.__self__ if isinstance(context.entry_bound, MethodType) else None
