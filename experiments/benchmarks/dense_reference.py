"""Straightforward dense implementations of one training epoch, the yardstick of the benchmarks.

Like the MATLAB reference code, every quantity is a dense users x items matrix and every
product a dense GEMM; nothing exploits sparsity. Each class wraps the package's own model
(same parameters, initialisation, item means and fallback) and only replaces the forward
and backward of a step, so that the same mechanism optimizer (same seed, same noise)
updates both and the test RMSE of the two implementations must agree to float tolerance.

PNBM, Wang & Tang Eq. (2) on dense X = (R - r_bar) o I, I (N x M) and S (M x M):
    NUM = X S^T,   RAW = I |S|^T,   DEN = max(C, RAW),   R_hat = r_bar + NUM / DEN        (2 GEMMs)
    exact:     G = (E/DEN)^T X - sign(S) o ((E NUM/DEN^2 [RAW >= C])^T I)                  (2 GEMMs)
    paper_eq5: G = (E/DEN)^T X - ((E NUM/DEN^2)^T I)                                        (Eq. (5))
with E = the (clipped) residuals at the observed targets, 0 elsewhere.

MF, r_hat = clip(mu + b_u + b_i + P Q^T) as a dense N x M matrix:
    dP = E Q, dQ = E^T P, db_u = E 1, db_i = E^T 1, dg = s 1^T E 1     (E masked by the clip)
"""

from __future__ import annotations

import torch

from dprec_torch.data.ratings import Ratings
from dprec_torch.models.batching import UserBatch


def dense_matrices(train: Ratings, item_means: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense X = (r - r_bar) I and I, both N x M."""
    x = torch.zeros(train.n_users, train.n_items, device=train.device)
    ind = torch.zeros_like(x)
    x[train.users, train.items] = train.values - item_means[train.items]
    ind[train.users, train.items] = 1.0
    return x, ind


class DensePNBMEpoch:
    """Dense full-batch epoch for a :class:`dprec_torch.models.pnbm.PNBM` (see module docstring)."""

    def __init__(self, model, train: Ratings) -> None:
        self.model, self.train = model, train
        self.x, self.ind = dense_matrices(train, model.item_means)

    def step(self, optimizer, batch: UserBatch) -> float:
        """One mechanism step on the full batch; returns the sum of squared (unclipped) errors."""
        m, t = self.model, self.train
        S = m.S.detach()
        optimizer.zero_grad(set_to_none=True)
        num = self.x @ S.T
        raw = self.ind @ S.abs().T
        den = raw.clamp_min(m.floor_c)
        pred = m.item_means[None, :] + num / den
        residuals = pred[t.users, t.items] - t.values
        e_t = optimizer.clip_residuals(residuals, batch, m)
        e = torch.zeros_like(num)
        e[t.users, t.items] = e_t
        a = e / den
        b = e * num / (den * den)
        if m.gradient == "exact":
            b = b * (raw >= m.floor_c)
            g = a.T @ self.x - torch.sign(S) * (b.T @ self.ind)
        else:
            g = a.T @ self.x - b.T @ self.ind
        m.S.grad = g
        optimizer.step()
        m.project_()
        return float((residuals.double() ** 2).sum())

    @torch.no_grad()
    def predict(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """Eq. (2) with the top-N_k neighbour matrix, every user's full history, dense GEMMs."""
        m = self.model
        sk = m.neighbour_matrix()
        num = self.x @ sk.T
        den = (self.ind @ sk.abs().T).clamp_min(m.floor_c)
        u = users.clamp(0, self.train.n_users - 1)
        i = items.clamp(0, self.train.n_items - 1)
        out = m.item_means[i] + num[u, i] / den[u, i]
        return m.fallback_.finish(users, items, out)


class DenseMFEpoch:
    """Dense full-batch epoch for :class:`dprec_torch.models.mf.MF` (see module docstring)."""

    def __init__(self, model, train: Ratings) -> None:
        self.model, self.train = model, train
        self.mask = torch.zeros(train.n_users, train.n_items, device=train.device)
        self.mask[train.users, train.items] = 1.0

    def step(self, optimizer, batch: UserBatch) -> float:
        m, t = self.model, self.train
        optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            p, q = m.user_factors.weight, m.item_factors.weight
            raw = m.mu + m.user_bias.weight + m.item_bias.weight.T + p @ q.T
            pred = m.scale.clip(raw) if m.clip_training_predictions else raw
            residuals = pred[t.users, t.items] - t.values
            e_t = optimizer.clip_residuals(residuals, batch, m)
            e = torch.zeros_like(raw)
            e[t.users, t.items] = e_t
            if m.clip_training_predictions:
                e = e * ((raw > m.scale.lo) & (raw < m.scale.hi))
            m.user_factors.weight.grad = e @ q
            m.item_factors.weight.grad = e.T @ p
            m.user_bias.weight.grad = e.sum(1, keepdim=True)
            m.item_bias.weight.grad = e.sum(0)[:, None]
            m.global_bias.grad = (m.mu_scale * e.sum()).reshape(())
        optimizer.step()
        return float((residuals.double() ** 2).sum())

    @torch.no_grad()
    def predict(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        m = self.model
        full = m.mu + m.user_bias.weight + m.item_bias.weight.T + m.user_factors.weight @ m.item_factors.weight.T
        u = users.clamp(0, self.train.n_users - 1)
        i = items.clamp(0, self.train.n_items - 1)
        out = full[u, i]
        if m.fallback_ is not None:
            return m.fallback_.finish(users, items, out)
        return m.scale.clip(out)
