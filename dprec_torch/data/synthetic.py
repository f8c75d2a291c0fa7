"""Seeded synthetic ratings with power-law degrees and a learnable low-rank signal.

Sampling (no users x items matrix, no loop over users or ratings):

1. User and item popularity weights follow a Zipf-Mandelbrot power law,
   ``w_k ~ (k + c n)^-a`` for popularity rank ``k`` of ``n``, with the ranks shuffled
   so ids carry no popularity order. The defaults (``a = 1.5``; ``c = 0.1`` for
   users, ``0.05`` for items) make the ``ml-100k`` preset look like the real
   thing: user degrees 19 / 64 / 509 (min / median / max; ML-100K: 20 / 65 / 737),
   item degrees 4 / 27 / 451 (ML-100K: 1 / 27 / 583).
2. Every item gets one rating (when the budget allows) and every user is topped
   up to ``min_user_degree`` ratings (when feasible), with items drawn by
   popularity.
3. The rest of the budget is filled with (user, item) pairs drawn from
   ``w_u * w_i``; repeated pairs are rejected and re-drawn in a few bulk rounds
   (later rounds blend towards uniform so the loop always ends).

Ratings: ``r_ui = clip(round(mu + b_u + b_i + <p_u, q_i> + noise), 1, 5)`` with
``b_u ~ N(0, 0.4^2)``, ``b_i ~ N(0, 0.5^2)``, ``<p_u, q_i>`` of standard deviation
0.9 and noise ``N(0, noise^2)``. The user bias and the low-rank term are what a
learned model can recover and an item mean cannot, so models beat the item mean.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import torch

from dprec_torch.data.item_features import attach_item_features, random_item_features
from dprec_torch.data.preprocess import build_dataset
from dprec_torch.data.ratings import RatingDataset, Ratings, RatingScale
from dprec_torch.data.splits import check_test_fraction, holdout_folds, select_folds
from dprec_torch.errors import ConfigError

log = logging.getLogger(__name__)

SYNTHETIC_SCALE = RatingScale(1.0, 5.0)
# (n_users, n_items, n_ratings), sized like the datasets they are named after
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (300, 200, 8_000),
    "ml-100k": (943, 1_682, 100_000),
    "ml-1m": (6_040, 3_706, 1_000_209),
    "ml-20m": (138_493, 26_744, 20_000_263),
    "netflix": (480_189, 17_770, 100_480_507),  # the Netflix Prize training set's sizes
}
_MAX_ROUNDS = 60
_DENSE_FRACTION = 0.5  # above this density, draw pairs uniformly without replacement instead
_DENSE_MAX_PAIRS = 2**25


def _zipf_weights(n: int, exponent: float, offset: float, rng: np.random.Generator) -> np.ndarray:
    """Popularity of ``n`` entities: shuffled Zipf-Mandelbrot weights ``(k + offset n)^-a``, summing to 1."""
    w = rng.permutation((np.arange(1, n + 1, dtype=np.float64) + offset * n) ** -exponent)
    return w / w.sum()


def _mix(p: np.ndarray, uniform_mix: float) -> np.ndarray:
    return (1.0 - uniform_mix) * p + uniform_mix / p.shape[0]


def _draw(p: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` i.i.d. indices drawn from ``p`` (inverse CDF)."""
    cdf = np.cumsum(p)
    return np.minimum(np.searchsorted(cdf, rng.random(size) * cdf[-1], side="right"), p.shape[0] - 1)


def _draw_pairs(pu: np.ndarray, pi: np.ndarray, size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``size`` independent (user ~ pu, item ~ pi) pairs: multinomial counts expanded by ``repeat``.

    Much faster than inverse-CDF lookups at ML-20M scale; the items are shuffled,
    which makes the pairing independent.
    """
    users = np.repeat(np.arange(pu.shape[0]), rng.multinomial(size, pu))
    items = rng.permutation(np.repeat(np.arange(pi.shape[0]), rng.multinomial(size, pi)))
    return users, items


def _fresh(keys: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """Sorted distinct candidate keys that are not in sorted ``keys`` (sort-based: no hashing)."""
    cand = np.sort(cand)
    cand = cand[np.r_[True, cand[1:] != cand[:-1]]] if cand.shape[0] else cand
    pos = np.searchsorted(keys, cand)  # sorted queries: a near-linear merge walk
    known = pos < keys.shape[0]
    known[known] = keys[pos[known]] == cand[known]
    return cand[~known]


def _insert(keys: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Merge sorted, disjoint ``new`` into sorted ``keys`` in linear time."""
    return np.insert(keys, np.searchsorted(keys, new), new)


def _random_subset(new: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """``k`` of ``new`` uniformly at random, keeping its order (partition, not a full shuffle)."""
    if k >= new.shape[0]:
        return new
    r = rng.random(new.shape[0])
    return new[r <= np.partition(r, k - 1)[k - 1]][:k]


def _rank_within(groups: np.ndarray, priority: np.ndarray) -> np.ndarray:
    """Rank of each entry among its group's entries, ordered by ``priority`` (vectorised)."""
    order = np.lexsort((priority, groups))
    sorted_groups = groups[order]
    starts = np.flatnonzero(np.r_[True, sorted_groups[1:] != sorted_groups[:-1]])
    run_start = np.repeat(starts, np.diff(np.r_[starts, groups.shape[0]]))
    rank = np.empty_like(order)
    rank[order] = np.arange(groups.shape[0]) - run_start
    return rank


def _sample_pairs(
    n_users: int, n_items: int, n_ratings: int, exponents: tuple[float, float], offsets: tuple[float, float],
    min_user_degree: int, rng: np.random.Generator,
) -> np.ndarray:  # fmt: skip
    """Sorted distinct keys ``user * n_items + item`` of ``n_ratings`` pairs (steps 1-3 above)."""
    total = n_users * n_items
    if n_ratings > _DENSE_FRACTION * total:
        if total > _DENSE_MAX_PAIRS:
            raise ConfigError(f"{n_ratings:,} ratings on {n_users:,} x {n_items:,} is too dense for the generator: use fewer ratings")
        return np.sort(rng.choice(total, size=n_ratings, replace=False))
    pu = _zipf_weights(n_users, exponents[0], offsets[0], rng)
    pi = _zipf_weights(n_items, exponents[1], offsets[1], rng)
    m = min(min_user_degree, n_items, n_ratings // n_users)
    keys = np.empty(0, dtype=np.int64)
    if n_ratings >= n_items + m * n_users:  # step 1: every item rated once
        keys = np.sort(_draw(pu, n_items, rng) * n_items + np.arange(n_items))
    for rnd in range(_MAX_ROUNDS):  # step 2: users up to m ratings; a few bulk rounds
        deficit = np.maximum(m - np.bincount(keys // n_items, minlength=n_users), 0)
        if not deficit.any():
            break
        users = np.repeat(np.arange(n_users), 2 * deficit)
        new = _fresh(keys, users * n_items + _draw(_mix(pi, min(1.0, rnd / 10)), users.shape[0], rng))
        new_users = new // n_items
        new = new[_rank_within(new_users, rng.random(new.shape[0])) < deficit[new_users]]
        keys = _insert(keys, new)
    for rnd in range(_MAX_ROUNDS):  # step 3: fill the budget by popularity
        need = n_ratings - keys.shape[0]
        if need <= 0:
            break
        mix = min(1.0, rnd / 20)
        users, items = _draw_pairs(_mix(pu, mix), _mix(pi, mix), int(need * 1.25) + 64, rng)
        keys = _insert(keys, _random_subset(_fresh(keys, users * n_items + items), need, rng))
    if keys.shape[0] != n_ratings:
        raise ConfigError(f"could not place {n_ratings:,} distinct ratings on {n_users:,} x {n_items:,}: use fewer ratings")
    return keys


def _rate(users: np.ndarray, items: np.ndarray, n_users: int, n_items: int, rank: int, noise: float,
          rng: np.random.Generator) -> np.ndarray:
    """Integer ratings 1..5 from biases + a rank-``rank`` interaction + Gaussian noise, in chunks."""
    mu = 3.6
    b_u = rng.normal(0.0, 0.4, n_users).astype(np.float32)
    b_i = rng.normal(0.0, 0.5, n_items).astype(np.float32)
    p = rng.standard_normal((n_users, rank), dtype=np.float32)
    q = rng.standard_normal((n_items, rank), dtype=np.float32) * np.float32(0.9 / math.sqrt(rank))
    out = np.empty(users.shape[0], dtype=np.float32)
    chunk = 1 << 21
    for s in range(0, users.shape[0], chunk):  # bounded memory at ML-20M size
        u, i = users[s : s + chunk], items[s : s + chunk]
        x = mu + b_u[u] + b_i[i] + np.einsum("ij,ij->i", p[u], q[i]) + noise * rng.standard_normal(u.shape[0], dtype=np.float32)
        out[s : s + chunk] = np.clip(np.rint(x), 1, 5)
    return out


def generate_synthetic(n_users: int, n_items: int, n_ratings: int, seed: int = 0, rank: int = 8, user_exponent: float = 1.5,
                       item_exponent: float = 1.5, user_offset: float = 0.1, item_offset: float = 0.05, min_user_degree: int = 5,
                       noise: float = 0.5) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(users, items, ratings)`` numpy arrays, sorted by (user, item), no duplicate pairs.

    Deterministic under ``seed``. Ids are ``0..n_users-1`` and ``0..n_items-1``;
    ratings are float32 integers on 1..5.
    """
    for key, val in (("n_users", n_users), ("n_items", n_items), ("n_ratings", n_ratings), ("rank", rank)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ConfigError(f"data.{key}={val!r} is invalid: use a positive integer")
    if n_ratings > n_users * n_items:
        raise ConfigError(f"data.n_ratings={n_ratings:,} exceeds n_users x n_items = {n_users * n_items:,}")
    if min(user_exponent, item_exponent, user_offset, item_offset, noise, min_user_degree) < 0:
        raise ConfigError("synthetic exponents, offsets, noise and min_user_degree must be >= 0")
    rng = np.random.default_rng(seed)
    keys = _sample_pairs(n_users, n_items, n_ratings, (user_exponent, item_exponent), (user_offset, item_offset), min_user_degree, rng)
    users, items = keys // n_items, keys % n_items
    return users, items, _rate(users, items, n_users, n_items, rank, noise, rng)


def load_synthetic(preset: str = "tiny", n_users: int | None = None, n_items: int | None = None, n_ratings: int | None = None,
                   fold: int | str = 1, n_folds: int = 5, test_fraction: float = 0.1, min_user_ratings: int = 0,
                   max_user_ratings: int | None = None, seed: int = 0, name: str = "synthetic", rank: int = 8) -> RatingDataset:
    """A synthetic dataset (``preset`` sizes, overridable) split into seeded 90/10 hold-outs."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown synthetic preset {preset!r}: valid presets are {', '.join(PRESETS)}")
    wanted = select_folds(fold, n_folds)
    check_test_fraction(test_fraction)
    n_users, n_items, n_ratings = (p if v is None else v for p, v in zip(PRESETS[preset], (n_users, n_items, n_ratings)))
    users, items, values = generate_synthetic(n_users, n_items, n_ratings, seed=seed, rank=rank)
    log.info("synthetic preset=%s: %d users x %d items, %d ratings (seed %d)", preset, n_users, n_items, n_ratings, seed)
    whole = Ratings(torch.from_numpy(users), torch.from_numpy(items), torch.from_numpy(values), n_users, n_items, SYNTHETIC_SCALE)
    folds = holdout_folds(whole, wanted, test_fraction, seed)
    report = {"source": f"synthetic preset={preset} seed={seed}", "n_ratings": n_ratings, "duplicates_dropped": 0}
    dataset = build_dataset(name, folds, list(range(n_users)), list(range(n_items)), SYNTHETIC_SCALE, min_user_ratings, max_user_ratings,
                            seed, report)
    # a synthetic catalogue: random public genres (their own seed, no rating enters them) for item_features=true
    attach_item_features(dataset, random_item_features(dataset.n_items, seed=seed))
    return dataset
