"""Evaluation sits outside the algorithms: fit on each fold's train, score its test."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from dprec_torch.data.ratings import Fold
from dprec_torch.evaluation.metrics import rating_metrics
from dprec_torch.evaluation.topn import topn_metrics
from dprec_torch.predictors.base import Predictor

log = logging.getLogger(__name__)


@dataclass
class FoldResult:
    fold: int
    metrics: dict[str, float]
    fit_seconds: float
    predict_seconds: float

    def as_dict(self) -> dict:
        return {"fold": self.fold, **{f"test_{k}": v for k, v in self.metrics.items()}, "fit_seconds": self.fit_seconds,
                "predict_seconds": self.predict_seconds}


@dataclass
class CVResult:
    folds: list[FoldResult] = field(default_factory=list)

    def mean(self, key: str) -> float:
        return float(np.mean([f.metrics[key] for f in self.folds if key in f.metrics]))

    def std(self, key: str) -> float:
        return float(np.std([f.metrics[key] for f in self.folds if key in f.metrics]))

    def keys(self) -> list[str]:
        return list(self.folds[0].metrics) if self.folds else []


def score_predictor(predictor: object, fold: Fold, topn: int = 10, relevance_threshold: float = 4.0) -> dict[str, float]:
    """RMSE/MAE if the predictor predicts ratings (plus ``fallback_rate`` for a predictor that counts its fallback pairs
    in ``fallback_rate_``: kNN, PNCF, McSherry-Mironov); Precision/Recall/F1@N and coverage if it recommends."""
    test = fold.test
    out: dict[str, float] = {}
    task = predictor.task  # every TrainableModel and FittedPredictor declares it (dprec_torch/interfaces.py)
    if task in ("rating", "both"):
        pred = predictor.predict(test.users, test.items).to(test.values.device)
        if not torch.isfinite(pred).all():
            raise FloatingPointError("predictions contain NaN or inf")
        out.update(rating_metrics(pred, test.values))
        rate = getattr(predictor, "fallback_rate_", None)  # BasePredictor's; trained models and wrappers have none
        if rate is not None:
            out["fallback_rate"] = rate  # share of test pairs answered by the fallback
    if task in ("topn", "both"):
        users = torch.unique(test.users)
        rec = predictor.recommend(users, topn)
        out.update(topn_metrics(rec.to(test.users.device), users, test, relevance_threshold))
    return out


def cross_validate(make_predictor: Callable[[], Predictor], folds: list[Fold], topn: int = 10,
                   relevance_threshold: float = 4.0) -> CVResult:
    """Fit a fresh predictor per fold; return per-fold metrics and fit/predict times."""
    result = CVResult()
    for fold in folds:
        predictor = make_predictor()
        t0 = time.perf_counter()
        predictor.fit(fold.train)
        t1 = time.perf_counter()
        metrics = score_predictor(predictor, fold, topn, relevance_threshold)
        t2 = time.perf_counter()
        result.folds.append(FoldResult(fold.index, metrics, t1 - t0, t2 - t1))
        log.info("fold %s: %s (fit %.2fs)", fold.index, ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()), t1 - t0)
    return result
