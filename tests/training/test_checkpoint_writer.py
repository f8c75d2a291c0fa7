"""Checkpoints written off the training thread hold the state of the moment ``save`` was called."""

from __future__ import annotations

import pytest
import torch

from dprec_torch.data.ratings import RatingScale
from dprec_torch.mechanisms.sgd import MapSGD
from dprec_torch.models.pnbm import PNBM
from dprec_torch.training.checkpoint import CheckpointWriter, read_checkpoint, save_checkpoint


def parts(model, opt, gen, epoch):
    return dict(model=model, optimizer=opt, sampler_generator=gen, epoch=epoch, history=[{"epoch": epoch}], extra={}, config=None)


def make():
    from dprec_torch.mechanisms.context import TrainingContext

    model = PNBM(6, seed=1)
    ctx = TrainingContext(total_steps=1, steps_per_epoch=1, n_ratings=10, n_users=3, scale=RatingScale(1.0, 5.0))
    return model, MapSGD(model.parameters(), context=ctx, lr=0.1), torch.Generator().manual_seed(0)


def test_background_save_equals_synchronous_save_and_snapshots_at_call(tmp_path):
    model, opt, gen = make()
    save_checkpoint(tmp_path / "sync.pt", **parts(model, opt, gen, 1))
    writer = CheckpointWriter()
    writer.save(tmp_path / "async.pt", **parts(model, opt, gen, 1))
    with torch.no_grad():
        model.S.add_(1.0)  # training goes on while the write is in flight
    writer.wait()
    a, b = read_checkpoint(tmp_path / "sync.pt"), read_checkpoint(tmp_path / "async.pt")
    assert torch.equal(a["model"]["S"], b["model"]["S"]) and not torch.equal(b["model"]["S"], model.S.detach())
    assert a["epoch"] == b["epoch"] == 1 and a["history"] == b["history"]
    assert torch.equal(a["sampler_generator"], b["sampler_generator"])


def test_failed_write_is_raised_by_wait_and_the_old_checkpoint_kept(tmp_path):
    model, opt, gen = make()
    good = tmp_path / "ckpt.pt"
    save_checkpoint(good, **parts(model, opt, gen, 1))
    writer = CheckpointWriter()
    writer.save(tmp_path / "missing-dir" / "x" / "ckpt.pt", **parts(model, opt, gen, 2))  # parent created: fine
    writer.wait()
    bad = tmp_path / "a-file"
    bad.write_text("not a folder")
    writer.save(bad / "ckpt.pt", **parts(model, opt, gen, 3))  # its parent is a file: the write fails
    with pytest.raises(OSError):
        writer.wait()
    assert read_checkpoint(good)["epoch"] == 1
    writer.wait()  # the error is reported once
