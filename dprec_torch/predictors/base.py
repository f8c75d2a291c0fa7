"""The plumbing every fitted predictor shares (LensKit/Surprise style); the interface itself is
:class:`dprec_torch.interfaces.FittedPredictor`: ``fit(train) -> self``, ``predict(users, items)`` clipped to the
rating scale, unknown users and items answered by the item mean, then the global mean (:class:`MeanFallback`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from dprec_torch.data.ratings import Ratings
from dprec_torch.errors import DataError
from dprec_torch.interfaces import MeanFallback, Predictor  # noqa: F401
from dprec_torch.predictors.release import check_release_items, restored_fallback
from dprec_torch.privacy.item_means import install_private_fallback, release_item_means


def gather_pair_scores(score: "callable", users: torch.Tensor, items: torch.Tensor, n_items: int, block: int,
                       dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``score(user_block) -> [B, M]`` evaluated once per block of distinct users, read at the pairs (as ``dtype``).
    Out-of-range items give 0; the caller applies its own fallback."""
    uniq, inv = torch.unique(users, return_inverse=True)
    ok_i = (items >= 0) & (items < n_items)
    i = items.clamp(0, n_items - 1)
    out = torch.empty(users.numel(), dtype=dtype, device=users.device)
    for start in range(0, uniq.numel(), block):
        scores = score(uniq[start : start + block])
        sel = (inv >= start) & (inv < start + block)
        out[sel] = scores[inv[sel] - start, i[sel]].to(dtype)
    return torch.where(ok_i, out, torch.zeros_like(out))


def query_ids(users: Any, items: Any, device: Any, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``users`` and ``items`` as long tensors on ``device``, checked to be 1-D of equal length."""
    users = torch.as_tensor(users, dtype=torch.long, device=device)
    items = torch.as_tensor(items, dtype=torch.long, device=device)
    if users.shape != items.shape or users.dim() != 1:
        raise DataError(f"{what}.predict: users {tuple(users.shape)} and items {tuple(items.shape)} must be 1-D of equal length")
    return users, items


def query_pairs(users: Any, items: Any, train: Ratings, user_counts: torch.Tensor, device: Any, what: str
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validated (user, item) query ids: ``(uc, ic, known_item, known_pair)`` with ids clamped into the tables,
    ``known_item`` = the item is in the training id space, ``known_pair`` = both ids are and the user has ratings."""
    users, items = query_ids(users, items, device, what)
    n_u, n_i = train.n_users, train.n_items
    ok_u, ok_i = (users >= 0) & (users < n_u), (items >= 0) & (items < n_i)
    uc, ic = users.clamp(0, n_u - 1), items.clamp(0, n_i - 1)
    return uc, ic, ok_i, ok_u & ok_i & (user_counts[uc] > 0)


def user_offsets(train: Ratings, item_avg: torch.Tensor, beta_p: float) -> torch.Tensor:
    """The damped user offsets ``b_u = sum_{i in R_u} (r_ui - item_avg_i) / (|R_u| + beta_p)`` (each from u's own ratings)."""
    resid = train.values - item_avg[train.items]
    counts = train.user_counts().to(torch.float32)
    user_sum = torch.zeros(train.n_users, device=train.device).index_add_(0, train.users, resid)
    return user_sum / (counts + beta_p).clamp_min(1e-6)


def user_residuals(train: Ratings, item_avg: torch.Tensor, beta_p: float, clamp_r: float) -> tuple[torch.Tensor, torch.Tensor]:
    """DP-ALS step 0 (float64): each user's own damped offset b_u and clamped residuals y_ui = clamp(r - r~_i - b_u, -Gamma_r, Gamma_r)."""
    e = train.values.double() - item_avg.double()[train.items]
    n = torch.bincount(train.users, minlength=train.n_users).double()
    offset = torch.zeros(train.n_users, dtype=torch.float64, device=e.device).index_add_(0, train.users, e) / (n + beta_p).clamp_min(1e-12)
    return offset.float(), (e - offset[train.users]).clamp(-clamp_r, clamp_r)


class BasePredictor:
    """Shared plumbing: device handling, the fallback, and an empty privacy report."""

    #: name used in tables and metrics.json
    name: str = "predictor"

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = torch.device(device) if device is not None else None
        self.fallback_: MeanFallback | None = None
        #: share of the last predict() call's pairs answered by the fallback (the evaluator's ``fallback_rate``)
        self.fallback_rate_: float | None = None

    @property
    def private(self) -> bool:
        """Whether noise is drawn: a finite ``epsilon`` (predictors that take one)."""
        return math.isfinite(self.epsilon)

    def _prepare(self, train: Ratings, state: dict[str, Any] | None = None, require_ratings: bool = False) -> Ratings:
        """Move ``train`` to this predictor's device and set up the fallback: from ``train`` in ``fit`` (refusing an
        empty ``train`` if ``require_ratings``); in ``restore(train, state)`` AS RELEASED (``state["fallback"]``,
        :func:`restored_fallback`; none when the release holds no fallback), after checking the release's item universe."""
        if require_ratings and len(train) == 0:
            raise DataError(f"{self.name}: the training set is empty; check the data split")
        if self.device is not None:
            train = train.to(self.device)
        else:
            self.device = train.device
        if state is None:
            self.fallback_ = MeanFallback(train)
        else:
            check_release_items(state, train, self.name)
            if "fallback" in state:
                self.fallback_ = restored_fallback(train, state["fallback"])
        return train

    def _release_means(self, train: Ratings, gen: Any) -> Any:
        """Release the DP item means r~ and g of ``means_spec`` (:func:`~dprec_torch.privacy.item_means.release_item_means`)
        at pure ``mean_epsilon_`` (Laplace) or GDP ``mu_["item_stats"]`` (Gaussian), without noise at epsilon = inf, and
        install them as the private fallback: no exact item statistic stays in the object."""
        budget = ({"epsilon": math.inf} if not self.private else {"epsilon": self.mean_epsilon_} if self.means_spec.noise == "laplace"
                  else {"mu": self.mu_["item_stats"]})
        rel = self.means_release_ = release_item_means(train, self.means_spec, gen, **budget)
        self.item_avg_, self.global_avg_ = rel.means.to(train.device), rel.global_mean
        install_private_fallback(self, self.item_avg_, self.global_avg_)
        return rel

    def _offset_predict(self, uc: torch.Tensor, ic: torch.Tensor, ok_i: torch.Tensor, known: torch.Tensor,
                        term: torch.Tensor | None = None) -> torch.Tensor:
        """clip(r~_i + b_u + term) at the :func:`query_pairs` ids of a predictor with released item means ``item_avg_``,
        global mean ``global_avg_`` and user offsets ``user_offset_``; unknown users get r~_i, unknown item ids g."""
        base = torch.where(ok_i, self.item_avg_[ic], torch.full_like(self.item_avg_[ic], self.global_avg_))
        own = base + self.user_offset_[uc]
        return self.train_.scale.clip(torch.where(known, own if term is None else own + term, base))

    def _finish_and_count(self, users: torch.Tensor, items: torch.Tensor, raw: torch.Tensor,
                usable: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`MeanFallback.finish`, counting the pairs that fell back in ``fallback_rate_``."""
        fb = self._check_fitted()
        answered = fb.answered(users, items, usable)
        self.fallback_rate_ = float((~answered).float().mean()) if answered.numel() else 0.0
        return fb.finish(users, items, raw, usable)

    def _check_fitted(self, what: str = "predict") -> MeanFallback:
        if self.fallback_ is None:
            raise RuntimeError(f"{type(self).__name__}.{what} called before fit()")
        return self.fallback_

    def privacy_report(self) -> dict[str, Any]:
        """Non-private by default."""
        return {"mechanism": "none", "relation": None, "epsilon": float("inf"), "analysis": "non-private"}
