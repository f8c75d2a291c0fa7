"""Atomic checkpoints (after the epochs ``checkpoint_every`` picks, and the last one always: ``Trainer.checkpoint_due``):
model, optimizer (with its noise RNG and accountant), all RNG states, epoch, and the resolved config they were trained under.

Resume trusts nothing it is given:

* the run dir's ``config_resolved.json`` (written before training) and each checkpoint's own copy of the config are
  compared with the new config; any difference outside :data:`RESUME_SAFE_KEYS` refuses to resume, naming the keys (a
  model trained at epsilon=20 must not be reported at 5);
* a truncated or corrupt checkpoint, or one that lacks the mechanism's accountant state or the record of its DP
  item-mean release (a resume restores what ``MechanismOptimizer.prepare`` made, never makes it again), gives one line
  naming the file and the fix, and nothing is written over it.

The checkpoint is SECRET: besides the model it holds the noise and Poisson-sampler generators' states (the run's secret
key material: whoever has them can replay the noise and undo it), the global RNG states, the mechanism's accountant and
its record of the DP item-mean release. It is resume state, never a release (that is ``release_fold<k>.pt``,
:mod:`dprec_torch.predictors.release`). After a successful run whose noise was secret (:func:`holds_secret`), every
fold's checkpoint is deleted once ``metrics.json`` and every release are on disk (:func:`discard_secret_checkpoints`),
unless ``resume=true`` or ``keep_checkpoint=true``. Never publish a kept checkpoint.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import threading
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from dprec_torch.errors import ConfigError
from dprec_torch.io import _json_default, _sanitize, atomic_torch_save, atomic_write_json
from dprec_torch.mechanisms.base import MechanismOptimizer
from dprec_torch.seeding import rng_state, set_rng_state

log = logging.getLogger(__name__)

#: top-level keys that may change between a run and its resume: where/how it runs and what it logs,
#: never what is trained, on which data, or under which privacy parameters
RESUME_SAFE_KEYS = ("resume", "checkpoint_every", "device", "tensorboard", "output_dir", "hydra", "log_private_diagnostics",
                    "compare_baselines", "baseline_k", "keep_checkpoint")
CHECKPOINT_KEYS = ("model", "optimizer", "sampler_generator", "rng", "epoch", "history")
FIX = "delete it to restart from scratch, or point hydra.run.dir (output_dir) elsewhere"


def normalised_config(config: Any) -> Any:
    """The config as ``config_resolved.json`` stores it (inf as "inf", tuples as lists), for comparison."""
    return json.loads(json.dumps(_sanitize(config), default=_json_default))


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out or {prefix[:-1]: {}}
    return {prefix[:-1]: obj}


def config_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Dotted keys whose values differ between two resolved configs, resume-safe keys left out."""
    a, b = _flatten(normalised_config(old)), _flatten(normalised_config(new))
    keys = sorted(k for k in set(a) | set(b) if a.get(k, "<absent>") != b.get(k, "<absent>"))
    return [k for k in keys if k.split(".")[0] not in RESUME_SAFE_KEYS]


def check_resume_config(old: dict[str, Any], new: dict[str, Any], source: Path) -> None:
    """Refuse to resume when anything but a resume-safe key changed since ``source`` was written."""
    if diff := config_differences(old, new):
        a, b = _flatten(normalised_config(old)), _flatten(normalised_config(new))
        shown = ", ".join(f"{k} ({a.get(k, '<absent>')} -> {b.get(k, '<absent>')})" for k in diff[:8])
        more = f" and {len(diff) - 8} more" if len(diff) > 8 else ""
        raise ConfigError(f"resume=true refused: the config differs from the one in {source}: {shown}{more}; "
                          f"resume with the original values, or start a new run (resume=false) in another hydra.run.dir")


def prepare_run_dir(out: Path, config: dict[str, Any]) -> None:
    """Check a resume against the run dir's recorded config, THEN (re)write ``config_resolved.json``."""
    path = out / "config_resolved.json"
    if config.get("resume") and path.exists():
        try:
            old = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise ConfigError(f"{path} is unreadable ({_first_line(err)}); {FIX}") from None
        check_resume_config(old, config, path)
    elif not config.get("resume") and (stale := sorted(p.name for p in out.glob("checkpoint_fold*.pt"))):
        log.warning("resume=false: %s in %s (an earlier run) will be overwritten", ", ".join(stale), out)
    atomic_write_json(path, config)


def holds_secret(report: dict[str, Any]) -> bool:
    """Whether a fold's checkpoint holds secret randomness: its mechanism drew noise, i.e. its report's epsilon is
    finite or not established (None); a non-private run (epsilon = inf) drew none and keeps a public seed."""
    eps = report.get("epsilon")
    try:
        return eps is None or math.isfinite(float(eps))
    except (TypeError, ValueError):
        return True


def discard_secret_checkpoints(out: Path, folds: list[dict[str, Any]], *, resume: bool, keep: bool) -> list[Path]:
    """Delete ``out/checkpoint_fold<k>.pt`` of every fold record (``train_fold``'s) whose noise was secret, unless
    ``resume`` or ``keep``; only once ``metrics.json`` and every release are on disk (a run killed before keeps its
    checkpoints and can be resumed). Returns the files deleted."""
    if resume or keep:
        return []
    gone = []
    for record in folds:
        path = out / f"checkpoint_fold{int(record['fold'])}.pt"
        if holds_secret(record.get("privacy", {})) and path.is_file():
            if not (out / f"release_fold{int(record['fold'])}.pt").is_file():  # a bug: never lose the only copy
                raise RuntimeError(f"{path}: no release_fold{record['fold']}.pt beside it; the checkpoint is kept")
            path.unlink()
            gone.append(path)
    if gone:
        log.info("deleted %s: it held the run's secret noise key (keep_checkpoint=true or resume=true keeps it); the "
                 "released models are release_fold<k>.pt", ", ".join(p.name for p in gone))
    return gone


def check_nothing_released(out: Path, fold_index: int) -> None:
    """``resume=true`` for a fold without a checkpoint: refuse when that fold already finished and was released
    (``release_fold<k>.pt`` and ``metrics.json`` are there; its secret checkpoint was deleted): training it again would
    make a second release of the same people with fresh noise. Nothing to resume: load it with ``load_run``."""
    release = out / f"release_fold{int(fold_index)}.pt"
    if release.is_file() and (out / "metrics.json").is_file():
        raise ConfigError(f"resume=true: fold {fold_index} of {out} already finished and was released ({release.name}); its "
                          "secret checkpoint was deleted, so there is nothing to resume. Load it with dprec_torch.load_run "
                          "or evaluate.py run=, or train again with resume=false or in another hydra.run.dir (a new release)")


def save_checkpoint(path: Path, **parts: Any) -> None:
    """Write everything needed to resume after ``epoch`` (temp file + rename); ``parts``: :func:`checkpoint_state`'s."""
    atomic_torch_save(path, checkpoint_state(**parts))


def checkpoint_state(*, model: torch.nn.Module, optimizer: torch.optim.Optimizer, sampler_generator: torch.Generator,
                     epoch: int, history: list[dict], extra: dict[str, Any] | None = None,
                     config: dict[str, Any] | None = None) -> dict[str, Any]:
    """What :func:`save_checkpoint` writes (the keys :data:`CHECKPOINT_KEYS` and more)."""
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "sampler_generator": sampler_generator.get_state(),
            "rng": rng_state(), "epoch": epoch, "history": history, "extra": extra or {},
            "config": None if config is None else normalised_config(config)}


def _on_cpu(obj: Any) -> Any:
    """A copy of ``obj`` whose tensors are fresh CPU tensors (training may change the originals right after)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return type(obj)((k, _on_cpu(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_on_cpu(v) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):  # a mechanism's release record (``mean_release``)
        return dataclasses.replace(obj, **{f.name: _on_cpu(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init})
    return copy.deepcopy(obj)


class CheckpointWriter:
    """:func:`save_checkpoint` off the training thread (an M x M checkpoint took ~1 s a save on the H200 machine).

    ``save`` copies the state to the CPU at once (the epoch's state, whatever training does next), then one background
    thread writes it atomically, one save at a time and in order: a later save first waits for the earlier one. A run
    killed mid-write keeps the previous complete checkpoint. ``wait`` returns when the last save is on disk and
    re-raises its error.
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def save(self, path: Path, **parts: Any) -> None:
        """As :func:`save_checkpoint` (same arguments), returning once the state is copied."""
        self.wait()
        snapshot = _on_cpu(checkpoint_state(**parts))
        self._thread = threading.Thread(target=self._write, args=(path, snapshot), name="checkpoint-writer")
        self._thread.start()

    def _write(self, path: Path, state: dict[str, Any]) -> None:
        try:
            atomic_torch_save(path, state)
        except BaseException as err:  # noqa: BLE001 - handed to the training thread by wait()
            self._error = err

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise err


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    line = text[0] if text else type(err).__name__
    return line if len(line) <= 160 else line[:157] + "..."


def read_checkpoint(path: Path, map_location: Any = "cpu") -> dict[str, Any]:
    """``torch.load`` a checkpoint; a truncated/corrupt/foreign file gives one line naming it and the fix."""
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as err:  # noqa: BLE001 - torch raises RuntimeError, EOFError, UnpicklingError, ...
        raise ConfigError(f"checkpoint {path} is truncated or corrupt ({_first_line(err)}); {FIX}") from None
    if missing := [k for k in CHECKPOINT_KEYS if not isinstance(ckpt, dict) or k not in ckpt]:
        raise ConfigError(f"checkpoint {path} is not a dprec-torch checkpoint (missing {', '.join(missing)}); {FIX}")
    return ckpt


def load_checkpoint(path: Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    sampler_generator: torch.Generator, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Restore a checkpoint written by :func:`save_checkpoint`; returns it (epoch, history, extra). Refuses
    (ConfigError) what the module doc lists: a damaged file, a changed config, a missing accountant or mean release."""
    ckpt = read_checkpoint(path)
    if config is not None and ckpt.get("config") is not None:
        check_resume_config(ckpt["config"], config, path)
    if isinstance(optimizer, MechanismOptimizer) and optimizer.accountant is not None and "accountant" not in ckpt["optimizer"]:
        raise ConfigError(f"checkpoint {path} holds no accountant state for {type(optimizer).__name__} (an older "
                          f"format): resuming would forget the epsilon already spent; {FIX}")
    if isinstance(optimizer, MechanismOptimizer) and optimizer.releases_item_means and "mean_release" not in ckpt["optimizer"]:
        raise ConfigError(f"checkpoint {path} holds no record of {type(optimizer).__name__}'s DP item-mean release (an "
                          f"older format): a resume restores that release, never makes it again; {FIX}")
    try:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        sampler_generator.set_state(ckpt["sampler_generator"])
    except (RuntimeError, KeyError, ValueError, TypeError) as err:
        raise ConfigError(f"checkpoint {path} does not fit this model/mechanism ({_first_line(err)}); {FIX}") from None
    set_rng_state(ckpt["rng"])
    log.info("resumed from %s after epoch %d", path, ckpt["epoch"])
    return ckpt


#: Classes moved since runs recorded them (``mechanism=X`` lives in ``mechanisms/X.py``): :func:`upgrade_recorded`
#: renames them in a run dir's ``config_resolved.json``, so ``evaluate.py run=`` and ``load_run`` read older runs.
RENAMED_TARGETS = {
    "dprec_torch.mechanisms.dpsgd_l1.ClippedLaplaceDPSGD": "dprec_torch.mechanisms.dpsgd.ClippedLaplaceDPSGD",
    "dprec_torch.mechanisms.dpsgd.DPSGDLaplace": "dprec_torch.mechanisms.dpsgd_paper.DPSGDLaplace",
    "dprec_torch.mechanisms.sgd.MapSGD": "dprec_torch.mechanisms.none.NoMechanism",  # the class of mechanism=none
    "dprec_torch.mechanisms.gaussian_pnbm.GaussianPNBM": "dprec_torch.mechanisms.gaussian.GaussianPNBM",
}
BUILTIN_TARGET = "dprec_torch.mechanisms.builtin.BuiltIn"


def upgrade_recorded(cfg: DictConfig) -> DictConfig:
    """A recorded run config (``config_resolved.json``) with today's class names, in place: a moved ``_target_``
    (:data:`RENAMED_TARGETS`), and ``mechanism=builtin``, which named no class before it had one."""
    mech = cfg.get("mechanism")
    if isinstance(mech, DictConfig):
        target = mech.get("_target_")
        if target in RENAMED_TARGETS:
            mech._target_ = RENAMED_TARGETS[target]
        elif not target and mech.get("name") == "builtin":
            mech._target_ = BUILTIN_TARGET
    return cfg
