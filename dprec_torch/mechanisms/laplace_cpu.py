"""Laplace noise for large CPU tensors: PCG64 uniforms, transformed chunk by chunk.

Mechanisms perturb all M^2 entries of the PNBM gradient every step (Alg. 1, line 6), 13.7 M
draws at ML-1M size. torch's CPU generator (mt19937) takes ~0.2 s for those uniforms alone;
numpy's PCG64 ~0.06 s. So for large tensors :func:`add_laplace_` draws one 62-bit seed from the
mechanism's torch generator (whose state the checkpoints keep, so runs stay reproducible and
resumable), seeds a PCG64 stream with it, and adds

    Lap(0, b) = -b sign(u - 1/2) log(1 - 2 |u - 1/2|),   u ~ U[0, 1) with 53 random bits,

the inverse-CDF transform of :func:`dprec_torch.mechanisms.base.laplace_noise`, chunk by chunk
in a cache-sized float64 buffer (torch's vectorised log; 1 - 2|u - 1/2| is exact in float64).
"""

from __future__ import annotations

import numpy as np
import torch

CHUNK = 1 << 16  # uniforms per chunk (512 KiB of float64: stays in cache)
MIN_SIZE = 1 << 20  # smaller tensors keep the torch sampler


def usable(target: torch.Tensor) -> bool:
    """Whether :func:`add_laplace_` applies: a large contiguous float CPU tensor."""
    return (target.device.type == "cpu" and target.is_contiguous() and target.numel() >= MIN_SIZE
            and target.dtype in (torch.float32, torch.float64))


def add_laplace_(target: torch.Tensor, scale: float, generator: torch.Generator) -> torch.Tensor:
    """target += Lap(0, ``scale``) entrywise (see the module docstring); consumes one draw of ``generator``."""
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
    rng = np.random.Generator(np.random.PCG64(seed))
    flat = target.detach().view(-1)
    n = flat.numel()
    buf_np = np.empty(min(CHUNK, n), dtype=np.float64)
    buf, sign = torch.from_numpy(buf_np), torch.empty(buf_np.size, dtype=torch.float64)
    for s in range(0, n, CHUNK):
        e = min(n, s + CHUNK)
        rng.random(out=buf_np[: e - s])
        u, sg = buf[: e - s], sign[: e - s]
        u.sub_(0.5)  # x = u - 1/2, exact
        torch.sign(u, out=sg)
        u.abs_().mul_(-2).add_(1).log_().mul_(sg)  # sign(x) log(1 - 2|x|); 1 - 2|x| is exact, log is faster than log1p
        flat[s:e].add_(u.to(target.dtype), alpha=-scale)
    return target
