"""The in-place Laplace samplers draw what their one-shot forms draw.

* The torch sampler (``DPREC_NOISE_SAMPLER=torch``, the numbers published before issue 28): the chunked in-place
  draw is ``target + torch_laplace_noise(...)`` bit for bit and consumes the generator's stream identically.
* The ChaCha20 sampler (the default on the CPU): element i is a function of (key, i) only, so a draw is the prefix
  of any longer draw under its key, whatever the group/piece boundaries, and a draw consumes one key (8 words) from
  the generator. (The old bit-exact pin ``add_laplace_noise_ == t + laplace_noise`` does not carry over: the ChaCha
  in-place add rounds t + noise once in float64, ``laplace_noise`` returns float32 noise.)
"""

from __future__ import annotations

import numpy as np
import torch

from dprec_torch.mechanisms import noise
from dprec_torch.mechanisms.base import (
    NOISE_CHUNK,
    add_laplace_noise_,
    laplace_noise,
    torch_add_laplace_noise_,
    torch_laplace_noise,
)


def test_torch_sampler_chunked_noise_is_bit_identical_and_consumes_the_same_stream() -> None:
    for n in (7, NOISE_CHUNK, 3 * NOISE_CHUNK + 11):
        t = torch.randn(n)
        g1, g2 = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
        assert torch.equal(torch_add_laplace_noise_(t.clone(), 0.9, g1), t + torch_laplace_noise(t.shape, 0.9, g2, t.device))
        assert torch.equal(g1.get_state(), g2.get_state())


def test_chacha_noise_is_a_prefix_of_a_longer_draw_and_consumes_one_key(monkeypatch) -> None:
    monkeypatch.delenv(noise.ENV, raising=False)
    per_piece = noise.GROUP * noise.ELEMENTS_PER_BLOCK * noise.GROUPS_PER_PIECE
    longest = add_laplace_noise_(torch.zeros(NOISE_CHUNK + 11, dtype=torch.float64), 0.9, torch.Generator().manual_seed(11))
    for n in (7, per_piece, 3 * per_piece + 11, NOISE_CHUNK + 11):
        t = torch.randn(n, dtype=torch.float64)
        g1, g2 = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
        assert torch.equal(add_laplace_noise_(t.clone(), 0.9, g1), t + longest[:n])
        noise.draw_key(g2)
        assert torch.equal(g1.get_state(), g2.get_state())
        one_shot = laplace_noise(torch.Size([n]), 0.9, torch.Generator().manual_seed(11), torch.device("cpu"))
        assert one_shot.dtype == torch.float32 and torch.equal(one_shot, longest[:n].float())
    assert np.isfinite(longest.numpy()).all()
