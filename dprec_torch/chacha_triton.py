"""ChaCha20 keystream blocks in one Triton kernel: the words of :func:`dprec_torch.chacha.torch_keystream` on a GPU.

torch's integer kernels compute a block batch in about 2,300 elementwise launches (ten double rounds of eight quarter
rounds, each a dozen operations on int64 tensors holding 32-bit words); on a GPU a step's noise and Poisson draws
were then launch-bound (tens of ms). Here one program computes ``BLOCK`` blocks in registers, uint32 arithmetic
wrapping as RFC 8439 section 2.1 states, and writes their 16 words: the same words, tested against the CPU's numba
kernels (on a GPU natively, without one in Triton's interpreter). Imported only where Triton is (``chacha``'s
``_triton()``): CPU wheels of torch ship without it.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

BLOCK = 128  # ChaCha blocks per program


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
def chacha_blocks(key, out, n_blocks, BLOCK: tl.constexpr):  # pragma: no cover - GPU
    """out[16 b + w] = word w of the ChaCha20 block with 64-bit counter b (words 12-13; nonce words 0)."""
    b = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    keep = b < n_blocks
    z = tl.zeros([BLOCK], dtype=tl.uint32)
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
    o = out + b * 16
    tl.store(o + 0, x0 + c0, mask=keep)
    tl.store(o + 1, x1 + c1, mask=keep)
    tl.store(o + 2, x2 + c2, mask=keep)
    tl.store(o + 3, x3 + c3, mask=keep)
    tl.store(o + 4, x4 + k0, mask=keep)
    tl.store(o + 5, x5 + k1, mask=keep)
    tl.store(o + 6, x6 + k2, mask=keep)
    tl.store(o + 7, x7 + k3, mask=keep)
    tl.store(o + 8, x8 + k4, mask=keep)
    tl.store(o + 9, x9 + k5, mask=keep)
    tl.store(o + 10, x10 + k6, mask=keep)
    tl.store(o + 11, x11 + k7, mask=keep)
    tl.store(o + 12, x12 + i12, mask=keep)
    tl.store(o + 13, x13 + i13, mask=keep)
    tl.store(o + 14, x14, mask=keep)
    tl.store(o + 15, x15, mask=keep)


def keystream(key: np.ndarray, constants: tuple[int, ...], n_blocks: int, device: torch.device) -> torch.Tensor:
    """The 16 words of blocks 0 .. n_blocks - 1 as int64 in [0, 2^32), shape ``[n_blocks, 16]``, on ``device``."""
    words = np.concatenate([np.asarray(key, np.uint32), np.asarray(constants, np.uint32)])
    buf = torch.from_numpy(words.view(np.int32).copy()).to(device).view(torch.uint32)
    out = torch.empty(n_blocks * 16, dtype=torch.uint32, device=device)
    if n_blocks:
        chacha_blocks[(triton.cdiv(n_blocks, BLOCK),)](buf, out, n_blocks, BLOCK=BLOCK)
    return out.view(torch.int32).to(torch.int64).bitwise_and_(0xFFFFFFFF).view(n_blocks, 16)
