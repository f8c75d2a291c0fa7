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
