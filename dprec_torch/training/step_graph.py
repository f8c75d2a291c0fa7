"""A Trainer step captured once in a CUDA graph and replayed: a step's ~30 kernel launches from Python become one.

On a GPU the low-rank PNBM's masked step (:attr:`~dprec_torch.models.batching.UserBatch.row_mask`) has fixed shapes
and no host wait, so its kernels can be recorded once (``torch.cuda.graph``) and replayed each step. Its device work
is then a few hundred microseconds of GPU time, no longer a millisecond of launches.

What a replay must still do on the host, and how it is kept exact:

* **fresh secret keys**: each secret draw of the captured step is fed a new key before every replay, drawn from the
  same generator in the same order (:mod:`dprec_torch.key_feed`); a step whose draws cannot all be fed is not
  captured;
* **the mechanism's bookkeeping**: :meth:`~dprec_torch.mechanisms.base.MechanismOptimizer.host_step` (the step count
  and the accountant's record), the only Python a replayed step runs. Only a mechanism that declares the host numbers
  its kernels are launched with (:meth:`~dprec_torch.mechanisms.base.MechanismOptimizer.graph_constants`) is
  replayed, and only while they are unchanged; otherwise the step is captured again;
* **what reads the step's tensors later**: the parameters' version counters are bumped (caches keyed by them see the
  new values), the lazily read clip statistics are reset, and the loss and target count returned are copies.

The captured step is itself the first graphed step: its Python ran once (its draws and bookkeeping are that step's),
then its graph is replayed once to run its kernels. If capturing raises, the state the capture touched is restored
(the mechanism's state dict, the sampler's generator), the step runs eagerly, and the rest of the run too (logged
once). ``DPREC_STEP_GRAPH=0`` turns graphs off.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable

import torch

from dprec_torch.key_feed import KeyFeed
from dprec_torch.mechanisms.base import LazyStatistic

log = logging.getLogger(__name__)

#: eager steps before the first capture (first launches compile the Triton kernels, build the masked batch's caches)
WARMUP_STEPS = 2


def graphed_steps(optimizer: Any, sampler: Any, device: torch.device) -> bool:
    """Whether a Trainer replays its steps from a CUDA graph: a CUDA device, a masked user-level sampler below q = 1
    (fixed shapes, no host wait), a mechanism that declares its step's host numbers, and ``DPREC_STEP_GRAPH`` not 0."""
    return (device.type == "cuda" and os.environ.get("DPREC_STEP_GRAPH", "1") != "0"
            and sampler.masked and sampler.ratio < 1 and optimizer.graph_constants() is not None)


class StepGraph:
    """``step()`` (the Trainer's eager step, returning (loss, target count) on the device) replayed from a CUDA graph;
    see the module doc."""

    def __init__(self, step: Callable[[], tuple[torch.Tensor, Any]], optimizer: Any, sampler: Any,
                 params: list[torch.Tensor], device: torch.device) -> None:
        self.step, self.optimizer, self.sampler, self.params, self.device = step, optimizer, sampler, params, device
        self.feed = KeyFeed(device)
        self.graph: Any = None
        self.constants: tuple | None = None
        self.outputs: tuple[torch.Tensor, Any] | None = None
        self.lazy: list[LazyStatistic] = []
        self.warm = 0
        self.failed: str | None = None
        self.replays = 0

    def __call__(self) -> tuple[torch.Tensor, Any]:
        if self.failed is not None or self.warm < WARMUP_STEPS:
            self.warm += 1
            return self.step()
        constants = self.optimizer.graph_constants()
        if self.graph is None or constants != self.constants:
            return self._capture(constants)
        self.feed.upload(self.feed.next_keys())  # queued before the replay that reads them
        self.graph.replay()
        self.optimizer.host_step()
        return self._finished()

    def _finished(self) -> tuple[torch.Tensor, Any]:
        self.replays += 1
        for p in self.params:  # the graph changed them in place without Python: caches keyed by _version must see it
            torch.autograd.graph.increment_version(p)
        for stat in self.lazy:
            stat.reset()
        sq, count = self.outputs
        return sq.clone(), count.clone() if isinstance(count, torch.Tensor) else count

    def _capture(self, constants: tuple | None) -> tuple[torch.Tensor, Any]:
        saved = (self.optimizer.state_dict(), self.sampler.generator.get_state())
        graph = torch.cuda.CUDAGraph()
        try:
            torch.cuda.synchronize(self.device)
            with self.feed, torch.cuda.graph(graph, capture_error_mode="thread_local"):
                outputs = self.step()
            self.feed.check()
        except Exception as err:  # noqa: BLE001 - any capture failure: this step and the rest run eagerly
            self.failed = f"{type(err).__name__}: {err}"
            log.warning("capturing the training step in a CUDA graph failed (%s); steps run eagerly "
                        "(DPREC_STEP_GRAPH=0 chooses that from the start)", self.failed)
            self.graph = None  # (a recapture's failure drops the graph of the old numbers too)
            self.optimizer.load_state_dict(saved[0])  # what the capture's Python did: its draws, count, accountant
            self.sampler.generator.set_state(saved[1])
            return self.step()
        self.graph, self.constants, self.outputs = graph, constants, outputs
        self.lazy = [v for v in self.optimizer.state["mechanism"].values() if isinstance(v, LazyStatistic)]
        self.feed.upload(self.feed.captured_keys())  # this step's own draws, made while it was captured
        graph.replay()
        return self._finished()
