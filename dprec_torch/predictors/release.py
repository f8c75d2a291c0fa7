"""A fitted predictor's release: what it learned, written to the run dir and restored without refitting.

A fitted predictor has two set-up paths with one job each (as a trainable model's, :mod:`dprec_torch.models.release`):

* ``fit(train)`` BUILDS from data: it draws the noise, makes the release and learns from it;
* ``restore(train, state)`` RESTORES what ``released_state()`` returned. Every item-side quantity (DP item means, the
  noisy Gram's learned matrix or factors, the item factors U or V, a similarity, the fallback's means) comes from
  ``state``; ``train`` supplies only the user-side part: each user's offset and factors are recomputed from that user's
  own ratings and the released item side (what the user does on their own device in the billboard model of joint DP),
  exactly as ``fit`` computed them. No noise is drawn and no item statistic is read from ``train``.

``released_state()`` holds tensors and numbers only: never the noise seed, a generator's state or the training ratings
(:func:`check_no_secrets` refuses a state that names them). ``train.py`` writes it per fold to ``release_fold<k>.pt``
(:func:`write_release`, atomic) with a copy of the fold's privacy report;
:func:`dprec_torch.training.evaluate.restore_predictor` reads it back for ``load_run`` and ``evaluate.py run=``.

What the file is depends on the claim (``meta["covered_by_epsilon"]``): for a predictor whose own epsilon is finite
(``noisy_gram``, ``dpals``, ``mcsherry``) it is the release that epsilon covers, and publishing it costs nothing more.
For a non-private predictor (epsilon = inf), for PNCF (per-query noise, no end-to-end claim) and for an output mechanism
(``laplace_output``, ``exponential_topk``, whose epsilon covers the noised answers, not the model) it is the curator's
fitted state: keep it as private as the training data.

A trained model (PNBM, its low-rank and top-k forms, MF) writes the same file at the end of its fold
(:func:`write_trained_release`): its ``state_dict`` (the learned parameters and the buffers it predicts with, e.g. U and
the DP item means) with a copy of the fold's privacy report and ``meta`` (model, mechanism, fold, sizes, epochs, the
resolved model config without its public init seed); :func:`dprec_torch.training.evaluate.restore_fold` restores it with
``model.restore``. The checkpoint ``checkpoint_fold<k>.pt`` is the resume state and holds the secret noise key: a
release never reads or copies it.
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
        raise ConfigError(f"missing release {path}: the run was made before releases were written (or did not finish "
                          "this fold); train or fit it again")
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


# ----------------------------------------------------------------------------------- a trained model
#: top-level keys of a trained model's release state a resumable checkpoint has and a release must not (the noise
#: generators, the accountant, the optimizer's moments): :func:`write_trained_release` refuses a state naming them
CHECKPOINT_ONLY_KEYS = frozenset({"optimizer", "sampler_generator", "rng", "accountant", "mean_release", "history"})


def _cpu_copy(obj: Any) -> Any:
    """Detached CPU copies of the tensors in ``obj`` (dicts, lists and plain values kept as they are)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cpu_copy(v) for v in obj)
    return obj


def model_released_state(model: torch.nn.Module) -> dict[str, Any]:
    """What a trained model released: its ``state_dict`` (the learned parameters, the buffers it predicts with -- the
    item means r_bar: the DP release where the mechanism made one; MF's public mu_0; top-k PNBM's support -- and, as
    ``_extra_state``, the fallback as released and MF's public rating scale) as CPU tensors and plain values, for
    ``model.restore(train, state)``. Nothing of the mechanism (optimizer, noise generators, accountant) is in it."""
    state = _cpu_copy(dict(model.state_dict()))
    check_no_secrets(state)
    bad = sorted(CHECKPOINT_ONLY_KEYS & set(state))
    if bad:
        raise RuntimeError(f"release state names {bad}: a release holds the model, never the checkpoint's resume state")
    return state


def user_side_of(model: torch.nn.Module) -> str:
    """The release entry's ``user_side``: where each user's own part of a trained model's predictions comes from."""
    if model.reads_own_ratings:  # PNBM, its low-rank and top-k forms (BaseModel's flag)
        return ("not in the file: each user's own training ratings R_u, which the prediction for u reads (Eq. (2): joint "
                "DP), are re-bound by load_run and evaluate.py run= from the run's training split (capped at tau for a "
                "user-level mechanism, as trained); u's offset (and item-feature weights) follow from them at prediction time")
    users = [n for n, _ in model.named_parameters() if n.startswith("user_")]
    text = (f"in the file: the user parameters ({', '.join(users)}) are trained parameters, noised with the rest by the "
            "mechanism and covered by its epsilon with them where it is finite (the privacy scope's epsilon_covers); "
            "predictions are post-processing of the file alone") if users else "no user-side part: predictions read the file alone"
    if model.fallback == "mean":
        text += ("; EXCEPT the fallback for ids without training ratings (model.fallback=mean): its exact training item "
                 "means and user counts are in the file and NOT covered by epsilon")
    return text


def write_trained_release(path: str | Path, model: torch.nn.Module, report: dict[str, Any],
                          meta: dict[str, Any]) -> dict[str, Any]:
    """Write a trained model's release (:func:`model_released_state`) to ``path`` atomically, as :func:`write_release`
    writes a fitted predictor's, and return the privacy report's ``release`` entry (also copied into ``meta``).

    Covered by epsilon when the mechanism's epsilon is finite and the model's privacy scope lists nothing the file
    holds that epsilon does not cover (non-DP item means, top-k PNBM's data-chosen support, MF's ``fallback=mean``
    means). No generator state, seed, optimizer or accountant state or pre-noise statistic is in the file."""
    import json
    import math

    from dprec_torch.privacy.scope import _model_artefacts

    eps = report.get("epsilon")
    finite = eps is not None and math.isfinite(float(eps))
    covers, not_covered = _model_artefacts(model, report)
    covered = finite and not not_covered
    if covered:
        what = ("the trained model, which epsilon covers whole (" + "; ".join(covers)
                + "): publishing it costs no further privacy")
    elif finite:
        what = ("the trained model; epsilon covers its parameters, NOT " + "; ".join(not_covered)
                + ": keep the file as private as the training data, or retrain without them")
    else:
        what = "the trained model, which no finite epsilon covers: keep it as private as the training data"
    entry = {"file": Path(path).name, "covered_by_epsilon": bool(covered), "what": what, "user_side": user_side_of(model),
             "holds": sorted(model.state_dict().keys()),
             "never_holds": "noise keys or seeds, generator or sampler state, optimizer/accountant state, pre-noise "
                            "statistics (all in the secret checkpoint_fold<k>.pt only)"}
    privacy = json.loads(json.dumps({**report, "release": entry}, default=str))  # plain values (weights_only loading)
    meta = {**meta, "kind": "trained", "privacy": privacy}
    check_no_secrets(meta.get("model_config", {}), "meta.model_config")
    atomic_torch_save(path, {"format": RELEASE_FORMAT, "meta": meta, "state": model_released_state(model)})
    return entry
