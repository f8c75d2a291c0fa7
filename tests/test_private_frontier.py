"""experiments/studies/private_frontier.py: the experiment files it writes come from the tuning record only (issue 17)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _study():
    spec = importlib.util.spec_from_file_location("private_frontier_under_test", ROOT / "experiments" / "studies" / "private_frontier.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _cell(mech, rel, eps, rows):
    tried = [{"config": c, "rmse": r} for c, r in rows]
    return {"mechanism": mech, "relation": rel, "epsilon": eps, "tried": tried, "chosen": min(tried, key=lambda t: t["rmse"])["config"]}


TUNING = {"cells": {
    "noisy_gram/user/1": _cell("noisy_gram", "user", 1.0, [({"relation": "user", "estimator": "none"}, 0.97),
                                                            ({"relation": "user", "estimator": "knn", "count_weight": 0.5}, 0.96)]),
    "lowrank_dpsgd/user/1": _cell("lowrank_dpsgd", "user", 1.0, [({"dim": 8, "lr": 5.0}, 0.965)]),
    "noisy_gram/user/10": _cell("noisy_gram", "user", 10.0, [({"relation": "user", "estimator": "knn"}, 0.91)]),
    "lowrank_dpsgd/user/10": _cell("lowrank_dpsgd", "user", 10.0, [({"dim": 16, "lr": 5.0}, 0.89)]),
    "noisy_gram/rating/1": _cell("noisy_gram", "rating", 1.0, [({"relation": "rating", "estimator": "knn", "support": None}, 0.90)]),
    "noisy_gram/rating/10": _cell("noisy_gram", "rating", 10.0, [({"relation": "rating", "estimator": "lowrank"}, 0.89)]),
}}


def test_best_choice_is_the_lowest_validation_rmse_across_mechanisms():
    pf = _study()
    assert pf.best_choice(TUNING, "user", 1.0) == ("noisy_gram", {"relation": "user", "estimator": "knn", "count_weight": 0.5}, 0.96)
    assert pf.best_choice(TUNING, "user", 10.0)[0] == "lowrank_dpsgd"


def test_written_experiments_select_the_choice_and_compose(tmp_path, monkeypatch):
    pf = _study()
    monkeypatch.setattr(pf, "EXPERIMENTS", tmp_path)
    pf.write_experiments(TUNING)
    user = yaml.safe_load((tmp_path / "private_user.yaml").read_text())
    assert user["defaults"] == [{"override /model": "noisy_gram"}]
    assert user["model"] == {"relation": "user", "estimator": "knn", "count_weight": 0.5}
    text = (tmp_path / "private_user.yaml").read_text()
    assert "python train.py model=lowrank_dpsgd epsilon=10 data=ml-1m model.dim=16 model.lr=5.0" in text  # its own model file
    rating = yaml.safe_load((tmp_path / "private_rating.yaml").read_text())
    assert rating["model"]["support"] is None


def _fake_study(tmp_path, monkeypatch, pf, val_rmse):
    """A two-configuration grid on two fake folds; ``run_one`` returns ``val_rmse(config, fold, eps)``."""
    calls = []
    monkeypatch.setattr(pf, "OUT", tmp_path)
    monkeypatch.setattr(pf, "BASE", {("noisy_gram", "user"): {"relation": "user"}})
    monkeypatch.setattr(pf, "GRID", {("noisy_gram", "user"): [{"estimator": "none"}, {"estimator": "knn", "k": 5}]})
    monkeypatch.setattr(pf, "EPS", [1.0, 10.0])
    monkeypatch.setattr(pf, "LOADERS", {"ml-100k": lambda k: ("fold", k)})
    monkeypatch.setattr(pf, "validation_fold", lambda fold, frac, seed: ("val",) + fold)

    def run_one(mech, cfg, eps, fold, seed):
        calls.append((fold, cfg.get("estimator"), eps))
        return {"rmse": val_rmse(cfg, fold, eps), "fit_seconds": 0.0}

    monkeypatch.setattr(pf, "run_one", run_one)
    return calls


def test_each_fold_is_tuned_on_its_own_validation_split_and_tested_with_its_own_choice(tmp_path, monkeypatch):
    """Issue 17's protocol: hyperparameters from each fold's own validation split; a fold's test uses that fold's
    choice; rerunning reuses every saved result."""
    pf = _study()

    def val_rmse(cfg, fold, eps):  # fold 1 prefers knn, fold 2 prefers none; the test split scores 0.5 + fold
        if fold[0] == "val":
            return (0.9 if cfg["estimator"] == "knn" else 1.0) if fold[-1] == 1 else (1.0 if cfg["estimator"] == "knn" else 0.9)
        return 0.5 + fold[-1]

    calls = _fake_study(tmp_path, monkeypatch, pf, val_rmse)
    tuning = pf.tune("ml-100k", 2)
    assert {c[0] for c in calls} == {("val", "fold", 1), ("val", "fold", 2)}  # never a test split
    assert pf.chosen(tuning, "noisy_gram", "user", 1.0, "ml-100k", 1)["estimator"] == "knn"
    assert pf.chosen(tuning, "noisy_gram", "user", 1.0, "ml-100k", 2)["estimator"] == "none"
    res = pf.test(tuning, "ml-100k", 2)
    row = res["rows"]["noisy_gram/user/1"]
    assert row["folds"]["1"]["config"]["estimator"] == "knn" and row["folds"]["2"]["config"]["estimator"] == "none"
    assert row["mean"] == 2.0 and row["n_folds"] == 2
    calls.clear()
    pf.test(pf.tune("ml-100k", 2), "ml-100k", 2)
    assert calls == []  # everything reused
