"""``evaluate(cfg)``: the plain function behind ``evaluate.py``.

Two modes:
* ``python evaluate.py model=pcc data.fold=all`` cross-validates a predictor and
  prints fold, RMSE, MAE, mean +- std and fit time;
* ``python evaluate.py run=<train run dir>`` reloads a trained run's checkpoints
  and prints its test RMSE/MAE next to PCC and COS fitted on the same folds.
Both write ``metrics.json`` into this command's run dir.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from dprec_torch.data.ratings import Fold
from dprec_torch.device import resolve_device
from dprec_torch.errors import ConfigError
from dprec_torch.evaluation.cross_validate import cross_validate, score_predictor
from dprec_torch.interfaces import TrainableModel
from dprec_torch.io import atomic_write_json
from dprec_torch.seeding import seed_everything
from dprec_torch.privacy.scope import diagnostics_enabled
from dprec_torch.evaluation.baselines import baseline_metrics
from dprec_torch.training.checkpoint import read_checkpoint
from dprec_torch.training.run import build_model, instantiate_node, is_trainable, mechanism_fold, output_dir, validate

log = logging.getLogger(__name__)


def evaluate(cfg: DictConfig) -> tuple[dict[str, Any], str]:
    """Returns (metrics, printable table)."""
    validate(cfg)
    seed_everything(int(cfg.seed))
    out = output_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.get("run"):
        metrics, table = evaluate_run(Path(cfg.run), resolve_device(cfg.device))
    else:
        metrics, table = evaluate_predictor(cfg)
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
    metrics: dict[str, Any] = {"model": cfg.model.get("name"), "data": dataset.name, "dataset": dataset.record()}
    for k in keys:
        metrics[f"test_{k}"] = cv.mean(k)
        metrics[f"test_{k}_std"] = cv.std(k)
    metrics["folds"] = [f.as_dict() for f in cv.folds]
    shown = [k for k in ("rmse", "mae") if k in keys] or keys[:3]
    lines = [f"{cfg.model.get('name')} on {dataset.name}", f"{'fold':>6} " + " ".join(f"{k.upper():>9}" for k in shown) + f" {'fit s':>8}"]
    for f in cv.folds:
        lines.append(f"{f.fold:>6} " + " ".join(f"{f.metrics[k]:>9.4f}" for k in shown) + f" {f.fit_seconds:>8.2f}")
    lines.append(f"{'mean':>6} " + " ".join(f"{cv.mean(k):>9.4f}" for k in shown))
    lines.append(f"{'std':>6} " + " ".join(f"{cv.std(k):>9.4f}" for k in shown))
    return metrics, "\n".join(lines)


def _run_diagnostics(cfg: DictConfig, run_dir: Path) -> bool:
    """The run's ``log_private_diagnostics`` (auto: from the epsilon its metrics.json reports; off if unknown)."""
    setting = cfg.get("log_private_diagnostics")
    if setting is not None:
        return diagnostics_enabled(setting, {})
    path = run_dir / "metrics.json"
    if not path.exists():
        return False
    return diagnostics_enabled(None, json.loads(path.read_text()).get("privacy", {}))


def restore_fold(cfg: DictConfig, fold: Fold, run_dir: Path,
                 device: torch.device) -> tuple[Fold, TrainableModel, dict[str, Any]]:
    """The model that ``run_dir`` released on ``fold``, RESTORED from its checkpoint (``model.restore``), never
    re-fitted; returns (the fold it was trained on -- capped for a user-level mechanism --, the model, the checkpoint)."""
    ckpt_path = run_dir / f"checkpoint_fold{fold.index}.pt"
    if not ckpt_path.exists():
        raise ConfigError(f"missing checkpoint {ckpt_path}; was the run trained on fold {fold.index}?")
    ckpt = read_checkpoint(ckpt_path, map_location=device)
    if int(ckpt["epoch"]) != int(cfg.mechanism.epochs):
        log.warning("%s holds epoch %d of %d: the run did not finish", ckpt_path, ckpt["epoch"], cfg.mechanism.epochs)
    fold = mechanism_fold(cfg, fold.to(device))
    model = build_model(cfg, fold, device).to(device)
    try:
        model.restore(fold.train, ckpt["model"])
    except RuntimeError as err:
        raise ConfigError(f"checkpoint {ckpt_path} does not fit model={cfg.model.get('name')} "
                          f"({str(err).splitlines()[0][:160]}); retrain the run with this version") from None
    return fold, model, ckpt


def evaluate_run(run_dir: Path, device: torch.device) -> tuple[dict[str, Any], str]:
    """Reload each fold's released model from a train.py run and score it (next to PCC/COS when the run
    logs non-private diagnostics).

    The model is RESTORED (``model.restore``): S / the factors, the item means -- the DP release for a
    mechanism that made one -- and the fallback all come from the checkpoint; only the users' own
    training histories are re-bound (PNBM reads them), so this scores exactly the private model trained.
    """
    cfg_path = run_dir / "config_resolved.json"
    if not cfg_path.exists():
        raise ConfigError(f"{run_dir} is not a train.py run dir (no config_resolved.json); pass run=<outputs/...>")
    cfg = OmegaConf.create(json.loads(cfg_path.read_text()))
    dataset = instantiate_node(cfg.data)
    diagnostics = _run_diagnostics(cfg, run_dir)
    rows, records = [], []
    for fold in dataset.folds:
        fold, model, ckpt = restore_fold(cfg, fold, run_dir, device)
        m = score_predictor(model, fold)
        b = baseline_metrics(fold, int(cfg.baseline_k)) if diagnostics else None
        records.append({"fold": fold.index, "test_rmse": m["rmse"], "test_mae": m["mae"], "epoch": int(ckpt["epoch"]),
                        **({"baselines": b} if b else {})})
        rows.append((fold.index, m, b))
    metrics = {
        "model": cfg.model.get("name"), "mechanism": cfg.mechanism.get("name"), "data": dataset.name, "dataset": dataset.record(), "run": str(run_dir),
        "epsilon": cfg.epsilon, "test_rmse": float(np.mean([r["test_rmse"] for r in records])),
        "test_mae": float(np.mean([r["test_mae"] for r in records])), "folds": records,
    }
    if diagnostics:
        metrics["baselines"] = {n: {k: float(np.mean([r["baselines"][n][k] for r in records])) for k in ("rmse", "mae")}
                                for n in ("PCC", "COS")}
    return metrics, _run_table(rows, metrics)


def _run_table(rows: list[tuple], metrics: dict[str, Any]) -> str:
    def base(b: dict | None, name: str) -> str:
        return f"{b[name]['rmse']:>9.4f}" if b else f"{'-':>9}"

    lines = [f"{'fold':>5} {'model RMSE':>11} {'MAE':>7} {'PCC RMSE':>9} {'COS RMSE':>9}"]
    for idx, m, b in rows:
        lines.append(f"{idx:>5} {m['rmse']:>11.4f} {m['mae']:>7.4f} {base(b, 'PCC')} {base(b, 'COS')}")
    mb = metrics.get("baselines")
    lines.append(f"{'mean':>5} {metrics['test_rmse']:>11.4f} {metrics['test_mae']:>7.4f} {base(mb, 'PCC')} {base(mb, 'COS')}")
    if not mb:
        lines.append("(PCC/COS not shown: the run does not log non-private diagnostics; log_private_diagnostics=true)")
    return "\n".join(lines)
