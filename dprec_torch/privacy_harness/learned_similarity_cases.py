"""Sensitivity-harness cases for the learned-similarity mechanisms (:mod:`dprec_torch.privacy_harness.registry`).

Each release runs the predictor module's own pre-noise functions on the harness's dataset; public inputs
(the item means released earlier, the item factors / subspace of the previous round) depend on the seed only.

* :class:`~dprec_torch.predictors.noisy_gram.NoisyGram`: the item statistics (S, C) (L2 for Gaussian, L1 for
  Laplace noise; per-unit rows = one user, or one rating at rating level) and the Gram triangle (per-user rows
  at user level, clip bound c^2; no per-unit clip at rating level, where the bound 2 B^2 comes from the entry
  clamp and the |R_u|^(-1/2) weight).
* :class:`~dprec_torch.predictors.dpals.DPALS`: one ALS round's (tri(A_j), b_j) over all items, and one
  power-iteration round's W = sum_u x_u x_u^T Q; per-user rows at user level; rating level is the
  replace-one-user bound (2x), checked for removed and changed ratings.
* ``count_weight``: the item statistics with a non-default gamma (user and rating level, both noises).
* ``mean_popularity_alpha``: the popularity counts K (bound 1) and the item statistics re-weighted by public
  a_i in (0, 1] (adversarial: some tiny, some 1), for every class, user and rating level.
"""

from __future__ import annotations

import math

import torch

from dprec_torch.data.ratings import Ratings
from dprec_torch.privacy_harness.case import Builder, Release, SensitivityCase, public_means, unit_rows


def _public_factors(n_items: int, d: int, seed: int, orthonormal: bool) -> torch.Tensor:
    f = torch.randn(n_items, d, generator=torch.Generator().manual_seed(int(seed) + 7), dtype=torch.float64) * 2.0
    return torch.linalg.qr(f)[0] if orthonormal else f


def _public_item_weights(n_items: int, seed: int) -> torch.Tensor:
    """Public a_i in (0, 1]: a mix of 1, tiny and intermediate values (the popularity weights' range)."""
    choices = torch.tensor([1.0, 1e-3, 0.5, 0.1], dtype=torch.float64)
    return choices[torch.randint(0, 4, (n_items,), generator=torch.Generator().manual_seed(int(seed) + 3))]


def _item_stats_case(cls_name: str, relation: str, noise: str, make, count_weight: float | None = None,
                     weighted: bool = False) -> SensitivityCase:
    from dprec_torch.privacy.item_means import item_stats, item_stats_sensitivity

    def release(data: Ratings, seed: int, units: bool) -> Release:
        a = _public_item_weights(data.n_items, seed) if weighted else None
        total = item_stats(data, relation, noise, count_weight, a)
        rows = unit_rows(data, relation, lambda d: item_stats(d, relation, noise, count_weight, a)) if units and len(data) else None
        return Release(total, rows, make().release_sensitivities()["item_stats"])

    bound = item_stats_sensitivity(relation, noise, count_weight)
    gamma = "" if count_weight is None else f" gamma={count_weight:g}"
    return SensitivityCase(name=f"{cls_name} item stats {relation} {noise}{gamma}{' popularity-weighted' if weighted else ''}",
                           relation=relation, norm=2 if noise == "gaussian" else 1, sensitivity=bound, clip_bound=bound,
                           also_change=relation == "rating", release=release, max_items=8)


def _popularity_cases(cls_name: str, make, relations: tuple[str, ...]) -> list[SensitivityCase]:
    """The stage-0 counts K (L2 bound 1) and the re-weighted Gaussian item statistics (privacy/item_means.py)."""
    from dprec_torch.privacy.item_means import popularity_counts

    def counts_case(relation: str) -> SensitivityCase:
        def release(data: Ratings, seed: int, units: bool) -> Release:
            rows = unit_rows(data, relation, lambda d: popularity_counts(d, relation)) if units and len(data) else None
            return Release(popularity_counts(data, relation), rows, 1.0)

        return SensitivityCase(name=f"{cls_name} popularity counts {relation}", relation=relation, norm=2, sensitivity=1.0,
                               clip_bound=1.0, also_change=relation == "rating", release=release, max_items=8)

    out = []
    for rel in relations:
        out += [counts_case(rel), _item_stats_case(cls_name, rel, "gaussian", lambda rel=rel: make(rel), None, weighted=True),
                _item_stats_case(cls_name, rel, "gaussian", lambda rel=rel: make(rel, 0.5), 0.5, weighted=True)]
    return out


def noisy_gram_cases() -> list[SensitivityCase]:
    from dprec_torch.predictors.noisy_gram import NoisyGram, gram, triangle, unit_vectors

    cases = [_item_stats_case("noisy_gram", rel, noise, lambda rel=rel, noise=noise, g=g: NoisyGram(relation=rel, mean_noise=noise,
                                                                                                     count_weight=g), g)
             for rel in ("user", "rating") for noise in ("gaussian", "laplace") for g in (None, 0.5, 2.5)]
    cases += _popularity_cases("noisy_gram", lambda rel, g=None: NoisyGram(relation=rel, mean_noise="gaussian", count_weight=g,
                                                                             mean_popularity_alpha=0.5), ("user", "rating"))

    def gram_case(relation: str, clamp_b: float, clip_norm: float, weighting: str, beta_p: float) -> SensitivityCase:
        mech = NoisyGram(relation=relation, clamp_b=clamp_b, clip_norm=clip_norm, weighting=weighting, beta_p=beta_p)

        def tri(d: Ratings, means: torch.Tensor) -> torch.Tensor:
            return triangle(gram(d, unit_vectors(d, means, relation, clamp_b, clip_norm, weighting, beta_p)))

        def release(data: Ratings, seed: int, units: bool) -> Release:
            means = public_means(data, seed)
            rows = unit_rows(data, "user", lambda d: tri(d, means)) if units and relation == "user" and len(data) else None
            return Release(tri(data, means), rows, mech.release_sensitivities()["gram"])

        bound = mech.release_sensitivities()["gram"]
        return SensitivityCase(name=f"noisy_gram gram {relation} B={clamp_b:g} c={clip_norm:g} {weighting}", relation=relation,
                               norm=2, sensitivity=bound, clip_bound=bound if relation == "user" else None,
                               also_change=relation == "rating", release=release, max_items=8)

    cases += [gram_case("user", 2.0, 3.0, "clip", 5.0), gram_case("user", 1.0, 0.5, "normalize", 0.0),
              gram_case("user", math.inf, 1.0, "clip", 0.0), gram_case("rating", 1.0, 1.0, "clip", 0.0),
              gram_case("rating", 2.5, 1.0, "clip", 0.0)]
    return cases


def dpals_cases() -> list[SensitivityCase]:
    from dprec_torch.predictors.dpals import DPALS, als_round_statistics, power_statistics, user_residuals
    from dprec_torch.data.preprocess import per_user_sample

    cases = [_item_stats_case("dpals", rel, noise, lambda rel=rel, noise=noise: DPALS(relation=rel, mean_noise=noise))
             for rel in ("user", "rating") for noise in ("gaussian", "laplace")]
    cases += [_item_stats_case("dpals", "user", "gaussian", lambda: DPALS(relation="user", mean_noise="gaussian", count_weight=0.5), 0.5)]
    cases += _popularity_cases("dpals", lambda rel, g=None: DPALS(relation=rel, mean_noise="gaussian", count_weight=g,
                                                                   mean_popularity_alpha=0.5), ("user", "rating"))

    def als_case(relation: str, m: int, gu: float, gr: float, d: int, power: bool) -> SensitivityCase:
        mech = DPALS(relation=relation, max_ratings_per_user=m, clip_factor=gu, clamp_r=gr, dim=d, reg=1.0, beta_p=2.0)

        def stats(data: Ratings, seed: int) -> torch.Tensor:
            _, y = user_residuals(data, public_means(data, seed), mech.beta_p, gr)
            keep = per_user_sample(data, m, seed, hash="lehmer")  # as DPALS.fit keys it: by the raw ids in data.meta
            if power:
                q = _public_factors(data.n_items, min(d, data.n_items), seed, orthonormal=True)
                return power_statistics(data, y, keep, q, gr * math.sqrt(m)).reshape(-1)
            v = _public_factors(data.n_items, d, seed, orthonormal=False)
            a, b = als_round_statistics(data, y, keep, v, mech.reg, gu)
            iu = torch.triu_indices(d, d)
            return torch.cat([a[:, iu[0], iu[1]].reshape(-1), b.reshape(-1)])

        def release(data: Ratings, seed: int, units: bool) -> Release:
            rows = unit_rows(data, "user", lambda sub: stats(sub, seed)) if units and relation == "user" and len(data) else None
            return Release(stats(data, seed), rows, mech.release_sensitivities()["power" if power else "als"])

        bound = mech.release_sensitivities()["power" if power else "als"]
        kind = "power" if power else "als"
        return SensitivityCase(name=f"dpals {kind} {relation} m={m} Gu={gu:g} Gr={gr:g} d={d}", relation=relation, norm=2,
                               sensitivity=bound, clip_bound=bound if relation == "user" else None,
                               also_change=relation == "rating", release=release, max_items=8)

    # rating level with Gu < Gr: one changed rating turns p~_u round (|p~_u| = Gu) and flips the sign of its residuals,
    # moving the round by ~1.8x the user-level bound -- the case that fails without the rating-level x2
    cases += [als_case("user", 3, 1.0, 1.0, 2, False), als_case("user", 2, 0.3, 2.0, 3, False),
              als_case("rating", 3, 1.0, 1.0, 2, False), als_case("rating", 3, 0.3, 1.0, 2, False),
              als_case("user", 3, 1.0, 1.0, 2, True), als_case("rating", 2, 1.0, 2.0, 2, True)]
    return cases


#: What this module harnesses: a class's qualified name -> the builder of its cases (collected by the registry).
SENSITIVITY_CASES: dict[str, Builder] = {
    "dprec_torch.predictors.noisy_gram.NoisyGram": noisy_gram_cases,
    "dprec_torch.predictors.dpals.DPALS": dpals_cases,
}
