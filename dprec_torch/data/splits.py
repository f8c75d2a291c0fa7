"""Fold selection and seeded random hold-out splits, keyed per rating by raw ids.

Wang & Tang (Sec. 5.1) use 5-fold cross validation. ML-100K ships its official
folds (u1..u5, read in :mod:`movielens`); every other dataset gets a seeded ~90/10
hold-out repeated ``n_folds`` times. Each repetition draws an independent random
test set, so hold-outs may overlap (this is repeated random sub-sampling, not a
partition). Fold ``k`` is a pure function of ``(seed, k)``: ``fold=3`` alone is the
same split as the third fold of ``fold=all``.

Per-user splits. Rating (u, i) goes to the test side of fold ``k`` iff a 32-bit hash of
(``derive_seed(seed, k, SPLIT_STREAM)``, u's RAW id key, i's RAW id key) -- :func:`~dprec_torch.data.preprocess.rating_keys`,
the hash of the tau cap, over :func:`~dprec_torch.data.preprocess.stable_id_keys` -- falls below
``test_fraction * 2^32``: an independent keyed Bernoulli per rating, not a draw over rating positions. So which of
u's ratings are held out depends on (seed, fold, u's raw id, u's own ratings) only, and the property every user-level
epsilon needs holds: *other users' ratings stay put when one user is added or removed* (even when the contiguous id
map is rebuilt without that user). The price: the test set holds ``test_fraction`` of the ratings only approximately
(binomial: standard deviation ``sqrt(n f (1 - f))``, ~300 ratings of ML-1M at f = 0.1), and a tiny dataset can
draw an empty side (``build_dataset`` then says so).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from dprec_torch.data.preprocess import ITEM_KEYS, USER_KEYS, rating_keys, stable_id_keys
from dprec_torch.data.ratings import Fold, Ratings
from dprec_torch.data.streams import CAP_STREAM, SPLIT_STREAM, VALIDATION_STREAM, derive_seed
from dprec_torch.errors import ConfigError

__all__ = ["CAP_STREAM", "SPLIT_STREAM", "VALIDATION_STREAM", "check_test_fraction", "derive_seed", "holdout_folds",
           "holdout_indices", "holdout_mask", "id_keys", "select_folds"]


def select_folds(fold: Any, n_folds: int) -> list[int]:
    """``data.fold`` (1-based int or ``"all"``) to the list of 1-based fold indices."""
    if isinstance(n_folds, bool) or not isinstance(n_folds, int) or n_folds < 1:
        raise ConfigError(f"data.n_folds={n_folds!r} is invalid: use a positive integer")
    if isinstance(fold, str) and fold.strip().lower() == "all":
        return list(range(1, n_folds + 1))
    try:
        k = int(fold)
        if isinstance(fold, bool) or (isinstance(fold, float) and fold != k):
            raise ValueError
    except (TypeError, ValueError):
        raise ConfigError(f"data.fold={fold!r} is invalid: use an integer in 1..{n_folds} or all") from None
    if not 1 <= k <= n_folds:
        raise ConfigError(f"data.fold={k} is out of range: use 1..{n_folds} or all")
    return [k]


def check_test_fraction(test_fraction: float) -> float:
    try:
        frac = float(test_fraction)
    except (TypeError, ValueError):
        frac = float("nan")
    if not 0.0 < frac < 1.0:
        raise ConfigError(f"data.test_fraction={test_fraction!r} is invalid: use a number strictly between 0 and 1")
    return frac


def id_keys(ratings: Ratings, user_keys: torch.Tensor | None = None,
            item_keys: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The raw-id keys (one per contiguous user / item index, on the ratings' device) a per-rating hash reads: the
    arguments, else ``ratings.meta`` (where ``build_dataset`` stores :func:`~dprec_torch.data.preprocess.stable_id_keys`),
    else the contiguous ids (stable only while the id map is: right for synthetic data, whose raw ids ARE 0..n-1)."""
    dev = ratings.device
    user_keys = ratings.meta.get(USER_KEYS) if user_keys is None else user_keys
    item_keys = ratings.meta.get(ITEM_KEYS) if item_keys is None else item_keys
    uk = torch.arange(ratings.n_users, device=dev) if user_keys is None else torch.as_tensor(user_keys).to(dev)
    ik = torch.arange(ratings.n_items, device=dev) if item_keys is None else torch.as_tensor(item_keys).to(dev)
    if uk.numel() != ratings.n_users or ik.numel() != ratings.n_items:
        raise ConfigError(f"raw-id keys for {uk.numel()} users x {ik.numel()} items given for ratings over "
                          f"{ratings.n_users} x {ratings.n_items}: pass one key per contiguous id")
    return uk, ik


def holdout_mask(ratings: Ratings, fold_index: int, test_fraction: float, seed: int,
                 user_keys: torch.Tensor | None = None, item_keys: torch.Tensor | None = None) -> torch.Tensor:
    """Bool mask of the TEST ratings of hold-out ``fold_index``: rating (u, i) is held out iff
    ``rating_keys(derive_seed(seed, fold, SPLIT_STREAM), key(u), key(i)) < test_fraction * 2^32`` (keys: :func:`id_keys`).

    A keyed Bernoulli(``test_fraction``) per rating, a function of (seed, fold, u's raw id, i's raw id) alone: adding
    or removing a user (and rebuilding the id map) moves no other rating between train and test. The test share is
    ``test_fraction`` only approximately. Vectorised (one hash per id, one mix per rating); any device.
    """
    frac = check_test_fraction(test_fraction)
    uk, ik = id_keys(ratings, user_keys, item_keys)
    keys = rating_keys(derive_seed(seed, fold_index, SPLIT_STREAM), uk, ik, ratings.users, ratings.items, "mix32")
    return keys < int(frac * 2**32)


def holdout_indices(ratings: Ratings, fold_index: int, test_fraction: float, seed: int,
                    user_keys: torch.Tensor | None = None,
                    item_keys: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions of the train and test ratings of hold-out ``fold_index``, each in ascending order
    (:func:`holdout_mask`: each rating held out by its own keyed hash, ~``test_fraction`` of them)."""
    if not isinstance(ratings, Ratings):
        raise TypeError("holdout_indices takes the Ratings to split (the split is keyed by each rating's raw "
                        f"user and item ids, not by its position), got {type(ratings).__name__}")
    is_test = holdout_mask(ratings, fold_index, test_fraction, seed, user_keys, item_keys)
    # nonzero is O(n) and already ascending
    return torch.nonzero(~is_test).squeeze(1), torch.nonzero(is_test).squeeze(1)


def holdout_folds(ratings: Ratings, folds: list[int], test_fraction: float, seed: int,
                  user_ids: Sequence[Any] | None = None, item_ids: Sequence[Any] | None = None) -> list[Fold]:
    """The selected hold-out folds of a whole dataset (shared id space, names ``holdout-k``).

    ``user_ids`` / ``item_ids``: the raw id of each contiguous index (the loaders' id space); the split is keyed by
    them (:func:`~dprec_torch.data.preprocess.stable_id_keys`), else by ``ratings.meta``'s keys, else by the contiguous
    ids (:func:`id_keys`). Loaders of real data must pass them: the contiguous ids shift when a user is removed.
    """
    user_keys = stable_id_keys(list(user_ids)) if user_ids is not None else None
    item_keys = stable_id_keys(list(item_ids)) if item_ids is not None else None
    # what the split was keyed by (build_dataset stores the same keys)
    keys = {name: k for name, k in ((USER_KEYS, user_keys), (ITEM_KEYS, item_keys)) if k is not None}
    out = []
    for k in folds:  # a handful of folds
        train, test = holdout_indices(ratings, k, test_fraction, seed, user_keys, item_keys)
        fold = Fold(k, ratings.select(train), ratings.select(test), name=f"holdout-{k}")
        fold.train.meta.update(keys)
        fold.test.meta.update(keys)
        out.append(fold)
    return out
