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


def check_epsilon_delta(epsilon: float, delta: float, what: str) -> tuple[float, float]:
    """(epsilon, delta) of a Gaussian release: epsilon as :func:`check_epsilon`; a finite epsilon needs 0 < delta < 1."""
    eps = check_epsilon(epsilon, what)
    try:
        dlt = float(delta)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{what}: delta={delta!r} is not a number; pass e.g. delta=1e-6") from err
    if math.isfinite(eps) and not 0 < dlt < 1:
        raise ConfigError(f"{what}: delta={delta} must be in (0, 1) for a Gaussian release (inf epsilon = no noise)")
    return eps, dlt
