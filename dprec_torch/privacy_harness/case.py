"""What one sensitivity case is: the types every case module builds and :mod:`.registry` collects (registration
runs one way: :mod:`.registry`'s docstring), and the public inputs the case modules share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from dprec_torch.data.ratings import Ratings
from dprec_torch.errors import ConfigError

RELATIONS = ("user", "rating", "rating_value", "score_entry")


@dataclass
class Release:
    """What a mechanism releases before its noise: ``total`` (flattened, float64) and the per-unit
    clipped contributions ``units`` ([n_units, len(total)], or None where nothing is clipped per unit)."""

    total: torch.Tensor
    units: torch.Tensor | None = None
    stated: float | None = None  # the sensitivity the mechanism OBJECT calibrates its noise to (checked == the case's)


@dataclass(frozen=True)
class SensitivityCase:
    """One configuration of a mechanism and the sensitivity it claims (see :mod:`.registry`'s docstring)."""

    name: str
    relation: str
    norm: float  # p of both bounds (1, 2 or math.inf)
    sensitivity: float  # Delta: ||total(D) - total(D')||_p for neighbours D, D'
    release: Callable[[Any, int], Release]
    clip_bound: float | None = None  # c: ||unit contribution||_p (None: no per-unit clipping)
    also_change: bool = False  # relation=rating also covers changing a rating's value
    tau: int | None = None  # users capped at tau ratings before the release
    max_items: int = 12  # the harness draws datasets with at most this many items
    sensitivity_for: Callable[[int], float] | None = None  # Delta as a function of the (public) n_items, if it depends

    def claimed(self, n_items: int) -> float:
        """The case's Delta on a dataset of ``n_items`` items."""
        return float(self.sensitivity_for(n_items)) if self.sensitivity_for is not None else float(self.sensitivity)

    def __post_init__(self) -> None:
        if self.relation not in RELATIONS:
            raise ConfigError(f"SensitivityCase.relation must be one of {RELATIONS}, got '{self.relation}'")


Builder = Callable[[], list[SensitivityCase]]


def public_means(data: Ratings, seed: int) -> torch.Tensor:
    """Item means drawn from {lo, mid, hi, lo + span/4} (public: independent of the ratings)."""
    lo, hi = float(data.scale.lo), float(data.scale.hi)
    choices = torch.tensor([lo, (lo + hi) / 2, hi, lo + (hi - lo) / 4])
    return choices[torch.randint(0, 4, (data.n_items,), generator=torch.Generator().manual_seed(int(seed) + 1))]


def unit_rows(data: Ratings, per_unit: str, fn: Callable[[Ratings], torch.Tensor]) -> torch.Tensor:
    """``fn`` applied to each unit's own data (one user, or one rating), stacked; ``select`` keeps ``meta``, so a
    unit's sample is keyed by the raw ids as in the whole release."""
    if per_unit == "user":
        return torch.stack([fn(data.select(data.users == u)) for u in range(data.n_users)])
    idx = torch.arange(len(data))
    return torch.stack([fn(data.select(idx == k)) for k in range(len(data))])
