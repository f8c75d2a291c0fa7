"""Sparse-pair kernels for Wang & Tang Eq. (2): work only on (target, history item) pairs.

For a target (u, i) with history R_u (the items u rated, values x_uj = r_uj - r_bar_j and weights w_uj = I_uj),
Eq. (2) needs three sums over the pairs (i, j), j in R_u:

    num_ui = sum_{j in R_u} s_ij x_uj          (numerator)
    abs_ui = sum_{j in R_u} |s_ij| w_uj        (denominator before the floor C)
    lin_ui = sum_{j in R_u} s_ij w_uj          (the linear term of the paper's Eq. (5) gradient)

and their gradients are scatters onto the same pairs,

    dL/ds_ij = sum_{(u,i) targets, j in R_u} g_num_ui x_uj + g_abs_ui sign(s_ij) w_uj + g_lin_ui w_uj,

(sign(0) = 0, explicitly: ``sign_table``). The kernels stop at the raw sums: the floor max(C, abs) and its kink are applied
by the caller (:class:`dprec_torch.models.pnbm.FlooredDenominator` with the batch's one [D >= C] mask), so ``g_abs``
arrives here already zero where the floor is active. A full-batch epoch touches sum_u |T_u| |R_u| entries of S (an
SDDMM forward and an SpGEMM-shaped backward), never a dense |B| x M block as the dense formulation does.

Layout. Users are put in buckets of similar history length (ratio 1.25) and each bucket keeps a padded table of its
users' histories (item ids and x). Targets are sorted by (bucket, item, user) and processed in chunks of at most
``budget`` pairs: a chunk gathers its users' padded history rows and reads S through flat indices ``i (M+1) + j``.
Because consecutive targets share the item i, the reads and the gradient scatters stay inside one row of S at a time
(cache-resident). Padding slots point at an extra zero row/column of S (index M), so they add nothing. Memory: O(nnz)
for the tables plus O(budget) per chunk, never O(N M) and never O(pairs). With ``row_block`` the targets are also
grouped by blocks of items, so a caller can read S from a dense block of rows built on the fly (:mod:`.pnbm_topk`).
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field

import torch

from dprec_torch.startup import lazy_import

pair_numba = lazy_import("dprec_torch.models.pair_numba")  # numba loads with the first CPU kernel, not in a GPU run

BACKENDS = ("auto", "torch", "numba")  # the sparse-pair kernels: auto (numba on the CPU where it imports), torch, numba


def use_numba(backend: str, S: torch.Tensor) -> bool:
    """Whether ``backend`` runs :mod:`.pair_numba`'s kernels for this S (:func:`.pair_numba.use_numba`); False for a
    tensor off the CPU without loading that module (and numba)."""
    return S.device.type == "cpu" and pair_numba.use_numba(backend, S)

LENGTH_RATIO = 1.25
DEFAULT_BUDGET = 1 << 19  # pairs per chunk (2 MiB per float32 chunk tensor)
ACCELERATOR_MIN_BUDGET = 1 << 25  # on a GPU: 128 MiB chunk tensors, so an ML-20M-size epoch is ~10^2 chunks, not ~10^4


def device_budget(budget: int, device: torch.device) -> int:
    """Pairs per chunk on ``device``: ``budget`` on the CPU (cache-sized chunks are fast there); at least
    :data:`ACCELERATOR_MIN_BUDGET` on an accelerator, where each chunk's Python-side launches were the cost."""
    return int(budget) if device.type == "cpu" else max(int(budget), ACCELERATOR_MIN_BUDGET)


@dataclass
class HistoryTables:
    """Every row's history as padded tables, one per length bucket: ``bucket[r]`` is the bucket of row r (-1 for an
    empty history), ``slot[r]`` its row in that bucket's tables, ``length[r]`` = |R_r|. ``items[b]`` holds item ids
    (pad = M), ``x[b]`` the values, ``w[b]`` the weights (None when every weight is 1, the indicator case)."""

    n_items: int
    bucket: torch.Tensor
    slot: torch.Tensor
    items: list[torch.Tensor]
    x: list[torch.Tensor]
    w: list[torch.Tensor | None]
    width: list[int]
    length: torch.Tensor
    csr_ptr: torch.Tensor | None = None  # the same histories as CSR (rows sorted, items ascending), for the numba kernels
    csr_items: torch.Tensor | None = None
    csr_x: torch.Tensor | None = None
    csr_w: torch.Tensor | None = None

    @property
    def index_dtype(self) -> torch.dtype:
        return torch.int32 if (self.n_items + 1) ** 2 < 2**31 else torch.int64


def build_history(rows: torch.Tensor, items: torch.Tensor, x: torch.Tensor, w: torch.Tensor | None,
                  n_rows: int, n_items: int) -> HistoryTables:
    """Padded history tables from COO entries (row, item, x, w); no duplicate (row, item) allowed."""
    dev = rows.device
    order = torch.argsort(rows * (n_items + 1) + items)
    rows, items, x = rows[order], items[order], x[order]
    w = None if w is None or bool((w == 1).all()) else w[order]
    length = torch.bincount(rows, minlength=n_rows)
    start = torch.cumsum(length, 0) - length
    bucket = torch.where(length > 0, torch.floor(torch.log(length.clamp_min(1).double()) / math.log(LENGTH_RATIO)).long(),
                         torch.full_like(length, -1))
    slot = torch.full((n_rows,), -1, dtype=torch.long, device=dev)
    idx_dtype = torch.int32 if (n_items + 1) ** 2 < 2**31 else torch.int64
    e_bucket = bucket[rows]
    e_order = torch.argsort(e_bucket, stable=True)
    b_ids, b_counts = torch.unique_consecutive(e_bucket[e_order], return_counts=True)
    tabs_i, tabs_x, tabs_w, widths = [], [], [], []
    pos = 0
    n_buckets = int(bucket.max()) + 1 if n_rows else 0
    remap = torch.full((max(n_buckets, 1),), -1, dtype=torch.long, device=dev)
    for k, (b, c) in enumerate(zip(b_ids.tolist(), b_counts.tolist())):
        sel = e_order[pos : pos + c]
        pos += c
        e_rows = rows[sel]
        b_rows = torch.unique_consecutive(e_rows)  # rows are sorted within the stable order
        slot[b_rows] = torch.arange(b_rows.numel(), device=dev)
        width = int(length[b_rows].max())
        col = sel - start[e_rows]
        ti = torch.full((b_rows.numel(), width), n_items, dtype=idx_dtype, device=dev)
        tx = torch.zeros(b_rows.numel(), width, dtype=x.dtype, device=dev)
        ti[slot[e_rows], col] = items[sel].to(idx_dtype)
        tx[slot[e_rows], col] = x[sel]
        if w is not None:
            tw = torch.zeros(b_rows.numel(), width, dtype=w.dtype, device=dev)
            tw[slot[e_rows], col] = w[sel]
            tabs_w.append(tw)
        else:
            tabs_w.append(None)
        tabs_i.append(ti)
        tabs_x.append(tx)
        widths.append(width)
        remap[b] = k
    bucket = torch.where(bucket >= 0, remap[bucket.clamp_min(0)], bucket)
    ptr = torch.cat([torch.zeros(1, dtype=torch.long, device=dev), torch.cumsum(length, 0)])
    return HistoryTables(n_items, bucket, slot, tabs_i, tabs_x, tabs_w, widths, length, ptr, items.to(idx_dtype), x, w)


@dataclass
class PairPlan:
    """Targets (row, item) laid out over a :class:`HistoryTables` in cache-friendly chunks.

    ``perm`` maps processing order to target index (targets with an empty history are left out: their sums are 0).
    ``chunks`` are (bucket, start, stop) ranges of ``perm``. With ``row_block`` set, targets are grouped by blocks of
    ``row_block`` items (``chunk_block`` gives each chunk's block) and ``base`` is relative to the block's first item,
    so a caller can read S from a dense ``row_block x (M+1)`` block per group (the top-k model does).
    """

    hist: HistoryTables
    n_targets: int
    perm: torch.Tensor
    base: torch.Tensor  # (i - first item of the row block) (M+1) of each target, processing order
    slot: torch.Tensor  # table row of each target's user, processing order
    chunks: list[tuple[int, int, int]]
    n_pairs: int
    n_padded: int
    row_block: int | None = None
    chunk_block: list[int] = field(default_factory=list)
    t_rows: torch.Tensor | None = None  # targets' rows and items (target order), for the numba layout
    t_items: torch.Tensor | None = None
    backend: str = "auto"  # auto | torch | numba (:mod:`.pair_numba`; CPU only)
    _cache: dict = field(default_factory=dict, repr=False)

    def numba_layout(self):
        """The :class:`~dprec_torch.models.pair_numba.NumbaLayout` of this plan (built once)."""
        lay = self._cache.get("numba")
        if lay is None:
            h = self.hist
            lay = pair_numba.build_layout(h.csr_ptr, h.csr_items, h.csr_x, h.csr_w, self.t_rows, self.t_items,
                                          h.n_items)
            self._cache["numba"] = lay
        return lay

    def _numba(self, S: torch.Tensor) -> bool:
        return self.row_block is None and self.t_rows is not None and use_numba(self.backend, S)

    # ------------------------------------------------------------ per chunk
    def _chunk(self, b: int, s: int, e: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Flat S indices [T, width], x [T, width] and w [T, width] of one chunk."""
        h, rows = self.hist, self.slot[s:e]
        idx = self.base[s:e, None] + h.items[b].index_select(0, rows)
        x = h.x[b].index_select(0, rows)
        w = None if h.w[b] is None else h.w[b].index_select(0, rows)
        return idx, x, w

    def chunk_sums(self, sa: torch.Tensor, b: int, s: int, e: int, need_lin: bool, top_k: int | None,
                   out: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]) -> None:
        """Write (num, abs, lin) of chunk (b, s, e) into ``out`` (processing order), reading S from flat ``sa``."""
        num, ab, lin = out
        idx, x, w = self._chunk(b, s, e)
        ss = sa.index_select(0, idx.view(-1)).view(idx.shape)
        if top_k is not None and self.hist.width[b] > top_k:
            pad = self.hist.items[b].index_select(0, self.slot[s:e]) == self.hist.n_items
            score = ss.masked_fill(pad, float("-inf"))  # padding is never selected
            kth = torch.topk(score, top_k, dim=1).values[:, -1:]
            ss = torch.where(score >= kth, ss, torch.zeros_like(ss))
        num[s:e] = (ss * x.to(ss.dtype)).sum(1)
        if w is None:
            ab[s:e] = ss.abs().sum(1)
            if need_lin:
                lin[s:e] = ss.sum(1)
        else:
            w = w.to(ss.dtype)
            ab[s:e] = (ss.abs() * w).sum(1)
            if need_lin:
                lin[s:e] = (ss * w).sum(1)

    def chunk_grad(self, signs: torch.Tensor | None, gflat: torch.Tensor, b: int, s: int, e: int,
                   gs: list[torch.Tensor | None]) -> None:
        """Scatter g_num x_uj + g_abs sign(s_ij) w_uj + g_lin w_uj of chunk (b, s, e) into flat ``gflat``; ``signs``:
        sign(S) as int8 on the forward's flat (padded) layout (needed only with g_abs; a quarter of S, cache-resident)."""
        dt = gflat.dtype
        idx, x, w = self._chunk(b, s, e)
        w = None if w is None else w.to(dt)
        v = gs[0][s:e, None] * x.to(dt) if gs[0] is not None else None
        if gs[2] is not None:  # g_lin w_uj
            lin = gs[2][s:e, None] if w is None else gs[2][s:e, None] * w
            v = lin.expand(idx.shape) if v is None else v + lin
        if gs[1] is not None:  # g_abs sign(s_ij) w_uj
            sgn = signs.index_select(0, idx.view(-1)).view(idx.shape)
            if w is not None:
                sgn = sgn * w
            v = gs[1][s:e, None] * sgn if v is None else torch.addcmul(v, gs[1][s:e, None], sgn)
        if v is not None:
            gflat.index_add_(0, idx.reshape(-1), v.reshape(-1))

    def new_sums(self, like: torch.Tensor, need_lin: bool):
        n = self.perm.numel()
        num = torch.zeros(n, dtype=like.dtype, device=like.device)
        return num, torch.zeros_like(num), torch.zeros_like(num) if need_lin else None

    def finish_sums(self, sums, key, need_lin: bool):
        """Back to target order, cached under ``key`` (a tuple whose first item is a weakref to the source)."""
        out = []
        for t in sums:
            if t is None:
                out.append(None)
                continue
            o = torch.zeros(self.n_targets, dtype=t.dtype, device=t.device)
            o[self.perm] = t
            out.append(o)
        self._cache["sums"] = (key, need_lin, tuple(out))
        return tuple(t.clone() if t is not None else None for t in out)

    def cached_sums(self, key, need_lin: bool):
        hit = self._cache.get("sums")
        if hit is None or hit[0][0]() is not key[0]() or hit[0][1:] != key[1:] or not (hit[1] or not need_lin):
            return None
        num, ab, lin = hit[2]
        return num.clone(), ab.clone(), lin.clone() if need_lin else None

    def gathered(self, g: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
        return None if g is None else g.to(dtype)[self.perm]

    # ---------------------------------------------------------- dense S
    @torch.no_grad()
    def sums(self, S: torch.Tensor, need_lin: bool = False,
             top_k: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(num, abs, lin) of the module docstring for every target (target order), no autograd.

        ``top_k``: only each target's k history items with the largest s_ij count (ties at the k-th value all count),
        the neighbour selection of item-kNN; None = every history item. Cached per (S object, S._version): a second
        call with an unmodified S (``batch_predict`` then ``surrogate_loss`` in one step) costs nothing.
        """
        key = (weakref.ref(S), S._version, S.dtype, S.device, top_k)
        hit = self.cached_sums(key, need_lin)
        if hit is not None:
            return hit
        if top_k is None and self._numba(S):
            pair_numba.set_threads(torch.get_num_threads())
            out = pair_numba.sums(self.numba_layout(), S, need_lin)
            self._cache["sums"] = (key, need_lin, out)
            return tuple(t.clone() if t is not None else None for t in out)
        sa = padded_flat(S)
        out = self.new_sums(S, need_lin)
        for b, s, e in self.chunks:
            self.chunk_sums(sa, b, s, e, need_lin, top_k, out)
        return self.finish_sums(out, key, need_lin)

    @torch.no_grad()
    def grad(self, S: torch.Tensor, g_num: torch.Tensor | None, g_abs: torch.Tensor | None,
             g_lin: torch.Tensor | None) -> torch.Tensor:
        """dL/dS = sum over pairs of g_num x_uj + g_abs sign(s_ij) w_uj + g_lin w_uj (dense M x M): one ``index_add_``
        per chunk onto the forward's flat indices; the |s| channel reads sign(s_ij) (sign(0) = 0) from an int8 table."""
        if self._numba(S):
            pair_numba.set_threads(torch.get_num_threads())
            return pair_numba.grad(self.numba_layout(), S, g_num, g_abs, g_lin)
        m, dt = S.shape[0], S.dtype
        gs = [self.gathered(g, dt) for g in (g_num, g_abs, g_lin)]
        gflat = torch.zeros((m + 1) * (m + 1), dtype=dt, device=S.device)
        signs = sign_table(padded_flat(S)) if gs[1] is not None else None
        for b, s, e in self.chunks:
            self.chunk_grad(signs, gflat, b, s, e, gs)
        return gflat.view(m + 1, m + 1)[:m, :m].clone()


def centred_history(cache: dict, history, item_means: torch.Tensor, device: torch.device) -> HistoryTables:
    """Padded history tables of the training users with x = r_uj - r_bar_j, cached in ``cache``; rebuilt when the
    training ratings, the item means (their version) or the device change."""
    key = (id(history), item_means._version, item_means.device, device)
    hit = cache.get("history")
    if hit is not None and hit[0] == key and hit[2] is history:
        return hit[1]
    users, items, vals = history.users.to(device), history.items.to(device), history.values.to(device)
    tables = build_history(users, items, vals - item_means[items], None, history.n_users, item_means.numel())
    cache["history"] = (key, tables, history)
    return tables


def sign_table(flat: torch.Tensor) -> torch.Tensor:
    """sign(s) as int8 (-1, 0, 1)."""
    return torch.sign(flat).to(torch.int8)


def padded_flat(S: torch.Tensor) -> torch.Tensor:
    """S with an extra zero row and column (index M, the padding slot), flattened."""
    return torch.nn.functional.pad(S, (0, 1, 0, 1)).reshape(-1)


def build_plan(hist: HistoryTables, rows: torch.Tensor, items: torch.Tensor, budget: int = DEFAULT_BUDGET,
               row_block: int | None = None, backend: str = "auto") -> PairPlan:
    """Lay the targets (rows[t], items[t]) out in chunks of at most ``budget`` padded pairs, ordered by (row block of
    the item, if ``row_block``), length bucket, item, user -- so a chunk reads few rows of S, one after the other."""
    m = hist.n_items
    n_rows = hist.slot.numel()
    tb = hist.bucket[rows]
    valid = tb >= 0
    n_buckets = len(hist.width) + 1
    group = tb.clamp_min(0) if row_block is None else (items // row_block) * n_buckets + tb.clamp_min(0)
    key = (group * (m + 1) + items) * (n_rows + 1) + hist.slot[rows].clamp_min(0)
    key = torch.where(valid, key, torch.full_like(key, -1))
    order = torch.argsort(key)
    n_invalid = int((~valid).sum())
    perm = order[n_invalid:]
    chunks: list[tuple[int, int, int]] = []
    chunk_block: list[int] = []
    n_padded = 0
    if perm.numel():
        g_ids, counts = torch.unique_consecutive(group[perm], return_counts=True)
        pos = 0
        for g, c in zip(g_ids.tolist(), counts.tolist()):
            b = g % n_buckets if row_block is not None else g
            width = hist.width[b]
            per = max(1, budget // width)
            for s in range(pos, pos + c, per):
                chunks.append((b, s, min(pos + c, s + per)))
                chunk_block.append(g // n_buckets if row_block is not None else 0)
            n_padded += c * width
            pos += c
    n_pairs = int(hist.length[rows[perm]].sum())
    t_items = items[perm]
    if row_block is not None:
        t_items = t_items - (t_items // row_block) * row_block
    base = t_items.to(hist.index_dtype) * (m + 1)
    return PairPlan(hist, int(rows.numel()), perm, base, hist.slot[rows[perm]], chunks, n_pairs, n_padded,
                    row_block, chunk_block, rows, items, backend)


def row_groups(plan: PairPlan):
    """(first item, last item + 1, chunks) of each block of ``plan.row_block`` items."""
    from itertools import groupby

    m, rb = plan.hist.n_items, plan.row_block
    assert rb is not None, "row_groups needs a plan built with row_block"
    for blk, chunks in groupby(zip(plan.chunk_block, plan.chunks), key=lambda t: t[0]):
        yield blk * rb, min(m, (blk + 1) * rb), [c for _, c in chunks]


@torch.no_grad()
def gram_row_blocks(users: torch.Tensor, items: torch.Tensor, channels: list[tuple[torch.Tensor, torch.Tensor | None]],
                    n_users: int, n_items: int, row_block: int, budget: int = DEFAULT_BUDGET):
    """Yield (start, stop, [G_c[start:stop]]) for Gram products G_c[i, j] = sum_u a_ui b_uj, block by block; ``channels``
    are (a, b) value vectors aligned with the COO ratings (b = None: ones). Each block is a dense ``(stop - start) x M``
    tensor per channel, filled by the pair scatter: memory O(nnz + row_block M)."""
    plans: dict[int, PairPlan] = {}
    for a, b in channels:
        key = id(b)
        if key not in plans:
            vals = torch.ones_like(a) if b is None else b
            hist = build_history(users, items, vals, None, n_users, n_items)
            plans[key] = build_plan(hist, users, items, budget, row_block)
    coefs = [(plans[id(b)], plans[id(b)].gathered(a, a.dtype)) for a, b in channels]
    first = next(iter(plans.values()))  # every plan has the same layout (same targets and lengths)
    m = n_items
    for start, stop, chunks in row_groups(first):
        blocks = []
        for plan, coef in coefs:
            gd = torch.zeros((stop - start) * (m + 1), dtype=coef.dtype, device=coef.device)
            for bk, s, e in chunks:
                plan.chunk_grad(None, gd, bk, s, e, [coef, None, None])
            blocks.append(gd.view(stop - start, m + 1)[:, :m])
        yield start, stop, blocks


class PairSums(torch.autograd.Function):
    """(num, abs, lin) = the Eq. (2) pair sums at the plan's targets, differentiable in S."""

    @staticmethod
    def forward(ctx, S: torch.Tensor, plan: PairPlan, need_lin: bool):  # type: ignore[override]
        ctx.set_materialize_grads(False)
        ctx.plan = plan
        ctx.save_for_backward(S)
        num, ab, lin = plan.sums(S, need_lin)
        return num, ab, (lin if lin is not None else torch.zeros_like(num))

    @staticmethod
    def backward(ctx, g_num, g_abs, g_lin):  # type: ignore[override]
        (S,) = ctx.saved_tensors
        if g_num is None and g_abs is None and g_lin is None:
            return None, None, None
        return ctx.plan.grad(S, g_num, g_abs, g_lin), None, None


def pair_sums(S: torch.Tensor, plan: PairPlan, need_lin: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Differentiable (num, abs, lin) at the plan's targets (lin is zeros unless ``need_lin``)."""
    return PairSums.apply(S, plan, need_lin)
