"""The sweep report regenerates from a tiny synthetic sweep and matches the runs' metrics.json."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from dprec_torch.errors import ConfigError
from dprec_torch.study.report import build_report
from dprec_torch.training.run import train
from tests.helpers import tiny_cfg


def test_report_matches_runs(tmp_path):
    sweep = tmp_path / "sweep"
    for k, (mech, eps) in enumerate([("dpsgd", "1"), ("dpsgd", "10"), ("none", "inf")]):
        for seed in (0, 1):
            train(tiny_cfg("data=synthetic", "device=cpu", "tensorboard=false", "compare_baselines=true", f"seed={seed}",
                           f"mechanism={mech}", f"epsilon={eps}", "mechanism.epochs=1", "baseline_k=20",
                           f"output_dir={sweep}/{k}_{seed}"))
    build_report(sweep)
    rows = list(csv.DictReader(open(sweep / "report.csv")))
    assert len(rows) == 3
    for r in rows:
        runs = [json.loads(p.read_text()) for p in sweep.rglob("metrics.json")]
        mine = [m["test_rmse"] for m in runs if f"{m['mechanism']}-{m['model']}" == r["method"] and float(m["epsilon"]) == float(r["epsilon"])]
        assert len(mine) == 2
        assert float(r["rmse_mean"]) == pytest.approx(np.mean(mine))
    md = (sweep / "report.md").read_text()
    assert "PCC (non-private reference)" in md and "dpsgd-pnbm" in md
    assert "Privacy ledger" in md and (sweep / "ledger.json").exists()
    assert (sweep / "rmse_vs_epsilon_synthetic.png").stat().st_size > 1000


def test_report_on_empty_dir_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="no metrics.json"):
        build_report(tmp_path)
