"""Custom data: a provable mechanism needs a DECLARED rating scale.

An inferred scale is the data's own min/max, and it feeds every clamp and sensitivity, so a run
that reports a finite epsilon on it must stop with one line naming ``data.rating_scale``.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dprec_torch.data.custom import SCALE_SOURCE, check_scale_declared, load_custom
from dprec_torch.errors import ConfigError
from dprec_torch.training.run import train
from tests.helpers import tiny_cfg

BASE = ["data=custom", "model=mf", "device=cpu", "compare_baselines=false", "tensorboard=false", "mechanism.epochs=1",
        "model.dim=2"]


def ratings_file(tmp_path: Path) -> Path:
    lines = [f"{u},{i},{1 + (u * 7 + i * 3) % 4}" for u in range(30) for i in range(12) if (u + i) % 3]
    path = tmp_path / "ratings.csv"
    path.write_text("\n".join(lines) + "\n")  # ratings 1..4 only: an inferred scale would be [1, 4]
    return path


def run(tmp_path: Path, *overrides: str) -> dict:
    cfg = tiny_cfg(*BASE, f"data.path={ratings_file(tmp_path)}", f"output_dir={tmp_path / 'out'}", *overrides)
    return train(cfg)


def test_loader_records_where_the_scale_came_from(tmp_path):
    path = ratings_file(tmp_path)
    inferred = load_custom(path=str(path))
    declared = load_custom(path=str(path), rating_scale=[1, 5])
    assert inferred.report[SCALE_SOURCE] == "inferred" and (inferred.scale.lo, inferred.scale.hi) == (1.0, 4.0)
    assert declared.report[SCALE_SOURCE] == "declared" and declared.scale.hi == 5.0
    assert inferred.folds[0].train.meta[SCALE_SOURCE] == "inferred"
    assert declared.folds[0].train.meta[SCALE_SOURCE] == "declared"
    train = inferred.folds[0].train
    with pytest.raises(ConfigError, match=r"data.rating_scale=\[1,4\]"):
        check_scale_declared(train, {"mechanism": "x", "epsilon": 1.0})
    with pytest.raises(ConfigError, match="inferred"):
        check_scale_declared(train, {"mechanism": "laplace_output", "epsilon": 0.0, "epsilon_per_query": 0.5})
    check_scale_declared(train, {"epsilon": math.inf})  # non-private: nothing is claimed
    check_scale_declared(train, {"epsilon": None})  # nothing defended (paper-faithful forms)
    check_scale_declared(declared.folds[0].train, {"epsilon": 1.0})


def test_provable_mechanism_refuses_an_inferred_scale(tmp_path):
    with pytest.raises(ConfigError, match="data.rating_scale") as err:
        run(tmp_path, "mechanism=gaussian", "epsilon=1")
    assert "\n" not in str(err.value)
    m = run(tmp_path, "mechanism=gaussian", "epsilon=1", "data.rating_scale=[1,5]")
    assert math.isfinite(m["privacy"]["epsilon"])
    assert math.isfinite(run(tmp_path, "mechanism=none", "epsilon=inf")["test_rmse"])  # non-private: allowed
