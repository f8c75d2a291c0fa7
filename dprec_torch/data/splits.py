"""Fold selection and seeded random hold-out splits.

Wang & Tang (Sec. 5.1) use 5-fold cross validation. ML-100K ships its official
folds (u1..u5, read in :mod:`movielens`); every other dataset gets a seeded 90/10
hold-out repeated ``n_folds`` times. Each repetition draws an independent random
test set, so hold-outs may overlap (this is repeated random sub-sampling, not a
partition). Fold ``k`` is a pure function of ``(seed, k)``: ``fold=3`` alone is the
same split as the third fold of ``fold=all``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dprec_torch.data.ratings import Fold, Ratings
from dprec_torch.errors import ConfigError
from dprec_torch.seeding import make_generator

# purposes mixed into derived seeds, so a fold's split and its cap never share a stream
SPLIT_STREAM = 0
CAP_STREAM = 1


def derive_seed(seed: int, fold_index: int, stream: int) -> int:
    """A 63-bit seed for (``seed``, fold, purpose), independent across folds and purposes."""
    state = np.random.SeedSequence([int(seed) % 2**63, int(fold_index), int(stream)]).generate_state(2, dtype=np.uint32)
    return int(state[0]) << 31 | int(state[1]) >> 1


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


def holdout_indices(n: int, fold_index: int, test_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions of the train and test ratings of hold-out ``fold_index``, each in ascending order.

    The test set is ``round(test_fraction * n)`` ratings drawn uniformly without
    replacement (one ``randperm``, no loop).
    """
    frac = check_test_fraction(test_fraction)
    gen = make_generator(derive_seed(seed, fold_index, SPLIT_STREAM))
    perm = torch.randperm(n, generator=gen)
    is_test = torch.zeros(n, dtype=torch.bool)
    is_test[perm[: int(round(frac * n))]] = True
    # nonzero is O(n) and already ascending: cheaper than sorting the permutation's halves
    return torch.nonzero(~is_test).squeeze(1), torch.nonzero(is_test).squeeze(1)


def holdout_folds(ratings: Ratings, folds: list[int], test_fraction: float, seed: int) -> list[Fold]:
    """The selected hold-out folds of a whole dataset (shared id space, names ``holdout-k``)."""
    out = []
    for k in folds:  # a handful of folds
        train, test = holdout_indices(len(ratings), k, test_fraction, seed)
        out.append(Fold(k, ratings.select(train), ratings.select(test), name=f"holdout-{k}"))
    return out
