"""The randomness a privacy proof needs comes from 256-bit keys (dprec_torch/seeding.py), never from torch's generators.

* every bit of the key matters: flipping any one of the 256 changes the noise, on the CPU and on CUDA;
* every bit of an explicit ``noise_seed`` matters (mt19937 kept 32: seeds 5 and 2^40 + 5 released the same model);
* under one ``noise_seed`` two folds, two jobs and two streams draw independent noise (no cancelling differences);
* a checkpointed generator state redraws the same noise, and its state is the only place the key lives.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import dprec_torch
from dprec_torch import chacha, seeding
from dprec_torch.mechanisms.base import add_gaussian_noise_, add_laplace_noise_
from dprec_torch.seeding import SecretGenerator, key_scope, noise_generator

FAST = ["data=synthetic", "data.preset=tiny", "compare_baselines=false", "tensorboard=false", "device=cpu"]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _flip(key: bytes, bit: int) -> bytes:
    raw = bytearray(key)
    raw[bit // 8] ^= 1 << (bit % 8)
    return bytes(raw)


@pytest.mark.parametrize("device", DEVICES)
def test_flipping_any_one_of_the_256_key_bits_changes_the_noise(device: str) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no GPU")
    key = bytes(range(32))
    base_lap = add_laplace_noise_(torch.zeros(64, device=device), 1.0, SecretGenerator(key, device))
    base_gau = add_gaussian_noise_(torch.zeros(64, device=device), 1.0, SecretGenerator(key, device))
    for bit in range(256):
        other = _flip(key, bit)
        lap = add_laplace_noise_(torch.zeros(64, device=device), 1.0, SecretGenerator(other, device))
        gau = add_gaussian_noise_(torch.zeros(64, device=device), 1.0, SecretGenerator(other, device))
        assert (lap != base_lap).float().mean() > 0.9, bit
        assert (gau != base_gau).float().mean() > 0.9, bit


@pytest.mark.gpu
def test_cuda_draws_are_the_cpu_keystream() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    key = chacha.as_key(bytes(range(32)))
    lo, hi = chacha.torch_keystream(key, 1001, "cuda")
    words = (hi.cpu().numpy().astype(np.uint64) << np.uint64(32)) | lo.cpu().numpy().astype(np.uint64)
    assert np.array_equal(words, chacha.keystream_words(key, 1001))
    for dtype, open_ in ((torch.float64, False), (torch.float64, True), (torch.float32, False), (torch.float32, True)):
        cpu = chacha.uniform(key, 1001, "cpu", dtype, open_interval=open_)  # one Triton launch on the GPU
        assert torch.equal(chacha.uniform(key, 1001, "cuda", dtype, open_interval=open_).cpu(), cpu), (dtype, open_)
    cpu = SecretGenerator(bytes(32)).rand(1000, dtype=torch.float64)
    assert torch.equal(SecretGenerator(bytes(32), "cuda").rand(1000, dtype=torch.float64).cpu(), cpu)


def test_every_bit_of_an_explicit_noise_seed_counts() -> None:
    a = noise_generator(5).randn(100)
    assert torch.equal(a, noise_generator(5).randn(100))  # reproducible
    assert not torch.equal(a, noise_generator(5 + 2**40).randn(100))  # mt19937 dropped bits 32..
    assert not torch.equal(a, noise_generator(5 + 2**200).randn(100))


def test_folds_jobs_and_streams_get_independent_keys_under_one_noise_seed() -> None:
    draws = {}
    for job in ("a", "b"):
        for fold in (1, 2):
            with key_scope(job=job, fold=fold):
                for stream in (seeding.NOISE_STREAM, seeding.SAMPLER_STREAM):
                    draws[job, fold, stream] = noise_generator(7, stream=stream).randn(1000)
    values = list(draws.values())
    for i in range(len(values)):
        for j in range(i + 1, len(values)):
            assert abs(float(torch.corrcoef(torch.stack([values[i], values[j]]))[0, 1])) < 0.15


def test_a_secret_key_is_fresh_each_time_and_never_a_torch_generator() -> None:
    assert not torch.equal(noise_generator(None).randn(100), noise_generator(None).randn(100))
    with pytest.raises(TypeError, match="SecretGenerator"):
        add_laplace_noise_(torch.zeros(3), 1.0, torch.Generator().manual_seed(0))


def test_a_restored_state_redraws_the_same_noise_and_the_state_holds_the_key() -> None:
    gen = noise_generator(None)
    gen.randn(10)
    state = gen.get_state()
    assert state.dtype == torch.uint8 and state.numel() == seeding.KEY_BYTES + 8
    nxt = gen.randn(1000)
    other = noise_generator(None)
    other.set_state(state)
    assert torch.equal(other.randn(1000), nxt)
    assert "key" not in repr(gen).lower() or "draws" in repr(gen)  # the repr never shows the key
    with pytest.raises(ValueError, match="256-bit keys"):
        other.set_state(torch.zeros(8, dtype=torch.uint8))


def _train(tmp_path, name: str, *overrides: str):
    return dprec_torch.train([*FAST, f"output_dir={tmp_path / name}", *overrides])


def _released_U(run) -> torch.Tensor:
    return next(run.model().parameters()).detach().clone()


def test_noise_seeds_that_agree_in_their_low_32_bits_release_different_models(tmp_path) -> None:
    """The review's reproduction: noise_seed=5 and noise_seed=2^40 + 5 released the same model under mt19937."""
    args = ["mechanism=gaussian", "epsilon=1", "mechanism.epochs=1"]
    a, again = _train(tmp_path, "a", *args, "noise_seed=5"), _train(tmp_path, "a2", *args, "noise_seed=5")
    b = _train(tmp_path, "b", *args, f"noise_seed={2**40 + 5}")
    assert torch.equal(_released_U(a), _released_U(again))
    assert not torch.equal(_released_U(a), _released_U(b))


def test_two_folds_and_two_jobs_draw_different_keys_under_an_explicit_noise_seed(tmp_path, monkeypatch) -> None:
    """Folds (and sweep jobs) share people: equal noise would cancel in the difference of two released models."""
    derived: list[tuple[tuple, bytes]] = []
    real = seeding.derive_key

    def record(key: bytes, *labels):
        out = real(key, *labels)
        derived.append((labels, out))
        return out

    monkeypatch.setattr(seeding, "derive_key", record)
    for eps in (1, 10):
        _train(tmp_path, f"e{eps}", "data.fold=all", "data.n_folds=2", "mechanism=gaussian", f"epsilon={eps}",
               "mechanism.epochs=1", "noise_seed=3")
    noise = [(labels, key) for labels, key in derived if labels[-1] == ("stream", seeding.NOISE_STREAM)]
    scopes = {labels[:-1] for labels, _ in noise}
    assert len(scopes) == 4  # 2 jobs (epsilon 1 and 10) x 2 folds
    assert len({key for _, key in noise}) == 4
