"""Top-N metrics: Precision@N, Recall@N, F1@N against a relevance threshold, and catalog coverage.

Relevant items of a user are their *test* ratings ``>= threshold``. All computations are batched: recommendations
arrive as a ``[U, N]`` index tensor.
"""

from __future__ import annotations

import torch

from dprec_torch.data.ratings import Ratings


def relevance_mask(recommended: torch.Tensor, users: torch.Tensor, test: Ratings, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Hit mask ``[U, N]`` and the number of relevant test items per user ``[U]``.

    A hit is a recommended item the user rated ``>= threshold`` in ``test``.
    """
    rel = test.values >= threshold
    n_items = test.n_items
    rel_keys = test.users[rel] * n_items + test.items[rel]
    rel_keys = torch.sort(rel_keys).values
    keys = users.to(recommended.device)[:, None] * n_items + recommended
    pos = torch.searchsorted(rel_keys, keys.reshape(-1)).clamp_max(max(rel_keys.numel() - 1, 0))
    hits = (rel_keys.numel() > 0) & (rel_keys[pos] == keys.reshape(-1)) if rel_keys.numel() else torch.zeros_like(keys.reshape(-1), dtype=torch.bool)
    hits = hits.reshape(keys.shape) & (recommended >= 0)
    n_rel = torch.bincount(test.users[rel], minlength=test.n_users)[users]
    return hits, n_rel


def topn_metrics(recommended: torch.Tensor, users: torch.Tensor, test: Ratings, threshold: float) -> dict[str, float]:
    """Precision@N, Recall@N and F1@N averaged over users with >= 1 relevant test item, plus coverage.

    precision_u = |hits_u| / N;  recall_u = |hits_u| / |relevant_u|;  F1 = 2PR/(P+R) of the averaged P and R;
    coverage = |distinct recommended items| / M. Padding entries (index -1) in ``recommended`` count as misses.
    """
    n = recommended.shape[1]
    hits, n_rel = relevance_mask(recommended, users, test, threshold)
    keep = n_rel > 0
    n_hits = hits.sum(1).double()
    if int(keep.sum()) == 0:
        precision = recall = 0.0
    else:
        precision = float((n_hits[keep] / n).mean())
        recall = float((n_hits[keep] / n_rel[keep].double()).mean())
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    valid = recommended[recommended >= 0]
    coverage = float(torch.unique(valid).numel() / test.n_items)
    return {f"precision@{n}": precision, f"recall@{n}": recall, f"f1@{n}": f1, "coverage": coverage, "topn_users": int(keep.sum())}
