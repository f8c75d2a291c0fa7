"""Canary audit of a fitted joint-DP predictor (``scripts/audit.py`` drives trainable models only; this drives ``fit``).

Same design as :mod:`dprec_torch.audit.runner` (canaries from :func:`make_canaries`, the guess rule and the
Clopper-Pearson bound from :mod:`dprec_torch.audit.bounds`). What the adversary sees is what joint DP releases: the
item-side state. The canary owner's own side is recomputed from the auditor's KNOWN histories (``personalise``: every
canary rating present, whether or not it was in the training data), so the score measures the leak through the released
statistics only, never the owner reading their own rating.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch

from dprec_torch.audit.bounds import epsilon_lower_bound, guesses
from dprec_torch.audit.canaries import make_canaries
from dprec_torch.data.ratings import Ratings
from dprec_torch.errors import ConfigError


@dataclass
class FittedAudit:
    epsilon_claimed: float
    epsilon_lower_bound: float
    trials: int
    canaries: int
    canary_kind: str
    correct: int
    guesses: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def audit_fitted(make: Callable[[int], Any], base: Ratings, kind: str, trials: int = 40, canaries: int = 20,
                 history: int = 5, guess_fraction: float = 0.25, alpha: float = 0.05, seed: int = 0) -> FittedAudit:
    """``make(seed)`` returns an unfitted predictor with ``fit``, ``personalise``, ``predict`` and ``privacy_report``."""
    if trials < 1 or canaries < 2:
        raise ConfigError(f"audit needs trials >= 1 and canaries >= 2, got {trials}, {canaries}")
    cs = make_canaries(base, canaries, kind, history, seed)
    known = cs.known()
    gen = torch.Generator().manual_seed(int(seed) + 7919)
    scores, included, claimed = [], [], math.nan
    for t in range(trials):  # independent releases
        inc = torch.rand(cs.m, generator=gen) < 0.5
        model = make(int(seed) + 1000 * (t + 1)).fit(cs.dataset(inc))
        claimed = float(model.privacy_report().get("epsilon", math.nan))
        model.personalise(known)
        pred = model.predict(cs.target_user, cs.target_item).double()
        scores.append(-(pred - cs.target_value).abs())
        included.append(inc)
    s, inc = torch.stack(scores), torch.stack(included)
    k = max(1, int(round(guess_fraction * cs.m)))
    correct, made = guesses(s, inc, k)
    return FittedAudit(claimed, epsilon_lower_bound(correct, made, alpha), trials, cs.m, kind, correct, made)
