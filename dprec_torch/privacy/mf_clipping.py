"""L1 norms of MF's per-example gradients (the L2 ones are ``MF.per_example_grad_norms``).

With e~ = e * m (m = ``MF.in_range``, 0 where the training clip is active) and the derivatives
d/dg = s, d/db_u = 1, d/db_i = 1, d/dp_u = q_i, d/dq_i = p_u (see :mod:`dprec_torch.models.mf`):

    unit=rating:  ||g_ui||_1 = |e~_ui| (s + 2 + ||p_u||_1 + ||q_i||_1)
    unit=user:    ||g_u||_1  = (s + 1) |sum_i e~_ui|                 (g and b_u)
                             + sum_i |e~_ui| (1 + ||p_u||_1)          (b_i and q_i: u rates each item once)
                             + ||sum_i e~_ui q_i||_1                   (p_u)

computed with ``index_add_`` over the batch rows (no loop over users).
"""

from __future__ import annotations

from typing import Any

import torch

from dprec_torch.errors import ConfigError


@torch.no_grad()
def mf_grad_norms_l1(model: Any, batch: Any, residuals: torch.Tensor, unit: str) -> torch.Tensor:
    """One L1 norm per target (``unit=rating``) or per batch row (``unit=user``), float64."""
    if unit not in ("rating", "user"):
        raise ConfigError(f"unit must be rating or user, got '{unit}'")
    users = model.batch_users(batch)
    r = model.raw(users, batch.items).double()
    e = residuals.double() * model.in_range(r)
    s = float(model.mu_scale)
    p, q = model.user_factors(users).double(), model.item_factors(batch.items).double()
    if unit == "rating":
        return e.abs() * (s + 2.0 + p.abs().sum(-1) + q.abs().sum(-1))
    n_rows = batch.users.numel()
    tot = torch.zeros(n_rows, dtype=e.dtype, device=e.device).index_add_(0, batch.rows, e)
    ab = torch.zeros(n_rows, dtype=e.dtype, device=e.device).index_add_(0, batch.rows, e.abs())
    v = torch.zeros(n_rows, q.shape[1], dtype=e.dtype, device=e.device).index_add_(0, batch.rows, e[:, None] * q)
    p_rows = model.user_factors(batch.users).double()
    return (s + 1.0) * tot.abs() + ab * (1.0 + p_rows.abs().sum(-1)) + v.abs().sum(-1)
