"""Public per-fold seeds of the data layer: ``derive_seed(seed, fold, purpose)``.

The hold-out split (:mod:`.splits`), the tau cap (:mod:`.preprocess`) and the validation split (:mod:`.validation`)
each hash ratings with a seed derived here from ``data.seed`` (public: a split is not a secret, it only has to be a
per-user function), one stream per purpose so no two of them share keys. Its own module so that :mod:`.splits` can
use :mod:`.preprocess`'s per-rating hash without an import cycle.
"""

from __future__ import annotations

import numpy as np

# purposes mixed into derived seeds, so a fold's split, its cap and its validation split never share a stream
SPLIT_STREAM = 0
CAP_STREAM = 1
VALIDATION_STREAM = 2


def derive_seed(seed: int, fold_index: int, stream: int) -> int:
    """A 63-bit seed for (``seed``, fold, purpose), independent across folds and purposes."""
    state = np.random.SeedSequence([int(seed) % 2**63, int(fold_index), int(stream)]).generate_state(2, dtype=np.uint32)
    return int(state[0]) << 31 | int(state[1]) >> 1
