"""Crafted canaries: extreme ratings on items nobody else rates.

``kind=user`` (user-level audits): canary c is a NEW user who rates ``history`` popular items with their rounded item
means (blending in) and one canary item i_c with the scale maximum -- an item no real user rates, so its training
statistics come from the canary alone. ``kind=rating`` (rating-level audits): canary c is ONE rating (u_c, i_c,
r_max) added to an existing user u_c (distinct users, distinct canary items), i.e. exactly a rating-level neighbour.

Edge designs (the inputs where a sensitivity bound is tight or was broken), user canaries whose profile size is
chosen by :func:`canary_history`:

* ``kind=floor`` -- |R_c| = C / s0 + 1 ratings, so at the data-independent start S = s0 (1 - I) of ``init=constant``
  every target of the canary has D = sum_{j != i} |s_ij| = C EXACTLY: the kink of the Eq. (2) floor, where the
  clipped norm and the released gradient once could follow different rules.
* ``kind=tau`` -- |R_c| = tau ratings, exactly the cap ``mechanism.max_user_ratings``: the largest profile the cap
  keeps whole, i.e. the user whose whole-profile sensitivity the cap is there to bound.

The auditor knows every canary's data. Its score for canary c is how well the released model predicts the canary
rating: ``-|r_hat(u_c, i_c) - r_max|`` computed with Eq. (2) from the released S and r_bar and the canary owner's
known history (canary rating included) -- higher when the canary was trained on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dprec_torch.data.item_features import ITEM_FEATURES, ItemFeatures, item_features_of
from dprec_torch.data.ratings import Ratings
from dprec_torch.errors import ConfigError

KINDS = ("user", "rating", "floor", "tau")
USER_KINDS = ("user", "floor", "tau")  # a canary is a new user with a whole profile


def canary_history(kind: str, history: int, floor_c: float | None = None, init_value: float | None = None,
                   tau: int | None = None) -> int:
    """History items per user canary (the canary item comes on top): ``history`` for ``user``; C / s0 for ``floor``
    (then D = C exactly at S = s0 (1 - I)); tau - 1 for ``tau`` (|R_c| = tau)."""
    if kind == "floor":
        if floor_c is None or not init_value:
            raise ConfigError("audit.canary=floor needs model.floor_c and mechanism.init=constant with init_value > 0")
        h = float(floor_c) / float(init_value)
        if h < 1 or abs(h - round(h)) > 1e-9:
            raise ConfigError(f"audit.canary=floor needs model.floor_c / mechanism.init_value to be a whole number >= 1 "
                              f"(D = C exactly), got {floor_c:g} / {init_value:g}")
        return int(round(h))
    if kind == "tau":
        if not tau or int(tau) < 2:
            raise ConfigError("audit.canary=tau needs the cap: set +mechanism.max_user_ratings=<tau >= 2>")
        return int(tau) - 1
    return int(history)


@dataclass
class CanarySet:
    """m canaries over an id space extended by m canary items (and m canary users for kind=user)."""

    kind: str
    base: Ratings  # the real data, re-indexed into the extended id space
    users: torch.Tensor  # canary ratings (all of them: history + target)
    items: torch.Tensor
    values: torch.Tensor
    owner: torch.Tensor  # canary index of every canary rating
    target_user: torch.Tensor  # [m]
    target_item: torch.Tensor  # [m]
    target_value: float

    @property
    def m(self) -> int:
        return int(self.target_item.numel())

    def dataset(self, included: torch.Tensor) -> Ratings:
        """The real data plus the ratings of the included canaries (``included``: bool [m])."""
        keep = included.bool()[self.owner]
        b = self.base
        return Ratings(torch.cat([b.users, self.users[keep]]), torch.cat([b.items, self.items[keep]]),
                       torch.cat([b.values, self.values[keep]]), b.n_users, b.n_items, b.scale, meta=dict(b.meta))

    def known(self) -> Ratings:
        """What the auditor knows: the owners' full histories with every canary rating (for scoring)."""
        b = self.base
        owners = torch.zeros(b.n_users, dtype=torch.bool)
        owners[self.target_user] = True
        sel = owners[b.users]
        return Ratings(torch.cat([b.users[sel], self.users]), torch.cat([b.items[sel], self.items]),
                       torch.cat([b.values[sel], self.values]), b.n_users, b.n_items, b.scale, meta=dict(b.meta))


def _canary_item_features(base: Ratings, m: int) -> dict:
    """The public item features of ``base`` (if any) with a zero row for each canary item: canaries are invented items
    without catalogue metadata, so a model's feature term is 0 on them (the releases never read features)."""
    if base.meta.get(ITEM_FEATURES) is None:
        return {}
    f = item_features_of(base, "audit")
    padded = torch.cat([f.matrix, torch.zeros(m, f.matrix.shape[1], dtype=f.matrix.dtype)])
    return {ITEM_FEATURES: ItemFeatures(padded, f.names, f"{f.source} (+{m} canary items: zero rows)")}


def make_canaries(base: Ratings, m: int, kind: str = "user", history: int = 5, seed: int = 0) -> CanarySet:
    """Append ``m`` canary items (and users for ``kind=user``) to ``base``'s id space."""
    if kind not in KINDS:
        raise ConfigError(f"audit.canary must be one of {KINDS}, got '{kind}'")
    if m < 2:
        raise ConfigError(f"audit.canaries must be >= 2, got {m}")
    gen = torch.Generator().manual_seed(int(seed))
    n_items = base.n_items + m
    target_item = torch.arange(base.n_items, n_items)
    hi = float(base.scale.hi)
    if kind in USER_KINDS:
        n_users = base.n_users + m
        target_user = torch.arange(base.n_users, n_users)
        if history > base.n_items:
            raise ConfigError(f"user canaries need {history} history items, the data has {base.n_items}")
        popular = torch.argsort(base.item_counts(), descending=True)[: min(base.n_items, max(history * 4, history))]
        keys = torch.rand(m, popular.numel(), generator=gen)
        pick = popular[torch.argsort(keys, dim=1)[:, :history]]  # m random subsets of the popular items
        means = base.item_means()
        h_users = target_user.repeat_interleave(history)
        h_items = pick.flatten()
        h_vals = means[h_items].round().clamp(base.scale.lo, hi)
        users = torch.cat([h_users, target_user])
        items = torch.cat([h_items, target_item])
        values = torch.cat([h_vals, torch.full((m,), hi)])
        owner = torch.cat([torch.arange(m).repeat_interleave(history), torch.arange(m)])
    else:
        n_users = base.n_users
        active = torch.nonzero(base.user_counts() >= 2).flatten()
        if active.numel() < m:
            raise ConfigError(f"rating canaries need {m} distinct users with >= 2 ratings, the data has {active.numel()}")
        target_user = active[torch.randperm(active.numel(), generator=gen)[:m]]
        users, items, values = target_user, target_item, torch.full((m,), hi)
        owner = torch.arange(m)
    real = Ratings(base.users, base.items, base.values, n_users, n_items, base.scale, meta=_canary_item_features(base, m))
    return CanarySet(kind, real, users, items, values.float(), owner, target_user, target_item, hi)


@torch.no_grad()
def score_canaries(model, canaries: CanarySet) -> torch.Tensor:
    """-|r_hat(u_c, i_c) - r_max| per canary, from the released model and the known histories."""
    from dprec_torch.models.batching import make_batch

    known = canaries.known()
    user_mask = torch.zeros(known.n_users, dtype=torch.bool)
    user_mask[canaries.target_user] = True
    is_target = torch.zeros(len(known), dtype=torch.bool)
    is_target[len(known) - canaries.m:] = True  # the canary targets: the last m known ratings, in canary order
    batch = make_batch(known, model.item_means, is_target, user_mask)
    pred = model.batch_predict(batch)  # targets come out in ascending position = canary order
    return -(pred.double() - canaries.target_value).abs()
