"""Privacy accountants behind one small interface (Opacus's ``IAccountant``):
``step(...)``, ``get_epsilon(delta)``, ``steps``, ``state_dict()`` / ``load_state_dict()``.

A mechanism holds its accountant in ONE attribute, ``MechanismOptimizer.accountant``; the base class saves and
restores it with the optimizer's state (so a resumed run keeps the epsilon it has spent) and the checkpoint loader
refuses a checkpoint that lacks it. Implementations: :class:`PureDPAccountant` (Laplace steps, below) and
:class:`dprec_torch.privacy.opacus_accounting.OpacusAccountant` (Gaussian steps, RDP/PRV).

Several whole releases about the same people (the fold models of a ``data.fold=all`` run, a sweep's jobs on
one dataset) compose by :func:`dprec_torch.privacy.ledger.joint_epsilon`, by the accountant their reports name.
"""

from __future__ import annotations

import math
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Accountant(Protocol):
    """What every accountant offers (the shape of Opacus's ``IAccountant``)."""

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Record one (or ``steps``) applications of the mechanism."""

    def get_epsilon(self, delta: float) -> float:
        """The epsilon of the history recorded so far (at ``delta``; pure-DP accountants ignore it)."""

    @property
    def steps(self) -> int:
        """The number of recorded steps."""

    def state_dict(self) -> dict[str, Any]:
        """The recorded history, picklable (saved in every checkpoint)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the history by a saved one."""


def amplified_epsilon(epsilon: float, sampling_ratio: float) -> float:
    """Exact amplification of a pure eps-DP step by Poisson subsampling: ln(1 + q (e^eps - 1)) (q >= 1: none).
    The package's one definition (privacy/analysis.py re-exports it)."""
    if sampling_ratio >= 1 or math.isinf(epsilon):
        return float(epsilon)
    return math.log1p(sampling_ratio * math.expm1(epsilon))


class PureDPAccountant:
    """Basic composition of pure-DP steps, with two views of subsampling.

    ``get_epsilon()`` uses the exact amplification ln(1 + gamma (e^eps - 1)) per step;
    ``get_linear_epsilon()`` uses the linear bound gamma * eps per step that Wang &
    Tang's Theorem 1 relies on (looser, and not a valid bound for large eps).
    """

    mechanism = "pure-dp"

    def __init__(self) -> None:
        self.history: list[tuple[float, float, int]] = []  # (eps per step, sampling ratio, steps)

    def step(self, epsilon: float, sampling_ratio: float = 1.0, steps: int = 1) -> None:
        if self.history and self.history[-1][:2] == (epsilon, sampling_ratio):
            e, q, n = self.history[-1]
            self.history[-1] = (e, q, n + steps)
        else:
            self.history.append((epsilon, sampling_ratio, steps))

    def get_epsilon(self, delta: float = 0.0) -> float:
        return sum(n * amplified_epsilon(e, q) for e, q, n in self.history)

    def get_linear_epsilon(self) -> float:
        return sum(n * e * q for e, q, n in self.history)

    @property
    def steps(self) -> int:
        return sum(n for _, _, n in self.history)

    def state_dict(self) -> dict[str, Any]:
        return {"history": list(self.history)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = [tuple(h) for h in state["history"]]  # type: ignore[misc]
