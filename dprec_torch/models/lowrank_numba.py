"""Fused CPU kernels (numba) for the low-rank PNBM's user-level step, bit for bit the torch path's numbers.

The torch path of :mod:`dprec_torch.models.pnbm_lowrank` makes a dozen passes over ``[R, d]`` float64 temporaries
a step (gathers of U's rows, products, ``index_add_`` scatters, whose CPU kernel radix-sorts its index first). These
kernels make one pass per stage over the user segments of a batch (its ratings are grouped by user, rows ascending):

* :func:`forward_sums`: p_sum_u = sum_{j in R_u} u_j y_uj and f_ui = (u_i . p_u) - |u_i|^2 y_ui w_u, p_u = p_sum_u w_u;
* :func:`gradient_terms`: the per-user norms of the rows g_uj of dL_u/dU (L2, or L1 for the Laplace mechanism), and
  the rows themselves where asked (:func:`gradient_rows`);
* :func:`scatter_clipped`: sum_u clip_u g_u into ``[M, d]`` (the clipped gradient), the rows recomputed on the fly
  (no ``[R, d]`` array), the item ids split over the threads (:func:`item_owner`);
* :func:`run_segments` / :func:`gather_runs`: a user-level batch's ratings as copies of its users' runs;
* :func:`feature_dots`: w_u . phi_i per rating (the public item features' part; once per release of the item
  means, for every rating of the training data: a step gathers its ratings').

Same numbers, not just close ones: every sum is formed in the order torch forms it. ``index_add_`` on the CPU adds
the sources of an output row in index order, starting from 0; ``x.sum(1)`` of a contiguous ``[R, d]`` tensor adds a
row in the order of ATen's ``SumKernel.cpp`` (:func:`row_sum`: 256-bit vectors on every x86 capability, so W = 4
lanes of float64 or 8 of float32; float32 accumulates in float32); products and differences are single IEEE
operations (no fastmath, no contraction into FMA). :func:`exact` checks the row-sum order against torch once per
process and dtype, and the caller keeps the torch path where it differs (another torch, another CPU).

The rank d and the lanes W reach the forward and gradient kernels as ``len(tag)`` and ``len(lanes)`` (:func:`rank_tag`,
:func:`lane_tag`), and :func:`row_sum` is inlined: each rank is compiled with a rating's row sums unrolled, one user
at a time (their U rows stay in cache), its d numbers in arrays on the stack (:func:`stack_array`: registers, where
heap arrays sent every element through memory). :func:`feature_dots` sums across blocks of ratings instead (its width
is the catalogue's).

The forward and gradient kernels run runs of a batch's users on torch's thread count (:func:`user_chunks`; a user's
numbers never depend on another's, so the bits do not depend on the threads; numba's OpenMP layer where no parallel
kernel ran before, :func:`prefer_openmp`); the clipped scatter runs ranges of item ids (each item's sum stays in user
order, in one thread).
Compiled once (``@njit(cache=True)``: later runs load the machine code).
"""

from __future__ import annotations

import functools
import logging
import os
import weakref

import numpy as np
import torch

log = logging.getLogger(__name__)

try:  # numba is a dependency, but the torch path must keep working where it cannot load
    import numba
    from numba import njit, prange
except Exception:  # pragma: no cover - exercised only without numba
    numba = None
try:  # numba's internals for stack arrays (stack_array); without them the kernels keep their rows on the heap
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic
    from numba.np.arrayobj import populate_array
except Exception:  # pragma: no cover - another numba's internals
    intrinsic = None

_CACHE = dict(cache=True, nogil=True)
#: the kernels run on batches of at least this many ratings: below it the torch path takes a few ms a step, less than
#: a first run's compilation of the kernels (about 15 s, then loaded from numba's cache) would ever give back
MIN_RATINGS = 100_000
_BLOCK = 256  # ratings per block: the row sums run across a block's ratings (loops the compiler vectorises)


def width(dtype: torch.dtype) -> int:
    """Lanes of the vector ATen's CPU sum kernel uses: 32 bytes on every x86 capability (AVX512 included)."""
    return 32 // torch.empty((), dtype=dtype).element_size()


@functools.lru_cache(maxsize=None)
def rank_tag(d: int) -> tuple[int, ...]:
    """d zeros: the kernels read d as ``len(tag)``, so numba compiles one version per rank with its loops unrolled
    (the same operations in the same order; about 2x faster than a rank read at run time)."""
    return (0,) * int(d)


_kept: dict = {}  # the last answers of user_chunks and item_owner (a step asks for the same ones again)


def user_chunks(seg: torch.Tensor) -> np.ndarray:
    """Bounds ``[T + 1]`` of T runs of a batch's users with about equal ratings, T = torch's thread count (the
    kernels' threads follow ``torch.set_num_threads`` / ``OMP_NUM_THREADS``). A step asks for the same batch's bounds
    seven times: the last answer is kept (keyed by the tensor, its version and T)."""
    threads = max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(threads)
    hit = _kept.get("seg")
    if hit is not None and hit[0]() is seg and hit[1] == seg._version and hit[2] == threads:
        return hit[3]
    offsets = seg.numpy()
    total = int(offsets[-1])
    marks = np.array([total * t // threads for t in range(1, threads)], dtype=offsets.dtype)
    cut = np.searchsorted(offsets, marks).clip(0, offsets.size - 1)
    out = np.concatenate([[0], cut, [offsets.size - 1]]).astype(np.int64)
    _kept["seg"] = (weakref.ref(seg), seg._version, threads, out)
    return out


def item_owner(counts: torch.Tensor, threads: int) -> np.ndarray:
    """Item id -> which of T = ``threads`` ranges of item ids it is in, the ranges holding about equal ``counts``
    (ratings per item): the clipped scatter's thread b adds the items of range b (:func:`scatter_clipped`). Kept for
    the last (counts, T)."""
    hit = _kept.get("owner")
    if hit is not None and hit[0]() is counts and hit[1] == threads:
        return hit[2]
    cum = np.cumsum(counts.numpy())
    total = int(cum[-1]) if cum.size else 0
    marks = np.array([total * t // threads for t in range(1, threads)], dtype=np.int64)
    cut = np.concatenate([[0], np.searchsorted(cum, marks, side="right"), [cum.size]])
    owner = np.repeat(np.arange(threads, dtype=np.int64), np.diff(cut))
    _kept["owner"] = (weakref.ref(counts), threads, owner)
    return owner


def prefer_openmp() -> None:
    """Choose numba's OpenMP threading layer for this process when no parallel kernel has run yet and the user set no
    layer: the low-rank step's two parallel kernels take 12 ms on it against 20 ms on the workqueue layer (ML-1M,
    q = 0.3, 2 cores), which ``chacha`` and ``pair_numba`` pick because OpenMP's spinning workers slow the full-S pair
    pass (4-9 %). Called by the low-rank model when it binds on the CPU; the layer is the process's, so a later run of
    another model in the same process keeps it (the numbers are the same on every layer)."""
    if numba is None or os.environ.get("NUMBA_THREADING_LAYER"):
        return
    from numba.np.ufunc import parallel

    if parallel._is_initialized:  # a parallel kernel ran: the layer is fixed
        return
    # numba's pool links the system's libgomp, torch bundles its own: two OpenMP runtimes on the same cores. Left to
    # spin after a kernel, numba's workers hold a core while torch's operations run between the kernels; told to
    # sleep (read once, when this load initialises that libgomp), a step took about 10 % less. Torch's runtime is not
    # touched (its own spinning pays), nor a policy the user set, and the environment is restored at once.
    passive = not ({"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"} & set(os.environ))
    if passive:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    try:
        from numba.np.ufunc import omppool  # noqa: F401  (loads only where an OpenMP runtime is present)
    except Exception:  # pragma: no cover - no OpenMP: the layer already chosen stands
        return
    finally:
        if passive:
            del os.environ["OMP_WAIT_POLICY"]
    numba.config.THREADING_LAYER = "omp"


@functools.lru_cache(maxsize=None)
def lane_tag(dtype: torch.dtype) -> tuple[int, ...]:
    """:func:`width` zeros: the lanes of torch's row sums, known to the kernels when compiled (as :func:`rank_tag`)."""
    return (0,) * width(dtype)


def available(n_ratings: int | None = None) -> bool:
    """Whether the kernels may run (on ``n_ratings`` ratings): numba imports, ``DPREC_LOWRANK_KERNEL`` is not ``torch``
    and the batch has at least :data:`MIN_RATINGS` ratings (``numba`` forces them on any size)."""
    mode = os.environ.get("DPREC_LOWRANK_KERNEL", "auto")
    big = n_ratings is None or n_ratings >= MIN_RATINGS or mode == "numba"
    return numba is not None and mode not in ("torch", "triton") and big


@functools.lru_cache(maxsize=None)
def exact(dtype: torch.dtype, d: int) -> bool:
    """Whether :func:`row_sum` reproduces torch's ``x.sum(1)`` of ``[R, d]`` ``dtype`` rows bit for bit here (checked
    once on 4,096 random rows with magnitudes over six decades, signs and zeros)."""
    if not available():
        return False
    gen = torch.Generator().manual_seed(d)
    x = torch.randn(4096, d, generator=gen, dtype=torch.float64) * 10 ** (6 * torch.rand(4096, d, generator=gen) - 3)
    x = x.to(dtype)
    x[::7, 0] = 0.0
    ok = torch.equal(torch.from_numpy(_rows_sum(x.numpy(), width(dtype))), x.sum(1))
    if not ok:
        log.warning("the low-rank kernels' row sums differ from this torch's x.sum(1) (%s, d=%d): the torch path runs",
                    dtype, d)
    return ok


if numba is not None:

    if intrinsic is not None:
        def _stack_array(typingctx, tag, dt):  # pragma: no cover - compiled
            """A float64 (or ``dt``) array of len(``tag``) elements on the kernel's stack (the function's entry block), not
            the heap: LLVM then keeps a rating's d numbers in registers. (With np.empty, every store to the row could alias
            U's reads, so each element went through memory: the gradient kernel ran 1.4x slower.)"""
            if not isinstance(tag, types.UniTuple) or not isinstance(dt, types.NumberClass):
                return None
            n, dtype = len(tag), dt.dtype
            arrty = types.Array(dtype, 1, "C")

            def codegen(context, builder, sig, args):
                llty = context.get_data_type(dtype)
                ptr = cgutils.alloca_once(builder, llty, size=context.get_constant(types.intp, max(n, 1)))
                ary = context.make_array(arrty)(context, builder)
                size = context.get_constant(types.intp, context.get_abi_sizeof(llty))
                populate_array(ary, data=ptr, shape=[context.get_constant(types.intp, n)], strides=[size], itemsize=size,
                               meminfo=None)
                return ary._getvalue()

            return arrty(tag, dt), codegen

        stack_array = intrinsic(_stack_array)
    else:  # pragma: no cover - another numba's internals: the same numbers from heap arrays

        @njit(inline="always", **_CACHE)
        def stack_array(tag, dt):
            return np.empty(len(tag), dt)

    @njit(**_CACHE)
    def _ceil_log2(x):  # pragma: no cover - compiled
        """ATen's CeilLog2: 1 for x <= 2, else ceil(log2 x)."""
        if x <= 2:
            return 1
        v, r = x - 1, 0
        while v > 0:
            v >>= 1
            r += 1
        return r

    @njit(**_CACHE)
    def _cascade(a, base, stride, n):  # pragma: no cover - compiled
        """multi_row_sum's one accumulator: a[base + i stride], i < n, through its 4-level cascade."""
        z = a.dtype.type(0)
        acc0, acc1, acc2, acc3 = z, z, z, z
        lp = max(4, _ceil_log2(n) // 4)
        step = 1 << lp
        lmask = step - 1
        i = 0
        while i + step <= n:
            for _ in range(step):
                acc0 += a[base + i * stride]
                i += 1
            acc1 += acc0
            acc0 = z
            if (i & (lmask << lp)) == 0:
                acc2 += acc1
                acc1 = z
                if (i & (lmask << (2 * lp))) == 0:
                    acc3 += acc2
                    acc2 = z
        while i < n:
            acc0 += a[base + i * stride]
            i += 1
        acc0 += acc1
        acc0 += acc2
        acc0 += acc3
        return acc0

    @njit(**_CACHE)
    def _ilp_sum(a, base, stride, n):  # pragma: no cover - compiled
        """row_sum with four interleaved accumulators over a[base + i stride], i < n."""
        n4 = n // 4
        if n4 == 0:  # p1 = p2 = p3 = +0, and p0 (a sum from +0) is never -0: adding them changes no bit
            p = a.dtype.type(0)
            for i in range(n):
                p += a[base + i * stride]
            return p
        p0 = _cascade(a, base, 4 * stride, n4)
        p1 = _cascade(a, base + stride, 4 * stride, n4)
        p2 = _cascade(a, base + 2 * stride, 4 * stride, n4)
        p3 = _cascade(a, base + 3 * stride, 4 * stride, n4)
        for i in range(4 * n4, n):
            p0 += a[base + i * stride]
        p0 += p1
        p0 += p2
        p0 += p3
        return p0

    @njit(inline="always", **_CACHE)
    def row_sum(a, d, w):  # pragma: no cover - compiled
        """a[0] + ... + a[d - 1] in the order of torch's CPU ``sum(1)`` (W = ``w`` lanes): rows shorter than W by the
        scalar path; else the tail past the last whole vector first, then lane totals 0 .. W - 1, each lane a strided
        four-accumulator sum over the vectors."""
        if d < w:
            if d < 4:  # _ilp_sum's one-accumulator case, here (inlined: no call per row)
                p = a.dtype.type(0)
                for i in range(d):
                    p += a[i]
                return p
            return _ilp_sum(a, 0, 1, d)
        nv = d // w
        f = a.dtype.type(0)
        for k in range(nv * w, d):
            f += a[k]
        if nv < 4:  # a lane is a[lane] + a[lane + w] + ...: its leading +0 only turns an all -0 lane into +0, which
            # f (a sum from +0, never -0) absorbs alike
            for lane in range(w):
                p = a[lane]
                for i in range(1, nv):
                    p += a[lane + i * w]
                f += p
            return f
        for lane in range(w):
            f += _ilp_sum(a, lane, w, nv)
        return f

    @njit(**_CACHE)
    def _rows_sum(x, w):  # pragma: no cover - compiled
        out = np.empty(x.shape[0], x.dtype)
        for r in range(x.shape[0]):
            out[r] = row_sum(x[r], x.shape[1], w)
        return out

    @njit(**_CACHE)
    def _columns_ilp(buf, base, stride, n, nb, out):  # pragma: no cover - compiled
        """:func:`_ilp_sum` of each column of ``buf``, column by column (long rows: the cascade)."""
        for b in range(nb):
            out[b] = _ilp_sum(buf[:, b], base, stride, n)

    @njit(inline="always", **_CACHE)
    def _block_ilp(buf, base, stride, n, nb, out, tmp):  # pragma: no cover - compiled
        """out[:nb] = :func:`_ilp_sum` of each column b of ``buf`` ([d, B]: element e of row b at buf[e, b]), over
        elements base + i stride, i < n; the same operations in the same order per row, the loops over rows inside."""
        n4 = n // 4
        if n4 >= 16:  # long rows (the cascade): row by row
            _columns_ilp(buf, base, stride, n, nb, out)
            return
        z = buf.dtype.type(0)
        if n4 == 0:  # p1 = p2 = p3 = +0, and p0 (a sum from +0) is never -0: adding them changes no bit
            for b in range(nb):
                out[b] = z
            for i in range(n):
                col = base + i * stride
                for b in range(nb):
                    out[b] += buf[col, b]
            return
        for j in range(4):  # p_j = sum_t a[4t + j], from 0
            for b in range(nb):
                tmp[j, b] = z
            for t in range(n4):
                col = base + (4 * t + j) * stride
                for b in range(nb):
                    tmp[j, b] += buf[col, b]
        for i in range(4 * n4, n):
            col = base + i * stride
            for b in range(nb):
                tmp[0, b] += buf[col, b]
        for b in range(nb):
            out[b] = ((tmp[0, b] + tmp[1, b]) + tmp[2, b]) + tmp[3, b]

    @njit(inline="always", **_CACHE)
    def block_row_sum(buf, d, w, nb, out, lane, tmp):  # pragma: no cover - compiled
        """out[:nb] = :func:`row_sum` of each column of ``buf`` ([d, B]), bit for bit, vectorised across rows."""
        if d < w:
            _block_ilp(buf, 0, 1, d, nb, out, tmp)
            return
        nv = d // w
        z = buf.dtype.type(0)
        for b in range(nb):
            out[b] = z
        for k in range(nv * w, d):
            for b in range(nb):
                out[b] += buf[k, b]
        for ln in range(w):
            _block_ilp(buf, ln, w, nv, nb, lane, tmp)
            for b in range(nb):
                out[b] += lane[b]

    @njit(inline="always", **_CACHE)
    def _user_sum(U, items, lo, hi, wts, acc, d):  # pragma: no cover - compiled
        """acc = sum_{k in [lo, hi)} u_{i_k} wts_k (float64, in index order from 0: ``index_add_``'s sum of a user)."""
        for c in range(d):
            acc[c] = 0.0
        for k in range(lo, hi):
            wk, i = np.float64(wts[k]), items[k]
            for c in range(d):
                acc[c] += U[i, c] * wk

    @njit(parallel=True, **_CACHE)
    def forward_sums(U, items, seg, y, wu, sq, tag, lanes, chunks):  # pragma: no cover - compiled
        """(p_sum [n, d], f [R]) of :meth:`LowRankPNBM._f` on a user-level batch: p_sum_u = sum_k u_{i_k} y_k (float64,
        index order), f_k = (u_{i_k} . p_u) - (|u_{i_k}|^2 y_k) w_u with p_u = p_sum_u w_u (the dot in torch's row-sum
        order); ``sq`` = |u_i|^2 per item (torch's ``(U * U).sum(1)``), ``wu`` = n_u^(-1/2) in float32 per user,
        ``seg`` the users' rating offsets; ``tag`` = :func:`rank_tag` (d), ``lanes`` = :func:`lane_tag` (W): both
        known when compiled, so a rating's dot is unrolled. One user at a time (their U rows stay in cache); the runs of
        users ``chunks`` (:func:`user_chunks`) on parallel threads: a user's numbers never depend on another's."""
        n, d, n_r = seg.size - 1, len(tag), items.size
        w = len(lanes)
        p_sum = np.empty((n, d))
        f = np.empty(n_r)
        for t in prange(chunks.size - 1):
            acc, p, a = stack_array(tag, np.float64), np.empty(d), np.empty(d)  # (measured: p, a on the stack ran slower)
            for r in range(chunks[t], chunks[t + 1]):
                _user_sum(U, items, seg[r], seg[r + 1], y, acc, d)
                wr = np.float64(wu[r])
                for c in range(d):
                    p_sum[r, c] = acc[c]
                    p[c] = acc[c] * wr
                for k in range(seg[r], seg[r + 1]):
                    i = items[k]
                    for c in range(d):
                        a[c] = U[i, c] * p[c]
                    f[k] = row_sum(a, d, w) - (sq[i] * np.float64(y[k])) * wr
        return p_sum, f

    @njit(inline="always", **_CACHE)
    def _gradient_row(U, i, pv, q, yw, ek, g, d):  # pragma: no cover - compiled
        """g = ((pv - (2 u_i) yw) e_k + q_u yw) (-2): a rating's row of dL_u/dU, each operation as torch's path has it."""
        for c in range(d):
            g[c] = ((pv[c] - (U[i, c] * 2.0) * yw) * ek + q[c] * yw) * -2.0

    @njit(parallel=True, **_CACHE)
    def gradient_terms(U, items, seg, y, e, p_sum, inv_sqrt, l1, tag, lanes, chunks, out, owner, order, bounds
                       ):  # pragma: no cover - compiled
        """(q [n, d], squared L2 norms [n], L1 norms [n] or empty) of :func:`per_user_gradients`, and its rows written
        to ``out`` ([R, d]; None: not written, :func:`scatter_clipped` recomputes them): with v = n_u^(-1/2)
        (``inv_sqrt``, float64, torch's rsqrt), q_u = sum_k u_{i_k} e_k and yw = y_k v, row k = ((p_sum_u v -
        (2 u_{i_k}) yw) e_k + q_u yw) (-2); a row's |.|^2 and |.|_1 in torch's row-sum order, a user's in index order
        from 0 (``index_add_``). The square root is the caller's (torch's vectorised sqrt is not always correctly
        rounded: its bits are its own). ``tag``/``lanes``/``chunks``: as :func:`forward_sums`.

        ``owner`` (item -> one of T item ranges, :func:`item_owner`; or None): the ratings' indices k are also sorted
        into ``order`` ([R]) by range, within each run of users in k order: range b of run t is
        order[bounds[t, b] : bounds[t, b + 1]] (``bounds`` [runs, T + 1]), what :func:`scatter_clipped` reads."""
        n, d = seg.size - 1, len(tag)
        w = len(lanes)
        qs = np.empty((n, d))
        l2 = np.empty(n)
        l1n = np.empty(n if l1 else 0)
        for t in prange(chunks.size - 1):
            pv, g, q = stack_array(tag, np.float64), stack_array(tag, np.float64), stack_array(tag, np.float64)
            a, b = stack_array(tag, np.float64), stack_array(tag, np.float64)
            if owner is not None:  # this run's ratings per item range, then where each range's list starts
                n_ranges = bounds.shape[1] - 1
                at = np.zeros(n_ranges, np.int64)
                for k in range(seg[chunks[t]], seg[chunks[t + 1]]):
                    at[owner[items[k]]] += 1
                pos = seg[chunks[t]]
                for rg in range(n_ranges):
                    bounds[t, rg] = pos
                    pos += at[rg]
                    at[rg] = bounds[t, rg]
                bounds[t, n_ranges] = pos
            for r in range(chunks[t], chunks[t + 1]):
                _user_sum(U, items, seg[r], seg[r + 1], e, q, d)
                iv = inv_sqrt[r]
                for c in range(d):
                    qs[r, c] = q[c]
                    pv[c] = p_sum[r, c] * iv
                s2, s1 = 0.0, 0.0
                for k in range(seg[r], seg[r + 1]):
                    i = items[k]
                    _gradient_row(U, i, pv, q, np.float64(y[k]) * iv, e[k], g, d)
                    for c in range(d):
                        a[c] = g[c] * g[c]
                        b[c] = abs(g[c])
                    if out is not None:
                        for c in range(d):
                            out[k, c] = g[c]
                    if owner is not None:
                        rg = owner[i]
                        order[at[rg]] = k
                        at[rg] += 1
                    s2 += row_sum(a, d, w)
                    if l1:
                        s1 += row_sum(b, d, w)
                l2[r] = s2
                if l1:
                    l1n[r] = s1
        return qs, l2, l1n

    @njit(parallel=True, **_CACHE)
    def scatter_clipped(U, items, rows, y, e, p_sum, inv_sqrt, q, factor, n_items, tag, order, bounds
                        ):  # pragma: no cover - compiled
        """out [M, d] = sum_k (row_k factor_u(k)) at item i_k, each item's sum in k order from 0 (``index_add_``): the
        rows of :func:`gradient_terms` (its ``q``, ``order`` and ``bounds``) recomputed, bit for bit, instead of read
        back; ``rows``: each rating's user row. Thread b adds item range b's ratings, run after run (each in k order),
        so an item's sum is one thread's, in k order."""
        d = len(tag)
        out = np.zeros((n_items, d))
        for rg in prange(bounds.shape[1] - 1):
            pv, g, qr = stack_array(tag, np.float64), stack_array(tag, np.float64), stack_array(tag, np.float64)
            last, iv, fr = -1, 0.0, 0.0
            for t in range(bounds.shape[0]):
                for at in range(bounds[t, rg], bounds[t, rg + 1]):
                    k = order[at]
                    r = rows[k]
                    if r != last:
                        last, iv, fr = r, inv_sqrt[r], factor[r]
                        for c in range(d):
                            pv[c] = p_sum[r, c] * iv
                            qr[c] = q[r, c]
                    i = items[k]
                    _gradient_row(U, i, pv, qr, np.float64(y[k]) * iv, e[k], g, d)
                    for c in range(d):
                        out[i, c] = out[i, c] + g[c] * fr
        return out

    def gradient_rows(U, items, seg, y, e, p_sum, inv_sqrt, l1, tag, lanes, chunks):
        """(rows [R, d], squared L2 norms [n], L1 norms [n] or empty): :func:`gradient_terms` with its rows kept."""
        out = np.empty((items.size, len(tag)))
        _, l2, l1n = gradient_terms(U, items, seg, y, e, p_sum, inv_sqrt, l1, tag, lanes, chunks, out, None, None, None)
        return out, l2, l1n

    @njit(parallel=True, **_CACHE)
    def run_segments(starts, offsets, chunks):  # pragma: no cover - compiled
        """(positions, rows) of runs: row r's ratings sit at starts[r] .. starts[r] + offsets[r + 1] - offsets[r] - 1
        of the source, in order (what a rating mask's nonzero gives for ratings grouped by user); ``chunks``: the rows
        per thread (:func:`user_chunks`)."""
        pos = np.empty(offsets[-1], np.int64)
        rows = np.empty(offsets[-1], np.int64)
        for t in prange(chunks.size - 1):
            for r in range(chunks[t], chunks[t + 1]):
                s, o = starts[r], offsets[r]
                for k in range(offsets[r + 1] - o):
                    pos[o + k] = s + k
                    rows[o + k] = r
        return pos, rows

    @njit(parallel=True, **_CACHE)
    def gather_runs(src, starts, offsets, chunks):  # pragma: no cover - compiled
        """src (one row per rating) at the positions of :func:`run_segments` (a copy of each run: ``index_select``'s
        values); ``chunks`` as :func:`run_segments`."""
        out = np.empty((offsets[-1],) + src.shape[1:], src.dtype)
        for t in prange(chunks.size - 1):
            for r in range(chunks[t], chunks[t + 1]):
                s, o = starts[r], offsets[r]
                n = offsets[r + 1] - o
                out[o:o + n] = src[s:s + n]  # a slice copy (no per-element index arithmetic): 2.5x the loop's speed
        return out

    @njit(**_CACHE)
    def feature_dots(wf, phi, rows, items, w):  # pragma: no cover - compiled
        """w_{u_k} . phi_{i_k} per pair in wf's dtype (products in wf's dtype, torch's row-sum order)."""
        n_r, n_f = rows.size, wf.shape[1]
        out = np.empty(n_r, wf.dtype)
        buf, tmp = np.empty((n_f, _BLOCK), wf.dtype), np.empty((4, _BLOCK), wf.dtype)
        tot, lane = np.empty(_BLOCK, wf.dtype), np.empty(_BLOCK, wf.dtype)
        for k0 in range(0, n_r, _BLOCK):
            nb = min(n_r - k0, _BLOCK)
            for b in range(nb):
                r, i = rows[k0 + b], items[k0 + b]
                for c in range(n_f):
                    buf[c, b] = wf[r, c] * phi[i, c]
            block_row_sum(buf, n_f, w, nb, tot, lane, tmp)
            for b in range(nb):
                out[k0 + b] = tot[b]
        return out
