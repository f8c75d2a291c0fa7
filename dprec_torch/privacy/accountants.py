"""Privacy accountants behind one small interface (Opacus style):
``step(...)``, ``get_epsilon(delta)``, ``state_dict()`` / ``load_state_dict()``.

The optimizers notify their accountant through a hook after each step, so the
accounting never tangles with the update.
"""

from __future__ import annotations

import math
from typing import Any


def amplified_epsilon(epsilon: float, sampling_ratio: float) -> float:
    """Exact amplification of a pure eps-DP step by Poisson subsampling: ln(1 + gamma (e^eps - 1))."""
    if sampling_ratio >= 1:
        return epsilon
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
