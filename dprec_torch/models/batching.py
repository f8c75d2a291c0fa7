"""Mini-batches of users with their full rating history, as sparse CSR blocks.

A batch carries the *history* of each sampled user (all of their training ratings, needed by Eq. (2)) and the
*targets* (the ratings whose error enters the loss). With rating-level sampling the targets are a subset of the
history; with user-level sampling they are the whole history.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from dprec_torch.data.ratings import Ratings, _to_csr
from dprec_torch.seeding import SecretGenerator


class _HistoryBlock:
    """``UserBatch.x`` / ``.ind``: the field ``x_`` / ``ind_``, built by the batch's ``history_builder`` on first read or
    write."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = name + "_"

    def __get__(self, batch: "UserBatch | None", owner: type | None = None) -> Any:
        if batch is None:
            return self
        batch._history()
        return getattr(batch, self.slot)

    def __set__(self, batch: "UserBatch", value: torch.Tensor | None) -> None:
        batch._history()
        setattr(batch, self.slot, value)


@dataclass
class UserBatch:
    """History blocks ``x`` (centred ratings) and ``ind`` (indicator), |B| x M CSR, plus targets."""

    users: torch.Tensor  # global ids of the batch rows
    x_: torch.Tensor | None  # CSR |B| x M, (r_uj - r_bar_j) I_uj (None: not built, see make_batch's ``history``)
    ind_: torch.Tensor | None  # CSR |B| x M, I_uj
    rows: torch.Tensor  # batch row of each target
    items: torch.Tensor  # item of each target
    values: torch.Tensor  # rating of each target
    target_index: torch.Tensor  # position of each target in the training Ratings
    source: Ratings | None = None  # that training Ratings (None: unknown), so per-user terms can be read from it
    #: the targets are every rating of each sampled user (make_batch without a rating mask): the user-level checks
    user_level: bool = False
    #: [|B| + 1] start of each row's targets when they are grouped by row (make_batch's segment path), else None
    row_offsets: torch.Tensor | None = None
    #: [|B|] where each row's run of targets starts in ``source`` (with ``row_offsets``), else None
    source_starts: torch.Tensor | None = None
    #: builds (x, ind) on first read (make_batch's user-level batches: a model that reads the targets only, such as
    #: the low-rank PNBM, never pays for the CSR blocks)
    history_builder: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None = field(default=None, repr=False, compare=False)
    #: [|B|] bool, which rows were sampled this step, for a *masked* batch: every user of ``source`` is a row (the
    #: rows, items and offsets are one fixed full batch, ``base``) and only the sampled rows carry weight (the Trainer
    #: zeroes the others' residuals, so their gradient rows are exactly 0). None: every row was sampled.
    row_mask: torch.Tensor | None = None
    #: the fixed full batch a masked batch reuses (its step-invariant cache included), else None
    base: "UserBatch | None" = field(default=None, repr=False, compare=False)
    #: values derived from this batch and reused within a step (name -> (validity key, value)); the one place a step
    #: parks work between the model's forward and the mechanism's gradient, so a reader sees what is reused
    cache: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def _history(self) -> None:
        if self.x_ is None and self.history_builder is not None:
            self.x_, self.ind_ = self.history_builder()
            self.history_builder = None

    x = _HistoryBlock()
    ind = _HistoryBlock()

    @property
    def has_history(self) -> bool:
        """Whether ``x``/``ind`` exist or can be built (False: make_batch's ``history=False``)."""
        return self.x_ is not None or self.history_builder is not None

    def gather(self, per_rating: torch.Tensor) -> torch.Tensor:
        """``per_rating`` (one value per rating of ``source``) at the targets (:func:`_gather`)."""
        return _gather(per_rating, self.target_index, self.source_starts, self.row_offsets)

    def is_user_level(self) -> bool:
        """Whether the targets are the whole history of each sampled user (what per-user clipping needs)."""
        return self.user_level or (self.has_history and self.n_targets == int(self.ind.values().numel()))

    @property
    def n_targets(self) -> int:
        """The number of targets that enter the loss (a masked batch: the sampled rows' ratings)."""
        return int(self.values.numel()) if self.row_mask is None else int(self.target_mask.sum())

    def target_count(self) -> int | torch.Tensor:
        """:attr:`n_targets`, as a device scalar for a masked batch (counted without waiting for the device)."""
        return int(self.values.numel()) if self.row_mask is None else self.target_mask.sum()

    @property
    def target_mask(self) -> torch.Tensor | None:
        """[#targets] bool: the target's row was sampled (masked batches), else None."""
        if self.row_mask is None:
            return None
        hit = self.cache.get("_target_mask")
        if hit is None:
            hit = self.cache["_target_mask"] = self.row_mask.index_select(0, self.rows)
        return hit

    @property
    def invariant_cache(self) -> dict[str, Any]:
        """The cache of values that do not change between steps drawn from the same full batch (a masked batch's
        ``base``'s cache), else this batch's own :attr:`cache`. A reader keys each entry by what it was derived from."""
        return self.cache if self.base is None else self.base.cache


def same_key(a: tuple, b: tuple) -> bool:
    """Whether two cache keys match: tensors by identity, everything else by ``==``."""
    return len(a) == len(b) and all(x is y if isinstance(x, torch.Tensor) else x == y for x, y in zip(a, b))


#: densify a |B| x M history block on an accelerator up to this many bytes (per block, per dtype)
DENSE_ROWS_MAX_BYTES = 1 << 30


def dense_gemm_wins(n_rows: int, n_cols: int, device: torch.device) -> bool:
    """Whether a |B| x M history block times a dense M x K matrix runs as a dense GEMM on ``device``.

    Chosen by measured cost, not by sparsity: on an H200, R(ML-1M, 4 % dense) x S took 13.8 ms a call as cuSPARSE
    ``csrmm`` and under 2 ms as a dense float32 GEMM (``experiments/benchmarks/gpu_bench.py``, the ``gemm`` row). On the
    CPU the CSR product is the faster one. The dense block must fit in :data:`DENSE_ROWS_MAX_BYTES`.
    """
    return device.type != "cpu" and n_rows * n_cols * 8 <= DENSE_ROWS_MAX_BYTES


def dense_rows(batch: "UserBatch", name: str) -> torch.Tensor:
    """``batch.x`` or ``batch.ind`` as a dense |B| x M tensor, built once and cached on the batch."""
    src = getattr(batch, name)
    hit = batch.cache.get("_dense_" + name)
    if hit is not None and hit[0] is src:
        return hit[1]
    dense = src.to_dense()
    batch.cache["_dense_" + name] = (src, dense)
    return dense


def rows_times(batch: "UserBatch", name: str, mat: torch.Tensor) -> torch.Tensor:
    """``batch.<name> @ mat`` (|B| x M history block times a dense M x K), in ``mat``'s dtype, differentiable in ``mat``:
    a dense GEMM where :func:`dense_gemm_wins`, else the CSR x dense product (the same sums up to summation order)."""
    src = getattr(batch, name)
    if dense_gemm_wins(src.shape[0], src.shape[1], src.device):
        return dense_rows(batch, name).to(mat.dtype) @ mat
    return torch.sparse.mm(src if src.dtype == mat.dtype else src.to(mat.dtype), mat)


def user_offsets(train: Ratings) -> torch.Tensor | None:
    """[N + 1] start of each user's ratings in ``train`` when its ratings are grouped by ascending user (as the data
    layer stores them), else None."""
    u = train.users
    if u.numel() > 1 and not bool((u[1:] >= u[:-1]).all()):
        return None
    off = torch.zeros(train.n_users + 1, dtype=torch.long, device=u.device)
    off[1:] = torch.cumsum(train.user_counts(), 0)
    return off


def _runs_kernel(t: torch.Tensor, n: int) -> bool:
    """Whether a batch of ``n`` ratings copies runs of ``t`` with the CPU kernel (numba; big batches only, as the
    low-rank kernels: :func:`.lowrank_numba.available`)."""
    if t.device.type != "cpu":
        return False
    from dprec_torch.models import lowrank_numba

    return lowrank_numba.available(n)


def _gather(per_rating: torch.Tensor, index: torch.Tensor, starts: torch.Tensor | None,
            row_offsets: torch.Tensor | None) -> torch.Tensor:
    """``per_rating[index]``: ``index_select``, or, for a big CPU batch of runs (``starts``, ``row_offsets``), a copy
    of each row's run (the same values)."""
    if starts is not None and _runs_kernel(per_rating, int(index.numel())):
        from dprec_torch.models import lowrank_numba

        return torch.from_numpy(lowrank_numba.gather_runs(per_rating.numpy(), starts.numpy(), row_offsets.numpy(),
                                                          lowrank_numba.user_chunks(row_offsets)))
    return per_rating.index_select(0, index)


def _segments(offsets: torch.Tensor, users: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(positions of the ratings of ``users`` (ascending ids) in the grouped ratings, the batch row of each, each
    row's offsets in the batch, each row's start in the ratings): what the nonzero of their rating mask gives, from
    the users' offsets instead of a pass over every rating."""
    starts = offsets.index_select(0, users)
    lens = offsets.index_select(0, users + 1) - starts
    row_offsets = torch.zeros(users.numel() + 1, dtype=torch.long, device=users.device)
    torch.cumsum(lens, 0, out=row_offsets[1:])
    if users.device.type == "cpu" and _runs_kernel(users, int(row_offsets[-1])):  # (no host sync on a GPU)
        from dprec_torch.models import lowrank_numba

        pos, rows = lowrank_numba.run_segments(starts.numpy(), row_offsets.numpy(), lowrank_numba.user_chunks(row_offsets))
        return torch.from_numpy(pos), torch.from_numpy(rows), row_offsets, starts
    rows = torch.repeat_interleave(torch.arange(users.numel(), device=users.device), lens)
    shift = starts - row_offsets[:-1]  # each user's start minus its place in the batch
    return torch.arange(rows.numel(), device=users.device) + shift.index_select(0, rows), rows, row_offsets, starts


def make_batch(train: Ratings, item_means: torch.Tensor, rating_mask: torch.Tensor | None, user_mask: torch.Tensor,
               history: bool = True, offsets: torch.Tensor | None = None) -> UserBatch:
    """Build a batch: history of users in ``user_mask``, targets = ratings in ``rating_mask`` (None: every rating of
    those users, i.e. user level), which must only select ratings of users in ``user_mask``. ``history=False`` leaves
    ``x``/``ind`` unbuilt (None) for a model that reads the targets only (``reads_history = False``). ``offsets``:
    :func:`user_offsets` of ``train`` (a user-level batch then gathers its users' segments)."""
    users = torch.nonzero(user_mask).flatten()
    if rating_mask is None and offsets is not None:
        tgt, rows, row_offsets, starts = _segments(offsets, users)
        items, values = (_gather(t, tgt, starts, row_offsets) for t in (train.items, train.values))
        return UserBatch(users, None, None, rows, items, values, tgt, train, user_level=True, row_offsets=row_offsets,
                         source_starts=starts, history_builder=lambda: _blocks(train, item_means, users, rows, items, values))
    row_of = torch.full((train.n_users,), -1, dtype=torch.long, device=train.device)
    row_of[users] = torch.arange(users.numel(), device=train.device)
    hist = user_mask.index_select(0, train.users) if history or rating_mask is None else None

    def ratings(mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        at = torch.nonzero(mask).flatten()
        return (at, row_of.index_select(0, train.users.index_select(0, at)), train.items.index_select(0, at),
                train.values.index_select(0, at))

    tgt, rows, items, values = targets = ratings(hist if rating_mask is None else rating_mask)
    if rating_mask is None:  # user level: the history is the targets, its blocks built when first read
        return UserBatch(users, None, None, rows, items, values, tgt, train, user_level=True,
                         history_builder=lambda: _blocks(train, item_means, users, rows, items, values))
    x = ind = None
    if history:
        _, h_rows, h_items, h_vals = targets if torch.equal(hist, rating_mask) else ratings(hist)
        x, ind = _blocks(train, item_means, users, h_rows, h_items, h_vals)
    return UserBatch(users, x, ind, rows, items, values, tgt, train)


def _blocks(train: Ratings, item_means: torch.Tensor, users: torch.Tensor, rows: torch.Tensor, items: torch.Tensor,
            values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, ind): the history's CSR blocks, x centred by ``item_means`` as they stand when built (a batch is used
    within the step that drew it; the full batch of gamma = 1 reads them at its first use)."""
    x = _to_csr(rows, items, values - item_means.index_select(0, items), users.numel(), train.n_items)
    # x's sparsity pattern, sorted once
    return x, torch.sparse_csr_tensor(x.crow_indices(), x.col_indices(), torch.ones_like(x.values()), x.shape,
                                      check_invariants=False)


def full_batch(train: Ratings, item_means: torch.Tensor) -> UserBatch:
    """Every user, every rating (gamma = 1)."""
    return make_batch(train, item_means, None, train.user_counts() > 0)


def poisson_steps_per_epoch(ratio: float) -> int:
    """Steps of one epoch at sampling ratio gamma: round(1 / gamma), at least 1 (known before any sampler exists)."""
    if not 0 < ratio <= 1:
        raise ValueError(f"sampling ratio must be in (0, 1], got {ratio}")
    return max(1, round(1.0 / float(ratio)))


class PoissonBatchSampler:
    """Poisson sampling with ratio gamma of ratings (``unit=rating``) or of users (``unit=user``).

    Each unit is included independently with probability gamma, the sampling scheme the subsampling-amplification
    bounds assume. Every batch is built from the live ``item_means`` when it is first drawn (the full batch of
    gamma = 1 once, then reused), so it centres the history by whatever ``prepare`` or a restored checkpoint installed.
    """

    def __init__(self, train: Ratings, item_means: torch.Tensor, ratio: float, unit: str, generator: SecretGenerator,
                 history: bool = True, masked: bool = False) -> None:
        poisson_steps_per_epoch(ratio)  # checks the ratio
        if unit not in ("rating", "user"):
            raise ValueError(f"sampling unit must be 'rating' or 'user', got {unit}")
        self.train, self.item_means, self.ratio, self.unit, self.generator = train, item_means, float(ratio), unit, generator
        # rating-level batches of a targets-only model (MF) skip the history; user-level ones keep it (targets = history,
        # which the mechanisms' unit=user checks read)
        self.history = bool(history) or unit == "user"
        self._full: UserBatch | None = None  # gamma = 1: built by the first sample(), then reused
        self._offsets: torch.Tensor | None | bool = False  # user_offsets(train), found at the first user-level draw
        # user level: a step's batch is one fixed full batch with the sampled users marked (row_mask), instead of a
        # compacted batch of their ratings (at q = 1: that full batch, with its row offsets). Same users, same draws;
        # on an accelerator this avoids the host round trips that sizing a compacted batch takes (nonzero,
        # repeat_interleave). The model must read every row's ratings only for that row (the low-rank PNBM): see
        # UserBatch.row_mask.
        self.masked = bool(masked) and unit == "user"
        self._template: UserBatch | None = None  # the masked batches' full batch, built at the first draw

    def steps_per_epoch(self) -> int:
        return poisson_steps_per_epoch(self.ratio)

    def sample(self) -> UserBatch:
        if self.ratio >= 1:
            if self._full is None:  # (a masked sampler's full batch carries its row offsets, as its masked ones)
                self._full = self._full_of_users() if self.masked else full_batch(self.train, self.item_means)
            return self._full
        t = self.train
        if self.unit == "rating":
            pick = self.generator.rand(len(t), device=self.generator.device).to(t.device) < self.ratio
            user_mask = torch.zeros(t.n_users, dtype=torch.bool, device=t.device)
            user_mask[t.users[pick]] = True
        else:
            user_mask = self.generator.rand(t.n_users, device=self.generator.device).to(t.device) < self.ratio
            if self.masked:
                return self._masked(user_mask)
            if self._offsets is False:
                self._offsets = user_offsets(t)
            return make_batch(t, self.item_means, None, user_mask, self.history, self._offsets)  # every rating of them
        return make_batch(t, self.item_means, pick, user_mask, self.history)

    def _full_of_users(self) -> UserBatch:
        """Every user with ratings, every rating, grouped by user with the row offsets (built once)."""
        if self._template is None:
            if self._offsets is False:
                self._offsets = user_offsets(self.train)
            self._template = make_batch(self.train, self.item_means, None, self.train.user_counts() > 0, self.history,
                                        self._offsets)
        return self._template

    def _masked(self, user_mask: torch.Tensor) -> UserBatch:
        """The full batch with the rows of ``user_mask`` marked sampled (:attr:`UserBatch.row_mask`)."""
        full = self._full_of_users()
        return replace(full, row_mask=user_mask.index_select(0, full.users), base=full)
