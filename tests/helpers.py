"""Small builders shared by the tests (no fixtures with hidden state)."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from omegaconf import DictConfig

from dprec_torch.data.ratings import Fold, Ratings, RatingScale

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")


def tiny_cfg(*overrides: str, config_name: str = "config", return_hydra_config: bool = False) -> DictConfig:
    """The real Hydra config (``conf/<config_name>.yaml``) composed with exactly ``overrides`` -- no hidden base list
    (tests spell their own ``data=synthetic device=cpu ...``); the one Hydra setup the tests share."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides), return_hydra_config=return_hydra_config)


def toy_ratings(rows: list[list[float | None]], lo: float = 1, hi: float = 5) -> Ratings:
    """Ratings from a small dense table (None = unrated); used for hand-computed checks."""
    u, i, v = [], [], []
    for a, row in enumerate(rows):
        for b, r in enumerate(row):
            if r is not None:
                u.append(a), i.append(b), v.append(float(r))
    return Ratings(torch.tensor(u), torch.tensor(i), torch.tensor(v), len(rows), len(rows[0]), RatingScale(lo, hi))


def tiny_fold(seed: int = 0) -> Fold:
    """The synthetic ``tiny`` preset, fold 1."""
    from dprec_torch.data.synthetic import load_synthetic

    return load_synthetic(preset="tiny", fold=1, seed=seed).folds[0]


def ml100k_available() -> bool:
    root = os.environ.get("DPREC_DATA")
    return bool(root) and (Path(root) / "ml-100k" / "u1.base").exists()


def kill_in_epoch(monkeypatch, epoch: int = 3):
    """Make ``Trainer`` raise KeyboardInterrupt ("simulated kill") when it evaluates ``epoch``; returns the
    original ``_epoch_metrics`` (``monkeypatch.setattr`` it back to let a resumed run finish)."""
    from dprec_torch.training import trainer as trainer_mod

    original = trainer_mod.Trainer._epoch_metrics

    def killed(self, at, fold, train_rmse):
        if at == epoch:
            raise KeyboardInterrupt("simulated kill")
        return original(self, at, fold, train_rmse)

    monkeypatch.setattr(trainer_mod.Trainer, "_epoch_metrics", killed)
    return original


def walk(obj, path=""):
    """Every (path, value) of a nested dict/list, depth first (for scanning a loaded release for forbidden entries)."""
    yield path, obj
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from walk(value, f"{path}.{key}")
    elif isinstance(obj, (list, tuple)):
        for k, value in enumerate(obj):
            yield from walk(value, f"{path}[{k}]")


def script_json(script: str, *args: str, env: dict[str, str] | None = None, timeout: int = 900) -> dict:
    """Run ``python -c script args`` from the repository root in a fresh process (a flag read at import, such as
    ``TRITON_INTERPRET``, takes effect there) and parse the JSON of its last stdout line."""
    import json
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", script, *args], cwd=Path(__file__).resolve().parents[1],
                          env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
