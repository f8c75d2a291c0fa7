"""One seed drives torch, numpy and Python's RNG; RNG states round-trip through checkpoints.

Two kinds of randomness (issue 24, 1). ``seed`` drives what a privacy argument does not need secret:
initialisation, splits, the tau cap's per-user hash key (a per-user function is bounded for any fixed
key). The randomness a proof needs -- noise draws, Poisson sampling, per-user sampling keys of a private
release -- comes from :func:`noise_generator`: 63 bits of the OS entropy source (``secrets``, Opacus's
``secure_mode`` convention), never written to the config, metrics, logs or TensorBoard; only the
checkpoint holds its generator state. ``noise_seed=<int>`` makes such a run reproducible, and its
privacy report then says the epsilon holds only while that seed stays secret. The training mechanisms' CPU noise is
the ChaCha20 keystream under a key drawn from that generator (:mod:`dprec_torch.mechanisms.noise`, issue 28);
:func:`randomness_report` says which sampler ran.
"""

from __future__ import annotations

import importlib.util
import os
import random
import secrets
from typing import Any

import numpy as np
import torch

from dprec_torch.errors import ConfigError


def seed_everything(seed: int) -> None:
    """Seed Python, numpy and torch (all devices) from one integer."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """An explicit torch generator, so noise draws never depend on global state."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


#: offsets of the derived noise streams when ``noise_seed`` is explicit (stream 0 = the mechanism's noise)
NOISE_STREAM, SAMPLER_STREAM = 0, 1


def secret_seed() -> int:
    """63 bits from the OS entropy source: a noise seed nobody can read back from the run directory."""
    return secrets.randbits(63)


def noise_seed_or_secret(noise_seed: int | None, stream: int = NOISE_STREAM, private: bool = True) -> int:
    """``noise_seed + stream`` when the seed is explicit (reproducible), else a fresh :func:`secret_seed`;
    a non-private fit (``private=False``: epsilon = inf) has nothing to hide and uses ``0 + stream``."""
    if noise_seed is None:
        return secret_seed() if private else int(stream)
    return int(noise_seed) + int(stream)


def noise_generator(noise_seed: int | None, device: torch.device | str = "cpu", stream: int = NOISE_STREAM,
                    private: bool = True) -> torch.Generator:
    """The generator of randomness a privacy proof needs: secret unless ``noise_seed`` is given (see module doc)."""
    return make_generator(noise_seed_or_secret(noise_seed, stream, private), device)


NOISE_SAMPLER_ENV = "DPREC_NOISE_SAMPLER"
NOISE_SAMPLERS = ("chacha20", "torch")


def noise_sampler() -> str:
    """The CPU noise sampler: ``chacha20`` (default, :mod:`dprec_torch.mechanisms.noise`) or ``torch``
    (``DPREC_NOISE_SAMPLER=torch``: torch's serial mt19937 draws, reproducing numbers published before issue 28)."""
    name = os.environ.get(NOISE_SAMPLER_ENV, "chacha20").strip().lower() or "chacha20"
    if name not in NOISE_SAMPLERS:
        raise ConfigError(f"{NOISE_SAMPLER_ENV}={name!r} is not a noise sampler: set it to one of "
                          f"{', '.join(NOISE_SAMPLERS)} or unset it")
    if name == "chacha20" and importlib.util.find_spec("numba") is None:  # pragma: no cover - numba is a dependency
        return "torch"
    return name


def randomness_report(secret: bool) -> dict[str, Any]:
    """What the privacy report says about the noise's randomness (``privacy.randomness``), with the CPU noise sampler
    of this process (``noise_sampler``: ``chacha20`` or ``torch``, :func:`dprec_torch.mechanisms.noise.sampler`)."""
    name = noise_sampler()
    if name == "chacha20":
        samplers = ("the training mechanisms' Laplace and Gaussian noise on CPU tensors is the ChaCha20 keystream "
                    "(RFC 8439 block function) under a fresh 256-bit key per draw, the key drawn from that generator: "
                    "a stream cipher's output, as unpredictable as the generator's seed (at most 63 bits of entropy); "
                    "their noise on CUDA tensors (Philox) and the other draws (Poisson sampling, item means, one-shot "
                    "releases) come from torch's generators (mt19937 on the CPU, Philox on CUDA: not CSPRNG streams); "
                    "floating-point inverse-CDF and Box-Muller samplers (no snapping)")
    else:
        samplers = ("every draw comes from torch's generators (DPREC_NOISE_SAMPLER=torch: mt19937 on the CPU, Philox on "
                    "CUDA; not CSPRNG streams); floating-point inverse-CDF samplers (no snapping)")
    if secret:
        return {"noise_seed": "secret", "noise_sampler": name,
                "statement": "noise, Poisson sampling and per-user sampling keys come from 63 bits of the OS entropy "
                             "source, recorded nowhere but the (private) checkpoint's generator state; " + samplers}
    return {"noise_seed": "explicit", "noise_sampler": name,
            "statement": "noise_seed was set explicitly (it is in the resolved config): the run is reproducible, and "
                         "its epsilon holds only while that seed stays secret; for anyone who reads the config, "
                         "epsilon is infinite; " + samplers}


def rng_state() -> dict[str, Any]:
    """Capture every global RNG state (for checkpoints)."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the states captured by :func:`rng_state`."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
