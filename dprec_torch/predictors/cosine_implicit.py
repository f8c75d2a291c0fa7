"""Cosine item-to-item recommender on purchase (binary) data (Park & Acharya 2011, Sec. 3.1-3.2).

How the converted PDF was read
------------------------------
* Purchases: ``p_ij = 1`` iff user i rated item j with a value ``>= threshold`` (default 4.0, MovieLens' usual
  "liked it" cut, so the model learns from the same events that Precision/Recall@N count as relevant).
  ``threshold=null`` counts every rating as a purchase.
* Eq. (7): ``s_jk = p_.j . p_.k / (|p_.j| |p_.k|)`` over the complete binary matrix; an item without purchases has
  similarity 0 to everything.
* Eq. (8): ``p_hat_ij = (1/|p_i.|) sum_{k in p_i.} s_kj`` (a mean of cosines, in [0, 1]). Served to users with at
  least ``T`` purchases; the others get the normalised popularity ``|p_.j| / max_k |p_.k|`` (also in [0, 1]).
* Theorem 3.2, Eq. (17): ``Delta f <= 2/T``.

What Theorem 3.2 really covers (see :meth:`CosineImplicit.sensitivity_report`)
----------------------------------------------------------------------------------
One rating flips at most one purchase (add/remove). Case (ii) of the proof (another user buys an item) assumes one
similarity term changes; but when that user buys the *queried* item j, every ``s_kj`` with ``k in p_i.`` changes at
once. Example in ``tests/predictors/test_cosine_implicit.py``: j had no buyers, the new buyer shares every item of
user i's history with only i -> every ``s_kj`` goes 0 -> 1/sqrt(2), so ``p_hat_ij`` moves by 0.707, versus
``2/T = 0.1`` for T = 20. The bound the code can defend is the width of the output range, ``1`` (every released value
lies in [0, 1]), so noise calibrated to ``2/T`` gives ``epsilon * T/2`` per released score, not ``epsilon``.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from dprec_torch.data.ratings import Ratings, dense_rows
from dprec_torch.errors import ConfigError, DataError
from dprec_torch.predictors.base import BasePredictor, gather_pair_scores
from dprec_torch.predictors.slope_one import _BLOCK, _ServedUsers, item_gram

log = logging.getLogger(__name__)


def cosine_sensitivity(T: int) -> float:
    """Theorem 3.2, Eq. (17): ``Delta f = 2/T``."""
    return 2.0 / T


class CosineImplicit(_ServedUsers, BasePredictor):
    """Amazon-style item-to-item cosine recommender on binarised ratings (Eqs. (7)-(8)).

    Learned state: ``sim_`` (``[M, M]`` float64, Eq. (7)), ``purchase_counts_`` (per user), ``served_`` (users with
    ``>= T`` purchases), ``popularity_`` (fallback scores). ``predict`` returns the purchase estimate ``p_hat_ij`` in
    [0, 1], not a rating; ``task = "topn"`` so the evaluator reports Precision/Recall@N only.
    """

    name = "cosine_implicit"
    task = "topn"
    _learned = "sim_"

    def __init__(self, T: int = 20, threshold: float | None = 4.0, device: str | None = None) -> None:
        if int(T) != T or T < 1:
            raise ConfigError(f"cosine_implicit T={T} must be an integer >= 1 (users need T purchases to be served)")
        super().__init__(device=None if device in (None, "auto") else device)
        self.T, self.threshold = int(T), None if threshold is None else float(threshold)
        self.sim_: torch.Tensor | None = None

    def binarise(self, train: Ratings) -> Ratings:
        """The purchase set ``{(i, j): r_ij >= threshold}`` as ratings of value 1."""
        keep = torch.ones_like(train.values, dtype=torch.bool) if self.threshold is None else train.values >= self.threshold
        purchases = train.select(keep)
        purchases.values = torch.ones_like(purchases.values)
        return purchases

    def fit(self, train: Ratings) -> "CosineImplicit":
        """Eq. (7) from the sparse Gram matrix ``P^T P`` and the item norms ``sqrt(|p_.j|)``."""
        train = self._prepare(train)
        purchases = self.binarise(train)
        if len(purchases) == 0:
            raise DataError(f"cosine_implicit: no rating reaches threshold={self.threshold}; lower model.threshold")
        ones = purchases.values
        gram = item_gram(purchases, ones, ones)  # p_.j . p_.k
        norms = gram.diagonal().sqrt()  # |p_.j| = sqrt(#buyers)
        denom = norms[:, None] * norms[None, :]
        self.sim_ = torch.where(denom > 0, gram / denom.clamp_min(1e-300), torch.zeros_like(gram))  # Eq. (7)
        item_buyers = purchases.item_counts().double()
        self.popularity_ = item_buyers / item_buyers.max().clamp_min(1)
        self._index_users(train, purchases)
        log.info("cosine_implicit: %d purchases (threshold %s); %d/%d users served (>= %d purchases)",
                 len(purchases), self.threshold, int(self.served_.sum()), self.n_users, self.T)
        return self

    def _index_users(self, train: Ratings, purchases: Ratings) -> None:
        """Each user's own part of Eq. (8): their purchases p_i., their count and whether they are served (>= T)."""
        self.n_users, self.n_items = train.n_users, train.n_items
        self.purchase_counts_ = purchases.user_counts()
        self.served_ = self.purchase_counts_ >= self.T
        self.purchases_ = purchases.indicator_csr()
        self.indicator_ = train.indicator_csr()  # every rated item is excluded from recommendations

    # ------------------------------------------------------------ release
    def released_state(self) -> dict[str, Any]:
        """The cosines s_jk (Eq. (7)) and the normalised popularity. Non-private: with ``mechanism=laplace_output`` this
        is the curator's state, and the epsilon covers the noised answers, not this."""
        self._check()
        return {"n_items": int(self.n_items), "similarity": self.sim_, "popularity": self.popularity_}

    def restore(self, train: Ratings, state: dict[str, Any]) -> "CosineImplicit":
        """s_jk and the popularity from ``state``; each user's purchases from their own ratings in ``train``."""
        train = self._prepare(train, state)
        self.sim_, self.popularity_ = state["similarity"].to(train.device), state["popularity"].to(train.device)
        self._index_users(train, self.binarise(train))
        return self

    def score(self, users: torch.Tensor) -> torch.Tensor:
        """Eq. (8) for every item, ``[len(users), M]`` float64 in [0, 1]; popularity below ``T``."""
        self._check()
        u, served = self._users(users)
        out = self.popularity_.expand(u.numel(), -1).clone()
        for start in range(0, u.numel(), _BLOCK):
            blk = slice(start, start + _BLOCK)
            rows = dense_rows(self.purchases_, u[blk]).double()  # [B, M] indicator of p_i.
            f = (rows @ self.sim_) / self.purchase_counts_[u[blk], None].clamp_min(1)  # Eq. (8)
            out[blk] = torch.where(served[blk, None], f, out[blk])
        return out

    def raw_predict(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """Eq. (8) at the given pairs (float64); out-of-range items score 0."""
        self._check()
        return gather_pair_scores(self.score, self._ids(users), self._ids(items), self.n_items, _BLOCK)

    def predict(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """The purchase estimate ``p_hat_ij`` of Eq. (8) (float32, in [0, 1])."""
        return self.raw_predict(users, items).clamp(0.0, 1.0).float()

    def score_range(self) -> tuple[float, float]:
        """Every score lies in [0, 1] (used by mechanism=exponential_topk)."""
        return 0.0, 1.0

    # ------------------------------------------------------------- privacy
    def output_sensitivity(self) -> float:
        """``Delta f = 2/T`` of Theorem 3.2, Eq. (17) -- the value the paper calibrates its noise to."""
        return cosine_sensitivity(self.T)

    def sensitivity_report(self) -> dict[str, Any]:
        """How far Eq. (17) can be trusted; the Laplace wrapper turns this into epsilons."""
        return {
            "unit": "one rating (flips at most one purchase)",
            "relation": "rating",
            "neighbouring": "add/remove one purchase",
            "theorem": "Park & Acharya Theorem 3.2, Eq. (17)",
            "params": {"T": self.T, "threshold": self.threshold},
            "sensitivity_paper": cosine_sensitivity(self.T),
            "sensitivity_guaranteed": 1.0,
            "sensitivity_add_remove": 1.0,
            "users_below_T": int((~self.served_).sum()) if self.sim_ is not None else None,
            "caveats": (
                "Eq. (17) misses that a purchase of the queried item changes every s_kj at once (a 0.707 move "
                "is possible); only the output-range bound 1 is defended, i.e. epsilon*T/2 per released score."
            ),
        }

    def privacy_report(self) -> dict[str, Any]:
        return {
            "mechanism": "none", "relation": None, "sensitivity": None, "noise": "none",
            "epsilon": float("inf"), "delta": 0.0,
            "analysis": "non-private cosine item-to-item; combine with mechanism=laplace_output for Theorem 3.2 noise",
        }

    # ------------------------------------------------ LIA side information
    def lia_side_information(self, users: torch.Tensor, query_items: torch.Tensor,
                             target_items: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Theorem 3.4, Eq. (26): ``(a, b, truth)`` with ``LIA = a * A_ij + b ~= s_lj``.

        ``a = |p_i.|``, ``b = -sum_{k in p_i. minus l} s_kj``, ``truth = s_lj``; the attacker concludes ``p_il = 1``
        when the estimate matches ``s_lj``.
        """
        self._check()
        u, served = self._users(users)
        if not bool(served.all()):
            raise DataError("LIA side information exists only for users served by Eq. (8); attack users with >= T purchases")
        rows = dense_rows(self.purchases_, u)
        q = torch.as_tensor(query_items, dtype=torch.long, device=u.device)
        t = torch.as_tensor(target_items, dtype=torch.long, device=u.device)
        ar = torch.arange(u.numel(), device=u.device)
        if not bool((rows[ar, t] > 0).all()) or bool((rows[ar, q] > 0).any()):
            raise DataError("LIA needs target items the user purchased and query items the user did not purchase")
        n = self.purchase_counts_[u].double()
        total = self.raw_predict(u, q) * n  # sum_{k in p_i.} s_kj
        s_lj = self.sim_[t, q]
        return n, -(total - s_lj), s_lj
