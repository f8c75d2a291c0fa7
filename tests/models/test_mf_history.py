"""MF reads a batch's targets only: rating-level batches skip the history blocks, with the same numbers
(ML-1M MF at small q once spent ~90 % of each step building CSR histories it never read), and
``mechanism=none``'s per-epoch ``lr_decay``."""

from __future__ import annotations

import json

import pytest
import torch

from dprec_torch.mechanisms.context import TrainingContext
from dprec_torch.mechanisms.sgd import MapSGD
from dprec_torch.models.batching import full_batch
from dprec_torch.models.mf import MF
from dprec_torch.training.run import setup_training, train
from tests.helpers import tiny_cfg, tiny_fold


def _cfg(tmp_path, *overrides):
    data = ["data=synthetic", "data.preset=tiny"]
    return tiny_cfg(*data, "device=cpu", "compare_baselines=false", "tensorboard=false", f"output_dir={tmp_path}",
                    *overrides)


@pytest.mark.parametrize("overrides,history", [
    (["model=mf", "mechanism=none"], False),
    (["model=mf", "mechanism=gaussian", "mechanism.unit=rating"], False),
    (["model=mf", "mechanism=gaussian", "mechanism.unit=user"], True),  # user level: targets = history
    (["model=pnbm", "mechanism=dpsgd", "mechanism.sampling_ratio=0.5"], True),
])
def test_the_runner_builds_histories_only_for_models_that_read_them(tmp_path, overrides, history):
    s = setup_training(_cfg(tmp_path, "epsilon=5", *overrides), tiny_fold(), torch.device("cpu"))
    batch = s.sampler.sample()
    assert s.sampler.history is history
    assert (batch.x is not None and batch.ind is not None) is history
    assert (not s.model.reads_history) is ("model=mf" in overrides)  # MF overrides BaseModel's True


@pytest.mark.parametrize("overrides", [
    ["mechanism=none", "epsilon=inf", "mechanism.sampling_ratio=0.2", "mechanism.epochs=3"],
    ["mechanism=gaussian", "epsilon=5", "mechanism.unit=rating", "mechanism.sampling_ratio=0.2", "mechanism.epochs=2", "noise_seed=0"],
    ["mechanism=dpsgd", "epsilon=5", "mechanism.sampling_ratio=0.2", "mechanism.epochs=2", "noise_seed=0"],
])
def test_skipping_the_history_changes_no_number(tmp_path, monkeypatch, overrides):
    """The same run with the histories built (as before the change) gives bit-identical metrics."""
    skip = train(_cfg(tmp_path / "skip", "model=mf", *overrides))
    monkeypatch.setattr(MF, "reads_history", True)
    built = train(_cfg(tmp_path / "built", "model=mf", *overrides))
    assert skip["test_rmse"] == built["test_rmse"] and skip["test_mae"] == built["test_mae"]
    assert json.dumps(skip["history"]) == json.dumps(built["history"])


def _one_epoch_updates(lr_decay: float, steps: int) -> list[float]:
    """|first-parameter change| of each step of MapSGD on a fixed gradient, 2 steps per epoch."""
    train_ = tiny_fold().train
    model = MF(train_.n_users, train_.n_items, dim=2, seed=0).attach(train_)
    ctx = TrainingContext(steps, 2, len(train_), train_.n_users, train_.scale, n_units=len(train_),
                          expected_batch_size=len(train_), gradient_reduction="mean")
    opt = MapSGD(model.parameters(), ctx, lr=0.5, weight_decay=0.0, beta=1.0, lr_decay=lr_decay)
    batch = full_batch(train_, train_.item_means())
    out = []
    for _ in range(steps):
        opt.zero_grad()
        model.surrogate_loss(batch, torch.ones(batch.n_targets)).backward()  # the same gradient every step
        before = model.global_bias.detach().clone()
        opt.step()
        out.append(float((model.global_bias.detach() - before).abs()))
    return out


def test_lr_decay_multiplies_the_step_once_per_epoch():
    const, decayed = _one_epoch_updates(1.0, 6), _one_epoch_updates(0.5, 6)
    assert const[0] > 0 and all(c == pytest.approx(const[0]) for c in const)
    assert decayed == pytest.approx([const[0], const[0], const[0] / 2, const[0] / 2, const[0] / 4, const[0] / 4])


def test_lr_decay_is_checked_where_every_number_is(tmp_path):
    from dprec_torch.config import check_config
    from dprec_torch.errors import ConfigError

    with pytest.raises(ConfigError, match="lr_decay"):
        check_config(_cfg(tmp_path, "model=mf", "mechanism=none", "mechanism.lr_decay=1.5"))
