"""Slope One item-to-item predictor (Park & Acharya 2011, Sec. 3.1-3.2).

How the converted PDF was read
------------------------------
* Eq. (3): ``s_jk = sum_{i in Phi(j,k)} (r_ij - r_ik) / |Phi(j,k)|`` -- the mean rating difference between items j
  and k over their co-raters ``Phi(j,k)``.
* Eq. (4): ``s_jk`` as in Eq. (3) when ``|Phi(j,k)| > phi_m`` (strictly), else 0.
* Eq. (5)/(6): ``r_hat_ij = (1/|r_i.|) sum_{k in r_i.} (s_jk + r_ik) = r_bar_i + (1/|r_i.|) sum_{k in r_i.} s_jk``.
  The denominator is the user's *whole* rating count ``|r_i.|`` (pairs without enough co-raters give ``s_jk = 0``),
  unlike Lemire's original (supported pairs only); Theorem 3.1 is proved for this form, so we keep it.
* Eq. (6) is served only to users with at least ``T`` training ratings (Sec. 3.2/3.4). Users below ``T`` (and unknown
  users) get the training global mean (the paper serves them nothing); it moves by at most ``delta_r/|R|`` when one
  rating changes, so the Laplace wrapper's guarantee still covers every released value. Unknown items need no
  fallback: Eq. (6) gives ``r_bar_i`` for them (all ``s_jk = 0``).
* Theorem 3.1 / Eq. (11): ``Delta f <= max(delta_r/T * (1 + 2/phi_m), delta_r/phi_m)``, ``delta_r = r_max - r_min``.
  (T, phi_m, delta_r) = (20, 10, 5) gives 0.5.

What Theorem 3.1 really covers (see :meth:`SlopeOne.sensitivity_report`)
----------------------------------------------------------------------------
Checked case by case for a query (i, j) with j unrated by i:

* *Substitution* (R and R' have the same rated positions and differ in the value of one rating): user i changing one
  of their ratings moves ``r_bar_i`` by ``<= delta_r/|r_i.|`` and no ``s_jk`` (i is not a co-rater of j); another user
  changing a rating moves each ``s_jk`` by ``<= delta_r/(phi_m+1)`` (co-rater counts are fixed, so no pair crosses
  the ``phi_m`` threshold). Hence ``Delta f = max(delta_r/T, delta_r/(phi_m+1))``, which is below the paper's
  Eq. (11): Eq. (11) is a valid (slightly loose) bound here.
* *Add/remove one rating*: Eq. (11) does NOT hold. A new co-rater can lift a pair over the ``phi_m`` threshold,
  switching ``s_jk`` from 0 to up to ``delta_r`` for every k the user rated at once (``tests/predictors/test_slope_one.py``
  builds a case that moves the output by ``delta_r``, ten times Eq. (11)), and the paper's bound ``|s'_jl| <=
  delta_r/phi_m`` in case (i) has no basis (``|s_jl| <= delta_r``). The only defensible bound is the width of the
  output range, ``3 * delta_r`` (Eq. (6) lies in ``[r_min - delta_r, r_max + delta_r]``).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from dprec_torch.data.ratings import Ratings, dense_rows
from dprec_torch.errors import ConfigError, DataError
from dprec_torch.predictors.base import BasePredictor, gather_pair_scores

log = logging.getLogger(__name__)

#: users per dense block when scoring (bounds memory to block x n_items)
_BLOCK = 1024


def item_gram(train: Ratings, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """Dense ``[M, M]`` float64 product ``A^T B`` of two users x items sparse matrices with the rating pattern of ``train``
    (values ``left`` and ``right``): ``item_gram(train, 1, 1)`` is the co-rating count ``I^T I``,
    ``item_gram(train, r, 1)`` is ``sum_{i in Phi(j,k)} r_ij`` (the ingredients of Eq. (3) and Eq. (7))."""
    a_t = torch.sparse_coo_tensor(torch.stack([train.items, train.users]), left.double(), (train.n_items, train.n_users),
                                  check_invariants=False)
    b = torch.sparse_coo_tensor(torch.stack([train.users, train.items]), right.double(), (train.n_users, train.n_items),
                                check_invariants=False)
    prod = torch.sparse.mm(a_t.coalesce(), b.coalesce()).coalesce()
    # scatter into dense by hand: Tensor.to_dense() has a large fixed cost on small inputs
    out = torch.zeros(train.n_items, train.n_items, dtype=torch.float64, device=train.device)
    idx = prod.indices()
    return out.index_put_((idx[0], idx[1]), prod.values())  # coalesced: no duplicates


def slope_one_sensitivity(T: int, phi_m: int, delta_r: float) -> float:
    """Theorem 3.1, Eq. (11): ``max(delta_r/T * (1 + 2/phi_m), delta_r/phi_m)`` (inf if phi_m = 0)."""
    if phi_m <= 0:
        return math.inf
    return max(delta_r / T * (1.0 + 2.0 / phi_m), delta_r / phi_m)


def slope_one_substitution_sensitivity(T: int, phi_m: int, delta_r: float) -> float:
    """The exact-case bound under substitution (module docstring): ``max(delta_r/T, delta_r/(phi_m+1))``."""
    return max(delta_r / T, delta_r / (phi_m + 1))


class _ServedUsers:
    """What Slope One and the cosine recommender (Park & Acharya 2011) share: users with >= ``T`` ratings (purchases)
    are served by ``score(users) -> [B, M]``; ``_learned`` names the fitted item-item matrix."""

    _learned = "dev_"

    def _check(self) -> None:
        if getattr(self, self._learned) is None:
            raise RuntimeError(f"{type(self).__name__} used before fit()")

    def _ids(self, ids: Any) -> torch.Tensor:
        return torch.as_tensor(ids, dtype=torch.long, device=getattr(self, self._learned).device)

    def _users(self, users: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Clamped user ids and the mask of users served by ``score`` (out-of-range ids are unknown)."""
        users = self._ids(users)
        ok = (users >= 0) & (users < self.n_users)
        u = users.clamp(0, self.n_users - 1)
        return u, ok & self.served_[u]

    def rated_mask(self, users: torch.Tensor) -> torch.Tensor:
        """``[len(users), M]`` bool: items each user rated in training (never recommended)."""
        self._check()
        u, _ = self._users(users)
        return dense_rows(self.indicator_, u) > 0

    def recommend(self, users: torch.Tensor, n: int) -> torch.Tensor:
        """Top-``n`` unrated items by ``score``, ``-1`` padded (ties broken arbitrarily)."""
        return top_n_unrated(self.score(users), self.rated_mask(users), n)


class SlopeOne(_ServedUsers, BasePredictor):
    """Slope One with the co-rater threshold ``phi_m`` and the user threshold ``T``.

    Learned state: ``dev_`` (``[M, M]`` float64, Eq. (4)), ``user_means_``, ``user_counts_``, ``served_`` (users with
    ``>= T`` ratings), ``global_mean_``. Non-private by itself; ``mechanism=laplace_output`` adds
    ``Lap(Delta f/eps)`` to every released prediction using :meth:`output_sensitivity`.
    """

    name = "slope_one"
    task = "both"

    def __init__(self, T: int = 20, phi_m: int = 10, delta_r: float | None = None, device: str | None = None) -> None:
        if int(T) != T or T < 1:
            raise ConfigError(f"slope_one T={T} must be an integer >= 1 (users need T ratings to be served)")
        if int(phi_m) != phi_m or phi_m < 0:
            raise ConfigError(f"slope_one phi_m={phi_m} must be an integer >= 0 (minimum co-raters per item pair)")
        if delta_r is not None and not delta_r > 0:
            raise ConfigError(f"slope_one delta_r={delta_r} must be > 0, or null to use the data's r_max - r_min")
        super().__init__(device=None if device in (None, "auto") else device)
        self.T, self.phi_m = int(T), int(phi_m)
        self.delta_r = None if delta_r is None else float(delta_r)
        self.dev_: torch.Tensor | None = None

    # ------------------------------------------------------------------ fit
    def fit(self, train: Ratings) -> "SlopeOne":
        """Eq. (3)/(4): deviations from sparse products ``R^T I - I^T R`` and counts ``I^T I``."""
        if len(train) == 0:
            raise DataError("slope_one got an empty training set; check the data split")
        train = self._prepare(train)
        ones = torch.ones_like(train.values)
        counts = item_gram(train, ones, ones)  # |Phi(j,k)|
        a = item_gram(train, train.values, ones)  # a_jk = sum_{i in Phi(j,k)} r_ij
        dev = (a - a.T) / counts.clamp_min(1)  # Eq. (3)
        self.dev_ = torch.where(counts > self.phi_m, dev, torch.zeros_like(dev))  # Eq. (4)
        self.delta_r_ = self.delta_r if self.delta_r is not None else train.scale.span
        self.global_mean_ = train.global_mean
        self._index_users(train)
        log.info("slope_one: %d item pairs with > %d co-raters; %d/%d users served (>= %d ratings)",
                 int((counts > self.phi_m).sum()), self.phi_m, int(self.served_.sum()), self.n_users, self.T)
        return self

    def _index_users(self, train: Ratings) -> None:
        """Each user's own part of Eq. (6): their count |r_i.|, mean r_bar_i, whether they are served (>= T), their
        rated items; and the sorted training ratings :meth:`lookup` reads (LIA side information)."""
        self.scale = train.scale
        self.n_users, self.n_items = train.n_users, train.n_items
        self.user_counts_ = train.user_counts()
        self.user_means_ = train.user_means().double()
        self.served_ = self.user_counts_ >= self.T
        self.indicator_ = train.indicator_csr()
        order = torch.argsort(train.users * train.n_items + train.items)
        self._keys = (train.users * train.n_items + train.items)[order]
        self._vals = train.values[order].double()

    # ------------------------------------------------------------ release
    def released_state(self) -> dict[str, Any]:
        """The deviations s_jk (Eq. (4)), the global mean and delta_r. Non-private: with ``mechanism=laplace_output``
        this is the curator's state, and the epsilon covers the noised answers, not this."""
        self._check()
        return {"n_items": int(self.n_items), "deviations": self.dev_, "global_mean": float(self.global_mean_),
                "delta_r": float(self.delta_r_)}

    def restore(self, train: Ratings, state: dict[str, Any]) -> "SlopeOne":
        """s_jk, the global mean and delta_r from ``state``; each user's part of Eq. (6) from their own ratings."""
        train = self._prepare(train, state)
        self.dev_ = state["deviations"].to(train.device)
        self.global_mean_, self.delta_r_ = float(state["global_mean"]), float(state["delta_r"])
        self._index_users(train)
        return self

    # ---------------------------------------------------------- prediction
    def score(self, users: torch.Tensor) -> torch.Tensor:
        """Unclipped Eq. (6) for every item: ``[len(users), M]`` float64 (the output ``f_ij`` of Eq. (9)); users with
        fewer than ``T`` ratings get the global mean in every column."""
        self._check()
        u, served = self._users(users)
        out = torch.full((u.numel(), self.n_items), self.global_mean_, dtype=torch.float64, device=u.device)
        for start in range(0, u.numel(), _BLOCK):
            blk = slice(start, start + _BLOCK)
            rows = dense_rows(self.indicator_, u[blk]).double()  # [B, M] indicator of r_i.
            sums = rows @ self.dev_.T  # sum_{k in r_i.} s_jk
            f = self.user_means_[u[blk], None] + sums / self.user_counts_[u[blk], None].clamp_min(1)
            out[blk] = torch.where(served[blk, None], f, out[blk])
        return out

    def raw_predict(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """Unclipped Eq. (6) at the given pairs (float64): the value the Laplace wrapper perturbs."""
        self._check()
        users, items = self._ids(users), self._ids(items)
        ok_i = (items >= 0) & (items < self.n_items)
        out = gather_pair_scores(self.score, users, items, self.n_items, _BLOCK)
        # an out-of-range item has no co-raters: Eq. (6) reduces to r_bar_i
        u, served = self._users(users)
        fallback = torch.where(served, self.user_means_[u], torch.full_like(out, self.global_mean_))
        return torch.where(ok_i, out, fallback)

    def predict(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """Eq. (6) clipped to the rating scale (float32). Pairs of users below T (global mean) and of unknown items (the
        user's mean) are counted in ``fallback_rate_``."""
        out = self.scale.clip(self.raw_predict(users, items)).float()
        items = torch.as_tensor(items, dtype=torch.long, device=out.device)
        _, served = self._users(users)
        answered = served & (items >= 0) & (items < self.n_items)
        self.fallback_rate_ = float((~answered).float().mean()) if answered.numel() else 0.0
        return out

    # ------------------------------------------------------------- privacy
    def output_sensitivity(self) -> float:
        """``Delta f`` of Theorem 3.1, Eq. (11) -- the value the paper calibrates its noise to."""
        if self.delta_r is None and self.dev_ is None:
            raise RuntimeError("SlopeOne.output_sensitivity needs fit() (delta_r comes from the data's scale)")
        delta_r = self.delta_r if self.delta_r is not None else self.delta_r_
        return slope_one_sensitivity(self.T, self.phi_m, delta_r)

    def sensitivity_report(self) -> dict[str, Any]:
        """How far Eq. (11) can be trusted; the Laplace wrapper turns this into epsilons."""
        delta_r = self.delta_r if self.delta_r is not None else self.delta_r_
        n_unserved = int((~self.served_).sum()) if self.dev_ is not None else None
        return {
            "unit": "one rating", "relation": "rating",
            "neighbouring": "substitution: same rated (user, item) positions, one rating value differs",
            "theorem": "Park & Acharya Theorem 3.1, Eq. (11)",
            "params": {"T": self.T, "phi_m": self.phi_m, "delta_r": delta_r},
            "sensitivity_paper": slope_one_sensitivity(self.T, self.phi_m, delta_r),
            "sensitivity_guaranteed": slope_one_substitution_sensitivity(self.T, self.phi_m, delta_r),
            "sensitivity_add_remove": 3.0 * delta_r, "users_below_T": n_unserved,
            "caveats": (
                "Eq. (11) holds under substitution for items the user has not rated (every test pair); "
                "under add/remove of one rating it fails (a co-rater can push a pair over phi_m), so only "
                "the output-range bound 3*delta_r is defended there. Users below T get the global mean "
                "(sensitivity delta_r/|R|), which Eq. (11) covers."
            ),
        }

    def privacy_report(self) -> dict[str, Any]:
        return {"mechanism": "none", "relation": None, "sensitivity": None, "noise": "none", "epsilon": float("inf"), "delta": 0.0,
                "analysis": "non-private Slope One; combine with mechanism=laplace_output for Theorem 3.1 noise"}

    # ------------------------------------------------ LIA side information
    def lookup(self, users: torch.Tensor, items: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Training ratings at the given pairs: ``(found mask, values)`` (values 0 where not found)."""
        self._check()
        keys = users.to(self._keys.device) * self.n_items + items.to(self._keys.device)
        pos = torch.searchsorted(self._keys, keys).clamp_max(self._keys.numel() - 1)
        found = self._keys[pos] == keys
        return found, torch.where(found, self._vals[pos], torch.zeros_like(self._vals[pos]))

    def lia_side_information(self, users: torch.Tensor, query_items: torch.Tensor,
                             target_items: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Theorem 3.3, Eq. (23): ``(a, b, truth)`` with ``LIA = a * A_ij + b`` recovering ``r_il``: ``a = |r_i.|``,
        ``b = -(sum_{k in r_i.} s_jk + sum_{k in r_i. minus l} r_ik)``, ``truth = r_il`` for user i, released (query)
        item j and attacked (target) item l."""
        self._check()
        u, served = self._users(users)
        if not bool(served.all()):
            raise DataError("LIA side information exists only for users served by Eq. (6); attack users with >= T ratings")
        found_t, r_il = self.lookup(u, target_items)
        found_q, _ = self.lookup(u, query_items)
        if not bool(found_t.all()) or bool(found_q.any()):
            raise DataError("LIA needs target items the user rated and query items the user did not rate")
        sum_s = self.raw_predict(u, query_items) - self.user_means_[u]  # (1/|r_i.|) sum_k s_jk
        n = self.user_counts_[u].double()
        return n, -(n * sum_s + n * self.user_means_[u] - r_il), r_il  # (a, b, truth)


def top_n_unrated(scores: torch.Tensor, rated: torch.Tensor, n: int) -> torch.Tensor:
    """Top-``n`` columns of ``scores`` outside ``rated`` per row, ``-1`` where fewer exist."""
    if int(n) != n or n < 1:
        raise ConfigError(f"recommend n={n} must be an integer >= 1")
    n = int(n)
    masked = scores.masked_fill(rated, float("-inf"))
    k = min(n, masked.shape[1])
    vals, idx = torch.topk(masked, k, dim=1)
    idx = torch.where(torch.isfinite(vals), idx, torch.full_like(idx, -1))
    if k < n:
        idx = torch.cat([idx, idx.new_full((idx.shape[0], n - k), -1)], dim=1)
    return idx
