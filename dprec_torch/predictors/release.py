"""A fitted predictor's release: what it learned, written to the run dir and restored without refitting (issue 25, 2).

A fitted predictor has two set-up paths with one job each (as a trainable model's ``attach``/``restore``,
:mod:`dprec_torch.models.release`):

* ``fit(train)`` BUILDS from data: it draws the noise, makes the release and learns from it;
* ``restore(train, state)`` RESTORES what ``released_state()`` returned. Every item-side quantity (DP item means,
  the noisy Gram's learned matrix or factors, the item factors U or V, a similarity, the fallback's means) comes
  from ``state``; ``train`` supplies only the user-side part: each user's offset and factors are recomputed from
  that user's own ratings and the released item side (what the user does on their own device in the billboard
  model of joint DP), exactly as ``fit`` computed them. No noise is drawn and no item statistic is read from ``train``.

``released_state()`` holds tensors and numbers only: never the noise seed, a generator's state or the training
ratings (:func:`check_no_secrets` refuses a state that names them). ``train.py`` writes it per fold to
``release_fold<k>.pt`` (:func:`write_release`, atomic) with a copy of the fold's privacy report;
:func:`dprec_torch.training.evaluate.restore_predictor` reads it back for ``load_run`` and ``evaluate.py run=``.

What the file is depends on the claim (``meta["covered_by_epsilon"]``): for a predictor whose own epsilon is finite
(``noisy_gram``, ``dpals``, ``mcsherry``) it is the release that epsilon covers, and publishing it
costs nothing more. For a non-private predictor (epsilon = inf), for PNCF (per-query noise, no end-to-end claim)
and for an output mechanism (``laplace_output``, ``exponential_topk``, whose epsilon covers the noised answers, not
the model) it is the curator's fitted state: keep it as private as the training data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from dprec_torch.data.ratings import Ratings
from dprec_torch.errors import ConfigError
from dprec_torch.interfaces import MeanFallback
from dprec_torch.io import atomic_torch_save

#: version of the file layout written by :func:`write_release`
RELEASE_FORMAT = 1
#: key names a release must never carry (the noise seed, a generator or RNG state)
SECRET_KEYS = frozenset({"seed", "noise_seed", "generator", "generator_state", "rng", "rng_state", "sampler_generator"})


@runtime_checkable
class ReleasesState(Protocol):
    """A fitted predictor that can be written as its release and restored from it (module docstring):
    ``released_state()`` -> tensors and numbers; ``restore(train, state)`` -> the predictor, ready to predict."""

    def released_state(self) -> dict[str, Any]: ...

    def restore(self, train: Ratings, state: dict[str, Any]) -> Any: ...


def release_path(run_dir: str | Path, fold_index: int) -> Path:
    """``<run_dir>/release_fold<k>.pt``."""
    return Path(run_dir) / f"release_fold{int(fold_index)}.pt"


def check_no_secrets(obj: Any, where: str = "state") -> None:
    """Raise if ``obj`` names a seed, a generator or an RNG state anywhere (a bug: the release must not hold them)."""
    if isinstance(obj, torch.Generator):
        raise RuntimeError(f"release {where} holds a torch.Generator: the noise's randomness must stay secret")
    if isinstance(obj, dict):
        for key, value in obj.items():
            if str(key).lower() in SECRET_KEYS:
                raise RuntimeError(f"release {where}.{key}: a release must not carry the noise seed or RNG state")
            check_no_secrets(value, f"{where}.{key}")
    elif isinstance(obj, (list, tuple)):
        for k, value in enumerate(obj):
            check_no_secrets(value, f"{where}[{k}]")


def write_release(path: str | Path, predictor: ReleasesState, meta: dict[str, Any]) -> None:
    """Atomically ``torch.save`` ``{"format", "meta", "state"}`` (``state`` = ``predictor.released_state()``)."""
    state = predictor.released_state()
    check_no_secrets(state)
    atomic_torch_save(path, {"format": RELEASE_FORMAT, "meta": meta, "state": state})


def read_release(path: str | Path, device: torch.device | str | None = None) -> dict[str, Any]:
    """The file :func:`write_release` wrote (tensors and plain values only: ``weights_only`` loading)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"missing release {path}: the run was fitted before releases were written; fit it again")
    try:
        release = torch.load(path, map_location=device, weights_only=True)
    except Exception as err:  # noqa: BLE001 - a damaged file is one readable line
        raise ConfigError(f"{path} is not a readable release ({str(err).splitlines()[0][:160]}); fit the run again") from None
    if not isinstance(release, dict) or release.get("format") != RELEASE_FORMAT:
        raise ConfigError(f"{path} is not a release of this version (format {release.get('format') if isinstance(release, dict) else '?'}, "
                          f"expected {RELEASE_FORMAT}); fit the run again")
    return release


def check_release_items(state: dict[str, Any], train: Ratings, who: str) -> None:
    """One readable line when a release was written for another item universe than ``train``'s."""
    if int(state["n_items"]) != train.n_items:
        raise ConfigError(f"{who}: the release covers {int(state['n_items'])} items but the dataset now has {train.n_items}; "
                          "load it with the data it was fitted on")


# ----------------------------------------------------------------------------------- the fallback
def fallback_release(fb: MeanFallback) -> dict[str, Any]:
    """The item side of a fallback (its item means and counts, global mean); the user counts are user-side."""
    return {"global_mean": float(fb.global_mean), "item_means": fb.item_means_, "item_counts": fb.item_counts_}


def restored_fallback(train: Ratings, state: dict[str, Any]) -> MeanFallback:
    """The fallback as released (:func:`fallback_release`): item means and counts from ``state``, never from
    ``train``; only the users' own counts (who is a known user) come from ``train``."""
    fb = MeanFallback.__new__(MeanFallback)  # restored, not fitted
    fb.scale = train.scale
    fb.global_mean = float(state["global_mean"])
    fb.item_means_ = torch.as_tensor(state["item_means"], device=train.device)
    fb.item_counts_ = torch.as_tensor(state["item_counts"], device=train.device)
    fb.user_counts_ = train.user_counts()
    return fb
