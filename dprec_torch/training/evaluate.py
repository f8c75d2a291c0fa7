"""``evaluate(cfg)``: the plain function behind ``evaluate.py``. Two modes, both writing ``metrics.json`` into this
command's run dir:

* ``python evaluate.py model=pcc data.fold=all`` cross-validates a predictor and prints fold, RMSE, MAE, mean +- std
  and fit time;
* ``python evaluate.py run=<train run dir>`` reloads a run's releases (never the secret checkpoints) and prints its
  test RMSE/MAE next to its references on the same folds and k (:func:`evaluate_run`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from dprec_torch.training.checkpoint import upgrade_recorded
from dprec_torch.data.ratings import Fold
from dprec_torch.device import resolve_device
from dprec_torch.errors import ConfigError
from dprec_torch.evaluation.cross_validate import cross_validate, score_predictor
from dprec_torch.interfaces import TrainableModel
from dprec_torch.io import atomic_write_json
from dprec_torch.seeding import key_scope, seed_everything
from dprec_torch.evaluation.baselines import dp_reference_target, reference_info, reference_label, reference_metrics
from dprec_torch.training.run import (build_model, build_predictor, instantiate_node, is_trainable, job_label, mechanism_fold,
                                      output_dir, validate)

log = logging.getLogger(__name__)


def evaluate(cfg: DictConfig) -> tuple[dict[str, Any], str]:
    """Returns (metrics, printable table)."""
    validate(cfg)
    seed_everything(int(cfg.seed))
    out = output_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    metrics, table = (evaluate_run(Path(cfg.run), resolve_device(cfg.device), bool(cfg.compare_baselines)) if cfg.get("run")
                      else evaluate_predictor(cfg))
    atomic_write_json(out / "metrics.json", metrics)
    return metrics, table


def evaluate_predictor(cfg: DictConfig) -> tuple[dict[str, Any], str]:
    if is_trainable(cfg.model):
        raise ConfigError(f"model={cfg.model.name} is trained: run train.py, then evaluate.py run=<its run dir>")
    device = resolve_device(cfg.device)
    dataset = instantiate_node(cfg.data)
    folds = [f.to(device) for f in dataset.folds]
    cv = cross_validate(lambda: instantiate_node(cfg.model), folds, int(cfg.eval.topn), float(cfg.eval.relevance_threshold))
    keys = cv.keys()
    metrics: dict[str, Any] = {"model": cfg.model.get("name"), "data": dataset.name, "dataset": dataset.record(),
                               **{f"test_{k}{s}": f(k) for k in keys for s, f in (("", cv.mean), ("_std", cv.std))},
                               "folds": [f.as_dict() for f in cv.folds]}
    shown = [k for k in ("rmse", "mae") if k in keys] or keys[:3]
    lines = [f"{cfg.model.get('name')} on {dataset.name}", f"{'fold':>6} " + " ".join(f"{k.upper():>9}" for k in shown) + f" {'fit s':>8}"]
    for f in cv.folds:
        lines.append(f"{f.fold:>6} " + " ".join(f"{f.metrics[k]:>9.4f}" for k in shown) + f" {f.fit_seconds:>8.2f}")
    lines += [f"{name:>6} " + " ".join(f"{stat(k):>9.4f}" for k in shown) for name, stat in (("mean", cv.mean), ("std", cv.std))]
    return metrics, "\n".join(lines)


def restore_fold(cfg: DictConfig, fold: Fold, run_dir: Path, device: torch.device) -> tuple[Fold, TrainableModel, dict[str, Any]]:
    """The model that ``run_dir`` released on ``fold``, RESTORED from ``release_fold<k>.pt`` (``model.restore``:
    parameters, item means, fallback as released), never re-fitted nor read from the checkpoint; returns (the fold it was
    trained on -- capped for a user-level mechanism, whose users' own histories the model re-binds --, the model, the release)."""
    from dprec_torch.predictors.release import read_release, release_path

    path = release_path(run_dir, fold.index)
    release = read_release(path, device)
    fold = mechanism_fold(cfg, fold.to(device))
    model = build_model(cfg, fold, device).to(device)
    try:
        model.restore(fold.train, release["state"])
    except (RuntimeError, KeyError, ConfigError) as err:
        raise ConfigError(f"release {path} does not fit model={cfg.model.get('name')} "
                          f"({str(err).splitlines()[0][:160]}); retrain the run with this version") from None
    return fold, model, release


def restore_predictor(cfg: DictConfig, fold: Fold, run_dir: Path, device: torch.device) -> Any:
    """The fitted predictor that ``run_dir`` released on ``fold``, RESTORED from ``release_fold<k>.pt`` (its
    ``restore``), never re-fitted: the item side comes from the release; only each user's own part is recomputed from
    their ratings in ``fold.train`` (joint DP). Built as ``fit_fold`` built it (the model, wrapped by an output mechanism)."""
    from dprec_torch.predictors.release import ReleasesState, read_release, release_path

    release = read_release(release_path(run_dir, fold.index), device)
    predictor = build_predictor(cfg)
    if not isinstance(predictor, ReleasesState):
        raise ConfigError(f"model={cfg.model.get('name', '?')} cannot be restored from a release (no released_state/restore)")
    return predictor.restore(fold.train.to(device), release["state"])


def score_restored(cfg: DictConfig, model: Any, fold: Fold) -> dict[str, float]:
    """:func:`score_predictor` with the run's own top-N settings (``fit_fold`` scored with them; a trained model
    predicts ratings only)."""
    return score_predictor(model, fold, int(cfg.eval.topn), float(cfg.eval.relevance_threshold))


def evaluate_run(run_dir: Path, device: torch.device, compare_baselines: bool = True) -> tuple[dict[str, Any], str]:
    """Reload each fold's released model from a train.py run and score it next to its references (non-private
    PCC/COS and, for a finite epsilon, DP item means + user offset at that epsilon; none with
    ``compare_baselines=False``), on the same folds and the same k (the run's ``baseline_k``) as ``train.py``.

    The model is RESTORED from its release (:func:`restore_fold`, :func:`restore_predictor`), so this scores exactly
    the private model trained.
    """
    cfg_path, metrics_path = run_dir / "config_resolved.json", run_dir / "metrics.json"
    if not cfg_path.exists():
        raise ConfigError(f"{run_dir} is not a train.py run dir (no config_resolved.json); pass run=<outputs/...>")
    cfg = upgrade_recorded(OmegaConf.create(json.loads(cfg_path.read_text())))
    dataset = instantiate_node(cfg.data)
    privacy = json.loads(metrics_path.read_text()).get("privacy", {}) if metrics_path.exists() else {}  # {}: an unfinished run
    k, target = int(cfg.baseline_k), dp_reference_target(privacy, cfg.epsilon)
    rows, records = [], []
    trainable = is_trainable(cfg.model)
    job = job_label(cfg)
    for loaded in dataset.folds:
        with key_scope(job=job, fold=loaded.index):  # the keys the run answered under: a seeded per-answer mechanism repeats
            if trainable:
                fold, model, release = restore_fold(cfg, loaded, run_dir, device)
                m, done = score_predictor(model, fold), {"epoch": int(release["meta"].get("epochs", cfg.mechanism.epochs))}
            else:  # a fitted predictor: its release_fold<k>.pt (train.py fitted it on the fold as loaded)
                fold = loaded.to(device)
                m, done = score_restored(cfg, restore_predictor(cfg, fold, run_dir, device), fold), {}
            # the references on the fold as loaded (train.py scores them on the same split, before any tau cap, and
            # draws the DP reference under the same keys: run_experiment)
            b = reference_metrics(loaded.to(device), k, target, cfg.get("noise_seed")) if compare_baselines else {}
        records.append({"fold": fold.index, **{f"test_{key}": v for key, v in m.items()}, **done, **({"baselines": b} if b else {})})
        rows.append((fold.index, m, b))
    metrics = {"model": cfg.model.get("name"), "mechanism": cfg.mechanism.get("name"), "data": dataset.name, "dataset": dataset.record(),
               "run": str(run_dir), "epsilon": cfg.epsilon,
               **{key: float(np.mean([r[key] for r in records])) for key in records[0] if key.startswith("test_")}, "folds": records}
    if compare_baselines:
        names = list(records[0]["baselines"])
        metrics["baselines"] = {n: {key: float(np.mean([r["baselines"][n][key] for r in records])) for key in ("rmse", "mae")}
                                for n in names}
        metrics["baseline_info"] = reference_info(k, target)
    return metrics, _run_table(rows, metrics)


def _run_table(rows: list[tuple], metrics: dict[str, Any]) -> str:
    """Per fold: the model's RMSE/MAE and each reference's RMSE; then what each reference is."""
    names = list(metrics.get("baselines", {}))
    head = [f"{n + ' RMSE':>{max(9, len(n) + 5)}}" for n in names]

    def base(b: dict | None) -> str:
        return " ".join(f"{b[n]['rmse']:>{max(9, len(n) + 5)}.4f}" for n in names) if b else ""

    # a rating model's RMSE/MAE; a top-N-only model (cosine_implicit, d2p, exponential_topk) shows its top-N metrics
    shown = [key for key in ("rmse", "mae") if key in rows[0][1]] or [key for key in rows[0][1] if "@" in key][:3]
    label = {"rmse": "model RMSE", "mae": "MAE"}
    width = {key: max(7, len(label.get(key, key)) + (key == "rmse")) for key in shown}
    lines = [f"{'fold':>5} " + " ".join(f"{label.get(key, key):>{width[key]}}" for key in shown) + " " + " ".join(head)]
    for idx, m, b in rows:
        lines.append(f"{idx:>5} " + " ".join(f"{m[key]:>{width[key]}.4f}" for key in shown) + f" {base(b)}")
    mb = metrics.get("baselines")
    lines.append(f"{'mean':>5} " + " ".join(f"{metrics['test_' + key]:>{width[key]}.4f}" for key in shown) + f" {base(mb)}")
    if mb:
        lines += [f"  {n}: {reference_label(n, metrics.get('baseline_info'))}" for n in names]
    else:
        lines.append("(no reference baselines: compare_baselines=false)")
    return "\n".join(lines)
