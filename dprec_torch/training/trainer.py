"""The training loop for models learned under a mechanism (PNBM, MF).

Per step: sample a batch, predict its targets, clip the residuals (the
mechanism's per-example clipping), back-propagate the surrogate loss whose
gradient is G = sum e_ui d r_hat_ui / d theta, then ``optimizer.step()`` adds
noise and updates. Per epoch: evaluate, log to TensorBoard, checkpoint atomically.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dprec_torch.data.ratings import Fold
from dprec_torch.errors import TrainingDiverged
from dprec_torch.evaluation.metrics import rating_metrics
from dprec_torch.mechanisms.base import MechanismOptimizer
from dprec_torch.models.batching import PoissonBatchSampler
from dprec_torch.training.checkpoint import load_checkpoint, save_checkpoint

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    history: list[dict[str, float]] = field(default_factory=list)
    train_seconds: float = 0.0
    epochs: int = 0


class Trainer:
    """Runs ``epochs`` epochs of ``steps_per_epoch`` mechanism steps on one fold."""

    def __init__(self, model: torch.nn.Module, optimizer: MechanismOptimizer, sampler: PoissonBatchSampler, epochs: int,
                 checkpoint_path: Path | None = None, writer: Any = None, resume: bool = False) -> None:
        self.model, self.optimizer, self.sampler, self.epochs = model, optimizer, sampler, int(epochs)
        self.checkpoint_path, self.writer, self.resume = checkpoint_path, writer, resume

    def _step(self) -> tuple[float, int]:
        """One mechanism step; returns (sum of squared unclipped errors, #targets)."""
        batch = self.sampler.sample()
        self.optimizer.zero_grad(set_to_none=True)
        pred = self.model.batch_predict(batch)
        residuals = (pred - batch.values).detach()
        if not torch.isfinite(residuals).all():
            raise TrainingDiverged("the training loss became NaN/inf; lower the learning rate (mechanism.lr) "
                                   "-- the last good checkpoint was kept")
        clipped = self.optimizer.clip_residuals(residuals, batch, self.model)
        self.model.surrogate_loss(batch, clipped).backward()
        self.optimizer.step()
        if hasattr(self.model, "project_"):
            self.model.project_()
        return float((residuals.double() ** 2).sum()), batch.n_targets

    def fit(self, fold: Fold) -> TrainResult:
        result = TrainResult()
        start_epoch = 1
        if self.resume and self.checkpoint_path is not None and self.checkpoint_path.exists():
            ckpt = load_checkpoint(self.checkpoint_path, model=self.model, optimizer=self.optimizer,
                                   sampler_generator=self.sampler.generator)
            result.history = ckpt["history"]
            result.train_seconds = float(ckpt["extra"].get("train_seconds", 0.0))
            start_epoch = int(ckpt["epoch"]) + 1
        for epoch in range(start_epoch, self.epochs + 1):
            t0 = time.perf_counter()
            sq, n = 0.0, 0
            for _ in range(self.sampler.steps_per_epoch()):
                s, c = self._step()
                sq, n = sq + s, n + c
            if not all(torch.isfinite(p).all() for p in self.model.parameters()):
                raise TrainingDiverged(f"parameters became NaN/inf in epoch {epoch}; lower mechanism.lr "
                                       "-- the last good checkpoint was kept")
            result.train_seconds += time.perf_counter() - t0
            row = self._epoch_metrics(epoch, fold, math.sqrt(sq / max(n, 1)))
            result.history.append(row)
            self._log(row)
            if self.checkpoint_path is not None:
                save_checkpoint(self.checkpoint_path, model=self.model, optimizer=self.optimizer,
                                sampler_generator=self.sampler.generator, epoch=epoch, history=result.history,
                                extra={"train_seconds": result.train_seconds})
        result.epochs = self.epochs
        return result

    @torch.no_grad()
    def _epoch_metrics(self, epoch: int, fold: Fold, train_rmse_running: float) -> dict[str, float]:
        test = rating_metrics(self.model.predict(fold.test.users, fold.test.items), fold.test.values)
        state = self.optimizer.state["mechanism"]
        return {
            "epoch": epoch,
            "train_rmse": train_rmse_running,
            "test_rmse": test["rmse"],
            "test_mae": test["mae"],
            "epsilon_spent": self.optimizer.epsilon_spent(),
            "noise_scale": float(state["noise_scale"]),
            "grad_norm": float(state["grad_norm"]),
            "step_size": float(self.optimizer.step_size()),
            "residual_bound": float(state.get("residual_bound", float("inf"))),
        }

    def _log(self, row: dict[str, float]) -> None:
        log.info("epoch %3d | train RMSE %.4f | test RMSE %.4f MAE %.4f | noise %.4g | |G| %.4g | eps spent %.4g",
                 row["epoch"], row["train_rmse"], row["test_rmse"], row["test_mae"], row["noise_scale"],
                 row["grad_norm"], row["epsilon_spent"])
        if self.writer is not None:
            for key, value in row.items():
                if key != "epoch" and math.isfinite(value):
                    tag = f"{key.split('_')[0]}/{key}" if key.startswith(("train", "test")) else f"mechanism/{key}"
                    self.writer.add_scalar(tag, value, row["epoch"])
            self.writer.flush()
