"""Wang & Tang's preprocessing: a minimum number of ratings per user and a per-user cap tau.

* Sec. 3 ("Preprocessing"): "we only put users who have more than 20 ratings in the training data" ->
  :func:`filter_min_user_ratings` (``data.min_user_ratings`` is an *at least* count: the paper's "more than 20"
  is ``min_user_ratings=21``).
* Sec. 4.3: "To those users who rated more than tau items, we randomly remove some ratings thus to ensure that
  each user at most has tau ratings" (tau = 200) -> :func:`cap_user_ratings` (``data.max_user_ratings``). The cap
  bounds one user's contribution, which the user-level privacy accounting relies on.

The loaders apply both to the TRAIN side of each fold only, min-filter first, then the cap; test sets are never
touched, so every configuration is scored on the same ratings (a filtered-out user becomes an unknown user at test
time). Both functions are vectorised (sort + rank within user, no loop over users) and keep the id space
(``n_users``, ``n_items``) unchanged.

The cap is a PER-USER function: which of u's ratings survive depends on (seed, fold, u's raw id,
u's own ratings) only, through a hash of (seed, raw user id, raw item id) per rating. Neighbouring
datasets (user level) differ by one user's whole profile, and the raw-id map of the loaded data may
be rebuilt without that user (contiguous ids shift); every other user's capped profile stays the
same, so a user-level bound on capped profiles (B = phi^2 tau, capped dpsgd_l1 / gaussian) holds.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Sequence

import numpy as np
import torch

from dprec_torch.data.ratings import Fold, RatingDataset, Ratings, RatingScale
from dprec_torch.data.streams import CAP_STREAM, derive_seed
from dprec_torch.errors import ConfigError, DataError

log = logging.getLogger(__name__)


def _check_count(value: Any, key: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key}={value!r} is invalid: use an integer >= {minimum}")
    return value


MASK32 = 0xFFFFFFFF
FNV_OFFSET, FNV_PRIME = np.uint64(0xCBF29CE484222325), np.uint64(0x100000001B3)
USER_KEYS, ITEM_KEYS = "user_keys", "item_keys"  # Ratings.meta entries: stable keys per contiguous id


def stable_id_keys(ids: Sequence[Any]) -> torch.Tensor:
    """An int64 key per contiguous index that depends on that raw id ALONE (not on the id map).

    Integer ids are their own key; text ids are hashed (FNV-1a over their UTF-8 bytes, vectorised
    over ids: the loop runs over the characters of the longest id). Contiguous indices shift when a
    user is removed and the id map is rebuilt, raw ids do not, so the cap keys by these.
    """
    arr = np.asarray(list(ids))
    if arr.size == 0:
        return torch.zeros(0, dtype=torch.long)
    if arr.dtype.kind in "iu":
        return torch.from_numpy(arr.astype(np.int64))
    raw = np.char.encode(arr.astype(str), "utf-8")
    lengths = np.char.str_len(raw)
    width = max(raw.dtype.itemsize, 1)
    chars = np.frombuffer(raw.tobytes(), dtype=np.uint8).reshape(arr.size, width).astype(np.uint64)
    h = np.full(arr.size, FNV_OFFSET, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for col in range(width):  # padding bytes (col >= length) leave the hash alone
            h = np.where(col < lengths, (h ^ chars[:, col]) * FNV_PRIME, h)
    return torch.from_numpy((h >> np.uint64(1)).astype(np.int64))


def _mul32(h: torch.Tensor, c: int) -> torch.Tensor:
    """(h * c) mod 2^32 for 0 <= h < 2^32 in int64 without overflow (c split in 16-bit halves)."""
    lo, hi = c & 0xFFFF, c >> 16
    return (h * lo + (((h * hi) & 0xFFFF) << 16)) & MASK32


def _mix32(h: torch.Tensor) -> torch.Tensor:
    """A 32-bit avalanche (Wellons' lowbias32) on int64 tensors holding 32-bit values."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x7FEB352D)
    h = h ^ (h >> 15)
    h = _mul32(h, 0x846CA68B)
    return h ^ (h >> 16)


def _id_hash(seed: int, keys: torch.Tensor) -> torch.Tensor:
    """A 32-bit hash per id of (seed, its 64-bit key)."""
    h = _mix32(torch.full_like(keys, seed & MASK32))
    h = _mix32(h ^ (keys & MASK32))
    return _mix32(h ^ ((keys >> 32) & MASK32))


#: the two per-rating hashes (:func:`rating_keys`); each feeds published numbers, so both stay
HASHES = ("mix32", "lehmer")
_P = 2147483647  # 2^31 - 1 (Park-Miller modulus): every product of the lehmer hash fits in int64


def rating_keys(seed: int, user_keys: torch.Tensor, item_keys: torch.Tensor, users: torch.Tensor,
                items: torch.Tensor, hash: str = "mix32") -> torch.Tensor:
    """A pseudo-random key per rating (users[k], items[k]), a function of (seed, the user's key, the item's key)
    only (``user_keys`` / ``item_keys``: one key per contiguous id). The package's one definition; ``hash``:

    * ``mix32`` (the cap ``data.max_user_ratings``): 32-bit; each id is hashed once (lowbias32 of (seed, its 64-bit
      key)), then one mix per rating;
    * ``lehmer`` (DP-ALS's per-user sample): in [0, 2^31 - 1); three Lehmer rounds of (seed, user key,
      item key), each key taken mod 2^31 - 1, with an xor of the item key between them.
    """
    if hash == "mix32":
        h_user = _id_hash(seed, user_keys)
        h_item = _id_hash((seed >> 32) ^ 0x9E3779B9, item_keys)
        return _mix32(h_user[users] ^ h_item[items])
    if hash != "lehmer":
        raise ConfigError(f"rating_keys: hash must be one of {HASHES}, got '{hash}'")
    u, i = user_keys[users].long() % _P, item_keys[items].long() % _P
    x = (u * 1000003 + i * 7919 + (int(seed) % _P) * 104729 + 12345) % _P  # a 63-bit secret seed fits
    for mult in (48271, 69621, 16807):
        x = (x * mult) % _P
        x = (x ^ (i % 65536)) % _P
    return x


def per_user_sample(ratings: Ratings, max_per_user: int | None, seed: int, *, hash: str,
                    user_keys: torch.Tensor | None = None, item_keys: torch.Tensor | None = None) -> torch.Tensor:
    """Bool mask keeping at most ``max_per_user`` ratings of each user (all if None): the user's ratings of smallest
    :func:`rating_keys` (``hash``), ties by item key. The package's one per-user cap (``data.max_user_ratings``:
    :func:`cap_user_ratings`; DP-ALS's sample: ``hash="lehmer"``).

    The keys come from RAW ids: the arguments, else ``ratings.meta`` (where the loaders store
    :func:`stable_id_keys`), else the contiguous ids (stable only while the id map is). So u's selection is a
    function of (seed, u's raw id, u's own ratings) only: removing or adding another user never changes it, even
    when the id map is rebuilt without that user. Vectorised; any device.
    """
    n, dev = len(ratings), ratings.device
    if max_per_user is None:
        return torch.ones(n, dtype=torch.bool, device=dev)
    if isinstance(max_per_user, bool) or int(max_per_user) < 1:
        raise ConfigError(f"the per-user cap (max_ratings_per_user) must be >= 1 or null, got {max_per_user}")
    user_keys = ratings.meta.get(USER_KEYS) if user_keys is None else user_keys
    item_keys = ratings.meta.get(ITEM_KEYS) if item_keys is None else item_keys
    uk = torch.arange(ratings.n_users, device=dev) if user_keys is None else user_keys.to(dev)
    ik = torch.arange(ratings.n_items, device=dev) if item_keys is None else item_keys.to(dev)
    return rank_within_user(ratings, rating_keys(seed, uk, ik, ratings.users, ratings.items, hash), ik) < int(max_per_user)


def rank_within_user(ratings: Ratings, keys: torch.Tensor, item_keys: torch.Tensor) -> torch.Tensor:
    """Each rating's rank (0 = first) among its user's ratings ordered by (``keys``, item key), in the ratings' order."""
    n, dev = len(ratings), ratings.device
    order = torch.argsort(item_keys[ratings.items], stable=True)  # ties in the key: by item key
    order = order[torch.argsort(((ratings.users << 32) | keys)[order], stable=True)]  # by (user, key, item key)
    counts = ratings.user_counts()
    first = torch.cumsum(counts, 0) - counts  # position of each user's first rating in `order`
    rank = torch.empty(n, dtype=torch.long, device=dev)
    rank[order] = torch.arange(n, device=dev) - first[ratings.users[order]]
    return rank


def _as_seed(seed: int | torch.Generator) -> int:
    if isinstance(seed, torch.Generator):  # older call sites passed make_generator(seed): only its seed is used
        return int(seed.initial_seed())
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ConfigError(f"the cap's seed must be an integer, got {seed!r}")
    return int(seed) % 2**63


def cap_user_ratings(ratings: Ratings, tau: int, seed: int | torch.Generator, user_keys: torch.Tensor | None = None,
                     item_keys: torch.Tensor | None = None) -> tuple[Ratings, int]:
    """Keep at most ``tau`` ratings per user, chosen at random PER USER (Sec. 4.3).

    :func:`per_user_sample` with ``hash="mix32"`` (keys from RAW ids, as there): user u keeps its ``tau`` ratings of
    smallest 32-bit key ``rating_keys(seed, key(u), key(i))`` (ties by item key). So u's capped profile is a function of
    (seed, u's raw id, u's own ratings) only: removing or adding another user never changes it, which every user-level
    bound that assumes a capped profile (B = phi^2 tau, capped dpsgd_l1 / gaussian) needs. The neighbouring relation is
    add/remove one user's whole (uncapped) profile. Each user keeps exactly ``min(|R_u|, tau)`` ratings, uniformly
    chosen over seeds. Returns ``(capped ratings in their original order, number dropped)``. Vectorised; any device.
    """
    tau = _check_count(tau, "data.max_user_ratings (tau)", 1)
    n = len(ratings)
    if n == 0:
        return ratings.select(torch.zeros(0, dtype=torch.long, device=ratings.device)), 0
    kept = ratings.select(per_user_sample(ratings, tau, _as_seed(seed), hash="mix32", user_keys=user_keys, item_keys=item_keys))
    return kept, n - len(kept)


def cap_seed(seed: int, fold_index: int) -> int:
    """The cap's seed for one fold; ``data.max_user_ratings`` and the runner's mechanism cap share it,
    so capping twice (tau' <= tau) keeps the tau' smallest keys of the same order."""
    return derive_seed(int(seed), int(fold_index), CAP_STREAM)


def filter_min_user_ratings(ratings: Ratings, min_count: int) -> tuple[Ratings, int]:
    """Drop every rating of users with fewer than ``min_count`` ratings (Sec. 3); ``min_count=0`` keeps all.
    Returns ``(filtered ratings, number of ratings dropped)``."""
    min_count = _check_count(min_count, "data.min_user_ratings", 0)
    if min_count <= 1:  # every present user has >= 1 rating: a no-op (a shallow copy, no tensor copies)
        return replace(ratings, meta=dict(ratings.meta)), 0
    kept = ratings.select(ratings.user_counts()[ratings.users] >= min_count)
    return kept, len(ratings) - len(kept)


def _n_users(r: Ratings) -> int:
    return int((r.user_counts() > 0).sum())


def preprocess_fold(fold: Fold, min_user_ratings: int = 0, max_user_ratings: int | None = None,
                    seed: int = 0) -> tuple[Fold, dict[str, int]]:
    """Min-filter then cap the TRAIN side of one fold; the test side is returned untouched."""
    train, min_dropped = filter_min_user_ratings(fold.train, min_user_ratings)
    stats = {"train_before": len(fold.train), "min_filter_dropped_ratings": min_dropped,
             "min_filter_dropped_users": _n_users(fold.train) - _n_users(train)}
    capped_users, dropped = 0, 0
    if max_user_ratings is not None:
        capped_users = int((train.user_counts() > max_user_ratings).sum())
        train, dropped = cap_user_ratings(train, max_user_ratings, cap_seed(seed, fold.index))
    stats.update(cap_dropped_ratings=dropped, capped_users=capped_users, train=len(train), test=len(fold.test))
    return Fold(fold.index, train, fold.test, fold.name), stats


def build_dataset(name: str, folds: list[Fold], user_ids: list, item_ids: list, scale: RatingScale, min_user_ratings: int = 0,
                  max_user_ratings: int | None = None, seed: int = 0, report: dict[str, Any] | None = None) -> RatingDataset:
    """Preprocess every selected fold's train side, reject empty splits, log and report the drops."""
    _check_count(min_user_ratings, "data.min_user_ratings", 0)
    if max_user_ratings is not None:
        _check_count(max_user_ratings, "data.max_user_ratings", 1)
    report = dict(report or {})
    report.update(dataset=name, n_users=len(user_ids), n_items=len(item_ids), scale=[scale.lo, scale.hi],
                  preprocessing={"min_user_ratings": min_user_ratings, "max_user_ratings": max_user_ratings, "applied_to": "train"},
                  folds={})
    out = []
    keys = {USER_KEYS: stable_id_keys(user_ids), ITEM_KEYS: stable_id_keys(item_ids)}  # what the cap keys by
    for fold in folds:  # a handful of folds
        for side, part in (("train", fold.train), ("test", fold.test)):
            part.meta.update(keys)
            if len(part) == 0:
                raise DataError(f"{name} fold {fold.name}: the {side} set has no ratings; check the split files or data.test_fraction")
        fold, stats = preprocess_fold(fold, min_user_ratings, max_user_ratings, seed)
        if len(fold.train) == 0:
            raise DataError(
                f"{name} fold {fold.name}: the train set is empty after preprocessing "
                f"(data.min_user_ratings={min_user_ratings}); lower data.min_user_ratings"
            )
        fold.train.meta.update(dataset=name, fold=fold.name, side="train")
        fold.test.meta.update(dataset=name, fold=fold.name, side="test")
        report["folds"][fold.name] = stats
        log.info(
            "%s %s: train %d, test %d ratings; min_user_ratings=%d dropped %d ratings (%d users); "
            "max_user_ratings=%s dropped %d ratings (%d users capped)",
            name, fold.name, stats["train"], stats["test"], min_user_ratings, stats["min_filter_dropped_ratings"],
            stats["min_filter_dropped_users"], max_user_ratings, stats["cap_dropped_ratings"], stats["capped_users"],
        )  # fmt: skip
        out.append(fold)
    return RatingDataset(name, out, list(user_ids), list(item_ids), scale, report)
