"""The epsilon-Linearly Ideal Adversary (LIA) and the epsilon-Risk / epsilon-Utility curves (Park & Acharya 2011, Sec.
3.3, Definitions 4-6, Theorems 3.3-3.4).

Model-agnostic: any model whose released value is affine in one secret record given side information can be attacked.
The model supplies ``(a, b, truth)`` (for Slope One, Theorem 3.3: ``a = |r_i.|``,
``b = -(sum_k s_jk + sum_{k != l} r_ik)``, truth ``r_il``) through a
``lia_side_information(users, query_items, target_items)`` method, and a release function supplies ``A^eps``. Then

* Eq. (22): ``LIA(A^eps) = a * A^eps + b``; with ``A^eps = f + Lap(Delta f/eps)`` this is ``truth + a * delta`` (Eq.
  (25)), exact at eps = inf.
* A guess is a hit when ``|LIA - truth| < tolerance`` (0.5 on an integer rating scale: the attacker rounds to the
  nearest rating; an estimate off the scale is a miss, so accuracy tends to 0 as eps -> 0, as in the paper's Fig.
  1b).
* Definition 5, epsilon-Risk ``= E[Pr[d = LIA(A^eps)]]``: the mean hit rate; with Laplace noise of scale b the
  per-target probability is exactly ``1 - exp(-tolerance / (|a| b))`` (:func:`lia_hit_probability`), which we report
  next to the empirical rate.
* Definition 6, epsilon-Utility ``= 1 - dist(A^eps, A^inf) / max dist``: with ``dist`` the top-N difference (fraction
  of the non-private top N that the private top N misses, Fig. 1a) the maximum is 1, so utility = 1 - top-N
  difference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from dprec_torch.errors import DataError


class LinearlyAttackable(Protocol):
    """A model that can state LIA side information for (user, released item, attacked item) triples."""

    def lia_side_information(self, users: torch.Tensor, query_items: torch.Tensor,
                             target_items: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


@dataclass
class LIAResult:
    """Per-target estimates and the attack's summary numbers."""

    estimate: torch.Tensor  # [Q] LIA output, Eq. (22)
    truth: torch.Tensor  # [Q] the secret record
    hits: torch.Tensor  # [Q] bool, |estimate - truth| < tolerance
    hit_probability: torch.Tensor | None  # [Q] exact Pr[hit] under Laplace noise (None if unknown)

    @property
    def accuracy(self) -> float:
        """Empirical attack accuracy (the paper's Fig. 1b)."""
        return float(self.hits.double().mean()) if self.hits.numel() else float("nan")

    @property
    def risk(self) -> float:
        """epsilon-Risk (Definition 5) from the exact per-target probabilities, else the empirical rate."""
        if self.hit_probability is None:
            return self.accuracy
        return float(self.hit_probability.mean()) if self.hit_probability.numel() else float("nan")


def lia_estimate(released: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Eq. (22): ``LIA(A) = a * A + b``."""
    if released.shape != a.shape or a.shape != b.shape:
        raise DataError(f"LIA: released {tuple(released.shape)}, a {tuple(a.shape)} and b {tuple(b.shape)} must have one shape")
    return a.double() * released.double() + b.double()


def lia_hit_probability(a: torch.Tensor, noise_scale: float, tolerance: float) -> torch.Tensor:
    """``Pr[|a * delta| < tol]`` for ``delta ~ Lap(noise_scale)``: ``1 - exp(-tol / (|a| * b))`` (1 when b = 0)."""
    if noise_scale == 0.0:
        return torch.ones_like(a, dtype=torch.float64)
    return 1.0 - torch.exp(-tolerance / (a.double().abs() * noise_scale))


def lia_attack(model: LinearlyAttackable, release: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
               users: torch.Tensor, query_items: torch.Tensor, target_items: torch.Tensor, tolerance: float = 0.5,
               noise_scale: float | None = None) -> LIAResult:
    """Attack one record per row: release ``A_{u, query}``, reconstruct ``d_{u, target}`` (Theorems 3.3/3.4).

    ``release(users, items)`` is the mechanism's output (e.g. ``LaplaceOutputPredictor.release``); ``noise_scale``
    (the Laplace ``b``) enables the exact risk of Definition 5.
    """
    a, b, truth = model.lia_side_information(users, query_items, target_items)
    released = release(users, query_items).to(a.device)
    est = lia_estimate(released, a, b)
    hits = (est - truth.double()).abs() < tolerance
    prob = None if noise_scale is None else lia_hit_probability(a, noise_scale, tolerance)
    return LIAResult(est, truth, hits, prob)


def topn_difference(private_top: torch.Tensor, reference_top: torch.Tensor) -> torch.Tensor:
    """Per row, the fraction of ``reference_top`` items missing from ``private_top`` (Fig. 1a's "# of different items /
    N"; ``-1`` padding ignored)."""
    if private_top.shape != reference_top.shape:
        raise DataError("topn_difference: both lists must be [U, N]")
    same = (reference_top[:, :, None] == private_top[:, None, :]) & (reference_top[:, :, None] >= 0)
    n_ref = (reference_top >= 0).sum(1).clamp_min(1)
    return 1.0 - same.any(2).sum(1).double() / n_ref.double()


def epsilon_utility(difference: torch.Tensor | float) -> float:
    """Definition 6 with dist = top-N difference (max dist = 1): ``1 - mean difference``."""
    diff = torch.as_tensor(difference, dtype=torch.float64)
    return float(1.0 - diff.mean())
