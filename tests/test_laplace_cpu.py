"""Laplace noise on large CPU tensors (PCG64 uniforms seeded from the mechanism's torch generator)."""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats

from dprec_torch.mechanisms import laplace_cpu
from dprec_torch.mechanisms.base import add_laplace_noise_, laplace_noise

N = laplace_cpu.MIN_SIZE + 12345  # above the cut-off, not a multiple of the chunk


def test_large_tensor_noise_is_laplace_with_scale_b() -> None:
    b = 0.7
    x = add_laplace_noise_(torch.zeros(N), b, torch.Generator().manual_seed(0)).double()
    assert laplace_cpu.usable(torch.zeros(N))
    assert abs(float(x.abs().mean()) - b) < 0.005 * b  # E|X| = b
    assert abs(float(x.var()) - 2 * b * b) < 0.02 * 2 * b * b  # Var X = 2 b^2
    assert abs(float(x.mean())) < 0.01
    ks = stats.kstest(x.numpy()[::7] / b, "laplace")
    assert ks.pvalue > 1e-3
    # both tails, symmetric: P(X > 3b) = exp(-3)/2
    assert abs(float((x > 3 * b).double().mean()) - np.exp(-3) / 2) < 0.002
    assert abs(float((x < -3 * b).double().mean()) - np.exp(-3) / 2) < 0.002


def test_noise_is_added_in_place_and_reproducible_from_the_generator_state() -> None:
    base = torch.randn(N)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    a = add_laplace_noise_(base.clone(), 1.0, g1)
    state = g1.get_state()
    b = add_laplace_noise_(base.clone(), 1.0, g2)
    assert torch.equal(a, b)  # same seed, same noise
    c = add_laplace_noise_(base.clone(), 1.0, g1)
    assert not torch.equal(a, c)  # the generator advanced
    g3 = torch.Generator()
    g3.set_state(state)  # a resumed run continues the same stream
    assert torch.equal(add_laplace_noise_(base.clone(), 1.0, g3), c)
    assert torch.allclose(a - base, (a - base).clamp(-40, 40))  # finite


def test_small_tensors_keep_the_torch_draws_bit_for_bit() -> None:
    t = torch.randn(1000)
    g1, g2 = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    assert torch.equal(add_laplace_noise_(t.clone(), 0.3, g1), t + laplace_noise(t.shape, 0.3, g2, t.device))
    assert not laplace_cpu.usable(t)
