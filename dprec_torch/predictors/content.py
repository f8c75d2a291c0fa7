"""User-side weights on public item features (joint DP: computed by each user from their own ratings, never released).

With public item features phi_i (:mod:`dprec_torch.data.item_features`), user u's weights are the ridge solution

    q_u = (Phi_Ru^T Phi_Ru + lambda I)^-1 Phi_Ru^T y_u,

and a model's learned item-side part then reads the residuals y_u - Phi_Ru q_u. q_u is a function of u's own
ratings and public data only, so every per-user contribution (and its clipping) is still a function of that user alone.
"""

from __future__ import annotations

import torch

from dprec_torch.data.item_features import ItemFeatures
from dprec_torch.data.ratings import Ratings
from dprec_torch.predictors.dpals import solve_rows


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
