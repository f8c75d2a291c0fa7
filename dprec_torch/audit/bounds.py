"""From canary guesses to a (1 - alpha) lower bound on epsilon (Steinke, Nasr & Jagielski 2023).

Each canary is included independently with probability 1/2. After training, the auditor ranks the canaries of a run
by their score and guesses "in" for the top ``k`` and "out" for the bottom ``k`` (k fixed in advance). For an eps-DP
mechanism (w.r.t. adding/removing one canary), the number W of correct guesses among r guesses is stochastically
dominated by Binomial(r, p_eps), p_eps = e^eps / (1 + e^eps) (SNJ 2023, Thm. 3.1; it holds jointly over the canaries
of one run and over independent runs). So eps is rejected at level alpha when P[Bin(r, p_eps) >= W] <= alpha, and

    eps_lb = logit(p_lo),   p_lo = the one-sided Clopper-Pearson lower bound of W/r:
                            P[Bin(r, p_lo) >= W] = alpha,  i.e.  p_lo = Beta.ppf(alpha; W, r - W + 1),

clamped at 0. For (eps, delta)-DP mechanisms the same bound holds up to an additive O(r delta) in the accuracy (SNJ
2023, Thm. 5.2), negligible for delta = 1e-6 and r ~ 10^3.
"""

from __future__ import annotations

import math

import torch
from scipy.stats import beta


def clopper_pearson_lower(successes: int, trials: int, alpha: float) -> float:
    """One-sided (1 - alpha) Clopper-Pearson lower bound on a binomial proportion."""
    if trials <= 0 or successes <= 0:
        return 0.0
    return float(beta.ppf(alpha, successes, trials - successes + 1))


def epsilon_lower_bound(correct: int, guesses: int, alpha: float) -> float:
    """eps_lb = max(0, logit(CP lower bound of correct/guesses))."""
    p = clopper_pearson_lower(correct, guesses, alpha)
    if p <= 0.5:
        return 0.0
    if p >= 1.0:
        return math.inf
    return math.log(p / (1.0 - p))


def guesses(scores: torch.Tensor, included: torch.Tensor, k: int) -> tuple[int, int]:
    """(correct, made) for one run: guess 'in' for the k highest scores, 'out' for the k lowest.

    ``scores``/``included`` are ``[trials, m]``; ties are broken by position (fixed in advance).
    """
    if scores.dim() == 1:
        scores, included = scores[None], included[None]
    m = scores.shape[1]
    k = min(int(k), m // 2)
    if k <= 0:
        return 0, 0
    order = torch.argsort(scores, dim=1, descending=True, stable=True)
    inc = torch.gather(included.bool(), 1, order)
    correct = int(inc[:, :k].sum()) + int((~inc[:, m - k:]).sum())
    return correct, 2 * k * scores.shape[0]
