"""One-epoch Hydra smoke runs of model=mf under every mechanism (real config, tiny synthetic data)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from dprec_torch.mechanisms.gaussian import GaussianDPSGD
from dprec_torch.training.run import train
from tests.helpers import CONF_DIR, tiny_cfg, tiny_fold

pytestmark = pytest.mark.filterwarnings("ignore:Optimal order is the largest alpha")

BASE = ["model=mf", "device=cpu", "compare_baselines=false", "tensorboard=false", "mechanism.epochs=1"]
DATA = ["data=synthetic"] if (Path(CONF_DIR) / "data" / "synthetic.yaml").exists() else [
    "data._target_=dprec_torch.data.synthetic.load_synthetic", "data.name=synthetic", "+data.preset=tiny"]


def run(tmp_path: Path, *overrides: str) -> dict:
    cfg = tiny_cfg(*DATA, *BASE, f"output_dir={tmp_path}", *overrides)
    return train(cfg)


def global_mean_rmse() -> float:
    fold = tiny_fold()
    return float(torch.sqrt(((fold.train.global_mean - fold.test.values) ** 2).mean()))


def check_common(m: dict, epochs: int = 1) -> None:
    assert m["model"] == "mf" and m["epochs"] == epochs
    assert math.isfinite(m["test_rmse"]) and 0 < m["test_rmse"] < 4
    assert {"mechanism", "relation", "epsilon", "analysis"} <= set(m["privacy"])


def test_none(tmp_path):
    # lr is a per-example step on the mean over the expected batch B = q n: on the tiny data (n = 7200) the
    # ML-100K per-rating step lr / B needs ML-100K's B ~ 1,600, i.e. q = 0.2 (docs/mf.md)
    m = run(tmp_path, "mechanism=none", "epsilon=inf", "mechanism.sampling_ratio=0.2", "mechanism.epochs=5")
    check_common(m, epochs=5)
    assert m["test_rmse"] < global_mean_rmse()
    assert m["privacy"]["epsilon"] == math.inf


def test_dpsgd_mf(tmp_path):
    m = run(tmp_path, "mechanism=dpsgd_paper", "epsilon=5")  # DPSGD-MF (Berlioz), the paper-faithful form
    check_common(m)
    rep = m["privacy"]
    assert rep["mechanism"].startswith("dpsgd-mf") and rep["relation"].startswith("rating")
    assert rep["epsilon"] == 5.0 and rep["delta"] == 0.0  # full passes: pure eps
    assert rep["max_visits_per_rating"] == 1 and rep["sensitivity"]["delta_r"] == 4.0


def test_dpps_mf(tmp_path):
    m = run(tmp_path, "mechanism=sgld", "epsilon=20")
    check_common(m)
    rep = m["privacy"]
    assert rep["relation"] == "user" and rep["temperature"] == 1.0
    assert rep["epsilon"] is None  # the chain's delta is not established
    assert rep["epsilon_if_exact_sample"] == pytest.approx(20.0)  # rho = 1: an exact sample would deliver the nominal
    assert rep["sensitivity"]["log_likelihood_bound_B"] == pytest.approx(16 * 200)


def test_gaussian_rating(tmp_path):
    m = run(tmp_path, "mechanism=gaussian", "epsilon=5")
    check_common(m)
    rep = m["privacy"]
    assert rep["relation"] == "rating" and rep["accountant"] == "opacus rdp" and rep["delta"] == 1e-6
    assert 4.9 <= rep["epsilon"] <= 5.0 and rep["epsilon_spent"] == pytest.approx(rep["epsilon"])
    assert rep["noise"]["std"] == pytest.approx(rep["noise"]["noise_multiplier"] * rep["sensitivity"]["clip_norm"])
    assert rep["steps"] == rep["steps_taken"] == 10  # epochs=1, q=0.1
    assert m["test_rmse"] < global_mean_rmse() + 0.3


def test_gaussian_user(tmp_path, monkeypatch):
    # run.py picks the sampler from the class attribute; until it reads mechanism.unit, emulate that here
    monkeypatch.setattr(GaussianDPSGD, "relation", "user")
    m = run(tmp_path, "mechanism=gaussian", "mechanism.unit=user", "epsilon=5")
    check_common(m)
    rep = m["privacy"]
    assert rep["relation"] == "user" and "user's whole profile" in rep["guarantee"]
    assert 4.9 <= rep["epsilon"] <= 5.0


def test_gaussian_prv_accountant(tmp_path):
    m = run(tmp_path, "mechanism=gaussian", "mechanism.accountant=prv", "epsilon=5")
    assert m["privacy"]["accountant"] == "opacus prv" and m["privacy"]["epsilon"] <= 5.0


def test_gaussian_resume_restores_the_accountant(tmp_path, monkeypatch):
    from dprec_torch.training import trainer as trainer_mod

    args = ["mechanism=gaussian", "mechanism.noise_multiplier=1.0", "mechanism.epochs=2", "mechanism.sampling_ratio=0.25",
            "noise_seed=0"]
    full = run(tmp_path / "full", *args)
    original = trainer_mod.Trainer._epoch_metrics

    def killed_in_epoch_2(self, epoch, fold, train_rmse):
        if epoch == 2:
            raise KeyboardInterrupt("simulated kill")
        return original(self, epoch, fold, train_rmse)

    monkeypatch.setattr(trainer_mod.Trainer, "_epoch_metrics", killed_in_epoch_2)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "killed", *args, "resume=true")  # asks to be resumable: a checkpoint every epoch
    monkeypatch.setattr(trainer_mod.Trainer, "_epoch_metrics", original)
    resumed = run(tmp_path / "killed", *args, "resume=true")
    assert resumed["test_rmse"] == full["test_rmse"]
    assert resumed["privacy"]["epsilon_spent"] == full["privacy"]["epsilon_spent"]
    assert resumed["privacy"]["steps_taken"] == full["privacy"]["steps_taken"] == 8
