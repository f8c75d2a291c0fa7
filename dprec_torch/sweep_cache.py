"""What the jobs of one process may share: the loaded dataset, its folds on a device, the PCC/COS baselines.

``hydra/launcher=batched`` (``hydra_plugins/dprec_batched_launcher``) runs the jobs of a sweep that read the same data
in one process, inside :func:`sharing`. There, :func:`shared` builds an object once per key and hands the same object to
every later job of the group; elsewhere it just calls ``build()``.

Only objects that are a pure function of their key are shared: the dataset and its folds (a function of the resolved
``cfg.data``, whose ``seed`` is part of the key), a fold moved to a device, and the non-private baselines of a fold.
Nothing private or trained is shared -- each job still builds its own model, mechanism, noise generators, item means
and checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class SweepCache:
    """Objects keyed by ``(what, data key, extra)``; ``built``/``reused`` count both outcomes per ``what``."""

    objects: dict[tuple, Any] = field(default_factory=dict)
    built: Counter = field(default_factory=Counter)
    reused: Counter = field(default_factory=Counter)

    def stats(self) -> dict[str, dict[str, int]]:
        return {"built": dict(self.built), "reused": dict(self.reused)}


_ACTIVE: SweepCache | None = None


def data_key(node: DictConfig | dict) -> str:
    """A canonical string for a resolved data config (plus ``$DPREC_DATA``, which changes what it reads)."""
    data = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
    return json.dumps({"cfg": data, "DPREC_DATA": os.environ.get("DPREC_DATA")}, sort_keys=True, default=str)


@contextlib.contextmanager
def sharing() -> Iterator[SweepCache]:
    """Share objects between the jobs run inside this block (not re-entrant: one group at a time)."""
    global _ACTIVE
    if _ACTIVE is not None:
        raise RuntimeError("sweep_cache.sharing() is already active")
    _ACTIVE = SweepCache()
    try:
        yield _ACTIVE
    finally:
        _ACTIVE = None


def active() -> SweepCache | None:
    return _ACTIVE


def shared(what: str, data: DictConfig, build: Callable[[], T], *extra: Any) -> T:
    """``build()``, or the object an earlier job of this :func:`sharing` block built for the same key. ``data`` is the
    job's ``cfg.data`` (the key's main part); ``extra`` (fold index, device, k, ...) must name everything else the
    object depends on."""
    cache = _ACTIVE
    if cache is None:
        return build()
    key = (what, data_key(data), *map(str, extra))
    if key in cache.objects:
        cache.reused[what] += 1
        return cache.objects[key]
    obj = cache.objects[key] = build()
    cache.built[what] += 1
    return obj
