"""User-side weights on public item features (joint DP: computed by each user from their own ratings, never released).

With public item features phi_i (:mod:`dprec_torch.data.item_features`), user u's weights are the ridge solution

    q_u = (Phi_Ru^T Phi_Ru + lambda I)^-1 Phi_Ru^T y_u,

and a model's learned item-side part then reads the residuals y_u - Phi_Ru q_u. q_u is a function of u's own ratings
and public data only, so every per-user contribution (and its clipping) is still a function of that user alone.
"""

from __future__ import annotations

import logging

import torch

from dprec_torch.data.item_features import ITEM_FEATURES, ItemFeatures, item_features_of
from dprec_torch.data.ratings import Ratings, _to_csr
from dprec_torch.errors import ConfigError

log = logging.getLogger(__name__)

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


def feature_systems(rows: torch.Tensor, items: torch.Tensor, y: torch.Tensor, features: ItemFeatures, reg: float,
                    n_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's ridge system (sum_{i in row r} phi_i phi_i^T + reg I ``[n_rows, F, F]``, sum_i y_ri phi_i
    ``[n_rows, F]``) for the ratings (rows, items, y), in ``y``'s dtype; a row's system reads that row's ratings only."""
    phi = features.matrix.to(y.device, y.dtype)
    n_items, f = phi.shape

    def csr(v: torch.Tensor) -> torch.Tensor:
        return _to_csr(rows, items, v, n_rows, n_items)

    outer = (phi[:, :, None] * phi[:, None, :]).reshape(n_items, f * f)
    a = (csr(torch.ones_like(y)) @ outer).reshape(-1, f, f) + reg * torch.eye(f, device=y.device, dtype=y.dtype)
    return a, csr(y) @ phi


def feature_weights(train: Ratings, y: torch.Tensor, features: ItemFeatures, reg: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(q_u for every user ``[N, F]``, the residual y_ui - q_u . phi_i per rating ``[R]``), in ``y``'s dtype: the
    batched ridge solve q_u = (sum_{i in R_u} phi_i phi_i^T + reg I)^-1 sum_i y_ui phi_i."""
    a, rhs = feature_systems(train.users, train.items, y, features, reg, train.n_users)
    q = torch.linalg.solve(a, rhs.unsqueeze(-1)).squeeze(-1)
    return q, y - (q[train.users] * features.matrix.to(y.device, y.dtype)[train.items]).sum(1)


#: what a privacy report's ``joint_dp`` line adds when a model reads public item features
JOINT_DP_SUFFIX = "; with item_features, u's weights on the public item features too"


def public_features_text(features: ItemFeatures | None, reg: float, how: str = "") -> str | None:
    """The privacy report's ``public_item_features`` entry (None without features)."""
    if features is None:
        return None
    return (features.describe() + f"; each user fits their own weights q_u on them (ridge {reg:g}) from their own "
            "ratings, never released (joint DP)" + how)
