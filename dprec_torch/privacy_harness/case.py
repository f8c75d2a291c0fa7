"""What one sensitivity case is: the types every case module builds and :mod:`.registry` collects.

Registration runs one way: a case module (``sensitivity_cases``, ``learned_similarity_cases``,
``lowrank_pnbm_cases``, ``preprocessing``) imports these types and exports its cases as a table
(``SENSITIVITY_CASES``: a class's qualified name -> the builder of its cases; ``NON_PRIVATE``: qualified name ->
why it reports no finite epsilon); the registry imports the case modules and reads their tables. No case module
imports the registry, and a case module imports the classes it checks only inside its builders, so reading the
tables (the runner's claim check) stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

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
