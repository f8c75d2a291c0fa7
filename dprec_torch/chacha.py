"""ChaCha20 keystreams turned into uniforms, Laplace and Gaussian noise: the package's one CSPRNG.

Every draw a privacy proof needs (noise, Poisson sampling, sampling keys of a private release) comes from here,
through :class:`dprec_torch.seeding.SecretGenerator`, which gives each draw its own 256-bit key (a keyed BLAKE2b of
the run's secret key and the draw's counter). This module only turns one key into numbers.

What is drawn. Draw ``key`` is the keystream of ChaCha20 -- RFC 8439's block function, 20 rounds -- block counter
from 0. Block k's 64 bytes, read as eight little-endian 64-bit words, are the words of elements 8k .. 8k + 7
(``ELEMENTS_PER_BLOCK``), so element i of a draw is a function of (key, i) alone: never of the thread count, the
device or how the work is split (the CPU's numba kernels and the torch kernels on other devices give the same
words, tested). The 64-bit block counter fills input words 12-13; nonce words 14-15 are 0: a fresh key per draw
makes a nonce unnecessary.

From a word w: v = ((w >> 11) + 1) 2^-53 in (0, 1] (53 bits, never 0, so log v is finite), and

* Laplace(0, b), inverse CDF: -b sign(u) log(1 - 2|u|) with u in (-1/2, 1/2) is written with v = 1 - 2|u| and
  sign(u) = bit 0 of w (independent of the 53 bits of v): -b s log v. One word per element; on the CPU the log is
  an fdlibm ``__ieee754_log`` port (< 1 ulp) so the loop vectorises without SVML.
* N(0, std^2), Box-Muller on the pair of words (2m, 2m + 1): r = std sqrt(-2 log v_0), elements 2m and 2m + 1 get
  r cos(2 pi u_1) and r sin(2 pi u_1) with u_1 = (w_1 >> 11) 2^-53 in [0, 1).
* a uniform in [0, 1): (w >> 11) 2^-53 (float64) or (w >> 40) 2^-24 (float32), so it never rounds up to 1.

On the CPU both noises are added in place, in float64, to a float32 or float64 tensor, the keystream made and
consumed group by group in a few KiB of scratch (no M^2 float64 temporaries); numba ``@njit(parallel=True,
cache=True)``. On any other device (CUDA) the keystream is computed by torch's integer kernels on that device, in
chunks, and transformed there: no host round trip, and no torch generator (Philox's seed has 64 bits). Where Triton
imports (CUDA builds of torch), one kernel (:mod:`dprec_torch.chacha_triton`) computes the same words, and for a
contiguous float32/float64 target one kernel also transforms them and adds the noise in place (the torch path's
formula in float64, rounded once to the target's dtype; no temporaries, one launch where the torch path made about
fifteen over M^2-sized arrays).

Why ChaCha20 and not ChaCha12: 20 rounds is the RFC's function (checked against its test vector; "secure" needs no
argument about reduced rounds), and 12 saved under 20 % of a Laplace draw at M = 3706 (the log, the float conversions
and the memory traffic are most of the kernel).

Security: given a key nobody else knows, the keystream cannot be told from uniform bits (ChaCha20 as a stream
cipher, the construction of Opacus's ``secure_mode`` generator torchcsprng offers too). The keys are 256-bit
(:mod:`dprec_torch.seeding`), drawn from the OS entropy source or derived from an explicit ``noise_seed``.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import torch

import numba
from numba import njit, prange

if "NUMBA_THREADING_LAYER" not in os.environ:
    numba.config.THREADING_LAYER = "workqueue"  # sleeping workers (see dprec_torch.models.pair_numba)

ELEMENTS_PER_BLOCK = 8  # 64-byte block = eight 64-bit words, one per element (Box-Muller: two per pair)
GROUP = 64  # blocks made per pass: the keystream scratch is 4 KiB
GROUPS_PER_PIECE = 16  # a piece (one unit of parallel work) is 16 groups = 8192 elements
TORCH_CHUNK_BLOCKS = 1 << 20  # blocks per chunk of the torch kernels: 16 M words of int64 temporaries at most
_U32 = np.uint32
_U64 = np.uint64
_TWO_M53 = 2.0 ** -53
_TWO_M24 = 2.0 ** -24
_TWO_PI = 2.0 * np.pi
_CONSTANTS = (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574)  # "expand 32-byte k"
_MASK = 0xFFFFFFFF


def as_key(key: np.ndarray | bytes) -> np.ndarray:
    """A ChaCha key as 8 little-endian uint32 words (from 32 bytes or 8 words)."""
    if isinstance(key, (bytes, bytearray)):
        if len(key) != 32:
            raise ValueError(f"a ChaCha key is 32 bytes, got {len(key)}")
        return np.frombuffer(bytes(key), dtype="<u4").astype(np.uint32)
    key = np.ascontiguousarray(np.asarray(key), dtype=np.uint32)
    if key.shape != (8,):
        raise ValueError(f"a ChaCha key is 8 uint32 words, got shape {key.shape}")
    return key


def _set_threads() -> None:
    numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))


def chacha20_block(key: np.ndarray, counter: int, nonce: tuple[int, int, int]) -> np.ndarray:
    """RFC 8439 section 2.3: the 16 output words of the ChaCha20 block function (serialise little-endian)."""
    out = np.empty((16, 1), np.uint32)
    n0, n1, n2 = (int(x) & 0xFFFFFFFF for x in nonce)
    _blocks(as_key(key), (n0 << 32) | (int(counter) & 0xFFFFFFFF), _U32(n1), _U32(n2), 1, out)
    return out[:, 0].copy()


def keystream_words(key: np.ndarray, n: int) -> np.ndarray:
    """The first ``n`` 64-bit words of the draw keyed ``key`` (word i is element i's), as uint64 (CPU, numba)."""
    out = np.empty(int(n), np.uint64)
    if n:
        _set_threads()
        _words(as_key(key), out)
    return out


def torch_keystream(key: np.ndarray, n: int, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """The same words as :func:`keystream_words`, computed on ``device`` by torch integer kernels: ``(lo, hi)``, the
    low and high 32-bit halves of words 0 .. n-1 as int64 tensors (torch has no uint64 arithmetic). Chunked by
    ``TORCH_CHUNK_BLOCKS`` blocks."""
    k = [int(w) for w in as_key(key)]
    n = int(n)
    n_blocks = -(-n // ELEMENTS_PER_BLOCK)
    device = torch.device(device)
    fused = _triton(device)
    if fused is not None:  # one launch instead of ~2,300 elementwise ones per chunk
        words = fused.keystream(as_key(key), _CONSTANTS, n_blocks, device)
        return words[:, 0::2].reshape(-1)[:n], words[:, 1::2].reshape(-1)[:n]
    los, his = [], []
    for b0 in range(0, n_blocks, TORCH_CHUNK_BLOCKS):
        ctr = torch.arange(b0, min(n_blocks, b0 + TORCH_CHUNK_BLOCKS), device=device, dtype=torch.int64)
        init = [*_CONSTANTS, *k, ctr & _MASK, ctr >> 32, 0, 0]
        x = [v if isinstance(v, torch.Tensor) else torch.full_like(ctr, v) for v in init]
        for _ in range(10):  # ten double rounds: columns, then diagonals (RFC 8439 section 2.3)
            for a, b, c, d in ((0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15),
                               (0, 5, 10, 15), (1, 6, 11, 12), (2, 7, 8, 13), (3, 4, 9, 14)):
                x[a], x[b], x[c], x[d] = _torch_quarter(x[a], x[b], x[c], x[d])
        words = torch.stack([(x[w] + init[w]) & _MASK for w in range(16)], dim=1)  # (blocks, 16)
        los.append(words[:, 0::2].reshape(-1))  # element 8 b + j: words 2j (low half) and 2j + 1 (high half)
        his.append(words[:, 1::2].reshape(-1))
    if not los:
        empty = torch.zeros(0, dtype=torch.int64, device=device)
        return empty, empty
    return torch.cat(los)[:n], torch.cat(his)[:n]


@functools.lru_cache(maxsize=None)
def _triton(device: torch.device):  # noqa: ANN202 - the module dprec_torch.chacha_triton, or None
    """:mod:`dprec_torch.chacha_triton` for ``device`` (CUDA, or the CPU under ``TRITON_INTERPRET=1``), or None where
    Triton does not import (the torch kernels then compute the same words)."""
    if not (device.type == "cuda" or (device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") == "1")):
        return None
    try:
        from dprec_torch import chacha_triton
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return None
    return chacha_triton


def _fused_noise(target: torch.Tensor):  # noqa: ANN202 - dprec_torch.chacha_triton, or None
    """:mod:`dprec_torch.chacha_triton` where it adds the noise to ``target`` in one launch (words and noise in registers,
    the torch path's formula), else None."""
    fused = _triton(target.device)
    return fused if fused is not None and fused.fusable(target) else None


def _torch_rotl(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) & _MASK) | (x >> (32 - r))


def _torch_quarter(a, b, c, d):  # noqa: ANN001, ANN202 - int64 tensors holding 32-bit words
    """RFC 8439 section 2.1 on int64 tensors holding 32-bit words (every sum masked back to 32 bits)."""
    a = (a + b) & _MASK
    d = _torch_rotl(d ^ a, 16)
    c = (c + d) & _MASK
    b = _torch_rotl(b ^ c, 12)
    a = (a + b) & _MASK
    d = _torch_rotl(d ^ a, 8)
    c = (c + d) & _MASK
    b = _torch_rotl(b ^ c, 7)
    return a, b, c, d


def _top53(lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """w >> 11 of the 64-bit word (hi, lo): 53 bits, as int64."""
    return (hi << 21) | (lo >> 11)


def uniform(key: np.ndarray, n: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float64,
            open_interval: bool = False) -> torch.Tensor:
    """``n`` uniforms of the draw keyed ``key``, element i from word i: in [0, 1) (float64: (w >> 11) 2^-53;
    float32: (w >> 40) 2^-24), or with ``open_interval`` in (0, 1] (((w >> 11) + 1) 2^-53, never 0: finite log)."""
    device = torch.device(device)
    if device.type == "cpu":
        words = keystream_words(key, n)
        top = torch.from_numpy((words >> np.uint64(11)).astype(np.int64))
    else:
        fused = _triton(device)
        if fused is not None:  # one launch: the same integer arithmetic and exact scaling
            return fused.uniform(as_key(key), _CONSTANTS, int(n), device, dtype, open_interval)
        top = _top53(*torch_keystream(key, n, device))
    if open_interval:
        return ((top + 1).double() * _TWO_M53).to(dtype)
    if dtype == torch.float64:
        return top.double() * _TWO_M53
    return ((top >> 29).to(torch.float32) * _TWO_M24).to(dtype)


def _in_place(target: torch.Tensor, kernel, value: float, key: np.ndarray) -> torch.Tensor:
    if target.numel() == 0 or value == 0:
        return target
    key = as_key(key)
    _set_threads()
    if target.is_contiguous() and target.dtype in (torch.float32, torch.float64):
        kernel(target.detach().view(-1).numpy(), key, float(value))
        return target
    # a non-contiguous or other-dtype tensor: the same draws (element i in row-major order) on a contiguous copy
    work = target.detach().to(torch.float64 if target.dtype == torch.float64 else torch.float32).contiguous()
    kernel(work.view(-1).numpy(), key, float(value))
    with torch.no_grad():
        target.copy_(work)
    return target


def add_laplace_(target: torch.Tensor, scale: float, key: np.ndarray) -> torch.Tensor:
    """target += Lap(0, b = ``scale``) entrywise, in place (element i in row-major order uses word i)."""
    if target.device.type != "cpu":
        if target.numel() == 0 or scale == 0:
            return target
        fused = _fused_noise(target)
        if fused is not None:
            with torch.no_grad():
                return fused.add_laplace_(target, float(scale), as_key(key), _CONSTANTS)
        with torch.no_grad():
            return target.add_(laplace_noise(key, target.numel(), scale, target.device).view(target.shape).to(target.dtype))
    return _in_place(target, _add_laplace, scale, key)


def laplace_noise(key: np.ndarray, n: int, scale: float, device: torch.device | str) -> torch.Tensor:
    """The ``n`` float64 Laplace draws of :func:`add_laplace_` off the CPU, by torch kernels on ``device``: sign from
    word i's lowest bit, magnitude -scale log(((w_i >> 11) + 1) 2^-53)."""
    lo, hi = torch_keystream(key, n, device)
    sign = 1.0 - 2.0 * (lo & 1).double()
    return (-float(scale) * sign) * torch.log((_top53(lo, hi) + 1).double() * _TWO_M53)


def add_gaussian_(target: torch.Tensor, std: float, key: np.ndarray) -> torch.Tensor:
    """target += N(0, ``std``^2) entrywise, in place (Box-Muller: elements 2m, 2m + 1 from words 2m, 2m + 1)."""
    if target.device.type != "cpu":
        n = target.numel()
        if n == 0 or std == 0:
            return target
        fused = _fused_noise(target)
        if fused is not None:
            with torch.no_grad():
                return fused.add_gaussian_(target, float(std), as_key(key), _CONSTANTS)
        with torch.no_grad():
            return target.add_(gaussian_noise(key, n, std, target.device).view(target.shape).to(target.dtype))
    return _in_place(target, _add_gaussian, std, key)


def gaussian_noise(key: np.ndarray, n: int, std: float, device: torch.device | str) -> torch.Tensor:
    """The ``n`` float64 Gaussian draws of :func:`add_gaussian_` off the CPU, by torch kernels on ``device`` (Box-Muller
    on words 2m, 2m + 1: r = std sqrt(-2 log u_0), u_0 = ((w >> 11) + 1) 2^-53, theta = 2 pi (w' >> 11) 2^-53)."""
    lo, hi = torch_keystream(key, n + (n % 2), device)
    top = _top53(lo, hi)
    r = float(std) * torch.sqrt(-2.0 * torch.log((top[0::2] + 1).double() * _TWO_M53))
    theta = _TWO_PI * (top[1::2].double() * _TWO_M53)
    return torch.stack([r * torch.cos(theta), r * torch.sin(theta)], dim=1).reshape(-1)[:n]


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
def _blocks(key, ctr0, w14, w15, n, out):  # pragma: no cover - compiled
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
    _blocks(key, g * GROUP, _U32(0), _U32(0), GROUP, ks)
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
def _words(key, out):  # pragma: no cover - compiled
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
def _add_laplace(target, key, b):  # pragma: no cover - compiled
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
def _add_gaussian(target, key, std):  # pragma: no cover - compiled
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
