"""Mini-batches of users with their full rating history, as sparse CSR blocks.

A batch carries the *history* of each sampled user (all of their training
ratings, needed by Eq. (2)) and the *targets* (the ratings whose error enters
the loss). With rating-level sampling the targets are a subset of the history;
with user-level sampling they are the whole history.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dprec_torch.data.ratings import Ratings, _to_csr


@dataclass
class UserBatch:
    """History blocks ``x`` (centred ratings) and ``ind`` (indicator), |B| x M CSR, plus targets."""

    users: torch.Tensor  # global ids of the batch rows
    x: torch.Tensor  # CSR |B| x M, (r_uj - r_bar_j) I_uj
    ind: torch.Tensor  # CSR |B| x M, I_uj
    rows: torch.Tensor  # batch row of each target
    items: torch.Tensor  # item of each target
    values: torch.Tensor  # rating of each target
    target_index: torch.Tensor  # position of each target in the training Ratings

    @property
    def n_targets(self) -> int:
        return int(self.values.numel())


def make_batch(train: Ratings, item_means: torch.Tensor, rating_mask: torch.Tensor, user_mask: torch.Tensor) -> UserBatch:
    """Build a batch: history of users in ``user_mask``, targets = ratings in ``rating_mask``.

    ``rating_mask`` must only select ratings of users in ``user_mask``.
    """
    users = torch.nonzero(user_mask).flatten()
    row_of = torch.full((train.n_users,), -1, dtype=torch.long, device=train.device)
    row_of[users] = torch.arange(users.numel(), device=train.device)
    hist = user_mask[train.users]
    h_rows, h_items, h_vals = row_of[train.users[hist]], train.items[hist], train.values[hist]
    x = _to_csr(h_rows, h_items, h_vals - item_means[h_items], users.numel(), train.n_items)
    ind = _to_csr(h_rows, h_items, torch.ones_like(h_vals), users.numel(), train.n_items)
    tgt = torch.nonzero(rating_mask).flatten()
    return UserBatch(users, x, ind, row_of[train.users[tgt]], train.items[tgt], train.values[tgt], tgt)


def full_batch(train: Ratings, item_means: torch.Tensor) -> UserBatch:
    """Every user, every rating (gamma = 1)."""
    all_users = train.user_counts() > 0
    return make_batch(train, item_means, torch.ones(len(train), dtype=torch.bool, device=train.device), all_users)


class PoissonBatchSampler:
    """Poisson sampling with ratio gamma of ratings (``unit=rating``) or of users (``unit=user``).

    Each unit is included independently with probability gamma, which is the
    sampling scheme the subsampling-amplification bounds assume.
    """

    def __init__(self, train: Ratings, item_means: torch.Tensor, ratio: float, unit: str, generator: torch.Generator) -> None:
        if not 0 < ratio <= 1:
            raise ValueError(f"sampling ratio must be in (0, 1], got {ratio}")
        if unit not in ("rating", "user"):
            raise ValueError(f"sampling unit must be 'rating' or 'user', got {unit}")
        self.train, self.item_means, self.ratio, self.unit, self.generator = train, item_means, float(ratio), unit, generator
        self._full = full_batch(train, item_means) if ratio >= 1 else None

    def steps_per_epoch(self) -> int:
        return max(1, round(1.0 / self.ratio))

    def sample(self) -> UserBatch:
        if self._full is not None:
            return self._full
        t = self.train
        if self.unit == "rating":
            pick = torch.rand(len(t), generator=self.generator, device=self.generator.device).to(t.device) < self.ratio
            user_mask = torch.zeros(t.n_users, dtype=torch.bool, device=t.device)
            user_mask[t.users[pick]] = True
        else:
            user_mask = torch.rand(t.n_users, generator=self.generator, device=self.generator.device).to(t.device) < self.ratio
            pick = user_mask[t.users]
        return make_batch(t, self.item_means, pick, user_mask)
