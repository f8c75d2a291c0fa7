"""Atomic per-epoch checkpoints: model, optimizer (with its noise RNG), all RNG states, epoch."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from dprec_torch.io import atomic_torch_save
from dprec_torch.seeding import rng_state, set_rng_state

log = logging.getLogger(__name__)


def save_checkpoint(path: Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer, sampler_generator: torch.Generator,
                    epoch: int, history: list[dict], extra: dict[str, Any] | None = None) -> None:
    """Write everything needed to resume after ``epoch`` (temp file + rename)."""
    atomic_torch_save(path, {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "sampler_generator": sampler_generator.get_state(),
        "rng": rng_state(),
        "epoch": epoch,
        "history": history,
        "extra": extra or {},
    })


def load_checkpoint(path: Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    sampler_generator: torch.Generator) -> dict[str, Any]:
    """Restore a checkpoint written by :func:`save_checkpoint`; returns it (epoch, history, extra)."""
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    sampler_generator.set_state(ckpt["sampler_generator"])
    set_rng_state(ckpt["rng"])
    log.info("resumed from %s after epoch %d", path, ckpt["epoch"])
    return ckpt
