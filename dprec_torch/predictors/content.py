"""User-side weights on public item features (joint DP: computed by each user from their own ratings, never released).

With public item features phi_i (:mod:`dprec_torch.data.item_features`), user u's weights are the ridge solution

    q_u = (Phi_Ru^T Phi_Ru + lambda I)^-1 Phi_Ru^T y_u,

and a model's learned item-side part then reads the residuals y_u - Phi_Ru q_u. q_u is a function of u's own
ratings and public data only, so every per-user contribution (and its clipping) is still a function of that user alone.
"""

from __future__ import annotations

import logging

import torch

from dprec_torch.data.item_features import ITEM_FEATURES, ItemFeatures, item_features_of
from dprec_torch.data.ratings import Ratings
from dprec_torch.errors import ConfigError
from dprec_torch.predictors.dpals import solve_rows

log = logging.getLogger(__name__)

#: the values of a predictor's ``item_features``: ``auto`` = on when the dataset has a catalogue attached
ITEM_FEATURE_SETTINGS = (True, False, "auto")


def check_item_features(value: bool | str, who: str) -> bool | str:
    """``true``, ``false`` or ``auto`` (the string), else one readable :class:`ConfigError`."""
    if isinstance(value, bool) or value == "auto":
        return value
    raise ConfigError(f"{who}: item_features={value!r} is invalid: it must be true, false or auto (auto = on when the "
                      "dataset has a public catalogue attached)")


def resolve_item_features(setting: bool | str, train: Ratings, who: str) -> ItemFeatures | None:
    """The public item features a fit reads: ``true`` -> the attached ones (or one readable DataError), ``false`` ->
    None, ``auto`` -> the attached ones when the dataset has a catalogue, else None; ``auto`` logs which, once."""
    if setting == "auto":
        if train.meta.get(ITEM_FEATURES) is None:
            log.info("%s: item_features=auto -> off: the dataset has no public catalogue attached (data=custom: set "
                     "data.catalog_path)", who)
            return None
        features = item_features_of(train, who)
        log.info("%s: item_features=auto -> on: %d public item features from %s", who, features.matrix.shape[1],
                 features.source)
        return features
    return item_features_of(train, who) if setting else None


def feature_weights(train: Ratings, y: torch.Tensor, features: ItemFeatures, reg: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(q_u for every user ``[N, F]``, the residual y_ui - q_u . phi_i per rating ``[R]``), in ``y``'s dtype."""
    phi = features.matrix.to(y.device, y.dtype)
    q = solve_rows(train.indicator_csr().to(y.dtype), train.csr(y), phi, reg)
    return q, y - (q[train.users] * phi[train.items]).sum(1)


#: what a privacy report's ``joint_dp`` line adds when a model reads public item features
JOINT_DP_SUFFIX = "; with item_features, u's weights on the public item features too"


def public_features_text(features: ItemFeatures | None, reg: float, how: str = "") -> str | None:
    """The privacy report's ``public_item_features`` entry (None without features)."""
    if features is None:
        return None
    return (features.describe() + f"; each user fits their own weights q_u on them (ridge {reg:g}) from their own "
            "ratings, never released (joint DP)" + how)
