"""The CPU kernels (numba) of :mod:`dprec_torch.chacha`: ChaCha20 blocks, keystream words, and Laplace and Gaussian
noise added in place, in float64, rounded once to the target's dtype (the formulas are :mod:`~dprec_torch.chacha`'s).

Imported on the first CPU draw (:func:`dprec_torch.chacha._numba`), so a run whose draws are all on a GPU never loads
numba (about 0.2 s of start-up). ``@njit(parallel=True, cache=True)``: compiled once, then loaded from numba's cache.
"""

from __future__ import annotations

import os

import numpy as np

import numba
from numba import njit, prange

if "NUMBA_THREADING_LAYER" not in os.environ and numba.config.THREADING_LAYER == "default":
    numba.config.THREADING_LAYER = "workqueue"  # sleeping workers (dprec_torch.models.pair_numba); a layer chosen first stands

# the layout and scaling of chacha's draws (dprec_torch.chacha defines them; tests/privacy/test_secure_noise.py checks
# that both modules agree): the kernels read them as compile-time constants
ELEMENTS_PER_BLOCK = 8  # 64-byte block = eight 64-bit words, one per element (Box-Muller: two per pair)
GROUP = 64  # blocks made per pass: the keystream scratch is 4 KiB
GROUPS_PER_PIECE = 16  # a piece (one unit of parallel work) is 16 groups = 8192 elements
_U32 = np.uint32
_U64 = np.uint64
_TWO_M53 = 2.0 ** -53
_TWO_PI = 2.0 * np.pi


def set_threads(n: int) -> None:
    """Use ``n`` numba threads (capped at numba's maximum): chacha follows ``torch.get_num_threads()``."""
    numba.set_num_threads(max(1, min(int(n), numba.config.NUMBA_NUM_THREADS)))


# fdlibm __ieee754_log (e_log.c): log(x) = k ln2 + log(1 + f), 1 + f in [sqrt(2)/2, sqrt(2)), error < 1 ulp
_LN2_HI, _LN2_LO = 6.93147180369123816490e-01, 1.90821492927058770002e-10
_LG1, _LG2, _LG3 = 6.666666666666735130e-01, 3.999999999940941908e-01, 2.857142874366239149e-01
_LG4, _LG5, _LG6, _LG7 = 2.222219843214978396e-01, 1.818357216161805012e-01, 1.531383769920937332e-01, 1.479819860511658591e-01

# fdlibm __kernel_sin / __kernel_cos (k_sin.c, k_cos.c) on [-pi/4, pi/4]
_S1, _S2, _S3 = -1.66666666666666324348e-01, 8.33333333332248946124e-03, -1.98412698298579493134e-04
_S4, _S5, _S6 = 2.75573137070700676789e-06, -2.50507602534068634195e-08, 1.58969099521155010221e-10
_C1, _C2, _C3 = 4.16666666666666019037e-02, -1.38888888888741095749e-03, 2.48015872894767294178e-05
_C4, _C5, _C6 = -2.75573143513906633035e-07, 2.08757232129817482790e-09, -1.13596475577881948265e-11

_FAST = dict(cache=True, nogil=True, error_model="numpy")  # numpy's error model: no branch on division

@njit(**_FAST)
def _rotl(x, n):  # pragma: no cover - compiled
    return _U32(_U32(x << n) | _U32(x >> (32 - n)))

@njit(**_FAST)
def _quarter(a, b, c, d):  # pragma: no cover - compiled
    """RFC 8439 section 2.1 (every step truncated to 32 bits: numba widens small integers)."""
    a = _U32(a + b)
    d = _rotl(_U32(d ^ a), 16)
    c = _U32(c + d)
    b = _rotl(_U32(b ^ c), 12)
    a = _U32(a + b)
    d = _rotl(_U32(d ^ a), 8)
    c = _U32(c + d)
    b = _rotl(_U32(b ^ c), 7)
    return a, b, c, d

@njit(**_FAST)
def _double_round(x):  # pragma: no cover - compiled
    """A column round and a diagonal round (RFC 8439 section 2.3)."""
    x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15 = x
    x0, x4, x8, x12 = _quarter(x0, x4, x8, x12)
    x1, x5, x9, x13 = _quarter(x1, x5, x9, x13)
    x2, x6, x10, x14 = _quarter(x2, x6, x10, x14)
    x3, x7, x11, x15 = _quarter(x3, x7, x11, x15)
    x0, x5, x10, x15 = _quarter(x0, x5, x10, x15)
    x1, x6, x11, x12 = _quarter(x1, x6, x11, x12)
    x2, x7, x8, x13 = _quarter(x2, x7, x8, x13)
    x3, x4, x9, x14 = _quarter(x3, x4, x9, x14)
    return x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15

@njit(**_FAST)
def blocks(key, ctr0, w14, w15, n, out):  # pragma: no cover - compiled
    """out[w, l] = word w of the ChaCha20 block with 64-bit counter ctr0 + l (words 12-13), l < n.

    One block per iteration of the l loop, written out as straight-line code (ten double rounds) so LLVM
    vectorises the loop across blocks (one SIMD lane per block; the unsigned index avoids numba's
    wraparound select, which would turn the stores into scatters)."""
    k0, k1, k2, k3, k4, k5, k6, k7 = key[0], key[1], key[2], key[3], key[4], key[5], key[6], key[7]
    c0, c1, c2, c3 = _U32(0x61707865), _U32(0x3320646E), _U32(0x79622D32), _U32(0x6B206574)
    for li in range(n):
        c = _U64(ctr0) + _U64(li)
        i12, i13 = _U32(c & _U64(0xFFFFFFFF)), _U32(c >> _U64(32))
        x = (c0, c1, c2, c3, k0, k1, k2, k3, k4, k5, k6, k7, i12, i13, w14, w15)
        x = _double_round(x)
        x = _double_round(x)
        x = _double_round(x)
        x = _double_round(x)
        x = _double_round(x)
        x = _double_round(x)
        x = _double_round(x)
        x = _double_round(x)
        x = _double_round(x)
        x = _double_round(x)
        ll = _U64(li)
        out[0, ll] = x[0] + c0
        out[1, ll] = x[1] + c1
        out[2, ll] = x[2] + c2
        out[3, ll] = x[3] + c3
        out[4, ll] = x[4] + k0
        out[5, ll] = x[5] + k1
        out[6, ll] = x[6] + k2
        out[7, ll] = x[7] + k3
        out[8, ll] = x[8] + k4
        out[9, ll] = x[9] + k5
        out[10, ll] = x[10] + k6
        out[11, ll] = x[11] + k7
        out[12, ll] = x[12] + i12
        out[13, ll] = x[13] + i13
        out[14, ll] = x[14] + w14
        out[15, ll] = x[15] + w15

@njit(**_FAST)
def _group(key, g, ks, flat):  # pragma: no cover - compiled
    """The keystream of group g (blocks g GROUP ..), in stream order: ``flat`` viewed as uint64 words."""
    blocks(key, g * GROUP, _U32(0), _U32(0), GROUP, ks)
    for li in range(GROUP):
        for w in range(16):
            flat[_U64(li * 16 + w)] = ks[w, li]
    return flat.view(np.uint64)

@njit(**_FAST)
def _log(x):  # pragma: no cover - compiled
    """fdlibm's log for a positive normal double, branch-free (so the element loops vectorise)."""
    bits = np.float64(x).view(np.uint64)
    hx = bits >> _U64(32)
    k = np.int64(hx >> _U64(20)) - 1023
    hm = hx & _U64(0xFFFFF)
    i = (hm + _U64(0x95F64)) & _U64(0x100000)  # 1 + f >= sqrt(2): halve it
    k += np.int64(i >> _U64(20))
    f = _U64(((hm | (i ^ _U64(0x3FF00000))) << _U64(32)) | (bits & _U64(0xFFFFFFFF))).view(np.float64) - 1.0
    s = f / (2.0 + f)
    dk = np.float64(k)
    z = s * s
    w = z * z
    r = z * (_LG1 + w * (_LG3 + w * (_LG5 + w * _LG7))) + w * (_LG2 + w * (_LG4 + w * _LG6))
    hfsq = 0.5 * f * f
    return dk * _LN2_HI - ((hfsq - (s * (hfsq + r) + dk * _LN2_LO)) - f)

@njit(**_FAST)
def _cos_sin_turn(k):  # pragma: no cover - compiled
    """(cos, sin)(2 pi k 2^-53) for a 53-bit integer k, branch-free: the quadrant q = round(4 k 2^-53) comes from
    the integer, the rest y = 2 pi (k 2^-53 - q / 4) in [-pi/4, pi/4] goes to fdlibm's kernels (< 1 ulp)."""
    q = (k + _U64(1 << 50)) >> _U64(51)  # round(k / 2^51) = round(4 u): 0 .. 4
    y = _TWO_PI * (np.float64(np.int64(k) - np.int64(q << _U64(51))) * _TWO_M53)
    z = y * y
    sn = y + (y * z) * (_S1 + z * (_S2 + z * (_S3 + z * (_S4 + z * (_S5 + z * _S6)))))
    cs = 1.0 - (0.5 * z - z * (z * (_C1 + z * (_C2 + z * (_C3 + z * (_C4 + z * (_C5 + z * _C6)))))))
    q = np.int64(q & _U64(3))  # (cos, sin)(y + q pi/2): q = 1 -> (-s, c), 2 -> (-c, -s), 3 -> (s, -c)
    odd = (q & 1) == 1
    c = np.float64(1 - 2 * (((q + 1) >> 1) & 1)) * (sn if odd else cs)
    s = np.float64(1 - 2 * (q >> 1)) * (cs if odd else sn)
    return c, s

@njit(**_FAST)
def _open_unit(w):  # pragma: no cover - compiled
    """((w >> 11) + 1) 2^-53: in (0, 1]."""
    return np.float64((w >> _U64(11)) + _U64(1)) * _TWO_M53

@njit(inline="always", **_FAST)
def _layout(n):  # pragma: no cover - compiled
    """(elements a group holds, groups, pieces of GROUPS_PER_PIECE groups) of an n-element draw."""
    per = GROUP * ELEMENTS_PER_BLOCK
    n_groups = (n + per - 1) // per
    return per, n_groups, (n_groups + GROUPS_PER_PIECE - 1) // GROUPS_PER_PIECE

@njit(parallel=True, **_FAST)
def words(key, out):  # pragma: no cover - compiled
    n = out.size
    per, n_groups, n_pieces = _layout(n)
    for p in prange(n_pieces):
        ks = np.empty((16, GROUP), np.uint32)
        flat = np.empty(GROUP * 16, np.uint32)
        for g in range(p * GROUPS_PER_PIECE, min(n_groups, (p + 1) * GROUPS_PER_PIECE)):
            w64 = _group(key, g, ks, flat)
            base = g * per
            for e in range(min(per, n - base)):
                out[_U64(base + e)] = w64[_U64(e)]

@njit(parallel=True, **_FAST)
def add_laplace(target, key, b):  # pragma: no cover - compiled
    """target[i] += -b s_i log v_i (module docstring), in float64, rounded once to target's dtype."""
    n = target.size
    per, n_groups, n_pieces = _layout(n)
    for p in prange(n_pieces):
        ks = np.empty((16, GROUP), np.uint32)
        flat = np.empty(GROUP * 16, np.uint32)
        for g in range(p * GROUPS_PER_PIECE, min(n_groups, (p + 1) * GROUPS_PER_PIECE)):
            w64 = _group(key, g, ks, flat)
            base = g * per
            for e in range(min(per, n - base)):
                w = w64[_U64(e)]
                sign = np.float64(1 - 2 * np.int64(w & _U64(1)))  # bit 0: the sign of u
                i = _U64(base + e)
                target[i] = target[i] + (-b * sign) * _log(_open_unit(w))

@njit(parallel=True, **_FAST)
def add_gaussian(target, key, std):  # pragma: no cover - compiled
    """Box-Muller on word pairs (module docstring), in float64, rounded once to target's dtype."""
    n = target.size
    per, n_groups, n_pieces = _layout(n)  # per is even: a pair never straddles two groups
    for p in prange(n_pieces):
        ks = np.empty((16, GROUP), np.uint32)
        flat = np.empty(GROUP * 16, np.uint32)
        for g in range(p * GROUPS_PER_PIECE, min(n_groups, (p + 1) * GROUPS_PER_PIECE)):
            w64 = _group(key, g, ks, flat)
            base = g * per
            m = min(per, n - base)
            for h in range(m // 2):  # whole pairs: no branch, so the loop vectorises
                e = _U64(2 * h)
                r = std * np.sqrt(-2.0 * _log(_open_unit(w64[e])))
                c, s = _cos_sin_turn(w64[e + _U64(1)] >> _U64(11))
                i = _U64(base) + e
                target[i] = target[i] + r * c
                target[i + _U64(1)] = target[i + _U64(1)] + r * s
            if m % 2:  # the draw's last element, alone: the cosine half of its pair
                e = _U64(m - 1)
                r = std * np.sqrt(-2.0 * _log(_open_unit(w64[e])))
                c, s = _cos_sin_turn(w64[e + _U64(1)] >> _U64(11))
                target[_U64(base) + e] = target[_U64(base) + e] + r * c
