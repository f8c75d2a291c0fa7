"""Item-item similarity from sparse ratings via Gram products (no per-pair loops).

All similarities are sums over co-rating users, so each is a Gram product
``A^T B`` of two value vectors on the ratings' sparsity pattern. We compute it
as sparse (items x users) times a dense column block of B, one block of items
at a time, so peak memory is ``n_users x block`` beyond the ``M x M`` result.
"""

from __future__ import annotations

import torch

from dprec_torch.data.ratings import Ratings, _to_csr


def gram(ratings: Ratings, a: torch.Tensor, b: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """G[i, j] = sum_u a_ui * b_uj, where a and b are values aligned with ``ratings``' COO entries."""
    m, n = ratings.n_items, ratings.n_users
    a_t = _to_csr(ratings.items, ratings.users, a, m, n)  # items x users
    out = torch.empty(m, m, dtype=a.dtype, device=a.device)
    for start in range(0, m, block):
        stop = min(start + block, m)
        sel = (ratings.items >= start) & (ratings.items < stop)
        dense = torch.zeros(n, stop - start, dtype=b.dtype, device=b.device)
        dense[ratings.users[sel], ratings.items[sel] - start] = b[sel]
        out[:, start:stop] = torch.sparse.mm(a_t, dense)
    return out


def pearson(ratings: Ratings, min_support: int = 1, shrinkage: float = 0.0) -> torch.Tensor:
    """Item-based Pearson correlation over co-rating users.

    s_ij = sum_u x_ui x_uj / sqrt(sum_u x_ui^2 I_uj * sum_u x_uj^2 I_ui),  x_ui = r_ui - r_bar_i,
    with all sums over users who rated both i and j. Optional shrinkage
    s * n_ij / (n_ij + shrinkage). Diagonal and pairs with < min_support co-raters are 0.
    """
    x = ratings.values - ratings.item_means()[ratings.items]
    ones = torch.ones_like(x)
    num = gram(ratings, x, x)
    sq = gram(ratings, x * x, ones)  # sq[i, j] = sum over co-raters of x_ui^2
    den = torch.sqrt(sq * sq.T)
    sim = torch.where(den > 0, num / den.clamp_min(1e-12), torch.zeros_like(num))
    return _finish(ratings, sim, min_support, shrinkage)


def cosine(ratings: Ratings, min_support: int = 1, shrinkage: float = 0.0) -> torch.Tensor:
    """Item-based cosine similarity of raw ratings over co-rating users.

    s_ij = sum_u r_ui r_uj / sqrt(sum_u r_ui^2 I_uj * sum_u r_uj^2 I_ui).
    """
    r = ratings.values
    ones = torch.ones_like(r)
    num = gram(ratings, r, r)
    sq = gram(ratings, r * r, ones)
    den = torch.sqrt(sq * sq.T)
    sim = torch.where(den > 0, num / den.clamp_min(1e-12), torch.zeros_like(num))
    return _finish(ratings, sim, min_support, shrinkage)


def _finish(ratings: Ratings, sim: torch.Tensor, min_support: int, shrinkage: float) -> torch.Tensor:
    if min_support > 1 or shrinkage > 0:
        ones = torch.ones_like(ratings.values)
        support = gram(ratings, ones, ones)
        sim = torch.where(support >= min_support, sim, torch.zeros_like(sim))
        if shrinkage > 0:
            sim = sim * support / (support + shrinkage)
    sim.fill_diagonal_(0.0)
    return sim
