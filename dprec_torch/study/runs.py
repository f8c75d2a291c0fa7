"""Train a fixed list of configurations into their own run dirs, reading back any run that already finished.

Used by the scripts that regenerate a single-run results table (``experiments/studies/pnbm_u1.py``,
``experiments/studies/provable_u1.py``): each run is ``train(cfg)`` on the real Hydra config with the given overrides.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from dprec_torch.config import CONF_DIR
from dprec_torch.training.run import train

log = logging.getLogger(__name__)


def run_configs(runs_dir: Path, runs: list[tuple[str, list[str]]]) -> dict[str, dict]:
    """``train(cfg)`` once per (name, overrides) into ``runs_dir/<name>``; returns each run's ``metrics.json``."""
    out = {}
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for name, overrides in runs:
            run_dir = Path(runs_dir) / name
            if not (run_dir / "metrics.json").exists():
                cfg = compose(config_name="config", overrides=[*overrides, "tensorboard=false", f"output_dir={run_dir}"])
                t0 = time.perf_counter()
                train(cfg)
                log.info("%s done in %.0fs", name, time.perf_counter() - t0)
            out[name] = json.loads((run_dir / "metrics.json").read_text())
    return out
