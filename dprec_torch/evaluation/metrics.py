"""Accuracy metrics: RMSE/MAE for rating prediction, Precision/Recall/F1@N and coverage for top-N."""

from __future__ import annotations

import torch


def rmse(pred: torch.Tensor, truth: torch.Tensor) -> float:
    """RMSE = sqrt(mean((r - r_hat)^2)) (Wang & Tang, Sec. 5)."""
    return float(torch.sqrt(torch.mean((pred.double() - truth.double()) ** 2)))


def mae(pred: torch.Tensor, truth: torch.Tensor) -> float:
    """MAE = mean(|r - r_hat|)."""
    return float(torch.mean(torch.abs(pred.double() - truth.double())))


def rating_metrics(pred: torch.Tensor, truth: torch.Tensor) -> dict[str, float]:
    return {"rmse": rmse(pred, truth), "mae": mae(pred, truth)}
