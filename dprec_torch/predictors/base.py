"""The one small interface every predictor implements (LensKit/Surprise style).

``fit(train) -> self`` learns from a :class:`Ratings`; ``predict(users, items)``
returns a float tensor of predictions, clipped to the rating scale. Unknown
users and items fall back to the item mean, then the global mean
(:class:`MeanFallback`).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from dprec_torch.data.ratings import Ratings, RatingScale


@runtime_checkable
class Predictor(Protocol):
    """Anything the evaluator can score."""

    def fit(self, train: Ratings) -> "Predictor": ...

    def predict(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class ReportsFallback(Protocol):
    """A predictor that counts how many pairs of its last ``predict`` call got the fallback
    (unknown ids, or no usable neighbour) instead of its own prediction; the evaluator records it
    as ``fallback_rate`` in ``metrics.json``."""

    fallback_rate_: float | None


class MeanFallback:
    """Learned state for the documented fallback: item mean, then global mean.

    An item is *known* if it has a training rating; a user is *known* if they have one.
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


def gather_pair_scores(score: "callable", users: torch.Tensor, items: torch.Tensor, n_items: int, block: int) -> torch.Tensor:
    """``score(user_block) -> [B, M]`` evaluated once per block of distinct users, read at the pairs.

    Out-of-range items give 0; the caller applies its own fallback. Returns float64.
    """
    uniq, inv = torch.unique(users, return_inverse=True)
    ok_i = (items >= 0) & (items < n_items)
    i = items.clamp(0, n_items - 1)
    out = torch.empty(users.numel(), dtype=torch.float64, device=users.device)
    for start in range(0, uniq.numel(), block):
        scores = score(uniq[start : start + block])
        sel = (inv >= start) & (inv < start + block)
        out[sel] = scores[inv[sel] - start, i[sel]].double()
    return torch.where(ok_i, out, torch.zeros_like(out))


class BasePredictor:
    """Shared plumbing: device handling, the fallback, and an empty privacy report."""

    #: name used in tables and metrics.json
    name: str = "predictor"

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = torch.device(device) if device is not None else None
        self.fallback_: MeanFallback | None = None
        #: share of the last predict() call's pairs answered by the fallback (ReportsFallback)
        self.fallback_rate_: float | None = None

    def _prepare(self, train: Ratings) -> Ratings:
        """Move ``train`` to this predictor's device and set up the fallback."""
        if self.device is not None:
            train = train.to(self.device)
        else:
            self.device = train.device
        self.fallback_ = MeanFallback(train)
        return train

    def _finish_and_count(self, users: torch.Tensor, items: torch.Tensor, raw: torch.Tensor,
                usable: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`MeanFallback.finish`, counting the pairs that fell back in ``fallback_rate_``."""
        fb = self._check_fitted()
        answered = fb.answered(users, items, usable)
        self.fallback_rate_ = float((~answered).float().mean()) if answered.numel() else 0.0
        return fb.finish(users, items, raw, usable)

    def _check_fitted(self) -> MeanFallback:
        if self.fallback_ is None:
            raise RuntimeError(f"{type(self).__name__}.predict called before fit()")
        return self.fallback_

    def privacy_report(self) -> dict[str, Any]:
        """Non-private by default."""
        return {"mechanism": "none", "relation": None, "epsilon": float("inf"), "analysis": "non-private"}
