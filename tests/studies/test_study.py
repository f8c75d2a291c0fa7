"""The two-stage study (scripts/study.py): stage 1 tunes on validation only, stage 2 trains exactly the choice, ledger charges tuning.

One tiny synthetic study (provable DPSGD-PNBM, 2 configurations x 2 epsilons, 2 folds) is shared by the tests;
every check reads the runs' own metrics.json / .hydra files, so a wrong selection or a stage 2 that
drifts from the chosen overrides fails.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

import dprec_torch.data.validation as validation
from dprec_torch.data.ratings import Fold
from dprec_torch.privacy.ledger import ledger_report
from dprec_torch.study.pipeline import run_stage1, run_study
from dprec_torch.training.run import train
from tests.helpers import tiny_cfg

EPSILONS = [1.0, 10.0]
FOLDS = [1, 2]
GRID = """# @package _global_
hydra:
  sweeper:
    params:
      mechanism.mean_shrinkage: choice(1.0, 64.0)
mechanism:
  epochs: 2
"""


def study_cfg(tmp: Path, *extra: str):
    (tmp / "grids" / "grid").mkdir(parents=True, exist_ok=True)
    (tmp / "grids" / "grid" / "dpsgd_pnbm_t.yaml").write_text(GRID)
    overrides = ["study=fig1", "dataset=synthetic", 'data_overrides=["preset=tiny"]', "search=t",
                 f"grid_root={tmp / 'grids'}", "study.epsilons=[1,10]", "study.methods=[{mechanism:dpsgd,model:pnbm}]",
                 'overrides=["device=cpu","baseline_k=20"]', f"folds=[{','.join(map(str, FOLDS))}]",
                 f"out={tmp / 'study'}", f"report={tmp / 'report'}", *extra]
    return tiny_cfg(*overrides, config_name="study")


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("study")
    run_study(study_cfg(tmp))
    return tmp


def jobs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("metrics.json"))


def job_overrides(job: Path) -> list[str]:
    return yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())


def test_stage1_picks_the_lowest_validation_rmse(study):
    selected = yaml.safe_load((study / "study" / "selected.yaml").read_text())["selected"]["dpsgd-pnbm"]
    stage1 = jobs(study / "study" / "stage1")
    assert len(stage1) == 2 * len(EPSILONS)
    for eps in EPSILONS:
        runs = [(json.loads((j / "metrics.json").read_text())["test_rmse"], j) for j in stage1
                if json.loads((j / "metrics.json").read_text())["epsilon"] == eps]
        assert len(runs) == 2 and runs[0][0] != runs[1][0]  # the choice matters
        best_rmse, best_job = min(runs, key=lambda r: r[0])
        choice = selected[f"{eps:g}"]
        assert choice["validation_rmse"] == pytest.approx(best_rmse, abs=0)
        assert Path(choice["run"]) == best_job
        wd = next(o for o in job_overrides(best_job) if o.startswith("mechanism.mean_shrinkage="))
        assert choice["overrides"] == [wd, "mechanism.epochs=2"]
        assert choice["n_configs"] == 2


def test_stage2_trains_exactly_the_chosen_overrides_on_every_fold(study):
    selected = yaml.safe_load((study / "study" / "selected.yaml").read_text())["selected"]["dpsgd-pnbm"]
    seen = set()
    for job in jobs(study / "study" / "stage2"):
        cfg = OmegaConf.load(job / ".hydra" / "config.yaml")
        metrics = json.loads((job / "metrics.json").read_text())
        assert metrics["data"] == "synthetic"  # the real train/test split
        eps = float(cfg.epsilon)
        chosen = selected[f"{eps:g}"]
        stage1_cfg = OmegaConf.load(Path(chosen["run"]) / ".hydra" / "config.yaml")
        for override in chosen["overrides"]:
            key, value = override.split("=", 1)
            assert OmegaConf.select(cfg, key) == yaml.safe_load(value) == OmegaConf.select(stage1_cfg, key)
        seen.add((eps, int(cfg.data.fold)))
    assert seen == {(e, f) for e in EPSILONS for f in FOLDS}
    report = (study / "report" / "report.md").read_text()
    assert "Stage 1: configuration chosen" in report and "dpsgd-pnbm" in report


def test_stage1_never_reads_the_test_split(study, monkeypatch, tmp_path):
    """Every stage-1 run scored a validation split; re-running one with the test split poisoned gives the same RMSE."""
    stage1 = jobs(study / "study" / "stage1")
    for job in stage1:
        assert json.loads((job / "metrics.json").read_text())["data"].endswith(validation.VALIDATION_SUFFIX)
        assert OmegaConf.load(job / ".hydra" / "config.yaml").data._target_.endswith("with_validation")

    class PoisonedFold(Fold):
        @property  # type: ignore[override]
        def test(self):
            raise AssertionError("stage 1 read the test split")

        @test.setter
        def test(self, value):
            pass

    original = validation.validation_fold
    monkeypatch.setattr(validation, "validation_fold",
                        lambda fold, *a, **k: original(PoisonedFold(fold.index, fold.train, fold.test, fold.name), *a, **k))
    job = stage1[0]
    overrides = [o for o in job_overrides(job) if not o.startswith(("hydra", "+grid"))]
    cfg = tiny_cfg(*overrides, "mechanism.epochs=2", f"output_dir={tmp_path}")
    assert train(cfg)["test_rmse"] == pytest.approx(json.loads((job / "metrics.json").read_text())["test_rmse"], rel=1e-6)


def test_ledger_charges_tuning_as_n_configs_times_epsilon(study):
    ledger = ledger_report(study / "study")
    (entry,) = ledger["entries"]  # one population: stage 1 (fold 1's validation split) and stage 2 (folds 1, 2)
    assert entry["data"] == "synthetic" and entry["folds"] == FOLDS
    tuning = {t["epsilon_nominal"]: t for t in entry["tuning"]}
    assert set(tuning) == set(EPSILONS)
    for eps, t in tuning.items():
        assert t["configs"] == 2 and t["epsilon_tuning"] == pytest.approx(2 * eps)
        assert "basic composition" in t["statement"] and "user level" in t["statement"]
    assert not any("TEST split" in w for w in entry["warnings"])  # one test run per (cell, fold)
    stage2 = [r for r in entry["per_run"] if not r["validation"]]
    assert len(stage2) == len(EPSILONS) * len(FOLDS)
    assert entry["epsilon_user_level"] == pytest.approx(sum(r["epsilon"] for r in entry["per_run"]))  # all composed


def test_ledger_says_nothing_is_defended_for_null_epsilon(tmp_path):
    for k in range(3):
        d = tmp_path / f"r{k}"
        d.mkdir()
        (d / "metrics.json").write_text(json.dumps({
            "data": "ml-100k" + validation.VALIDATION_SUFFIX, "mechanism": "dpsgd_paper", "model": "pnbm", "epsilon": 1.0,
            "test_rmse": 0.9, "folds": [{"fold": 1}], "privacy": {"epsilon": None, "relation": "rating"}}))
    (t,) = ledger_report(tmp_path)["entries"][0]["tuning"]
    assert t["configs"] == 3 and math.isinf(t["epsilon_tuning"]) and "none defended" in t["statement"]


@pytest.mark.skipif(importlib.util.find_spec("hydra_plugins.hydra_optuna_sweeper") is None,
                    reason="needs hydra-optuna-sweeper (dev extra)")
def test_optuna_stage1_two_trials(tmp_path):
    """``scripts/study.py sweeper=optuna n_trials=2``: the same search-space file, two TPE trials, the better one chosen."""
    cfg = study_cfg(tmp_path, "sweeper=optuna", "n_trials=2", "study.epsilons=[1]")
    choice = run_stage1(cfg, Path(cfg.out))["dpsgd-pnbm"][1.0]
    sweep = Path(cfg.out) / "stage1" / "dpsgd-pnbm" / "eps1"
    assert (sweep / "optimization_results.yaml").exists()
    runs = [json.loads((j / "metrics.json").read_text())["test_rmse"] for j in jobs(sweep)]
    assert len(runs) == 2 and choice.n_configs == 2
    assert choice.validation_rmse == min(runs)
