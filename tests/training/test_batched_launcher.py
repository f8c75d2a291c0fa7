"""``hydra/launcher=batched``: one process per group of jobs sharing data; each job's numbers are a separate run's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

from dprec_torch import sweep_cache
from dprec_torch.training.run import train
from tests.helpers import CONF_DIR, tiny_cfg

ROOT = Path(CONF_DIR).parent
TINY = ["data=synthetic", "device=cpu", "mechanism.epochs=1", "mechanism.sampling_ratio=0.2", "baseline_k=50",
        "log_private_diagnostics=true", "noise_seed=0"]  # explicit noise seed: batched and per-process jobs draw the same noise
# 8 jobs, 2 groups (the data config holds seed: ${seed}); a private and a non-private mechanism in each group
SWEEP = ["mechanism=none,gaussian", "epsilon=1,5", "seed=0,1"]
TIMING = ("fit_seconds", "seconds_per_epoch", "train_seconds", "epoch_seconds", "seconds_per_epoch_after_first")


def without_timing(obj):
    """metrics.json minus wall-clock fields (the only thing a separate run may change)."""
    if isinstance(obj, dict):
        return {k: without_timing(v) for k, v in obj.items() if k not in TIMING}
    if isinstance(obj, list):
        return [without_timing(v) for v in obj]
    return obj


def test_batched_launcher_is_a_discoverable_hydra_plugin():
    """Hydra finds launchers by scanning the ``hydra_plugins`` namespace package; the config names the class."""
    from hydra.core.plugins import Plugins
    from hydra.plugins.launcher import Launcher

    names = {f"{c.__module__}.{c.__name__}" for c in Plugins.instance().discover(Launcher)}
    target = tiny_cfg("hydra/launcher=batched", return_hydra_config=True).hydra.launcher._target_
    assert target == "hydra_plugins.dprec_batched_launcher.batched_launcher.BatchedLauncher"
    assert target in names


def test_plugin_module_imports_no_torch():
    """Hydra imports every ``hydra_plugins`` module at start-up of every app: the launcher must stay cheap."""
    code = ("import sys, hydra_plugins.dprec_batched_launcher.batched_launcher; "
            "assert 'torch' not in sys.modules and 'dprec_torch' not in sys.modules, sorted(sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_jobs_group_by_resolved_data_model_and_device():
    from hydra_plugins.dprec_batched_launcher.batched_launcher import group_jobs

    overrides = [["epsilon=1", "seed=0"], ["epsilon=5", "seed=0"], ["epsilon=1", "seed=1"],  # seed -> data.seed
                 ["epsilon=1", "seed=0", "data.preset=ml-100k"], ["epsilon=1", "seed=0", "model=mf"],
                 ["epsilon=20", "seed=0", "mechanism=none"]]
    cfgs = [tiny_cfg("data=synthetic", *o) for o in overrides]
    assert group_jobs(cfgs, ["data", "model._target_", "device"]) == [[0, 1, 5], [2], [3], [4]]
    assert group_jobs(cfgs, ["device"]) == [[0, 1, 2, 3, 4, 5]]


def test_shared_builds_once_inside_sharing_and_every_time_outside():
    data = OmegaConf.create({"name": "x", "seed": 0})
    calls = []

    def build():
        calls.append(1)
        return object()

    a, b = sweep_cache.shared("dataset", data, build), sweep_cache.shared("dataset", data, build)
    assert a is not b and len(calls) == 2  # a plain run never caches
    with sweep_cache.sharing() as cache:
        c = sweep_cache.shared("fold", data, build, 1, "cpu")
        assert sweep_cache.shared("fold", data, build, 1, "cpu") is c
        assert sweep_cache.shared("fold", data, build, 2, "cpu") is not c  # extra keys matter
        assert sweep_cache.shared("fold", OmegaConf.create({"name": "x", "seed": 1}), build, 1, "cpu") is not c
    assert cache.stats() == {"built": {"fold": 3}, "reused": {"fold": 1}}
    assert sweep_cache.active() is None


def test_batched_sweep_gives_separate_run_numbers_and_one_run_dir_per_job(tmp_path, monkeypatch):
    """``python train.py -m ... hydra/launcher=batched``: same metrics.json as ``train(cfg)`` run per job.

    Fails if a shared object leaks state between the jobs of a group (a mutated fold, a cached
    private quantity) or if a job loses its run dir, TensorBoard log or checkpoint.
    """
    env = {**os.environ, "DPREC_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    monkeypatch.setenv("DPREC_CACHE", str(tmp_path / "cache-separate"))  # the separate runs fit their own baselines
    sweep = tmp_path / "sweep"
    proc = subprocess.run([sys.executable, "train.py", "-m", "hydra/launcher=batched", *SWEEP, *TINY, f"hydra.sweep.dir={sweep}"],
                          cwd=ROOT, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    groups = json.loads((sweep / "batched_groups.json").read_text())
    assert sorted(j for g in groups for j in g["jobs"]) == list(range(8)) and len(groups) == 2
    for g in groups:  # data, fold and baselines built once per group, reused by its other 3 jobs
        assert g["failed"] == [] and g["built"] == {"dataset": 1, "fold": 1, "baselines": 1}
        assert g["reused"] == {"dataset": 3, "fold": 3, "baselines": 3}
    seen = set()
    for job in sorted(p for p in sweep.iterdir() if p.is_dir()):
        for name in (".hydra/config.yaml", ".hydra/overrides.yaml", "config_resolved.json", "metrics.json", "release_fold1.pt"):
            assert (job / name).exists(), f"{job.name} has no {name}"
        assert any((job / "tb" / "fold1").iterdir()), f"{job.name} has no TensorBoard log"
        overrides = OmegaConf.to_container(OmegaConf.load(job / ".hydra" / "overrides.yaml"))
        # the checkpoint holds the secret noise key: a private job deletes it at its end
        assert (job / "checkpoint_fold1.pt").exists() == ("mechanism=none" in overrides), job.name
        seen.add(tuple(sorted(o for o in overrides if not o.startswith("hydra."))))
        batched = json.loads((job / "metrics.json").read_text())
        separate = train(tiny_cfg(*overrides, f"output_dir={tmp_path / 'separate' / job.name}"))
        separate = json.loads(json.dumps(separate, default=str))  # the JSON form, as written
        assert without_timing(batched) == without_timing(json.loads((tmp_path / "separate" / job.name / "metrics.json").read_text()))
        assert batched["test_rmse"] == separate["test_rmse"] and batched["baselines"] == separate["baselines"]
    assert len(seen) == 8  # one run dir per job, each with its own overrides
