"""Privacy analysis of every training mechanism, as code: relation, sensitivity, noise, amplification, composition.

Conventions. *user level*: neighbouring datasets differ by adding or removing one user's whole profile; *rating
level*: by adding, removing or changing one rating, i.e. changing one user's profile: two user-level add/remove steps,
so eps-DP at user level (add/remove) is 2 eps-DP at rating level (group privacy; under Poisson subsampling tighter than
ln(1 + q(e^{2 eps} - 1)), since (1 + q(e^eps - 1))^2 <= 1 + q(e^{2 eps} - 1)).

Pure-DP building blocks (Laplace mechanism, Poisson subsampling, basic composition):

    Laplace:        a query with L1 sensitivity Delta plus Lap(Delta/eps) per entry is eps-DP.
    Amplification:  a step that is eps-DP on its Poisson(q) sample, under add/remove of the unit the sample is
                    drawn over, is ln(1 + q (e^eps - 1))-DP (Balle, Barthe & Gaboardi 2018, Thm. 8), exact for
                    pure DP; Wang & Tang's Theorem 1 uses q eps.
    Composition:    eps's add up (adaptive sequential composition).

So T steps of per-step eps_s after a one-off release of eps_0 spend

    eps = eps_0 + g T ln(1 + q (e^{eps_s} - 1))          (g = 1 user level, 2 rating level)

and :func:`laplace_step_epsilon` inverts it. Gaussian mechanisms are composed and calibrated in
:mod:`dprec_torch.privacy.calibration` (``gaussian_epsilon``, ``calibrate_gaussian``), a one-off Gaussian release as
an extra history entry (sigma, q = 1, 1 step).

:func:`analyse_dpsgd_l1` (``mechanism=dpsgd_l1``'s report) and :func:`analyse_dpsgd_paper` (the whole-update analysis
of Wang & Tang's Alg. 1, docs/privacy.md) return a :class:`MechanismAnalysis` whose ``epsilon`` is the *defended*
figure for the released model under ``relation`` (``inf`` when nothing is defended), and whose ``claimed`` is what the
source paper states, when it differs. The Gaussian and SGLD mechanisms state theirs in their own ``privacy_report()``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from dprec_torch.errors import ConfigError
from dprec_torch.privacy.accountants import amplified_epsilon  # noqa: F401 (one definition; re-exported)

USER, RATING = "user", "rating"


# --------------------------------------------------------------------------- pure-DP maths
def deamplified_epsilon(amplified: float, q: float) -> float:
    """Inverse of :func:`amplified_epsilon`: the per-sample eps whose amplification is ``amplified``."""
    if q >= 1 or math.isinf(amplified):
        return float(amplified)
    return math.log1p(math.expm1(amplified) / q)


def composed_epsilon(step_epsilon: float, q: float, steps: int, reserved: float = 0.0, group: int = 1) -> float:
    """eps = reserved + group * steps * ln(1 + q (e^{eps_s} - 1))."""
    return reserved + group * steps * amplified_epsilon(step_epsilon, q)


def laplace_step_epsilon(total: float, steps: int, q: float, reserved: float = 0.0, group: int = 1) -> float:
    """The eps_s with ``composed_epsilon(eps_s, q, steps, reserved, group) == total``."""
    if steps < 1:
        raise ConfigError(f"the number of steps must be >= 1, got {steps}")
    if not total > reserved:
        raise ConfigError(f"epsilon={total} leaves nothing for the {steps} noisy steps after {reserved} spent on the item means")
    return deamplified_epsilon((total - reserved) / (group * steps), q)


# --------------------------------------------------------------------------- the record
@dataclass
class MechanismAnalysis:
    """One mechanism's privacy statement (every field is printed in ``privacy_report()``)."""

    mechanism: str
    relation: str | None
    guarantee: str
    sensitivity: dict[str, Any]
    noise: str
    sampling: str
    composition: str
    epsilon: float
    delta: float = 0.0
    claimed: float | None = None
    caveats: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(d.pop("extra"))
        return d


# --------------------------------------------------------------------------- per mechanism
def analyse_dpsgd_paper(epsilon: float, steps: int, q: float, phi: float, floor_c: float, max_profile: int,
                        item_means_private: bool = False) -> MechanismAnalysis:
    """Wang & Tang Alg. 1 as implemented (``mechanism=dpsgd``, PNBM). Noise: Lap(q K Delta F(t) / eps) per entry with
    Delta F(t) = 2 e_max(t) phi / C (one ENTRY's range). The exact gradient entry obeys |e (x_uj/d - (n/d^2) sgn s_ij)|
    <= e_max 2 phi / C (|x| <= phi, |n/d| <= phi), so one rating moves the whole update by at most
    Delta_1 = 2 n (n-1) e_max 2 phi / C and each step is really eps_t = Delta_1 / b_t = 2 n (n-1) eps / (q K) -DP, with
    e_max cancelling. A rating-sampled batch carries the whole history of every sampled user, so the changed rating is
    present whenever any of its user's n ratings is sampled: q_eff = 1 - (1 - q)^n. The released model also holds
    r_bar computed exactly from the data (not DP at all) unless ``item_means_private``."""
    n = int(max_profile)
    eps_t_true = 2.0 * n * max(n - 1, 1) * epsilon / (q * steps)
    q_eff = 1.0 - (1.0 - q) ** n if q < 1 else 1.0
    bound = steps * amplified_epsilon(eps_t_true, q_eff)
    return MechanismAnalysis(
        mechanism="dpsgd (Wang & Tang Alg. 1, paper-faithful)",
        relation=RATING,
        guarantee="none for the released model (exact item means); per-entry figure only",
        sensitivity={"paper_delta_f": "2 e_max(t) phi / C (one gradient entry)",
                     "whole_update_l1": f"2 n (n-1) * 2 e_max phi / C, n = {n}",
                     "ratio_whole_to_paper": 2.0 * n * max(n - 1, 1)},
        noise="Laplace, scale q K Delta F(t) / eps on every entry of G",
        sampling=f"Poisson over ratings, q = {q:g}; each batch carries its users' whole histories (q_eff = {q_eff:.4g})",
        composition="Theorem 1: q eps_t per step (linear amplification), K steps summed",
        epsilon=math.inf if not item_means_private else bound,
        claimed=epsilon,
        caveats=["Delta F bounds one entry of G(u); one rating moves O(n^2) entries",
                 "r_bar_i are exact training means, released in the model and used to centre every gradient",
                 "linear amplification q eps is not an upper bound for large eps"],
        extra={"epsilon_upper_bound_with_public_means": bound, "per_step_epsilon_true": eps_t_true},
    )


def dpsgd_l1_group_factor(relation: str, unit: str) -> int:
    """g of ``analyse_dpsgd_l1``: 2 for ``relation=rating`` (add/remove/CHANGE one rating), else 1. Changing one
    rating's value replaces one clipped contribution by another (the rating's own, unit=rating, or its user's whole
    G_u, unit=user): the clipped sum moves by up to 2c in L1 (two add/remove steps); adding or removing one rating under
    unit=user also replaces G_u. ``relation=user``, ``unit=user``: add/remove a whole profile moves the sum by c, g = 1."""
    return 2 if relation == RATING else 1


def analyse_dpsgd_l1(epsilon: float, steps: int, q: float, clip_norm: float, mean_epsilon: float,
                     relation: str = USER, unit: str = USER) -> MechanismAnalysis:
    """``mechanism=dpsgd_l1`` (:mod:`dprec_torch.mechanisms.dpsgd`). Per step: release sum_{x in batch} clip_1(G_x, c)
    + Lap(c/eps_s)^{#params}; G_x is unit x's whole gradient contribution (PNBM: user u's G_u over rows and columns
    R_u), clipped in L1 to c, so the add/remove-one-unit L1 sensitivity is c and the step is eps_s-DP on its sample.
    Poisson(q) over units amplifies it to ln(1 + q(e^{eps_s} - 1)); with the item-mean release eps_0 (PNBM only) and T
    steps: eps = eps_0 + g T ln(1 + q(e^{eps_s} - 1)), g = :func:`dpsgd_l1_group_factor`."""
    group = dpsgd_l1_group_factor(relation, unit)
    eps_s = laplace_step_epsilon(epsilon, steps, q, mean_epsilon, group)
    return MechanismAnalysis(
        mechanism="dpsgd_l1 (clipped-Laplace DP-SGD, whole-update L1 sensitivity)",
        relation=relation,
        guarantee=f"pure eps-DP, {relation} level" + (" (add/remove one user)" if relation == USER else
                                                      " (add/remove/change one rating)"),
        sensitivity={"norm": "L1", "clip_norm": clip_norm, "of": f"each {unit}'s whole gradient contribution",
                     "add_remove": clip_norm if relation == USER or unit == RATING else 2 * clip_norm,
                     "change_one_rating": 2 * clip_norm if relation == RATING else None, "group_factor": group},
        noise=f"Laplace, scale c / eps_s = {clip_norm / eps_s:.4g} on every parameter entry",
        sampling=f"Poisson over {unit}s, q = {q:g}",
        composition="exact pure-DP amplification ln(1 + q(e^eps_s - 1)) per step, basic composition, "
                    "plus the item-mean release",
        epsilon=composed_epsilon(eps_s, q, steps, mean_epsilon, group),
        extra={"epsilon_step": eps_s, "epsilon_item_means": mean_epsilon, "steps": steps, "sampling_ratio": q},
    )
