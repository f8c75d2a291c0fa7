"""Opacus's RDP / PRV accountants behind the interface of :mod:`dprec_torch.privacy.accountants`: the epsilon is
whatever Opacus computes for the recorded history of (noise multiplier sigma, Poisson sampling rate q, number of steps)
of the subsampled Gaussian mechanism, under ``rdp`` or ``prv`` as :mod:`dprec_torch.privacy.calibration` states them
(its :func:`~dprec_torch.privacy.calibration.calibrate_gaussian` calibrates sigma to a target (eps, delta)).

``rdp`` is minimised over :data:`RDP_ORDERS` = Opacus's default orders (1.1 ... 63) plus 64 ... 1024. The conversion
adds log(1/delta)/(alpha - 1), so the default orders alone cannot certify eps < log(1/delta)/62 (0.22 at delta = 1e-6);
extra orders only add candidates to a minimum, every one of them a valid bound. ``prv`` (tighter) runs with Opacus's
default ``eps_error``.
"""
from __future__ import annotations

from typing import Any

from dprec_torch.errors import ConfigError
# RDP orders and Opacus's own figure live with every other call of Opacus's analysis (privacy/calibration.py)
from dprec_torch.privacy.calibration import OPACUS_DEFAULT_ALPHAS, RDP_ORDERS, gaussian_epsilon, opacus_epsilon  # noqa: F401

ACCOUNTANTS = ("rdp", "prv")
#: how a privacy report names each accountant
ACCOUNTANT_TEXT = {"rdp": "RDP (Poisson-subsampled Gaussian, Mironov et al. 2019)",
                   "prv": "PRV (numerical composition of privacy random variables, Gopi et al. 2021; an upper bound)"}


def _check(mechanism: str) -> str:
    if mechanism not in ACCOUNTANTS:
        raise ConfigError(f"mechanism.accountant must be one of {ACCOUNTANTS}, got '{mechanism}'")
    return mechanism


class OpacusAccountant:
    """Thin wrapper: ``step(noise_multiplier, sample_rate, steps)`` then ``get_epsilon(delta)``. It keeps the history
    of (sigma, q, steps) as Opacus's accountants do, and asks :func:`~dprec_torch.privacy.calibration.gaussian_epsilon`
    for the figure: Opacus's answer (``rdp``: the same sum of ``compute_rdp`` per entry and ``get_privacy_spent``;
    ``prv``: :func:`opacus_epsilon`), memoised in memory and on disk, so a figure computed before imports no Opacus."""

    def __init__(self, mechanism: str = "rdp") -> None:
        self.mechanism = _check(mechanism)
        self._history: list[tuple[float, float, int]] = []

    def step(self, noise_multiplier: float, sample_rate: float, steps: int = 1) -> None:
        """Record ``steps`` applications of the Poisson-subsampled Gaussian mechanism (merged into the last entry when
        (sigma, q) repeats, as Opacus's accountants record steps)."""
        entry = (float(noise_multiplier), float(sample_rate))
        if self._history and self._history[-1][:2] == entry:
            self._history[-1] = (*entry, self._history[-1][2] + int(steps))
        else:
            self._history.append((*entry, int(steps)))

    def get_epsilon(self, delta: float) -> float:
        """Opacus's epsilon for the history so far (0 before any step, inf with sigma = 0)."""
        return gaussian_epsilon(self._history, delta, self.mechanism)

    @property
    def history(self) -> list[tuple[float, float, int]]:
        return list(self._history)

    @property
    def steps(self) -> int:
        return sum(n for _, _, n in self._history)

    def state_dict(self) -> dict[str, Any]:
        return {"mechanism": self.mechanism, "history": [tuple(h) for h in self._history]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mechanism = _check(state.get("mechanism", self.mechanism))
        self._history = [(float(s), float(q), int(n)) for s, q, n in state["history"]]
