"""Wang & Tang's preprocessing: a minimum number of ratings per user and a per-user cap tau.

* Sec. 3 ("Preprocessing"): "we only put users who have more than 20 ratings in
  the training data" -> :func:`filter_min_user_ratings` (``data.min_user_ratings``
  is an *at least* count: the paper's "more than 20" is ``min_user_ratings=21``).
* Sec. 4.3: "To those users who rated more than tau items, we randomly remove
  some ratings thus to ensure that each user at most has tau ratings" (tau = 200)
  -> :func:`cap_user_ratings` (``data.max_user_ratings``). The cap bounds one
  user's contribution, which the user-level privacy accounting relies on.

The loaders apply both to the TRAIN side of each fold only, min-filter first,
then the cap; test sets are never touched, so every configuration is scored on
the same ratings (a filtered-out user becomes an unknown user at test time).
Both functions are vectorised (sort + rank within user, no loop over users) and
keep the id space (``n_users``, ``n_items``) unchanged.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import torch

from dprec_torch.data.ratings import Fold, RatingDataset, Ratings, RatingScale
from dprec_torch.data.splits import CAP_STREAM, derive_seed
from dprec_torch.errors import ConfigError, DataError
from dprec_torch.seeding import make_generator

log = logging.getLogger(__name__)


def _check_count(value: Any, key: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key}={value!r} is invalid: use an integer >= {minimum}")
    return value


def cap_user_ratings(ratings: Ratings, tau: int, generator: torch.Generator) -> tuple[Ratings, int]:
    """Keep at most ``tau`` ratings per user, chosen uniformly at random (Sec. 4.3).

    Every rating gets a random key; ratings are sorted by (user, key) and a rating
    is kept when its rank within its user is ``< tau``. So each user keeps exactly
    ``min(|R_u|, tau)`` ratings and, given the generator state, the result is
    deterministic. Returns ``(capped ratings in their original order, number dropped)``.
    Works on any device: keys are drawn on the generator's device and moved.
    """
    tau = _check_count(tau, "data.max_user_ratings (tau)", 1)
    n = len(ratings)
    if n == 0:
        return ratings.select(torch.zeros(0, dtype=torch.long, device=ratings.device)), 0
    keys = torch.rand(n, generator=generator, device=generator.device).to(ratings.device)
    by_key = torch.argsort(keys)
    order = by_key[torch.argsort(ratings.users[by_key], stable=True)]  # sorted by (user, key)
    counts = ratings.user_counts()
    first = torch.cumsum(counts, 0) - counts  # position of each user's first rating in `order`
    sorted_users = ratings.users[order]
    rank = torch.arange(n, device=ratings.device) - first[sorted_users]
    keep = torch.zeros(n, dtype=torch.bool, device=ratings.device)
    keep[order] = rank < tau
    kept = ratings.select(keep)
    return kept, n - len(kept)


def filter_min_user_ratings(ratings: Ratings, min_count: int) -> tuple[Ratings, int]:
    """Drop every rating of users with fewer than ``min_count`` ratings (Sec. 3).

    Returns ``(filtered ratings, number of ratings dropped)``; ``min_count=0`` keeps all.
    """
    min_count = _check_count(min_count, "data.min_user_ratings", 0)
    if min_count <= 1:  # every present user has >= 1 rating: a no-op (a shallow copy, no tensor copies)
        return replace(ratings, meta=dict(ratings.meta)), 0
    keep = ratings.user_counts()[ratings.users] >= min_count
    kept = ratings.select(keep)
    return kept, len(ratings) - len(kept)


def _n_users(r: Ratings) -> int:
    return int((r.user_counts() > 0).sum())


def preprocess_fold(
    fold: Fold, min_user_ratings: int = 0, max_user_ratings: int | None = None, seed: int = 0
) -> tuple[Fold, dict[str, int]]:
    """Min-filter then cap the TRAIN side of one fold; the test side is returned untouched."""
    train = fold.train
    stats = {"train_before": len(train)}
    train, dropped = filter_min_user_ratings(train, min_user_ratings)
    users_before = _n_users(fold.train)
    stats["min_filter_dropped_ratings"] = dropped
    stats["min_filter_dropped_users"] = users_before - _n_users(train)
    if max_user_ratings is not None:
        capped_users = int((train.user_counts() > max_user_ratings).sum())
        gen = make_generator(derive_seed(seed, fold.index, CAP_STREAM))
        train, dropped = cap_user_ratings(train, max_user_ratings, gen)
    else:
        capped_users, dropped = 0, 0
    stats["cap_dropped_ratings"] = dropped
    stats["capped_users"] = capped_users
    stats["train"] = len(train)
    stats["test"] = len(fold.test)
    return Fold(fold.index, train, fold.test, fold.name), stats


def build_dataset(
    name: str,
    folds: list[Fold],
    user_ids: list,
    item_ids: list,
    scale: RatingScale,
    min_user_ratings: int = 0,
    max_user_ratings: int | None = None,
    seed: int = 0,
    report: dict[str, Any] | None = None,
) -> RatingDataset:
    """Preprocess every selected fold's train side, reject empty splits, log and report the drops."""
    _check_count(min_user_ratings, "data.min_user_ratings", 0)
    if max_user_ratings is not None:
        _check_count(max_user_ratings, "data.max_user_ratings", 1)
    report = dict(report or {})
    report.update(
        dataset=name,
        n_users=len(user_ids),
        n_items=len(item_ids),
        scale=[scale.lo, scale.hi],
        preprocessing={"min_user_ratings": min_user_ratings, "max_user_ratings": max_user_ratings, "applied_to": "train"},
        folds={},
    )
    out = []
    for fold in folds:  # a handful of folds
        for side, part in (("train", fold.train), ("test", fold.test)):
            if len(part) == 0:
                raise DataError(f"{name} fold {fold.name}: the {side} set has no ratings; check the split files or data.test_fraction")
        fold, stats = preprocess_fold(fold, min_user_ratings, max_user_ratings, seed)
        if len(fold.train) == 0:
            raise DataError(
                f"{name} fold {fold.name}: the train set is empty after preprocessing "
                f"(data.min_user_ratings={min_user_ratings}); lower data.min_user_ratings"
            )
        fold.train.meta.update(dataset=name, fold=fold.name, side="train")
        fold.test.meta.update(dataset=name, fold=fold.name, side="test")
        report["folds"][fold.name] = stats
        log.info(
            "%s %s: train %d, test %d ratings; min_user_ratings=%d dropped %d ratings (%d users); "
            "max_user_ratings=%s dropped %d ratings (%d users capped)",
            name, fold.name, stats["train"], stats["test"], min_user_ratings, stats["min_filter_dropped_ratings"],
            stats["min_filter_dropped_users"], max_user_ratings, stats["cap_dropped_ratings"], stats["capped_users"],
        )  # fmt: skip
        out.append(fold)
    return RatingDataset(name, out, list(user_ids), list(item_ids), scale, report)
