"""Opacus's RDP / PRV accountants behind our accountant interface.

Same shape as :mod:`dprec_torch.privacy.accountants`: ``step(...)``,
``get_epsilon(delta)``, ``state_dict()`` / ``load_state_dict()``. The epsilon is
whatever Opacus computes for the recorded history of (noise multiplier sigma,
Poisson sampling rate q, number of steps) of the subsampled Gaussian mechanism:

* ``rdp``: Renyi-DP of the Poisson-subsampled Gaussian mechanism (Mironov et al.
  2019), composed over steps and converted to (eps, delta) by Opacus's
  ``RDPAccountant``, minimised over :data:`RDP_ORDERS` = Opacus's default orders
  (1.1 ... 63) plus 64 ... 1024. The conversion adds log(1/delta)/(alpha - 1), so the
  default orders alone cannot certify eps < log(1/delta)/62 (0.22 at delta = 1e-6);
  extra orders only add candidates to a minimum, every one of them a valid bound;
* ``prv``: numerical composition of privacy random variables (Gopi et al. 2021;
  Opacus's ``PRVAccountant``), tighter, with Opacus's default ``eps_error``.

Calibrating sigma to a target (eps, delta) under these accountants is
:func:`dprec_torch.privacy.calibration.calibrate_gaussian` (its ``search="opacus"`` is Opacus's ``get_noise_multiplier``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from opacus.accountants import RDPAccountant, create_accountant

from dprec_torch.errors import ConfigError

ACCOUNTANTS = ("rdp", "prv")
#: how a privacy report names each accountant
ACCOUNTANT_TEXT = {"rdp": "RDP (Poisson-subsampled Gaussian, Mironov et al. 2019)",
                   "prv": "PRV (numerical composition of privacy random variables, Gopi et al. 2021; an upper bound)"}
#: RDP orders: Opacus's defaults plus larger ones (needed for small epsilon at small delta)
RDP_ORDERS: list[float] = list(RDPAccountant.DEFAULT_ALPHAS) + [64, 80, 96, 128, 160, 192, 256, 384, 512, 768,
                                                               1024]


def _epsilon_kwargs(mechanism: str) -> dict[str, Any]:
    return {"alphas": RDP_ORDERS} if mechanism == "rdp" else {}


def _check(mechanism: str) -> str:
    if mechanism not in ACCOUNTANTS:
        raise ConfigError(f"mechanism.accountant must be one of {ACCOUNTANTS}, got '{mechanism}'")
    return mechanism


class OpacusAccountant:
    """Thin wrapper: ``step(noise_multiplier, sample_rate, steps)`` then ``get_epsilon(delta)``."""

    def __init__(self, mechanism: str = "rdp") -> None:
        self.mechanism = _check(mechanism)
        self._acc = create_accountant(mechanism=self.mechanism)

    def step(self, noise_multiplier: float, sample_rate: float, steps: int = 1) -> None:
        """Record ``steps`` applications of the Poisson-subsampled Gaussian mechanism."""
        if steps == 1:
            self._acc.step(noise_multiplier=float(noise_multiplier), sample_rate=float(sample_rate))
            return
        hist = self._acc.history
        if hist and hist[-1][:2] == (float(noise_multiplier), float(sample_rate)):
            hist[-1] = (hist[-1][0], hist[-1][1], hist[-1][2] + int(steps))
        else:
            hist.append((float(noise_multiplier), float(sample_rate), int(steps)))

    def get_epsilon(self, delta: float) -> float:
        """Opacus's epsilon for the history so far (0 before any step, inf with sigma = 0)."""
        if not self._acc.history:
            return 0.0
        if any(sigma <= 0 for sigma, _, _ in self._acc.history):
            return math.inf
        with np.errstate(divide="ignore"):  # PRV at q = 1 takes log(1 - q) = -inf on a branch np.where discards
            return float(self._acc.get_epsilon(delta=delta, **_epsilon_kwargs(self.mechanism)))

    @property
    def history(self) -> list[tuple[float, float, int]]:
        return list(self._acc.history)

    @property
    def steps(self) -> int:
        return sum(n for _, _, n in self._acc.history)

    def state_dict(self) -> dict[str, Any]:
        return {"mechanism": self.mechanism, "history": [tuple(h) for h in self._acc.history]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mechanism = _check(state.get("mechanism", self.mechanism))
        self._acc = create_accountant(mechanism=self.mechanism)
        self._acc.history = [tuple(h) for h in state["history"]]  # type: ignore[misc]
