"""What a trained model released, in a form its ``state_dict`` carries.

A model has two set-up paths with one job each:

* ``attach(train)`` BUILDS from data, once, before training: item means, fallback, support... (a mechanism may then
  replace them by a DP release, e.g. ``install_item_means``);
* ``restore(train, state)`` RESTORES what was released: every learned or released quantity comes from ``state`` (a
  checkpoint's ``model`` entry); ``train`` only binds the users' own training histories that a neighbourhood model
  reads at prediction time. Nothing is recomputed from data, so evaluating a run scores exactly the trained model.

The fallback for unknown users/items (:class:`~dprec_torch.interfaces.MeanFallback`) is not an ``nn.Module`` buffer,
so the models carry it through ``get_extra_state`` with these two helpers.
"""

from __future__ import annotations

from typing import Any

import torch

from dprec_torch.data.ratings import RatingScale
from dprec_torch.interfaces import MeanFallback


def fallback_state(fb: MeanFallback | None) -> dict[str, Any] | None:
    """The released state of a fallback (its means, counts, global mean and the public scale)."""
    if fb is None:
        return None
    return {"scale": [float(fb.scale.lo), float(fb.scale.hi)], "global_mean": float(fb.global_mean),
            "item_means": fb.item_means_, "item_counts": fb.item_counts_, "user_counts": fb.user_counts_}


def fallback_from_state(state: dict[str, Any] | None, device: torch.device | None = None) -> MeanFallback | None:
    """The fallback exactly as released (``MeanFallback(train)`` would refit it from the data)."""
    if state is None:
        return None
    fb = MeanFallback.__new__(MeanFallback)  # restored, not fitted
    fb.scale = RatingScale(*state["scale"])
    fb.global_mean = float(state["global_mean"])
    fb.item_means_ = torch.as_tensor(state["item_means"], device=device)
    fb.item_counts_ = torch.as_tensor(state["item_counts"], device=device)
    fb.user_counts_ = torch.as_tensor(state["user_counts"], device=device)
    return fb
