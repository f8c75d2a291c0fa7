"""The in-memory form of a ratings set: COO index tensors plus metadata.

No dense users x items matrix is ever built here. Sparse views (CSR) are
produced on demand on whatever device the ratings live on.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import PurePath

import torch


@dataclass(frozen=True)
class RatingScale:
    """The rating range ``[lo, hi]``; every sensitivity depends on ``span = hi - lo``."""

    lo: float
    hi: float

    @property
    def span(self) -> float:
        """phi = r_max - r_min (Wang & Tang, Sec. 3)."""
        return float(self.hi - self.lo)

    def clip(self, x: torch.Tensor) -> torch.Tensor:
        """Clip predictions to the scale."""
        return x.clamp(self.lo, self.hi)


#: key of the :class:`ItemUniverse` in ``Ratings.meta`` (set by loaders that know where their items come from)
ITEM_UNIVERSE = "item_universe"


@dataclass(frozen=True)
class ItemUniverse:
    """Where the contiguous item index ``0..n_items-1`` comes from.

    ``catalog`` is the path of a public catalogue (MovieLens ``movies.dat`` / ``u.item``): every catalogued item
    has an index whether or not anyone rated it, so the index reads no rating. ``None``: the index holds the
    items rated in the data files (train and test), which a release reveals; it is then *treated* as public.
    """

    n_items: int
    catalog: str | None = None

    def describe(self) -> str:
        """One line for the dataset record, e.g. ``catalogue movies.dat (3883 items)``."""
        if self.catalog is not None:
            return f"catalogue {PurePath(self.catalog).name} ({self.n_items} items)"
        return f"rated items ({self.n_items} items, treated as public)"

    def scope(self) -> list[str]:
        """What the privacy scope states about the item universe and the user count."""
        users = ("the number of users: the user index holds every user with a rating (train and test), and its "
                 "size is treated as public, not protected by epsilon")
        if self.catalog is not None:
            items = (f"the item universe: the public catalogue {PurePath(self.catalog).name} ({self.n_items} items, every one "
                     "indexed whether rated or not, in catalogue order); no rating enters it, so it costs no privacy")
        else:
            items = (f"the item universe: the {self.n_items} items rated anywhere in the data (train and test), "
                     "treated as public: the released rows reveal which items someone rated; no public catalogue "
                     "was given to index items by")
        return [items, users]


@dataclass
class Ratings:
    """Observed ratings as COO triples over contiguous ids ``0..n_users-1``, ``0..n_items-1``.

    Train and test sets of one dataset share ``n_users``/``n_items`` (one id space),
    so a test user without training ratings is an *unknown* user for a predictor.
    """

    users: torch.Tensor  # int64 (nnz,)
    items: torch.Tensor  # int64 (nnz,)
    values: torch.Tensor  # float32 (nnz,)
    n_users: int
    n_items: int
    scale: RatingScale
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.users = torch.as_tensor(self.users, dtype=torch.long)
        self.items = torch.as_tensor(self.items, dtype=torch.long, device=self.users.device)
        self.values = torch.as_tensor(self.values, dtype=torch.float32, device=self.users.device)

    # ----------------------------------------------------------------- basics
    def __len__(self) -> int:
        return int(self.values.numel())

    @property
    def device(self) -> torch.device:
        return self.values.device

    def to(self, device: torch.device | str) -> "Ratings":
        """A copy on ``device``."""
        return replace(self, users=self.users.to(device), items=self.items.to(device), values=self.values.to(device))

    def select(self, index: torch.Tensor) -> "Ratings":
        """The ratings at ``index`` (a bool mask or integer positions), same id space."""
        return replace(self, users=self.users[index], items=self.items[index], values=self.values[index], meta=dict(self.meta))

    def sorted_by_user(self) -> "Ratings":
        """Ratings ordered by (user, item): the row order a CSR matrix needs."""
        return self.select(torch.argsort(self.users * self.n_items + self.items))

    # ------------------------------------------------------------- statistics
    @property
    def global_mean(self) -> float:
        return float(self.values.mean()) if len(self) else (self.scale.lo + self.scale.hi) / 2

    def user_counts(self) -> torch.Tensor:
        """|R_u| for every user (zeros for users without ratings)."""
        return torch.bincount(self.users, minlength=self.n_users)

    def item_counts(self) -> torch.Tensor:
        """|I_i| for every item."""
        return torch.bincount(self.items, minlength=self.n_items)

    def item_sums(self) -> torch.Tensor:
        return torch.zeros(self.n_items, device=self.device).index_add_(0, self.items, self.values)

    def item_means(self) -> torch.Tensor:
        """r_bar_i; items without ratings get the global mean."""
        return self._means(self.item_counts(), self.item_sums())

    def user_means(self) -> torch.Tensor:
        """r_bar_u; users without ratings get the global mean."""
        return self._means(self.user_counts(), torch.zeros(self.n_users, device=self.device).index_add_(0, self.users, self.values))

    def _means(self, counts: torch.Tensor, sums: torch.Tensor) -> torch.Tensor:
        counts = counts.to(self.values.dtype)
        means = sums / counts.clamp_min(1)
        return torch.where(counts > 0, means, torch.full_like(means, self.global_mean))

    # ----------------------------------------------------------- sparse views
    def csr(self, values: torch.Tensor | None = None) -> torch.Tensor:
        """users x items sparse CSR matrix holding ``values`` (default: the ratings)."""
        return _to_csr(self.users, self.items, self.values if values is None else values, self.n_users, self.n_items)

    def indicator_csr(self) -> torch.Tensor:
        """The indicator I (users x items), CSR."""
        return self.csr(torch.ones_like(self.values))

    def centered_csr(self, item_means: torch.Tensor | None = None) -> torch.Tensor:
        """(r_uj - r_bar_j) I_uj as a users x items CSR matrix (Eq. 2's numerator input)."""
        means = self.item_means() if item_means is None else item_means
        return self.csr(self.values - means[self.items])

    def describe(self) -> str:
        return (
            f"{len(self):,} ratings, {int((self.user_counts() > 0).sum()):,} users, "
            f"{int((self.item_counts() > 0).sum()):,} items, scale [{self.scale.lo:g}, {self.scale.hi:g}]"
        )


def _to_csr(rows: torch.Tensor, cols: torch.Tensor, vals: torch.Tensor, n_rows: int, n_cols: int) -> torch.Tensor:
    """COO triples (any order, no duplicates) to a CSR tensor on the same device."""
    key = rows * n_cols + cols
    if key.numel() > 1 and not bool((key[1:] > key[:-1]).all()):  # training sets arrive sorted: skip the sort then
        order = torch.argsort(key)
        rows, cols, vals = rows[order], cols[order], vals[order]
    crow = torch.zeros(n_rows + 1, dtype=torch.long, device=rows.device)
    crow[1:] = torch.cumsum(torch.bincount(rows, minlength=n_rows), 0)
    return torch.sparse_csr_tensor(crow, cols, vals, size=(n_rows, n_cols), check_invariants=False)


@dataclass
class Fold:
    """One train/test split of a dataset (shared id space)."""

    index: int
    train: Ratings
    test: Ratings
    name: str = ""

    def to(self, device: torch.device | str) -> "Fold":
        return Fold(self.index, self.train.to(device), self.test.to(device), self.name)


@dataclass
class RatingDataset:
    """A loaded dataset: its folds, the raw-id maps and a preprocessing report."""

    name: str
    folds: list[Fold]
    user_ids: list  # raw id of contiguous user index k
    item_ids: list  # raw id of contiguous item index k
    scale: RatingScale
    report: dict = field(default_factory=dict)

    @property
    def n_users(self) -> int:
        return len(self.user_ids)

    @property
    def n_items(self) -> int:
        return len(self.item_ids)

    def record(self) -> dict:
        """What was loaded, for ``metrics.json``: name, source, counts, scale and each fold's sizes."""
        return {
            "name": self.name,
            "source": self.report.get("source"),
            "n_ratings": self.report.get("n_ratings"),
            "n_users": self.n_users,
            "n_items": self.n_items,
            "item_universe": self.report.get(ITEM_UNIVERSE) or ItemUniverse(self.n_items).describe(),
            "scale": [self.scale.lo, self.scale.hi],
            "folds": {f.name or str(f.index): {"train": len(f.train), "test": len(f.test)} for f in self.folds},
            "preprocessing": self.report.get("preprocessing"),
            "validation": self.report.get("validation"),
        }


def dense_rows(csr: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Dense ``[len(rows), n_cols]`` copy of the selected rows of a CSR matrix (batched gather)."""
    crow, col, val = csr.crow_indices(), csr.col_indices(), csr.values()
    starts = crow[rows]
    counts = crow[rows + 1] - starts
    out = torch.zeros(rows.numel(), csr.shape[1], dtype=val.dtype, device=val.device)
    total = int(counts.sum())
    if total == 0:
        return out
    row_ids = torch.repeat_interleave(torch.arange(rows.numel(), device=rows.device), counts)
    first = torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    idx = torch.repeat_interleave(starts, counts) + torch.arange(total, device=rows.device) - first
    out[row_ids, col[idx]] = val[idx]
    return out
