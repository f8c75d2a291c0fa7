"""A validation split carved from a fold's TRAIN side, for honest hyperparameter tuning.

Choosing hyperparameters by the test RMSE of many runs makes the reported test RMSE optimistic
(and, for a private model, the choice itself depends on the test data). Tune on
``validation_fold(fold, fraction, seed)`` instead: its train is the fold's train minus a seeded
``fraction`` of its ratings, its test is those ratings; the real test set is never read. Report
the test RMSE once, with the chosen hyperparameters, on the original fold.

The hold-out is drawn per user (each user with at least 2 training ratings gives
round(fraction x |R_u|) of them, at least 1, never all), so every validation user keeps a
history for Eq. (2). Privacy note: tuning runs train on the same users, so their epsilons add
up in the privacy ledger (:mod:`dprec_torch.privacy.ledger`) like any other run's.

``python train.py data=ml-100k-val`` (conf/data/ml-100k-val.yaml) selects this split through
:func:`with_validation`, which wraps any dataset loader.
"""

from __future__ import annotations

from typing import Any

import torch

from dprec_torch.data.ratings import Fold, RatingDataset
from dprec_torch.errors import ConfigError
from dprec_torch.seeding import make_generator

VALIDATION_SUFFIX = "+validation"


def validation_fold(fold: Fold, fraction: float = 0.1, seed: int = 0) -> Fold:
    """A Fold whose train/test are both carved from ``fold.train`` (``fold.test`` is never touched)."""
    if not 0 < float(fraction) < 1:
        raise ConfigError(f"validation fraction must be strictly between 0 and 1, got {fraction}")
    train = fold.train
    n = len(train)
    gen = make_generator(int(seed) * 1_000_003 + int(fold.index))
    key = torch.rand(n, generator=gen, dtype=torch.float64).to(train.device)
    order = torch.argsort(train.users.double() + key)  # by user, then by a random key within the user
    counts = torch.bincount(train.users, minlength=train.n_users)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.empty(n, dtype=torch.long, device=train.device)
    rank[order] = torch.arange(n, device=train.device) - starts[train.users[order]]
    take = torch.round(counts.double() * float(fraction)).long().clamp_min(1)
    take = torch.where(counts >= 2, torch.minimum(take, counts - 1), torch.zeros_like(take))
    is_val = rank < take[train.users]
    return Fold(fold.index, train.select(~is_val), train.select(is_val), name=f"{fold.name}{VALIDATION_SUFFIX}")


def with_validation(dataset: RatingDataset, fraction: float = 0.1, seed: int = 0) -> RatingDataset:
    """The same dataset with every fold replaced by its validation fold (name gets ``+validation``)."""
    folds = [validation_fold(f, fraction, seed) for f in dataset.folds]
    report: dict[str, Any] = dict(dataset.report)
    report["validation"] = {"fraction": float(fraction), "seed": int(seed)}
    return RatingDataset(dataset.name + VALIDATION_SUFFIX, folds, dataset.user_ids, dataset.item_ids, dataset.scale, report)
