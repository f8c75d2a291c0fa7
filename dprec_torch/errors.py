"""User-facing errors.

Every problem a user can fix (bad file, bad config value, missing data) raises :class:`DprecError` with a one-line
message that names the fix. The CLI entry points catch it, log the line and exit non-zero, so no torch traceback leaks.
"""

from __future__ import annotations


class DprecError(Exception):
    """An error the user can fix; ``str(err)`` is a single readable line."""


class DataError(DprecError):
    """Malformed, missing or out-of-range input data."""


class ConfigError(DprecError):
    """An invalid configuration value (epsilon <= 0, k <= 0, unknown choice...)."""


class TrainingDiverged(DprecError):
    """The loss became NaN or inf; the last good checkpoint is kept."""
