"""ChaCha20 keystream blocks in one Triton kernel: the words of :func:`dprec_torch.chacha.torch_keystream` on a GPU.

torch's integer kernels compute a block batch in about 2,300 elementwise launches (ten double rounds of eight quarter
rounds, each a dozen operations on int64 tensors holding 32-bit words); on a GPU a step's noise and Poisson draws
were then launch-bound (tens of ms). Here one program computes ``BLOCK`` blocks in registers, uint32 arithmetic
wrapping as RFC 8439 section 2.1 states, and writes their 16 words: the same words, tested against the CPU's numba
kernels (on a GPU natively, without one in Triton's interpreter). Imported only where Triton is (``chacha``'s
``_triton()``): CPU wheels of torch ship without it.

``gaussian_add`` / ``laplace_add`` also transform the words and add the noise to a contiguous float32/float64 tensor
in place: the formulas of ``chacha.gaussian_noise`` / ``chacha.laplace_noise`` in float64 (libdevice's log, sin, cos;
IEEE sqrt), rounded once to the target's dtype. The torch path made about fifteen launches over noise-sized float64
temporaries (an M x M matrix's worth for full S). Float scalars (the std or scale, and 2 pi) travel as float64 bits
in the key buffer: a float literal in a kernel is float32.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import triton
import triton.language as tl

from dprec_torch import key_feed

BLOCK = 128  # ChaCha blocks per program
TWO_M53 = tl.constexpr(2.0 ** -53)  # exact in any float width (a kernel reads only constexpr globals)
TWO_M24 = tl.constexpr(2.0 ** -24)
TWO_PI = 2.0 * np.pi  # chacha._TWO_PI; travels as float64 bits (a float literal in a kernel is float32)


@triton.jit
def rotl(x, n: tl.constexpr):  # pragma: no cover - GPU
    return (x << n) | (x >> (32 - n))


@triton.jit
def quarter(a, b, c, d):  # pragma: no cover - GPU
    """RFC 8439 section 2.1 on uint32 (additions wrap mod 2^32)."""
    a = a + b
    d = rotl(d ^ a, 16)
    c = c + d
    b = rotl(b ^ c, 12)
    a = a + b
    d = rotl(d ^ a, 8)
    c = c + d
    b = rotl(b ^ c, 7)
    return a, b, c, d


@triton.jit
def block_words(key, b):  # pragma: no cover - GPU
    """The 16 words of the ChaCha20 blocks with 64-bit counters ``b`` (words 12-13; nonce words 0), as uint32 vectors."""
    z = tl.zeros(b.shape, dtype=tl.uint32)
    k0 = z + tl.load(key + 0)
    k1 = z + tl.load(key + 1)
    k2 = z + tl.load(key + 2)
    k3 = z + tl.load(key + 3)
    k4 = z + tl.load(key + 4)
    k5 = z + tl.load(key + 5)
    k6 = z + tl.load(key + 6)
    k7 = z + tl.load(key + 7)
    c0 = z + tl.load(key + 8)  # the four "expand 32-byte k" constants follow the key in the buffer
    c1 = z + tl.load(key + 9)
    c2 = z + tl.load(key + 10)
    c3 = z + tl.load(key + 11)
    i12 = (b & 0xFFFFFFFF).to(tl.uint32)
    i13 = (b >> 32).to(tl.uint32)
    x0, x1, x2, x3, x4, x5, x6, x7 = c0, c1, c2, c3, k0, k1, k2, k3
    x8, x9, x10, x11, x12, x13, x14, x15 = k4, k5, k6, k7, i12, i13, z, z
    for _ in tl.static_range(10):  # ten double rounds: columns, then diagonals (RFC 8439 section 2.3)
        x0, x4, x8, x12 = quarter(x0, x4, x8, x12)
        x1, x5, x9, x13 = quarter(x1, x5, x9, x13)
        x2, x6, x10, x14 = quarter(x2, x6, x10, x14)
        x3, x7, x11, x15 = quarter(x3, x7, x11, x15)
        x0, x5, x10, x15 = quarter(x0, x5, x10, x15)
        x1, x6, x11, x12 = quarter(x1, x6, x11, x12)
        x2, x7, x8, x13 = quarter(x2, x7, x8, x13)
        x3, x4, x9, x14 = quarter(x3, x4, x9, x14)
    return (x0 + c0, x1 + c1, x2 + c2, x3 + c3, x4 + k0, x5 + k1, x6 + k2, x7 + k3,
            x8 + k4, x9 + k5, x10 + k6, x11 + k7, x12 + i12, x13 + i13, x14, x15)


@triton.jit
def chacha_blocks(key, out, n_blocks, BLOCK: tl.constexpr):  # pragma: no cover - GPU
    """out[16 b + w] = word w of the ChaCha20 block with 64-bit counter b."""
    b = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    keep = b < n_blocks
    w = block_words(key, b)
    o = out + b * 16
    for i in tl.static_range(16):
        tl.store(o + i, w[i], mask=keep)


@triton.jit
def top53(lo, hi):  # pragma: no cover - GPU
    """w >> 11 of the 64-bit word (hi, lo): 53 bits, as int64 (chacha._top53)."""
    return (hi.to(tl.int64) << 21) | (lo.to(tl.int64) >> 11)


@triton.jit
def scalar64(key, at: tl.constexpr):  # pragma: no cover - GPU
    """The float64 whose bits are words ``at`` (low) and ``at + 1`` (high) of the buffer."""
    bits = (tl.load(key + at + 1).to(tl.uint64) << 32) | tl.load(key + at).to(tl.uint64)
    return bits.to(tl.float64, bitcast=True)


@triton.jit
def gaussian_pair(lo_a, hi_a, lo_b, hi_b, std, two_pi):  # pragma: no cover - GPU
    """Box-Muller on two words, as chacha.add_gaussian_'s torch path writes it: r = std sqrt(-2 log u1), with
    u1 = (top(a) + 1) 2^-53 in (0, 1], theta = 2 pi top(b) 2^-53; (r cos theta, r sin theta) in float64."""
    u1 = (top53(lo_a, hi_a) + 1).to(tl.float64) * TWO_M53
    r = std * tl.sqrt(-2.0 * tl.log(u1))  # float64: correctly rounded (only float32 sqrt is approximate)
    theta = two_pi * (top53(lo_b, hi_b).to(tl.float64) * TWO_M53)
    return r * tl.cos(theta), r * tl.sin(theta)


@triton.jit
def add_noise_at(target, e, noise, n):  # pragma: no cover - GPU
    """target[e] += noise rounded once to target's dtype, for the elements e < n."""
    keep = e < n
    t = tl.load(target + e, mask=keep)
    tl.store(target + e, t + noise.to(t.dtype), mask=keep)


@triton.jit
def gaussian_add(key, target, n, BLOCK: tl.constexpr):  # pragma: no cover - GPU
    """target[i] += N(0, std^2), element i from word i (pairs 2m, 2m + 1 by Box-Muller): block b's words 4k .. 4k + 3
    give the pair (8 b + 2 k, 8 b + 2 k + 1), k = 0 .. 3."""
    b = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    w = block_words(key, b)
    std = scalar64(key, 12)
    two_pi = scalar64(key, 14)
    for k in tl.static_range(4):
        za, zb = gaussian_pair(w[4 * k], w[4 * k + 1], w[4 * k + 2], w[4 * k + 3], std, two_pi)
        add_noise_at(target, 8 * b + 2 * k, za, n)
        add_noise_at(target, 8 * b + 2 * k + 1, zb, n)


@triton.jit
def laplace_add(key, target, n, BLOCK: tl.constexpr):  # pragma: no cover - GPU
    """target[i] += Lap(0, b = scale), element i from word i: sign from the word's lowest bit, magnitude
    -scale log((top + 1) 2^-53), as chacha.add_laplace_'s torch path writes it."""
    b = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    w = block_words(key, b)
    scale = scalar64(key, 12)
    for j in tl.static_range(8):
        lo = w[2 * j]
        sign = 1.0 - 2.0 * (lo & 1).to(tl.float64)
        u = (top53(lo, w[2 * j + 1]) + 1).to(tl.float64) * TWO_M53
        add_noise_at(target, 8 * b + j, (-scale * sign) * tl.log(u), n)


@triton.jit
def uniform_fill(key, out, n, MODE: tl.constexpr, BLOCK: tl.constexpr):  # pragma: no cover - GPU
    """out[i] = the uniform of word i (chacha.uniform): MODE 0: top 2^-53 and 1: (top + 1) 2^-53, in float64;
    2: (top >> 29) 2^-24 in float32 (top = w >> 11). Integer arithmetic, then one exact scaling: the same bits."""
    b = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    w = block_words(key, b)
    for j in tl.static_range(8):
        top = top53(w[2 * j], w[2 * j + 1])
        if MODE == 2:
            v = (top >> 29).to(tl.float32) * TWO_M24
        elif MODE == 1:
            v = (top + 1).to(tl.float64) * TWO_M53
        else:
            v = top.to(tl.float64) * TWO_M53
        e = 8 * b + j
        tl.store(out + e, v, mask=e < n)


def _words(key: np.ndarray, constants: tuple[int, ...], value: float | None = None) -> np.ndarray:
    """:func:`_buffer`'s words on the host, as int32."""
    parts = [np.asarray(key, np.uint32), np.asarray(constants, np.uint32)]
    if value is not None:
        parts.append(np.array([value, TWO_PI], np.float64).view(np.uint32))
    return np.concatenate(parts).view(np.int32).copy()


def _buffer(key: np.ndarray, constants: tuple[int, ...], device: torch.device, value: float | None = None) -> torch.Tensor:
    """key (8 words), constants (4), and, with ``value``, the float64 bits of ``value`` and 2 pi (2 words each), as one
    uint32 tensor on ``device`` (one copy to it, from pinned memory without waiting: a copy from pageable memory makes
    torch wait for the device, a host round trip in every noised step; the caching host allocator keeps the pinned
    block until the copy has run)."""
    feed = key_feed.observing()
    if feed is not None:  # a step being captured (CUDA graph): a fixed slot, given each replay's fresh key
        return feed.slot(key, functools.partial(_words, constants=constants, value=value))
    host = torch.from_numpy(_words(key, constants, value))
    if torch.device(device).type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True).view(torch.uint32)


def keystream(key: np.ndarray, constants: tuple[int, ...], n_blocks: int, device: torch.device) -> torch.Tensor:
    """The 16 words of blocks 0 .. n_blocks - 1 as int64 in [0, 2^32), shape ``[n_blocks, 16]``, on ``device``."""
    buf = _buffer(key, constants, device)
    out = torch.empty(n_blocks * 16, dtype=torch.uint32, device=device)
    if n_blocks:
        chacha_blocks[(triton.cdiv(n_blocks, BLOCK),)](buf, out, n_blocks, BLOCK=BLOCK)
    return out.view(torch.int32).to(torch.int64).bitwise_and_(0xFFFFFFFF).view(n_blocks, 16)


def uniform(key: np.ndarray, constants: tuple[int, ...], n: int, device: torch.device, dtype: torch.dtype,
            open_interval: bool = False) -> torch.Tensor:
    """chacha.uniform's ``n`` uniforms in one launch (the torch path took about a dozen over int64 words)."""
    mode = 1 if open_interval else (0 if dtype == torch.float64 else 2)
    out = torch.empty(n, dtype=torch.float32 if mode == 2 else torch.float64, device=device)
    if n:
        n_blocks = -(-n // 8)
        uniform_fill[(triton.cdiv(n_blocks, BLOCK),)](_buffer(key, constants, device), out, n, MODE=mode, BLOCK=BLOCK)
    return out.to(dtype)


def fusable(target: torch.Tensor) -> bool:
    """Whether :func:`add_gaussian_` / :func:`add_laplace_` take ``target`` in place (contiguous float32/float64)."""
    return target.is_contiguous() and target.dtype in (torch.float32, torch.float64)


def _add_in_place(kernel, target: torch.Tensor, value: float, key: np.ndarray, constants: tuple[int, ...]) -> torch.Tensor:
    """One launch of a noise kernel over ``target`` (8 elements a ChaCha block), ``value`` its float64 scalar."""
    n_blocks = -(-target.numel() // 8)
    kernel[(triton.cdiv(n_blocks, BLOCK),)](_buffer(key, constants, target.device, float(value)), target.view(-1),
                                            target.numel(), BLOCK=BLOCK)
    return target


def add_gaussian_(target: torch.Tensor, std: float, key: np.ndarray, constants: tuple[int, ...]) -> torch.Tensor:
    """target += N(0, std^2) in one launch: the words and numbers of chacha.add_gaussian_'s torch path, no temporaries."""
    return _add_in_place(gaussian_add, target, std, key, constants)


def add_laplace_(target: torch.Tensor, scale: float, key: np.ndarray, constants: tuple[int, ...]) -> torch.Tensor:
    """target += Lap(0, scale) in one launch: the words and numbers of chacha.add_laplace_'s torch path."""
    return _add_in_place(laplace_add, target, scale, key, constants)
