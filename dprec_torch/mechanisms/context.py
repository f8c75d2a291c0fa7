"""What a training mechanism needs to know about the run it protects."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from dprec_torch.data.ratings import RatingScale


@dataclass
class TrainingContext:
    """Facts fixed before training starts, handed to the mechanism's constructor.

    total_steps: K, the number of noisy updates (epochs x steps per epoch).
    n_ratings: |R^{>0}| (the paper's script-L). max_user_ratings: tau, the per-user cap.
    entry_bound: callable e_max -> bound on |G_ij(u)| for one example (model-specific).
    prior_precision: per-parameter H (SGLD's prior correction, Eq. (11)), or None.
    model: the module being trained.
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


def prior_precision_for(mechanism_cls: type, model: Any, train: Any, batch_ratings: float) -> list[torch.Tensor | None]:
    """The model's SGLD prior correction H (Eq. (11)) when ``mechanism_cls`` uses it, else [].

    H is M x M for dense PNBM (2.9 GB at 27K items), so only the mechanisms that read it
    (``uses_prior_precision``) pay for it.
    """
    if not getattr(mechanism_cls, "uses_prior_precision", False) or not hasattr(model, "sgld_prior_precision"):
        return []
    return model.sgld_prior_precision(train, batch_ratings)
