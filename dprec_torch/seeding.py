"""One seed drives torch, numpy and Python's RNG; RNG states round-trip through checkpoints.

Two kinds of randomness (issue 24, 1). ``seed`` drives what a privacy argument does not need secret:
initialisation, splits, the tau cap's per-user hash key (a per-user function is bounded for any fixed
key). The randomness a proof needs -- noise draws, Poisson sampling, per-user sampling keys of a private
release -- comes from :func:`noise_generator`: 63 bits of the OS entropy source (``secrets``, Opacus's
``secure_mode`` convention), never written to the config, metrics, logs or TensorBoard; only the
checkpoint holds its generator state. ``noise_seed=<int>`` makes such a run reproducible, and its
privacy report then says the epsilon holds only while that seed stays secret.
"""

from __future__ import annotations

import random
import secrets
from typing import Any

import numpy as np
import torch


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


def randomness_report(secret: bool) -> dict[str, Any]:
    """What the privacy report says about the noise's randomness (``privacy.randomness``)."""
    if secret:
        return {"noise_seed": "secret",
                "statement": "noise, Poisson sampling and per-user sampling keys come from 63 bits of the OS entropy "
                             "source, recorded nowhere but the (private) checkpoint's generator state; floating-point "
                             "inverse-CDF samplers from torch's generators (no snapping, not a CSPRNG stream)"}
    return {"noise_seed": "explicit",
            "statement": "noise_seed was set explicitly (it is in the resolved config): the run is reproducible, and "
                         "its epsilon holds only while that seed stays secret; for anyone who reads the config, "
                         "epsilon is infinite"}


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
