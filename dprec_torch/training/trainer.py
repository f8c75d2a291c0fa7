"""The training loop for models learned under a mechanism (PNBM, MF).

Per step: sample a batch, predict its targets, clip the residuals (the mechanism's per-example clipping), back-propagate
the surrogate loss whose gradient is G = sum e_ui d r_hat_ui / d theta, then ``optimizer.step()`` adds noise and updates.
Per epoch: evaluate, log to TensorBoard, and checkpoint atomically when ``checkpoint_every`` says so
(:meth:`Trainer.checkpoint_due`; the last epoch always).

``private_diagnostics=False`` (``log_private_diagnostics``; the default for mechanisms with a finite
epsilon) keeps the quantities no mechanism protects -- :data:`NON_PRIVATE_ROW_KEYS`, the exact train
RMSE and the pre-noise gradient norm -- out of the history, the log lines and TensorBoard.
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
from dprec_torch.errors import ConfigError, TrainingDiverged
from dprec_torch.evaluation.metrics import rating_metrics
from dprec_torch.mechanisms.base import MechanismOptimizer
from dprec_torch.models.base import BaseModel
from dprec_torch.models.batching import PoissonBatchSampler
from dprec_torch.seeding import set_rng_state
from dprec_torch.training.checkpoint import CheckpointWriter, load_checkpoint
from dprec_torch.training.step_graph import StepGraph, graphed_steps

log = logging.getLogger(__name__)

#: per-epoch quantities computed from the training data without noise (not covered by any epsilon)
NON_PRIVATE_ROW_KEYS = ("train_rmse", "grad_norm")
DIVERGED = ("the training loss became NaN/inf; lower the learning rate (mechanism.lr) "
            "-- the last good checkpoint, if any (checkpoint_every), was kept")
#: ``checkpoint_every=auto`` without ``resume=true``: checkpoint once this much time has passed since the last checkpoint
#: (or the start), so a long run killed without having asked for resumability still loses at most this
AUTO_CHECKPOINT_SECONDS = 60.0


@dataclass
class TrainResult:
    history: list[dict[str, float]] = field(default_factory=list)
    train_seconds: float = 0.0
    epochs: int = 0
    epoch_seconds: list[float] = field(default_factory=list)  # the epochs this process ran (not restored ones)
    checkpointed: list[int] = field(default_factory=list)  # the epochs this process checkpointed


def loss_checked_each_step(sq: torch.Tensor) -> bool:
    """Whether a step checks its loss for NaN/inf at once (on the CPU, where it costs nothing); on an accelerator the
    epoch's summed loss is checked at the epoch's end instead (a check each step would make the host wait for the
    device each step), before the epoch's parameters are checked or checkpointed."""
    return sq.device.type == "cpu"


class Trainer:
    """Runs ``epochs`` epochs of ``steps_per_epoch`` mechanism steps on one fold.

    ``checkpoint_every`` (the config key of that name): ``"auto"`` checkpoints every epoch when ``resume`` is true (the
    run asked to be resumable) and otherwise once :data:`AUTO_CHECKPOINT_SECONDS` have passed since the last checkpoint;
    ``"end"`` only the last epoch; an integer N every N-th epoch. The last epoch is always checkpointed (a resume of a
    finished run reads it; a private run deletes it at its end: :mod:`dprec_torch.training.checkpoint`).
    """

    def __init__(self, model: BaseModel, optimizer: MechanismOptimizer, sampler: PoissonBatchSampler, epochs: int,
                 checkpoint_path: Path | None = None, writer: Any = None, resume: bool = False,
                 config: dict[str, Any] | None = None, private_diagnostics: bool = True,
                 checkpoint_every: int | str = "auto", auto_checkpoint_seconds: float = AUTO_CHECKPOINT_SECONDS) -> None:
        self.model, self.optimizer, self.sampler, self.epochs = model, optimizer, sampler, int(epochs)
        self.checkpoint_path, self.writer, self.resume = checkpoint_path, writer, resume
        self.config, self.private_diagnostics = config, bool(private_diagnostics)  # config: saved, checked on resume
        if not (checkpoint_every in ("auto", "end") or (type(checkpoint_every) is int and checkpoint_every >= 1)):
            raise ConfigError(f"checkpoint_every={checkpoint_every!r}: must be auto, end or an integer >= 1")
        self.checkpoint_every, self.auto_checkpoint_seconds = checkpoint_every, float(auto_checkpoint_seconds)
        self.checkpoints = CheckpointWriter()  # saves overlap the next epoch; finish() waits for the last
        self._graph: StepGraph | None | bool = False  # decided at the first step (graphed_steps)

    def checkpoint_due(self, epoch: int, seconds_since_last: float) -> bool:
        """Whether to checkpoint after ``epoch`` (see the class doc)."""
        if epoch >= self.epochs:
            return True
        if self.checkpoint_every == "auto":
            return self.resume or seconds_since_last >= self.auto_checkpoint_seconds
        if self.checkpoint_every == "end":
            return False
        return epoch % int(self.checkpoint_every) == 0

    def _step(self) -> tuple[torch.Tensor, int | torch.Tensor]:
        """One mechanism step (:meth:`_eager_step`), replayed from a CUDA graph where :func:`graphed_steps` allows."""
        if self._graph is False:
            device = next(self.model.parameters()).device
            self._graph = (StepGraph(self._eager_step, self.optimizer, self.sampler, list(self.model.parameters()), device)
                           if graphed_steps(self.optimizer, self.sampler, device) else None)
        return self._eager_step() if self._graph is None else self._graph()

    def _eager_step(self) -> tuple[torch.Tensor, int | torch.Tensor]:
        """One mechanism step; returns (sum of squared unclipped errors, on the device; #targets, an int or on the
        device for a masked batch).

        Where the mechanism's clipping is an element-wise clamp known up front (``elementwise_residual_clip()``) and the
        model fuses its forward and backward (``fused_step``: full PNBM on the CPU), one pass over the pairs computes
        pred, the residuals, the clamp and the gradient, bit for bit those of the separate path; the mechanism's
        ``clip_residuals`` still runs on the residuals (its state) and must return the kernel's clamp.
        """
        batch = self.sampler.sample()
        self.optimizer.zero_grad(set_to_none=True)
        bound = self.optimizer.elementwise_residual_clip()  # None: not an element-wise clamp
        target = self.model.training_targets(batch)  # the ratings, unless the model trains on a transformed target
        fused = None if bound is None else self.model.fused_step(batch, target, bound)  # None: not fused
        residuals = fused[1] if fused is not None else (self.model.batch_predict(batch) - target).detach()
        if batch.row_mask is not None:  # a masked batch: an unsampled user's residuals are 0, so is their gradient
            residuals = torch.where(batch.target_mask, residuals, 0.0)
        sq = (residuals.double() ** 2).sum()  # the step's loss: NaN/inf when a residual is (or |e| > 1e154): one scalar
        if loss_checked_each_step(sq) and not torch.isfinite(sq):
            raise TrainingDiverged(DIVERGED)
        clipped = self.optimizer.clip_residuals(residuals, batch, self.model)
        if fused is None:
            self.model.surrogate_loss(batch, clipped).backward()
        elif not torch.equal(clipped, fused[2]):  # the gradient already holds the kernel's clamp: it must be this one
            raise RuntimeError(f"{type(self.optimizer).__name__}.clip_residuals differs from its declared "
                               f"elementwise_residual_clip() = {bound}: the fused step's gradient would be wrong")
        self.optimizer.step()
        self.model.project_()  # a no-op unless the model has a constraint set
        return sq, batch.target_count()  # summed on the device

    def fit(self, fold: Fold, restored: dict[str, Any] | None = None) -> TrainResult:
        """Train (from the checkpoint when resuming). ``restored``: the checkpoint the caller (``train_fold``) already
        loaded into the model, mechanism and sampler."""
        result, start_epoch, ckpt = TrainResult(), 1, restored
        if ckpt is not None:  # the global RNGs as the checkpoint left them, whatever ran since the caller loaded it
            set_rng_state(ckpt["rng"])
        elif self.resume and self.checkpoint_path is not None and self.checkpoint_path.exists():
            ckpt = load_checkpoint(self.checkpoint_path, model=self.model, optimizer=self.optimizer,
                                   sampler_generator=self.sampler.generator, config=self.config)
        if ckpt is not None:
            result.history = [self._filtered(row) for row in ckpt["history"]]
            result.train_seconds = float(ckpt["extra"].get("train_seconds", 0.0))
            start_epoch = int(ckpt["epoch"]) + 1
        last_checkpoint = time.perf_counter()
        for epoch in range(start_epoch, self.epochs + 1):
            t0 = time.perf_counter()
            sq, n = None, 0
            for _ in range(self.sampler.steps_per_epoch()):  # (at least one step)
                s, c = self._step()
                sq, n = (s if sq is None else sq + s), n + c  # on the step's device: no copy to it, no host wait
            if not torch.isfinite(sq):  # a NaN/inf loss in any step of the epoch
                raise TrainingDiverged(DIVERGED)
            if not all(torch.isfinite(p).all() for p in self.model.parameters()):
                raise TrainingDiverged(f"parameters became NaN/inf in epoch {epoch}; lower mechanism.lr "
                                       "-- the last good checkpoint, if any (checkpoint_every), was kept")
            result.epoch_seconds.append(time.perf_counter() - t0)
            result.train_seconds += result.epoch_seconds[-1]
            row = self._epoch_metrics(epoch, fold, math.sqrt(float(sq) / max(int(n), 1)))
            result.history.append(row)
            self._log(row)
            if self.checkpoint_path is not None and self.checkpoint_due(epoch, time.perf_counter() - last_checkpoint):
                self.checkpoints.save(self.checkpoint_path, model=self.model, optimizer=self.optimizer,
                                sampler_generator=self.sampler.generator, epoch=epoch, history=result.history,
                                extra={"train_seconds": result.train_seconds}, config=self.config)
                result.checkpointed.append(epoch)
                last_checkpoint = time.perf_counter()
        result.epochs = self.epochs
        return result

    def finish(self) -> None:
        """Return once the last checkpoint is on disk (re-raising a failed write)."""
        self.checkpoints.wait()

    @torch.no_grad()
    def _epoch_metrics(self, epoch: int, fold: Fold, train_rmse_running: float) -> dict[str, float]:
        test = rating_metrics(self.model.predict(fold.test.users, fold.test.items), fold.test.values)
        state = self.optimizer.state["mechanism"]
        return self._filtered({"epoch": epoch, "train_rmse": train_rmse_running, "test_rmse": test["rmse"], "test_mae": test["mae"],
                               "epsilon_spent": self.optimizer.epsilon_spent(), "noise_scale": float(state["noise_scale"]),
                               "grad_norm": float(state["grad_norm"]), "step_size": float(self.optimizer.step_size()),
                               "residual_bound": float(state.get("residual_bound", float("inf")))})

    def _filtered(self, row: dict[str, float]) -> dict[str, float]:
        """``row`` without :data:`NON_PRIVATE_ROW_KEYS` unless private diagnostics are logged."""
        return row if self.private_diagnostics else {k: v for k, v in row.items() if k not in NON_PRIVATE_ROW_KEYS}

    def _log(self, row: dict[str, float]) -> None:
        """The per-epoch log line (and TensorBoard scalars)."""
        diag = (f" | train RMSE {row['train_rmse']:.4f} (non-private) | |G| {row['grad_norm']:.4g} (pre-noise)"
                if "train_rmse" in row else "")
        rep = self.optimizer.report()  # the line says what each epsilon figure covers
        log.info("epoch %3d | test RMSE %.4f MAE %.4f | noise %.4g | eps spent so far %.4g (as the mechanism counts it) "
                 "| defended eps of the released model: %s (%s level)%s", row["epoch"], row["test_rmse"], row["test_mae"],
                 row["noise_scale"], row["epsilon_spent"],
                 "none" if rep.get("epsilon") is None else f"{float(rep['epsilon']):.4g}",
                 str(rep.get("relation") or "no").split()[0], diag)
        if self.writer is not None:
            for key, value in row.items():
                if key != "epoch" and math.isfinite(value):
                    tag = f"{key.split('_')[0]}/{key}" if key.startswith(("train", "test")) else f"mechanism/{key}"
                    self.writer.add_scalar(tag, value, row["epoch"])
            self.writer.flush()
