"""``mechanism=none`` (``conf/mechanism/none.yaml``): no privacy mechanism.

A trained model (PNBM, MF) is trained by :class:`NoMechanism`: MAP training by SGD on Eq. (3)/(4), no clipping and no
noise (:class:`~dprec_torch.mechanisms.sgd.MapSGD`'s update, with the beta trick of Alg. 1; epsilon = inf). A fitted
predictor (kNN, Slope One, ...) has nothing to train: the runner fits it and releases it as it is, because this class
is a :class:`~dprec_torch.interfaces.LeavesPredictorAsFitted` (its ``lr``, ``epochs``, ... are then not read).
"""

from __future__ import annotations

import math

from dprec_torch.interfaces import LeavesPredictorAsFitted
from dprec_torch.mechanisms.sgd import MapSGD


class NoMechanism(MapSGD, LeavesPredictorAsFitted):
    """``mechanism=none``: :class:`MapSGD` as it is for a trained model; nothing at all for a fitted predictor."""

    name = "none"

    def elementwise_residual_clip(self) -> float | None:
        """No clipping (inf), unless ``rating_reg`` or ``per_rating_step`` make ``clip_residuals`` do more (None)."""
        plain = type(self).clip_residuals is MapSGD.clip_residuals and not self.rating_reg and not self.per_rating_step
        return math.inf if plain else None
