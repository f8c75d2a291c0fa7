"""What a job pays besides training: checkpoints only where ``checkpoint_every`` asks, one Hydra
composition per job in a batched sweep, and the TensorBoard writer closed off the critical path without losing events."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from dprec_torch.errors import ConfigError
from dprec_torch.training.checkpoint import config_differences, read_checkpoint
from dprec_torch.training.run import setup_training, train, validate
from dprec_torch.training.tb_close import close_in_background, wait_closed
from dprec_torch.training.trainer import Trainer
from hydra_plugins.dprec_batched_launcher.batched_launcher import ComposedOnce
from tests.helpers import kill_in_epoch, tiny_cfg, tiny_fold

BASE = ["data=synthetic", "device=cpu", "compare_baselines=false", "tensorboard=false"]
EPOCHS = 4


def compose_cfg(*overrides: str):
    return tiny_cfg(*BASE, *overrides)


def checkpointed(tmp_path: Path, resume: bool, every, seconds: float = 60.0) -> list[int]:
    cfg = compose_cfg("model=pnbm", "mechanism=none", "epsilon=inf", f"mechanism.epochs={EPOCHS}", "seed=3")
    validate(cfg)
    s = setup_training(cfg, tiny_fold(3), torch.device("cpu"))
    path = tmp_path / "checkpoint_fold1.pt"
    trainer = Trainer(s.model, s.optimizer, s.sampler, s.epochs, path, resume=resume, checkpoint_every=every,
                      auto_checkpoint_seconds=seconds)
    result = trainer.fit(s.fold)
    trainer.finish()
    assert read_checkpoint(path)["epoch"] == EPOCHS  # a finished fold always leaves its final checkpoint
    return result.checkpointed


@pytest.mark.parametrize("resume,every,seconds,epochs", [
    (False, "auto", 60.0, [4]),            # a short run that did not ask to be resumable: the last epoch only
    (True, "auto", 60.0, [1, 2, 3, 4]),    # resume=true asks for a checkpoint every epoch
    (False, "auto", 0.0, [1, 2, 3, 4]),    # a long run (here: any epoch past the time limit) checkpoints as it goes
    (True, "end", 60.0, [4]),
    (False, 1, 60.0, [1, 2, 3, 4]),
    (False, 3, 60.0, [3, 4]),
])
def test_epochs_checkpointed_under_each_setting(tmp_path, resume, every, seconds, epochs):
    assert checkpointed(tmp_path, resume, every, seconds) == epochs


def test_checkpoint_every_may_change_between_a_run_and_its_resume():
    assert config_differences({"epsilon": 1.0, "checkpoint_every": "auto"}, {"epsilon": 1.0, "checkpoint_every": 1}) == []
    assert config_differences({"epsilon": 1.0}, {"epsilon": 1.0, "checkpoint_every": "auto"}) == []  # run dirs from before the key


@pytest.mark.parametrize("bad", ["maybe", 0, "1.5"])
def test_a_bad_checkpoint_every_is_refused_before_training(tmp_path, bad):
    with pytest.raises(ConfigError, match="checkpoint_every"):
        train(compose_cfg(f"checkpoint_every={bad}", "mechanism.epochs=1", f"output_dir={tmp_path}"))


def test_a_default_run_killed_before_its_end_restarts_and_one_with_resume_true_continues(tmp_path, monkeypatch):
    """resume=true on the first run is what makes a short run resumable; the numbers are the same either way."""
    from dprec_torch.training import trainer as trainer_mod

    args = ["model=pnbm", "mechanism=dpsgd_paper", "epsilon=2", "mechanism.epochs=3", "noise_seed=0"]
    full = train(compose_cfg(*args, f"output_dir={tmp_path / 'full'}"))
    original = kill_in_epoch(monkeypatch, 3)
    for name, extra in (("default", []), ("resumable", ["resume=true"])):
        with pytest.raises(KeyboardInterrupt):
            train(compose_cfg(*args, *extra, f"output_dir={tmp_path / name}"))
    monkeypatch.setattr(trainer_mod.Trainer, "_epoch_metrics", original)
    assert not (tmp_path / "default" / "checkpoint_fold1.pt").exists()
    assert read_checkpoint(tmp_path / "resumable" / "checkpoint_fold1.pt")["epoch"] == 2
    for name in ("default", "resumable"):
        resumed = train(compose_cfg(*args, "resume=true", f"output_dir={tmp_path / name}"))
        assert resumed["test_rmse"] == full["test_rmse"] and resumed["history"] == full["history"]


class CountingLoader:
    def __init__(self) -> None:
        self.calls = 0

    def load_sweep_config(self, master_config, sweep_overrides):
        self.calls += 1
        return OmegaConf.create({"overrides": list(sweep_overrides)})

    def list_groups(self, parent: str) -> list[str]:
        return ["delegated"]


def test_the_launcher_takes_the_sweepers_validation_composition():
    inner = CountingLoader()
    loader, master = ComposedOnce(inner), OmegaConf.create({})
    jobs = [["epsilon=1"], ["epsilon=5"]]
    validated = [loader.load_sweep_config(master, j) for j in jobs]  # what Sweeper.validate_batch_is_legal does
    taken = [loader.take(master, j) for j in jobs]
    assert inner.calls == 2 and all(a is b for a, b in zip(validated, taken))
    assert loader.take(master, jobs[0]) is not validated[0] and inner.calls == 3  # taken once; then composed afresh
    assert loader.list_groups("") == ["delegated"]


def test_a_writer_is_finished_and_closed_in_the_background_and_waited_for(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    gate, seen = threading.Event(), []

    def last(w):
        gate.wait(10)  # the caller goes on while this runs
        seen.append(threading.current_thread().name)
        w.add_scalar("reference/x/test_rmse", 0.5, 0)

    writer = SummaryWriter(log_dir=str(tmp_path))
    writer.add_scalar("test/test_rmse", 1.0, 1)
    close_in_background(writer, last)
    assert not seen  # returned before the final summaries were written
    gate.set()
    wait_closed()
    assert seen == ["tensorboard-close"]
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert {"test/test_rmse", "reference/x/test_rmse"} <= set(acc.Tags()["scalars"])


def test_the_privacy_report_is_computed_once_per_epoch_and_once_before_training(tmp_path, monkeypatch):
    from dprec_torch.mechanisms.clipped_sgld import ClippedSGLD

    calls = []
    real = ClippedSGLD.privacy_report
    monkeypatch.setattr(ClippedSGLD, "privacy_report", lambda self: calls.append(self.t) or real(self))
    cfg = compose_cfg("mechanism=sgld", "epsilon=20", "mechanism.epochs=3", "mechanism.clip_norm=0.5",
                      "mechanism.lr=1", "mechanism.sampling_ratio=1.0", "mechanism.mean_fraction=0.6",
                      f"output_dir={tmp_path}")
    train(cfg)
    assert len(calls) == 1 + 3  # the claim checked before training, then one per epoch; the final report reuses the last
