"""Build-from-data vs restore-what-was-released (:mod:`.release`), shared by the neighbourhood models (PNBM, its
top-k and low-rank forms), which have ``n_items``, an ``item_means`` buffer and a ``_predict_cache`` dict.
"""

from __future__ import annotations

from typing import Any

import torch

from dprec_torch.data.ratings import Ratings, RatingScale
from dprec_torch.errors import ConfigError
from dprec_torch.interfaces import MeanFallback
from dprec_torch.models.release import fallback_from_state, fallback_state


class BindsHistory:
    """``attach`` / ``bind`` / ``restore``, the fallback's extra state and the rating scale of the bound histories."""

    reads_own_ratings = centres_on_item_means = True  # the prediction reads R_u, centred on the item means
    n_items: int
    item_means: torch.Tensor
    history: Ratings | None = None
    fallback_: MeanFallback | None
    _predict_cache: dict

    def attach(self, train: Ratings) -> Any:
        """BUILD from data (before training): bind the histories R_u, r_bar_i := the training means, the fallback."""
        self.bind(train)
        self.item_means.copy_(train.item_means().to(self.item_means.device))
        self.fallback_ = MeanFallback(train)
        return self

    def bind(self, train: Ratings) -> Any:
        """Bind the users' training histories R_u that the prediction reads; computes nothing from them."""
        if train.n_items != self.n_items:
            raise ConfigError(f"model has {self.n_items} items but the data has {train.n_items}")
        self.history = train
        self._predict_cache.clear()
        return self

    def restore(self, train: Ratings, state: dict) -> Any:
        """RESTORE what was released (the parameters, r_bar, the fallback) from ``state``; only R_u comes from ``train``."""
        self.bind(train)
        self.load_state_dict(state)  # type: ignore[attr-defined]  (nn.Module's)
        return self

    def get_extra_state(self) -> dict:
        return {"fallback": fallback_state(self.fallback_)}

    def set_extra_state(self, state: dict) -> None:
        self.fallback_ = fallback_from_state(state["fallback"], self.item_means.device)

    @property
    def scale(self) -> RatingScale:
        assert self.history is not None
        return self.history.scale
