"""Two kinds of randomness: the public ``seed``, and the secret keys a privacy proof needs.

``seed`` drives what a privacy argument does not need secret: initialisation, splits, the tau cap's per-user hash
key (a per-user function is bounded for any fixed key). It is recorded, and torch's generators serve it
(:func:`seed_everything`, :func:`make_generator`).

The randomness a proof needs -- noise, Poisson sampling, sampling keys of a private release -- comes from a
:class:`SecretGenerator`, never from torch's global or CPU generators (mt19937 keeps 32 bits of its seed, Philox 64):

* its root key has 256 bits: ``secrets.token_bytes(32)`` (Opacus's ``secure_mode`` convention) unless ``noise_seed``
  is given; an explicit ``noise_seed`` (any integer, every bit counts) is expanded by BLAKE2b to 256 bits;
* each stream's key is a keyed BLAKE2b of the root key and the labels of :func:`key_scope` (the run's job and fold,
  set by the runner) and the stream (mechanism noise, Poisson sampler, ...): two folds, two sweep jobs or two
  streams never share noise, even under one ``noise_seed``;
* draw n of a stream is the ChaCha20 keystream (:mod:`dprec_torch.chacha`) under BLAKE2b(stream key, n), on every
  device.

The keys are written nowhere but the private checkpoint (:meth:`SecretGenerator.get_state`).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import random
import secrets
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from dprec_torch import chacha, key_feed


def seed_everything(seed: int) -> None:
    """Seed Python, numpy and torch (all devices) from one integer: the PUBLIC randomness (init, splits)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """An explicit torch generator for PUBLIC draws (initialisation, synthetic data), never for noise."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


#: stream labels of one run's secret keys (stream 0 = the mechanism's noise)
NOISE_STREAM, SAMPLER_STREAM = 0, 1
KEY_BYTES = 32  # 256-bit keys
_STATE_BYTES = KEY_BYTES + 8  # a generator's state: its key and its 64-bit draw counter
_SCOPE: contextvars.ContextVar[tuple[Any, ...]] = contextvars.ContextVar("dprec_key_scope", default=())


def _blake(data: bytes, key: bytes = b"", person: bytes = b"") -> bytes:
    return hashlib.blake2b(data, digest_size=KEY_BYTES, key=key, person=person).digest()


def root_key(noise_seed: int | None, private: bool = True) -> bytes:
    """The run's 256-bit root key: fresh OS entropy (``noise_seed=None``, private), else BLAKE2b of the explicit
    integer's decimal digits (every bit of it counts; reproducible, and flagged in the report). A non-private draw
    with no seed (nothing to hide) uses the fixed key of seed 0."""
    if noise_seed is None:
        if private:
            return secrets.token_bytes(KEY_BYTES)
        noise_seed = 0
    return _blake(str(int(noise_seed)).encode(), person=b"dprec-noiseseed")


def derive_key(key: bytes, *labels: Any) -> bytes:
    """BLAKE2b keyed by ``key`` of the labels (a PRF, so derived keys are independent and reveal nothing of ``key``)."""
    return _blake(json.dumps([str(x) for x in labels]).encode(), key=key, person=b"dprec-derive")


@contextlib.contextmanager
def key_scope(**labels: Any) -> Iterator[None]:
    """Within this block every :func:`noise_generator` mixes ``labels`` (e.g. ``job=<config digest>, fold=3``) into
    its key: under one explicit ``noise_seed`` two folds or two jobs draw independent noise."""
    token = _SCOPE.set(_SCOPE.get() + tuple(sorted(labels.items())))
    try:
        yield
    finally:
        _SCOPE.reset(token)


class SecretGenerator:
    """A CSPRNG stream: ChaCha20 under a 256-bit key, one derived key per draw (draw n: BLAKE2b(key, n)).

    Mirrors the few torch generator calls the package makes (``rand``, ``randn``, ``exponential``, in-place Laplace
    and Gaussian noise; ``get_state``/``set_state`` for checkpoints; ``device``). Element i of a draw is a function of
    (key, n, i) alone, so draws are bit-identical across thread counts, and the keystream across devices.
    """

    def __init__(self, key: bytes, device: torch.device | str = "cpu", counter: int = 0) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"a SecretGenerator key has {KEY_BYTES} bytes, got {len(key)}")
        self._key, self.counter, self.device = bytes(key), int(counter), torch.device(device)

    def __repr__(self) -> str:  # never the key
        return f"SecretGenerator(device={self.device}, draws={self.counter})"

    def next_key(self) -> np.ndarray:
        """The ChaCha key of the next draw (8 uint32 words); advances the counter."""
        sub = _blake(self.counter.to_bytes(8, "little"), key=self._key, person=b"dprec-draw")
        self.counter += 1
        key = chacha.as_key(sub)
        feed = key_feed.observing()
        if feed is not None:  # a step being captured in a CUDA graph: each replay feeds this draw a fresh key
            feed.drew(self, key)
        return key

    def spawn(self, *labels: Any) -> "SecretGenerator":
        """An independent child stream (key derived from this one's and ``labels``)."""
        return SecretGenerator(derive_key(self._key, *labels), self.device)

    # ------------------------------------------------------------------ draws
    def rand(self, *size: Any, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> torch.Tensor:
        """Uniforms in [0, 1) (like ``torch.rand``)."""
        shape, n = _shape(size)
        return chacha.uniform(self.next_key(), n, device or self.device, dtype).view(shape)

    def randn(self, *size: Any, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> torch.Tensor:
        """Standard normals (like ``torch.randn``; Box-Muller on ChaCha20 words)."""
        return self.add_gaussian_(torch.zeros(_shape(size)[0], dtype=dtype, device=device or self.device), 1.0)

    def exponential(self, *size: Any, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None) -> torch.Tensor:
        """Exp(1) draws: -log v, v uniform in (0, 1]."""
        shape, n = _shape(size)
        v = chacha.uniform(self.next_key(), n, device or self.device, torch.float64, open_interval=True)
        return (-torch.log(v)).to(dtype).view(shape)

    def add_laplace_(self, target: torch.Tensor, scale: float) -> torch.Tensor:
        """target += Lap(0, b = ``scale``) entrywise, in place, in float64 rounded once to target's dtype."""
        return chacha.add_laplace_(target, scale, self.next_key())

    def add_gaussian_(self, target: torch.Tensor, std: float) -> torch.Tensor:
        """target += N(0, ``std``^2) entrywise, in place, in float64 rounded once to target's dtype."""
        return chacha.add_gaussian_(target, std, self.next_key())

    def randbits(self, k: int) -> int:
        """A ``k``-bit integer (e.g. a per-user sampling key of a private release)."""
        words = chacha.keystream_words(self.next_key(), -(-int(k) // 64))
        return int.from_bytes(words.tobytes(), "little") & ((1 << int(k)) - 1)

    # ------------------------------------------------------------------ state
    def get_state(self) -> torch.Tensor:
        """Key and counter as a uint8 tensor: SECRET (only the private checkpoint holds it)."""
        return torch.frombuffer(bytearray(self._key + self.counter.to_bytes(8, "little")), dtype=torch.uint8).clone()

    def set_state(self, state: torch.Tensor) -> None:
        raw = bytes(state.cpu().to(torch.uint8).tolist())
        if len(raw) != _STATE_BYTES:
            raise ValueError(f"a SecretGenerator state has {_STATE_BYTES} bytes, got {len(raw)} (a checkpoint written "
                             "before 256-bit keys: start the run afresh)")
        self._key, self.counter = raw[:KEY_BYTES], int.from_bytes(raw[KEY_BYTES:], "little")


def _shape(size: tuple[Any, ...]) -> tuple[tuple[int, ...], int]:
    """torch's size arguments (ints, or one sequence of ints) as (shape, number of elements)."""
    if len(size) == 1 and not isinstance(size[0], (int, np.integer)):
        size = tuple(size[0])
    shape = tuple(int(s) for s in size)
    return shape, int(np.prod(shape)) if shape else 1


def secret(generator: Any) -> SecretGenerator:
    """``generator`` itself, checked: private draws never come from a torch generator (its seed has 32 or 64 bits)."""
    if not isinstance(generator, SecretGenerator):
        raise TypeError(f"private randomness needs a SecretGenerator (seeding.noise_generator), got {type(generator).__name__}")
    return generator


def noise_generator(noise_seed: int | None, device: torch.device | str = "cpu", stream: int | str = NOISE_STREAM,
                    private: bool = True) -> SecretGenerator:
    """The generator of randomness a privacy proof needs: root key (:func:`root_key`: secret unless ``noise_seed`` is
    given) derived with the current :func:`key_scope` and ``stream``."""
    return SecretGenerator(derive_key(root_key(noise_seed, private), *_SCOPE.get(), ("stream", stream)), device)


def randomness_report(secret: bool) -> dict[str, Any]:
    """What the privacy report says about the noise's randomness (``privacy.randomness``)."""
    how = ("every private draw (noise, Poisson sampling, sampling keys) is the ChaCha20 keystream (RFC 8439) under its "
           "own 256-bit key, a keyed BLAKE2b of the run's root key, its job, fold, stream and draw counter, on every "
           "device; floating-point inverse-CDF and Box-Muller samplers (no snapping)")
    why = ("the root key is 256 bits of the OS entropy source, recorded nowhere but the (private) checkpoint, which a "
           "successful run deletes; " if secret else
           "noise_seed was set explicitly (it is in the resolved config): the run is reproducible, and for anyone who reads "
           "the config its epsilon is infinite; it holds only while that seed stays secret (then every fold and job still "
           "draws its own key); ")
    return {"noise_seed": "secret" if secret else "explicit", "key_bits": 8 * KEY_BYTES, "statement": why + how}


def rng_state() -> dict[str, Any]:
    """Capture every global RNG state (for checkpoints)."""
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
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
