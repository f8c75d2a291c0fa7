"""Item-item similarity from sparse ratings via Gram products (no per-pair loops).

All similarities are sums over co-rating users, so each is a Gram product
``G[i, j] = sum_u a_ui b_uj`` of two value vectors on the ratings' sparsity pattern. We
compute it with the sparse-pair scatter of :mod:`dprec_torch.models.pair_kernels`: every
(rating (u, i), rated item j) pair adds a_ui b_uj to G[i, j], in cache-friendly chunks,
one block of rows at a time. The work is sum_u |R_u|^2 multiply-adds (the co-rated pairs),
not N M^2, and the memory beyond the ``M x M`` results is O(nnz + block).
"""

from __future__ import annotations

import torch

from dprec_torch.data.ratings import Ratings
from dprec_torch.models.pair_kernels import gram_row_blocks

BLOCK_CELLS = 1 << 22  # cells of one dense block of rows while accumulating


def grams(ratings: Ratings, channels: list[tuple[torch.Tensor, torch.Tensor | None]]) -> list[torch.Tensor]:
    """Dense M x M products G_c[i, j] = sum_u a_ui b_uj for channels (a, b) (b = None: ones), in one sweep."""
    m = ratings.n_items
    outs = [torch.empty(m, m, dtype=a.dtype, device=a.device) for a, _ in channels]
    blocks = gram_row_blocks(ratings.users, ratings.items, channels, ratings.n_users, m, max(1, BLOCK_CELLS // (m + 1)))
    for start, stop, parts in blocks:
        for out, part in zip(outs, parts):
            out[start:stop] = part
    return outs


def gram(ratings: Ratings, a: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """G[i, j] = sum_u a_ui * b_uj, where a and b are values aligned with ``ratings``' COO entries (b = None: ones)."""
    return grams(ratings, [(a, b)])[0]


def pearson(ratings: Ratings, min_support: int = 1, shrinkage: float = 0.0) -> torch.Tensor:
    """Item-based Pearson correlation over co-rating users (all sums over users who rated both i and j):

    s_ij = sum_u x_ui x_uj / sqrt(sum_u x_ui^2 I_uj * sum_u x_uj^2 I_ui),  x_ui = r_ui - r_bar_i,
    optionally shrunk to s * n_ij / (n_ij + shrinkage). Diagonal and pairs with < min_support co-raters are 0.
    """
    return _normalised(ratings, ratings.values - ratings.item_means()[ratings.items], min_support, shrinkage)


def cosine(ratings: Ratings, min_support: int = 1, shrinkage: float = 0.0) -> torch.Tensor:
    """Item-based cosine similarity of raw ratings over co-rating users: :func:`pearson` with x_ui = r_ui."""
    return _normalised(ratings, ratings.values, min_support, shrinkage)


def _normalised(ratings: Ratings, x: torch.Tensor, min_support: int, shrinkage: float) -> torch.Tensor:
    """The body of :func:`pearson` and :func:`cosine` for the per-rating values ``x``."""
    num, sq = grams(ratings, [(x, x), (x * x, None)])  # sq[i, j] = sum over co-raters of x_ui^2
    den = torch.sqrt(sq * sq.T)
    sim = torch.where(den > 0, num / den.clamp_min(1e-12), torch.zeros_like(num))
    if min_support > 1 or shrinkage > 0:
        support = gram(ratings, torch.ones_like(ratings.values), None)
        sim = torch.where(support >= min_support, sim, torch.zeros_like(sim))
        if shrinkage > 0:
            sim = sim * support / (support + shrinkage)
    sim.fill_diagonal_(0.0)
    return sim
