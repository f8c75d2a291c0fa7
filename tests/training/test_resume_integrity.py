"""Resume refuses what it cannot trust; evaluation restores what was released; diagnostics stay out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dprec_torch.errors import ConfigError
from dprec_torch.training.evaluate import evaluate_run
from dprec_torch.training import trainer as trainer_mod
from dprec_torch.training.checkpoint import config_differences
from dprec_torch.training.run import train
from tests.helpers import CONF_DIR, tiny_cfg

ROOT = Path(CONF_DIR).parent
BASE = ["data=synthetic", "device=cpu", "compare_baselines=false", "tensorboard=false"]
PROVABLE = ["model=pnbm", "mechanism=dpsgd_l1", "mechanism.epochs=2", "noise_seed=0"]  # a reproducible noise seed: resumed == uninterrupted


def run(out: Path, *overrides: str) -> dict:
    cfg = tiny_cfg(*BASE, f"output_dir={out}", *overrides)
    return train(cfg)


def killed_after_epoch_1(tmp_path: Path, monkeypatch, *args: str) -> Path:
    """A run killed during epoch 2: its dir holds config_resolved.json and the epoch-1 checkpoint."""
    original = trainer_mod.Trainer._epoch_metrics

    def kill(self, epoch, fold, train_rmse):
        if epoch == 2:
            raise KeyboardInterrupt("simulated kill")
        return original(self, epoch, fold, train_rmse)

    monkeypatch.setattr(trainer_mod.Trainer, "_epoch_metrics", kill)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, *args, "resume=true")  # asks to be resumable: a checkpoint every epoch (checkpoint_every=auto)
    monkeypatch.setattr(trainer_mod.Trainer, "_epoch_metrics", original)
    assert (tmp_path / "checkpoint_fold1.pt").exists()
    return tmp_path


# ---------------------------------------------------------------- resume refuses a changed config
def test_resume_with_another_epsilon_is_refused_and_keeps_the_recorded_config(tmp_path, monkeypatch):
    """Old code: trained at 20, resumed at 5, recorded epsilon 5 silently."""
    out = killed_after_epoch_1(tmp_path, monkeypatch, *PROVABLE, "epsilon=20")
    recorded = (out / "config_resolved.json").read_text()
    ckpt_bytes = (out / "checkpoint_fold1.pt").read_bytes()
    with pytest.raises(ConfigError, match=r"resume=true refused.*epsilon \(20(\.0)? -> 5(\.0)?\).*mechanism\.epsilon") as err:
        run(out, *PROVABLE, "epsilon=5", "resume=true")
    assert "\n" not in str(err.value)
    assert (out / "config_resolved.json").read_text() == recorded  # compared BEFORE it is rewritten
    assert (out / "checkpoint_fold1.pt").read_bytes() == ckpt_bytes
    assert not (out / "metrics.json").exists()


def test_the_checkpoint_carries_its_own_config(tmp_path, monkeypatch):
    """Without config_resolved.json the checkpoint's copy of the config still refuses a changed one."""
    out = killed_after_epoch_1(tmp_path, monkeypatch, *PROVABLE, "epsilon=20")
    (out / "config_resolved.json").unlink()
    with pytest.raises(ConfigError, match=r"checkpoint_fold1.pt: .*mechanism\.clip_norm"):
        run(out, *PROVABLE, "epsilon=20", "mechanism.clip_norm=3", "resume=true")


def test_resume_with_only_resume_safe_keys_changed_continues(tmp_path, monkeypatch):
    out = killed_after_epoch_1(tmp_path, monkeypatch, *PROVABLE, "epsilon=4")
    full = run(tmp_path / "full", *PROVABLE, "epsilon=4")
    resumed = run(out, *PROVABLE, "epsilon=4", "resume=true", "log_private_diagnostics=true", "device=cpu")
    assert resumed["test_rmse"] == full["test_rmse"]
    assert resumed["privacy"]["epsilon_spent"] == full["privacy"]["epsilon_spent"]


@pytest.mark.parametrize("mechanism", ["dpsgd_l1", "sgld", "gaussian_pnbm"])
def test_a_resume_restores_the_dp_item_means_and_never_releases_them_again(tmp_path, monkeypatch, mechanism):
    """The checkpoint restores what prepare() made (r_bar, the fallback, the release record); prepare()
    is not called again. Secret noise, so a second release would differ from the first."""
    from dprec_torch.mechanisms.base import MechanismOptimizer

    args = (f"mechanism={mechanism}", "mechanism.epochs=2", "epsilon=2", "mechanism.sampling_ratio=1.0")
    out = killed_after_epoch_1(tmp_path, monkeypatch, *args)
    saved = torch.load(out / "checkpoint_fold1.pt", weights_only=False)
    calls = []
    monkeypatch.setattr(MechanismOptimizer, "prepare", lambda self, model: calls.append(type(self).__name__))
    resumed = run(out, *args, "resume=true")
    assert calls == []
    release = saved["optimizer"]["mean_release"]
    assert resumed["privacy"]["item_means"]["global_mean"] == release.global_mean  # the recorded release, not a new one
    final = torch.load(out / "checkpoint_fold1.pt", weights_only=False)
    assert torch.equal(final["model"]["item_means"], saved["model"]["item_means"])
    assert final["model"]["_extra_state"]["fallback"]["global_mean"] == release.global_mean


def test_a_checkpoint_without_the_release_record_is_refused(tmp_path, monkeypatch):
    out = killed_after_epoch_1(tmp_path, monkeypatch, *PROVABLE, "epsilon=4")
    ckpt = torch.load(out / "checkpoint_fold1.pt", weights_only=False)
    del ckpt["optimizer"]["mean_release"]  # a checkpoint from before the release record
    torch.save(ckpt, out / "checkpoint_fold1.pt")
    with pytest.raises(ConfigError, match="holds no record of ClippedLaplaceDPSGD's DP item-mean release"):
        run(out, *PROVABLE, "epsilon=4", "resume=true")


def test_config_differences_ignore_only_safe_keys():
    old = {"epsilon": 20.0, "resume": False, "device": "cuda", "output_dir": "a", "mechanism": {"lr": 0.1}}
    new = {"epsilon": 20.0, "resume": True, "device": "cpu", "output_dir": "b", "mechanism": {"lr": 0.2, "x": 1}}
    assert config_differences(old, new) == ["mechanism.lr", "mechanism.x"]
    assert config_differences({"epsilon": float("inf")}, {"epsilon": "inf"}) == []  # as config_resolved.json stores it


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_a_damaged_checkpoint_gives_one_line_and_is_not_overwritten(tmp_path, monkeypatch, damage):
    out = killed_after_epoch_1(tmp_path, monkeypatch, *PROVABLE)
    path = out / "checkpoint_fold1.pt"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"not a checkpoint" * 10)
    damaged = path.read_bytes()
    with pytest.raises(ConfigError, match=r"checkpoint .*checkpoint_fold1.pt is truncated or corrupt .*delete it") as err:
        run(out, *PROVABLE, "resume=true")
    assert "\n" not in str(err.value)
    assert path.read_bytes() == damaged


def test_cli_refuses_a_corrupt_checkpoint_with_one_line(tmp_path, monkeypatch):
    out = killed_after_epoch_1(tmp_path, monkeypatch, *PROVABLE)
    (out / "checkpoint_fold1.pt").write_bytes(b"\0" * 100)
    proc = subprocess.run([sys.executable, "train.py", *BASE, *PROVABLE, "resume=true", f"hydra.run.dir={out}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    text = proc.stderr + proc.stdout
    assert proc.returncode == 2 and "Traceback" not in text
    assert "checkpoint_fold1.pt is truncated or corrupt" in text and "hydra.run.dir" in text


# ------------------------------------------------------------- evaluate scores the released model
@pytest.mark.parametrize("mechanism", ["dpsgd_l1", "gaussian"])
def test_evaluate_run_scores_exactly_the_released_private_model(tmp_path, monkeypatch, mechanism):
    """Old code: evaluate re-attached the model, replacing the DP item means by the exact training means."""
    from dprec_torch.models.pnbm import PNBM

    m = run(tmp_path, f"mechanism={mechanism}", "model=pnbm", "epsilon=2", "mechanism.epochs=1")
    assert not (tmp_path / "checkpoint_fold1.pt").exists()  # evaluation reads the release
    released = torch.load(tmp_path / "release_fold1.pt", weights_only=True)["state"]["item_means"]

    seen = {}
    original_restore = PNBM.restore

    def spy(self, train, state):
        out = original_restore(self, train, state)
        seen["item_means"] = self.item_means.clone()
        return out

    def no_attach(self, train):
        raise AssertionError("evaluate_run must restore the released model, not rebuild it from the data")

    monkeypatch.setattr(PNBM, "restore", spy)
    monkeypatch.setattr(PNBM, "attach", no_attach)
    ev, _ = evaluate_run(tmp_path, torch.device("cpu"), compare_baselines=False)
    assert ev["test_rmse"] == m["test_rmse"] and ev["test_mae"] == m["test_mae"]
    assert torch.equal(seen["item_means"], released)
    assert "baselines" not in ev  # compare_baselines=false leaves the references out


def test_evaluate_run_restores_a_topk_support_without_refitting(tmp_path, monkeypatch):
    import dprec_torch.models.pnbm_topk as topk

    m = run(tmp_path, "mechanism=none", "epsilon=inf", "model=pnbm_topk", "model.sparse_k=8", "mechanism.epochs=1")

    def no_support(*args, **kwargs):
        raise AssertionError("the support is released state: restore must not recompute it")

    monkeypatch.setattr(topk, "pcc_support", no_support)
    monkeypatch.setattr("dprec_torch.evaluation.baselines.baseline_metrics", lambda *a, **k: None)
    monkeypatch.setattr("dprec_torch.training.evaluate.reference_metrics",
                        lambda fold, k, target, seed: {n: {"rmse": 1.0, "mae": 1.0} for n in ("PCC", "COS")})
    ev, _ = evaluate_run(tmp_path, torch.device("cpu"))
    assert ev["test_rmse"] == m["test_rmse"]


# ------------------------------------------------------------ diagnostics stay out of provable runs
def test_provable_runs_keep_non_private_diagnostics_out(tmp_path):
    m = run(tmp_path, *PROVABLE, "compare_baselines=true", "baseline_k=20")
    saved = json.loads((tmp_path / "metrics.json").read_text())
    rows = saved["history"]["1"]
    assert rows and all("train_rmse" not in r and "grad_norm" not in r for r in rows)
    # the references are test metrics like the model's own, reported for every run, and labelled
    assert {"PCC", "COS"} <= set(saved["baselines"]) and saved["baselines"] == json.loads(json.dumps(m["baselines"]))
    scope = saved["privacy"]["scope"]
    assert any("NON-PRIVATE" in s and "PCC/COS" in s for s in scope["not_covered"])
    assert scope["non_private_diagnostics_logged"] is False
    covers = " ".join(scope["epsilon_covers"])
    assert "S" in covers and "item means" in covers  # PNBM: parameters and the DP item means
    assert any("test metrics" in s for s in scope["not_covered"])
    assert any("checkpoint" in s for s in scope["not_covered"])


def test_diagnostics_on_request_and_by_default_without_a_finite_epsilon(tmp_path):
    on = run(tmp_path / "on", *PROVABLE, "log_private_diagnostics=true", "compare_baselines=true", "baseline_k=20")
    assert "train_rmse" in on["history"][1][0] and "grad_norm" in on["history"][1][0] and "baselines" in on
    assert any(s.startswith("train_rmse") for s in on["privacy"]["scope"]["not_covered"])
    none = run(tmp_path / "none", "mechanism=none", "epsilon=inf", "mechanism.epochs=1")
    assert "train_rmse" in none["history"][1][0]
    assert none["privacy"]["scope"]["epsilon_covers"] == [] and none["privacy"]["scope"]["non_private_diagnostics_logged"]
    with pytest.raises(ConfigError, match="log_private_diagnostics"):
        run(tmp_path / "bad", *PROVABLE, "log_private_diagnostics=maybe")


def test_tensorboard_carries_no_non_private_scalars_by_default(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from dprec_torch.training.tb_close import wait_closed

    def tags(out: Path) -> set:
        wait_closed()  # train() closes the writer in the background; dprec_torch.train() waits, train(cfg) does not
        acc = EventAccumulator(str(out / "tb" / "fold1"))
        acc.Reload()
        return set(acc.Tags()["scalars"])

    run(tmp_path / "off", *PROVABLE, "tensorboard=true")
    run(tmp_path / "on", *PROVABLE, "tensorboard=true", "log_private_diagnostics=true")
    off, on = tags(tmp_path / "off"), tags(tmp_path / "on")
    assert "test/test_rmse" in off and "mechanism/epsilon_spent" in off
    assert not {"train/train_rmse", "mechanism/grad_norm"} & off
    assert {"train/train_rmse", "mechanism/grad_norm"} <= on
