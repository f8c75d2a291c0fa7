"""The secret keys of a step captured in a CUDA graph (:mod:`dprec_torch.training.step_graph`), fed before each replay.

A captured step records its kernels, not the Python that chose their arguments: replayed as it is, it would draw the
same Poisson sample and the same noise every step. So while a step is captured, each secret draw
(:meth:`~dprec_torch.seeding.SecretGenerator.next_key`) is observed here, and the buffer its kernel reads its key from
(``chacha_triton._buffer``) becomes a fixed slot of :attr:`KeyFeed.static`. Before every replay, :meth:`KeyFeed.next_keys`
draws the next key of each observed draw from the same generator, in the same order (the generators advance exactly as
an eager step advances them), and :meth:`KeyFeed.upload` writes them into the slots (one copy from pinned memory, ordered
on the stream before the replay that reads it). A draw without a slot, a slot without a draw, or a key met twice
refuses the capture (:class:`GraphUnsupported`): every replayed draw is then a fresh key, and no key is reused.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np
import torch

#: the feed observing this thread's draws while a step is captured, else None
_observing: "KeyFeed | None" = None
_thread: int | None = None


class GraphUnsupported(RuntimeError):
    """A step that cannot be captured and replayed with fresh keys (the Trainer then runs it eagerly)."""


def observing() -> "KeyFeed | None":
    """The feed capturing the calling thread's step, or None (the common case: one global read)."""
    return _observing if _observing is not None and threading.get_ident() == _thread else None


class KeyFeed:
    """Slots of secret-key words on ``device``, one per draw of a captured step (see the module doc)."""

    def __init__(self, device: torch.device, words: int = 4096) -> None:
        self.static = torch.zeros(int(words), dtype=torch.int32, device=device)
        self.draws: list[tuple[Any, np.ndarray]] = []  # (generator, the key it drew at capture), in draw order
        self.slots: list[tuple[int, int, int, Callable[[np.ndarray], np.ndarray]]] = []  # (draw, offset, words, build)

    def __enter__(self) -> "KeyFeed":
        global _observing, _thread
        if _observing is not None:
            raise GraphUnsupported("a step is already being captured")
        self.draws, self.slots = [], []
        _observing, _thread = self, threading.get_ident()
        return self

    def __exit__(self, *exc: Any) -> None:
        global _observing, _thread
        _observing, _thread = None, None

    def drew(self, generator: Any, key: np.ndarray) -> None:
        """Record a draw of the captured step (called by ``SecretGenerator.next_key``)."""
        self.draws.append((generator, np.asarray(key, np.uint32).copy()))

    def slot(self, key: np.ndarray, build: Callable[[np.ndarray], np.ndarray]) -> torch.Tensor:
        """The fixed device words a captured kernel reads for the draw keyed ``key``; ``build(key)``: those words as int32
        on the host (the same function rebuilds them from each replay's key)."""
        key = np.asarray(key, np.uint32)
        found = [i for i, (_, k) in enumerate(self.draws) if np.array_equal(k, key)]
        if len(found) != 1 or any(s[0] == found[0] for s in self.slots):
            raise GraphUnsupported("a key buffer of the captured step is not one draw of it (no fresh key to feed)")
        words = np.asarray(build(key), np.int32)
        offset = self.slots[-1][1] + self.slots[-1][2] if self.slots else 0
        if offset + words.size > self.static.numel():
            raise GraphUnsupported("the captured step's keys do not fit the feed")
        self.slots.append((found[0], offset, int(words.size), build))
        return self.static[offset:offset + words.size].view(torch.uint32)

    def check(self) -> None:
        """Every draw of the captured step feeds exactly one slot (its kernel reads each replay's fresh key)."""
        fed = sorted(s[0] for s in self.slots)
        if fed != list(range(len(self.draws))):
            raise GraphUnsupported(f"{len(self.draws)} secret draws but {len(self.slots)} key buffers in the captured "
                                   "step: a draw would be replayed with a stale key")

    def captured_keys(self) -> list[np.ndarray]:
        return [key for _, key in self.draws]

    def next_keys(self) -> list[np.ndarray]:
        """The next key of each draw, from its generator in the captured order (advancing it as an eager step does)."""
        return [generator.next_key() for generator, _ in self.draws]

    def upload(self, keys: list[np.ndarray]) -> None:
        """Write ``keys`` (one per draw) into their slots: one copy from pinned memory, queued before the replay."""
        if not self.slots:
            return
        words = np.concatenate([build(keys[draw]) for draw, _, _, build in self.slots]).astype(np.int32, copy=False)
        host = torch.from_numpy(words)
        if self.static.device.type == "cuda":
            host = host.pin_memory()  # (the caching host allocator keeps it until the copy has run)
        self.static[:words.size].copy_(host, non_blocking=True)
