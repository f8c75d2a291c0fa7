"""The plumbing every fitted predictor shares (LensKit/Surprise style); the interface itself is
:class:`dprec_torch.interfaces.FittedPredictor`.

``fit(train) -> self`` learns from a :class:`Ratings`; ``predict(users, items)``
returns a float tensor of predictions, clipped to the rating scale. Unknown
users and items fall back to the item mean, then the global mean
(:class:`MeanFallback`).
"""

from __future__ import annotations

from typing import Any

import torch

from dprec_torch.data.ratings import Ratings
# the interface and the fallback live in dprec_torch/interfaces.py (below models/ and predictors/); re-exported here
from dprec_torch.interfaces import MeanFallback, Predictor  # noqa: F401
from dprec_torch.predictors.release import check_release_items, restored_fallback


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


def query_pairs(users: Any, items: Any, train: Ratings, user_counts: torch.Tensor, device: Any, what: str
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validated (user, item) query ids: ``(uc, ic, known_item, known_pair)`` with ids clamped into the tables,
    ``known_item`` = the item is in the training id space, ``known_pair`` = both ids are and the user has ratings."""
    from dprec_torch.errors import DataError

    users = torch.as_tensor(users, dtype=torch.long, device=device)
    items = torch.as_tensor(items, dtype=torch.long, device=device)
    if users.shape != items.shape or users.dim() != 1:
        raise DataError(f"{what}.predict: users {tuple(users.shape)} and items {tuple(items.shape)} must be 1-D of equal length")
    n_u, n_i = train.n_users, train.n_items
    ok_u, ok_i = (users >= 0) & (users < n_u), (items >= 0) & (items < n_i)
    uc, ic = users.clamp(0, n_u - 1), items.clamp(0, n_i - 1)
    return uc, ic, ok_i, ok_u & ok_i & (user_counts[uc] > 0)


class BasePredictor:
    """Shared plumbing: device handling, the fallback, and an empty privacy report."""

    #: name used in tables and metrics.json
    name: str = "predictor"

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = torch.device(device) if device is not None else None
        self.fallback_: MeanFallback | None = None
        #: share of the last predict() call's pairs answered by the fallback (the evaluator's ``fallback_rate``)
        self.fallback_rate_: float | None = None

    def _prepare(self, train: Ratings) -> Ratings:
        """Move ``train`` to this predictor's device and set up the fallback."""
        if self.device is not None:
            train = train.to(self.device)
        else:
            self.device = train.device
        self.fallback_ = MeanFallback(train)
        return train

    def _prepare_restored(self, train: Ratings, state: dict[str, Any]) -> Ratings:
        """:meth:`_prepare` for ``restore(train, state)``: move ``train`` to the device and set up the fallback AS
        RELEASED (``state["fallback"]``, :func:`~dprec_torch.predictors.release.restored_fallback`)."""
        if self.device is not None:
            train = train.to(self.device)
        else:
            self.device = train.device
        check_release_items(state, train, self.name)
        self.fallback_ = restored_fallback(train, state["fallback"])
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
