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

from dprec_torch.device import resolve_device
from dprec_torch.errors import ConfigError
from dprec_torch.evaluation.cross_validate import cross_validate, score_predictor
from dprec_torch.io import atomic_write_json
from dprec_torch.seeding import seed_everything
from dprec_torch.training.baselines import baseline_metrics
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


def evaluate_run(run_dir: Path, device: torch.device) -> tuple[dict[str, Any], str]:
    """Reload each fold's checkpoint of a train.py run and score it next to PCC/COS."""
    cfg_path = run_dir / "config_resolved.json"
    if not cfg_path.exists():
        raise ConfigError(f"{run_dir} is not a train.py run dir (no config_resolved.json); pass run=<outputs/...>")
    cfg = OmegaConf.create(json.loads(cfg_path.read_text()))
    dataset = instantiate_node(cfg.data)
    rows, records = [], []
    for fold in dataset.folds:
        ckpt_path = run_dir / f"checkpoint_fold{fold.index}.pt"
        if not ckpt_path.exists():
            raise ConfigError(f"missing checkpoint {ckpt_path}; was the run trained on fold {fold.index}?")
        fold = mechanism_fold(cfg, fold.to(device))
        model = build_model(cfg, fold).to(device)
        model.load_state_dict(torch.load(ckpt_path, map_location=device, weights_only=False)["model"])
        model.attach(fold.train)
        m = score_predictor(model, fold)
        b = baseline_metrics(fold, int(cfg.baseline_k))
        records.append({"fold": fold.index, "test_rmse": m["rmse"], "test_mae": m["mae"], "baselines": b})
        rows.append((fold.index, m, b))
    metrics = {
        "model": cfg.model.get("name"), "mechanism": cfg.mechanism.get("name"), "data": dataset.name, "dataset": dataset.record(), "run": str(run_dir),
        "epsilon": cfg.epsilon, "test_rmse": float(np.mean([r["test_rmse"] for r in records])),
        "test_mae": float(np.mean([r["test_mae"] for r in records])), "folds": records,
        "baselines": {n: {k: float(np.mean([r["baselines"][n][k] for r in records])) for k in ("rmse", "mae")} for n in ("PCC", "COS")},
    }
    lines = [f"{'fold':>5} {'model RMSE':>11} {'MAE':>7} {'PCC RMSE':>9} {'COS RMSE':>9}"]
    for idx, m, b in rows:
        lines.append(f"{idx:>5} {m['rmse']:>11.4f} {m['mae']:>7.4f} {b['PCC']['rmse']:>9.4f} {b['COS']['rmse']:>9.4f}")
    lines.append(f"{'mean':>5} {metrics['test_rmse']:>11.4f} {metrics['test_mae']:>7.4f} "
                 f"{metrics['baselines']['PCC']['rmse']:>9.4f} {metrics['baselines']['COS']['rmse']:>9.4f}")
    return metrics, "\n".join(lines)
