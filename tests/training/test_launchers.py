"""Sweeps past one process: Hydra multirun with the joblib launcher (local) and the submitit SLURM config."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import CONF_DIR, tiny_cfg

ROOT = Path(CONF_DIR).parent
TINY = ["data=synthetic", "device=cpu", "compare_baselines=false", "tensorboard=false", "mechanism.epochs=1"]


def has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def launcher_cfg(*overrides: str):
    return tiny_cfg(*overrides, return_hydra_config=True).hydra.launcher


@pytest.mark.skipif(not has("hydra_plugins.hydra_joblib_launcher"), reason="needs hydra-joblib-launcher (dev extra)")
def test_joblib_launcher_composes():
    cfg = launcher_cfg("hydra/launcher=joblib", "hydra.launcher.n_jobs=2")
    assert cfg._target_.endswith("JoblibLauncher") and cfg.n_jobs == 2


@pytest.mark.skipif(not has("hydra_plugins.hydra_submitit_launcher"), reason="needs hydra-submitit-launcher (dev extra)")
def test_slurm_config_composes_one_gpu_per_job():
    cfg = launcher_cfg("hydra/launcher=slurm", "hydra.launcher.partition=gpu")
    assert cfg._target_.endswith("SlurmLauncher")
    assert cfg.gpus_per_task == 1 and cfg.tasks_per_node == 1 and cfg.partition == "gpu"
    assert cfg.timeout_min > 0 and cfg.array_parallelism > 0


@pytest.mark.slow
@pytest.mark.skipif(not has("hydra_plugins.hydra_joblib_launcher"), reason="needs hydra-joblib-launcher (dev extra)")
def test_joblib_multirun_runs_two_jobs_in_parallel(tmp_path):
    """``python train.py -m hydra/launcher=joblib epsilon=1,5``: two jobs, both finished, overlapping in time.

    A job's lifetime is [its .hydra/config.yaml written, its metrics.json written]; a serial
    launcher would start the second job only after the first one's metrics.json exists.
    """
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [sys.executable, "train.py", "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "epsilon=1,5", *TINY,
         f"hydra.sweep.dir={sweep}"],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Joblib.Parallel(n_jobs=2" in proc.stdout + proc.stderr
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and (p / ".hydra").exists())
    assert len(jobs) == 2
    spans = []
    for job in jobs:
        metrics = job / "metrics.json"
        assert metrics.exists(), f"{job} has no metrics.json"
        spans.append(((job / ".hydra" / "config.yaml").stat().st_mtime, metrics.stat().st_mtime))
    (s0, e0), (s1, e1) = spans
    assert s0 < e1 and s1 < e0, f"jobs did not overlap: {spans}"
