"""A per-rating loop implementation of item-kNN (PCC/COS), the yardstick of the kNN benchmark.

The same maths as :class:`dprec_torch.predictors.knn.ItemKNN` (positive-only similarities,
top-k among the items the user rated, ties at the k-th value included), written the
straightforward way: a Python loop over ratings, each step a NumPy operation on one
user's history.

Fit (one step per training rating (u, i)):   num[i, R_u] += a_ui b_u,R_u ;  sq[i, R_u] += a_ui^2
    PCC: a = b = r - r_bar_item;  COS: a = b = r.   s_ij = num_ij / sqrt(sq_ij sq_ji), diag 0.
Predict (one step per test rating (u, i)):   N = top-k of s_i,R_u ;  r_bar_i + sum_N s x / sum_N |s|.

Both loops are timed on a subsample and extrapolated linearly per rating (fit: per training
rating of the sampled users; predict: per test rating), as the benchmark tables say.
"""

from __future__ import annotations

import time

import numpy as np

from dprec_torch.data.ratings import Ratings


def _by_user(r: Ratings) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    users, items, vals = r.users.numpy(), r.items.numpy(), r.values.numpy().astype(np.float64)
    order = np.lexsort((items, users))
    users, items, vals = users[order], items[order], vals[order]
    start = np.searchsorted(users, np.arange(r.n_users + 1))
    return users, items, vals, start


def item_means(train: Ratings) -> np.ndarray:
    return train.item_means().numpy().astype(np.float64)


def loop_fit(train: Ratings, similarity: str, users: np.ndarray | None = None) -> tuple[np.ndarray, float, int]:
    """(similarity, seconds, ratings visited); ``users`` restricts the loop (a subsample)."""
    m = train.n_items
    means = item_means(train)
    _, items, vals, start = _by_user(train)
    a_all = vals - means[items] if similarity == "pearson" else vals
    num = np.zeros((m, m))
    sq = np.zeros((m, m))
    users = np.arange(train.n_users) if users is None else users
    visited = 0
    t0 = time.perf_counter()
    for u in users:
        s, e = start[u], start[u + 1]
        its, a = items[s:e], a_all[s:e]
        for t in range(e - s):  # one step per rating (u, i)
            i = its[t]
            num[i, its] += a[t] * a
            sq[i, its] += a[t] * a[t]
        visited += e - s
    den = np.sqrt(sq * sq.T)
    with np.errstate(invalid="ignore", divide="ignore"):
        sim = np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)
    np.fill_diagonal(sim, 0.0)
    return np.maximum(sim, 0.0), time.perf_counter() - t0, int(visited)


def loop_predict(train: Ratings, sim: np.ndarray, k: int, users: np.ndarray, items: np.ndarray) -> tuple[np.ndarray, float]:
    """Per-test-rating loop; returns (raw predictions before the fallback/clip, seconds)."""
    means = item_means(train)
    _, h_items, h_vals, start = _by_user(train)
    out = np.empty(len(users))
    t0 = time.perf_counter()
    for t in range(len(users)):  # one step per test rating
        u, i = users[t], items[t]
        s, e = start[u], start[u + 1]
        its = h_items[s:e]
        x = h_vals[s:e] - means[its]
        w = sim[i, its]
        if len(w) > k:
            kth = np.partition(w, len(w) - k)[len(w) - k]
            w = np.where(w >= kth, w, 0.0)
        den = np.abs(w).sum()
        out[t] = means[i] + (float(w @ x) / den if den > 0 else 0.0)
    return out, time.perf_counter() - t0
