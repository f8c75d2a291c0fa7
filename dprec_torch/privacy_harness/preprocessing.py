"""Harness cases behind the loaders' per-user preprocessing.

:func:`preprocessed` wraps a case so that its release first runs what ``build_dataset`` runs on a fold's train
side: the min-count filter (``data.min_user_ratings``), then the per-user tau cap (``data.max_user_ratings``,
the runner's ``mechanism.max_user_ratings``), with the loaders' own functions. The harness then checks the
case's stated sensitivity on the RAW neighbours. At user level both steps are per-user functions, so the bound
holds; at rating level one removed rating can take a whole user with it (the filter) or let another rating in
(the cap), so it does not: :func:`dprec_torch.privacy.relations.check_relation_preprocessing` refuses those runs.
"""

from __future__ import annotations

from dataclasses import replace

from dprec_torch.privacy.relations import RATING_LEVEL
from dprec_torch.data.preprocess import cap_seed, cap_user_ratings, filter_min_user_ratings
from dprec_torch.data.ratings import Ratings
from dprec_torch.privacy_harness.case import Release, SensitivityCase


def preprocess(data: Ratings, seed: int, min_user_ratings: int = 0, tau: int | None = None) -> Ratings:
    """The loaders' train-side preprocessing: min-count filter, then the tau cap (keys from the raw ids)."""
    data, _ = filter_min_user_ratings(data, min_user_ratings)
    if tau is not None:
        data, _ = cap_user_ratings(data, tau, cap_seed(int(seed), 1))
    return data


def preprocessed(case: SensitivityCase, min_user_ratings: int = 0, tau: int | None = None) -> SensitivityCase:
    """``case`` released after :func:`preprocess`; its relation and stated sensitivity unchanged."""

    def release(data: Ratings, seed: int, units: bool) -> Release | None:
        return case.release(preprocess(data, seed, min_user_ratings, tau), seed, units)

    steps = ([f"min_user_ratings={min_user_ratings}"] if min_user_ratings > 1 else []) + ([f"tau={tau}"] if tau else [])
    return replace(case, name=f"{case.name} after {' + '.join(steps) or 'no preprocessing'}", release=release)


def refused(case: SensitivityCase) -> bool:
    """Whether the runner refuses this case's relation after per-user preprocessing (the config rule)."""
    return case.relation in RATING_LEVEL
