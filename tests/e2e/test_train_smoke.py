"""Compose the real Hydra config, shrink it, run train(): smoke, resume, and bad-input handling."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dprec_torch.errors import ConfigError, DprecError
from dprec_torch.training import trainer as trainer_mod
from dprec_torch.training.run import train
from tests.helpers import CONF_DIR, kill_in_epoch, tiny_cfg

pytestmark = pytest.mark.e2e  # whole runs: -m e2e selects them, -m 'not e2e' leaves them out

ROOT = Path(CONF_DIR).parent
BASE = ["data=synthetic", "device=cpu", "compare_baselines=false", "tensorboard=false"]


def run(tmp_path: Path, *overrides: str) -> dict:
    cfg = tiny_cfg(*BASE, f"output_dir={tmp_path}", *overrides)
    return train(cfg)


@pytest.mark.parametrize("mechanism,eps", [("none", "inf"), ("dpsgd", "5"), ("sgld", "20")])
def test_one_epoch_smoke(tmp_path, mechanism, eps):
    m = run(tmp_path, f"mechanism={mechanism}", f"epsilon={eps}", "mechanism.epochs=1")
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["test_rmse"] == pytest.approx(m["test_rmse"])
    assert 0 < m["test_rmse"] < 2.5 and m["epochs"] == 1
    assert {"fold", "test_rmse", "test_mae", "fit_seconds"} <= set(m["folds"][0])
    assert m["privacy"]["mechanism"].startswith(mechanism)
    assert {"epsilon_covers", "not_covered", "non_private_diagnostics_logged"} <= set(m["privacy"]["scope"])
    assert (tmp_path / "release_fold1.pt").exists() and (tmp_path / "config_resolved.json").exists()
    # the checkpoint holds the secret noise key: a private run deletes it at its end
    assert (tmp_path / "checkpoint_fold1.pt").exists() == (mechanism == "none")
    if mechanism == "sgld":  # the default low-rank PNBM: the accounted chain's figure, at most the typed epsilon
        assert m["privacy"]["epsilon_nominal"] == 20 and 0.99 * 20 <= m["privacy"]["epsilon"] <= 20


def test_nonprivate_pnbm_beats_item_mean(tmp_path):
    m = run(tmp_path, "model=pnbm", "mechanism=none", "epsilon=inf", "mechanism.epochs=3", "model.floor_c=1")
    from dprec_torch.data.synthetic import load_synthetic

    fold = load_synthetic(preset="tiny").folds[0]
    item_mean = fold.train.item_means()[fold.test.items]
    base = float(torch.sqrt(((item_mean - fold.test.values) ** 2).mean()))
    assert m["test_rmse"] < base


@pytest.mark.parametrize("mechanism", ["dpsgd", "dpsgd_paper"])  # dpsgd_paper: DPSGDLaplace, whose accountant was lost
def test_resume_matches_uninterrupted_run(tmp_path, monkeypatch, mechanism):
    args = ["model=pnbm", f"mechanism={mechanism}", "epsilon=2", "mechanism.epochs=3", "mechanism.sampling_ratio=0.5", "noise_seed=0"]
    full = run(tmp_path / "full", *args)

    original = kill_in_epoch(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "killed", *args, "resume=true")  # asks to be resumable: a checkpoint every epoch (checkpoint_every=auto)
    monkeypatch.setattr(trainer_mod.Trainer, "_epoch_metrics", original)
    resumed = run(tmp_path / "killed", *args, "resume=true")
    assert resumed["test_rmse"] == full["test_rmse"]
    assert [h["test_rmse"] for h in resumed["history"][1]] == [h["test_rmse"] for h in full["history"][1]]
    # the accountant survives the checkpoint: the epsilon spent after every epoch and the report match
    assert [h["epsilon_spent"] for h in resumed["history"][1]] == [h["epsilon_spent"] for h in full["history"][1]]
    assert resumed["privacy"] == full["privacy"]


def test_seed_reproducible_and_seed_sensitive(tmp_path):
    args = ["mechanism=dpsgd", "epsilon=1", "mechanism.epochs=1"]
    a = run(tmp_path / "a", *args, "seed=1", "noise_seed=1")
    b = run(tmp_path / "b", *args, "seed=1", "noise_seed=1")
    c = run(tmp_path / "c", *args, "seed=2", "noise_seed=2")
    assert a["test_rmse"] == b["test_rmse"] and a["test_rmse"] != c["test_rmse"]


@pytest.mark.parametrize("eps", ["0", "-1"])
def test_nonpositive_epsilon_is_a_config_error(tmp_path, eps):
    with pytest.raises(ConfigError, match=r"epsilon.*(must be > 0|\(0, inf\])"):
        run(tmp_path, f"epsilon={eps}")


def test_cli_bad_input_gives_one_line_and_nonzero_exit(tmp_path):
    proc = subprocess.run(
        [sys.executable, "train.py", "epsilon=-1", *BASE, f"hydra.run.dir={tmp_path}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2
    assert re.search(r"epsilon.*(must be > 0|\(0, inf\])", proc.stderr + proc.stdout)
    assert "Traceback" not in proc.stderr + proc.stdout


def test_cli_missing_custom_file(tmp_path):
    proc = subprocess.run(
        [sys.executable, "train.py", *BASE, "data=custom", f"data.path={tmp_path}/nope.csv", "model=pcc",
         f"hydra.run.dir={tmp_path}/run"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2 and "nope.csv" in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr + proc.stdout


def test_dprec_error_is_user_facing():
    assert issubclass(ConfigError, DprecError)


@pytest.mark.parametrize("path", ["fused", "separate", "checked at the epoch's end"])
def test_nan_stops_run_and_keeps_last_good_checkpoint(tmp_path, monkeypatch, path):
    """The second training step's predictions turn NaN, on the fused CPU step (PNBM.fused_step) or the separate one,
    or with the loss checked once an epoch (as on an accelerator)."""
    from dprec_torch.training import trainer as trainer_mod
    from dprec_torch.errors import TrainingDiverged
    from dprec_torch.models.pnbm import PNBM

    calls = {"n": 0}
    original, original_fused = PNBM.batch_predict, PNBM.fused_step

    def poisoned(self, batch):
        calls["n"] += 1
        out = original(self, batch)
        return out * float("nan") if calls["n"] == 2 else out

    def poisoned_fused(self, batch, target, bound):
        out = original_fused(self, batch, target, bound)
        assert out is not None, "the fused step should apply to model=pnbm mechanism=none on the CPU"
        calls["n"] += 1
        return tuple(t * float("nan") for t in out) if calls["n"] == 2 else out

    if path == "fused":
        monkeypatch.setattr(PNBM, "fused_step", poisoned_fused)
    else:
        monkeypatch.setattr(PNBM, "fused_step", lambda self, batch, target, bound: None)
        monkeypatch.setattr(PNBM, "batch_predict", poisoned)
    if path.startswith("checked"):
        monkeypatch.setattr(trainer_mod, "loss_checked_each_step", lambda sq: False)
    with pytest.raises(TrainingDiverged, match="training loss became NaN"):  # the loss check, not the parameters'
        run(tmp_path, "model=pnbm", "mechanism=none", "epsilon=inf", "mechanism.epochs=3", "checkpoint_every=1")
    assert calls["n"] >= 2
    ckpt = torch.load(tmp_path / "checkpoint_fold1.pt", weights_only=False)
    assert ckpt["epoch"] == 1 and torch.isfinite(ckpt["model"]["S"]).all()
