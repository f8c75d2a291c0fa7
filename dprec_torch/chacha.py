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
cache=True)`` in :mod:`dprec_torch.chacha_numba`, imported on the first CPU draw (a GPU run never loads numba). On
any other device (CUDA) the keystream is computed by torch's integer kernels on that device, in chunks, and
transformed there: no host round trip, and no torch generator (Philox's seed has 64 bits). Where Triton
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

ELEMENTS_PER_BLOCK = 8  # 64-byte block = eight 64-bit words, one per element (Box-Muller: two per pair)
TORCH_CHUNK_BLOCKS = 1 << 20  # blocks per chunk of the torch kernels: 16 M words of int64 temporaries at most
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


def _cpu_kernels():  # noqa: ANN202 - the module dprec_torch.chacha_numba
    """:mod:`dprec_torch.chacha_numba`, the CPU kernels, imported on the first CPU draw (a run that draws only on a GPU
    never loads numba), its threads set to torch's (``torch.get_num_threads()``) for this draw."""
    from dprec_torch import chacha_numba

    chacha_numba.set_threads(torch.get_num_threads())
    return chacha_numba


def chacha20_block(key: np.ndarray, counter: int, nonce: tuple[int, int, int]) -> np.ndarray:
    """RFC 8439 section 2.3: the 16 output words of the ChaCha20 block function (serialise little-endian)."""
    out = np.empty((16, 1), np.uint32)
    n0, n1, n2 = (int(x) & 0xFFFFFFFF for x in nonce)
    _cpu_kernels().blocks(as_key(key), (n0 << 32) | (int(counter) & 0xFFFFFFFF), np.uint32(n1), np.uint32(n2), 1, out)
    return out[:, 0].copy()


def keystream_words(key: np.ndarray, n: int) -> np.ndarray:
    """The first ``n`` 64-bit words of the draw keyed ``key`` (word i is element i's), as uint64 (CPU, numba)."""
    out = np.empty(int(n), np.uint64)
    if n:
        _cpu_kernels().words(as_key(key), out)
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
    """The CPU's in-place noise: a :mod:`~dprec_torch.chacha_numba` kernel on ``target`` (float32/64)."""
    if target.numel() == 0 or value == 0:
        return target
    key = as_key(key)
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
    return _in_place(target, _cpu_kernels().add_laplace, scale, key)


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
    return _in_place(target, _cpu_kernels().add_gaussian, std, key)


def gaussian_noise(key: np.ndarray, n: int, std: float, device: torch.device | str) -> torch.Tensor:
    """The ``n`` float64 Gaussian draws of :func:`add_gaussian_` off the CPU, by torch kernels on ``device`` (Box-Muller
    on words 2m, 2m + 1: r = std sqrt(-2 log u_0), u_0 = ((w >> 11) + 1) 2^-53, theta = 2 pi (w' >> 11) 2^-53)."""
    lo, hi = torch_keystream(key, n + (n % 2), device)
    top = _top53(lo, hi)
    r = float(std) * torch.sqrt(-2.0 * torch.log((top[0::2] + 1).double() * _TWO_M53))
    theta = _TWO_PI * (top[1::2].double() * _TWO_M53)
    return torch.stack([r * torch.cos(theta), r * torch.sin(theta)], dim=1).reshape(-1)[:n]
