"""Validation of privacy budgets shared by every mechanism and built-in private model."""

from __future__ import annotations

import math

from dprec_torch.errors import ConfigError


def check_epsilon(epsilon: float, what: str) -> float:
    """epsilon must be a positive number (``inf`` = non-private); returns it as a float."""
    try:
        eps = float(epsilon)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{what}: epsilon={epsilon!r} is not a number; pass e.g. epsilon=1 (inf = non-private)") from err
    if math.isnan(eps) or eps <= 0:
        raise ConfigError(f"{what}: epsilon={epsilon} must be > 0 (inf = non-private)")
    return eps
