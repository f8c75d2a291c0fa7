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

Keyed by raw ids: u's held-out ratings are the ones of smallest
:func:`~dprec_torch.data.preprocess.rating_keys` hash of (``derive_seed(seed, fold, VALIDATION_STREAM)``, u's raw id
key, the item's raw id key) -- ties by item key --, the keys the loaders store in ``Ratings.meta``. So u's validation
ratings depend on (seed, fold, u's raw id, u's own training ratings) only: *other users' ratings stay put when one
user is added or removed*, even when the id map is rebuilt without that user. Vectorised; any device.

``python train.py data=ml-100k-val`` (conf/data/ml-100k-val.yaml) selects this split through
:func:`with_validation`, which wraps any dataset loader.
"""

from __future__ import annotations

import torch

from dprec_torch.data.preprocess import rank_within_user, rating_keys
from dprec_torch.data.ratings import Fold, RatingDataset
from dprec_torch.data.splits import id_keys
from dprec_torch.data.streams import VALIDATION_STREAM, derive_seed
from dprec_torch.errors import ConfigError

VALIDATION_SUFFIX = "+validation"


def validation_fold(fold: Fold, fraction: float = 0.1, seed: int = 0) -> Fold:
    """A Fold whose train/test are both carved from ``fold.train`` (``fold.test`` is never touched)."""
    if not 0 < float(fraction) < 1:
        raise ConfigError(f"validation fraction must be strictly between 0 and 1, got {fraction}")
    train = fold.train
    uk, ik = id_keys(train)  # raw-id keys from train.meta (build_dataset stores them), else the contiguous ids
    key = rating_keys(derive_seed(int(seed), int(fold.index), VALIDATION_STREAM), uk, ik, train.users, train.items)
    rank = rank_within_user(train, key, ik)  # by (user, key, item key)
    counts = train.user_counts()
    take = torch.round(counts.double() * float(fraction)).long().clamp_min(1)
    take = torch.where(counts >= 2, torch.minimum(take, counts - 1), torch.zeros_like(take))
    is_val = rank < take[train.users]
    return Fold(fold.index, train.select(~is_val), train.select(is_val), name=f"{fold.name}{VALIDATION_SUFFIX}")


def with_validation(dataset: RatingDataset, fraction: float = 0.1, seed: int = 0) -> RatingDataset:
    """The same dataset with every fold replaced by its validation fold (name gets ``+validation``)."""
    folds = [validation_fold(f, fraction, seed) for f in dataset.folds]
    report = {**dataset.report, "validation": {"fraction": float(fraction), "seed": int(seed)}}
    return RatingDataset(dataset.name + VALIDATION_SUFFIX, folds, dataset.user_ids, dataset.item_ids, dataset.scale, report)
