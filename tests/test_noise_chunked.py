"""The chunked in-place Laplace sampler draws exactly what ``laplace_noise`` draws (published numbers stay reproducible)."""

from __future__ import annotations

import torch

from dprec_torch.mechanisms.base import NOISE_CHUNK, add_laplace_noise_, laplace_noise


def test_chunked_noise_is_bit_identical_and_consumes_the_same_stream() -> None:
    for n in (7, NOISE_CHUNK, 3 * NOISE_CHUNK + 11):
        t = torch.randn(n)
        g1, g2 = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
        assert torch.equal(add_laplace_noise_(t.clone(), 0.9, g1), t + laplace_noise(t.shape, 0.9, g2, t.device))
        assert torch.equal(g1.get_state(), g2.get_state())
