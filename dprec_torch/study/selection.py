"""Stage-1 selection: the configuration with the lowest validation RMSE per (method, epsilon).

Wang & Tang Sec. 5.1 choose hyperparameters "using a heuristic grid search"; here every stage-1 run
(``train.py -m data=<data>-val +grid=...``) wrote ``metrics.json`` (its ``test_rmse`` is the RMSE on the
validation split carved from the train side, :mod:`dprec_torch.data.validation`) and
``.hydra/overrides.yaml``. :func:`select_best` reads them back and keeps, per (method, epsilon), the run
with the smallest finite validation RMSE (ties: the lowest job path). The chosen overrides are the grid
keys exactly as the run received them, plus the grid file's fixed settings, so stage 2 trains exactly
that configuration (:func:`write_stage2_configs`).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from dprec_torch.data.validation import VALIDATION_SUFFIX
from dprec_torch.errors import ConfigError


@dataclass
class Trial:
    """One stage-1 run: its grid overrides and validation RMSE (nan if it failed)."""

    path: str
    method: str
    epsilon: float
    overrides: list[str]
    validation_rmse: float
    data: str
    privacy_epsilon: float | None


@dataclass
class Choice:
    """The selected configuration of one (method, epsilon)."""

    method: str
    epsilon: float
    overrides: list[str]
    validation_rmse: float
    run: str
    n_configs: int
    n_failed: int
    privacy_epsilon_per_run: float | None
    all_rmse: list[float] = field(default_factory=list)


def grid_spec(grid_file: Path) -> tuple[list[str], list[str]]:
    """(swept keys, fixed ``key=value`` overrides) of a ``conf/grid/*.yaml`` search space."""
    cfg = OmegaConf.load(grid_file)
    params = OmegaConf.select(cfg, "hydra.sweeper.params") or {}
    swept = [str(k) for k in params]
    body = OmegaConf.to_container(cfg, resolve=False)
    body.pop("hydra", None)
    fixed: list[str] = []

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))
        else:
            fixed.append(f"{prefix}={node}")

    walk(body, "")
    return swept, fixed


def read_trials(stage1_dir: Path, method: str, swept: list[str]) -> list[Trial]:
    """Every stage-1 job under ``stage1_dir`` (a job = a folder holding ``.hydra/``)."""
    trials = []
    for hydra_dir in sorted(Path(stage1_dir).rglob(".hydra")):
        job = hydra_dir.parent
        if job == Path(stage1_dir) or not (hydra_dir / "overrides.yaml").exists():
            continue
        ovr = list(yaml.safe_load((hydra_dir / "overrides.yaml").read_text()) or [])
        keys = set(swept)
        hydra_yaml = hydra_dir / "hydra.yaml"
        if hydra_yaml.exists():  # plus the keys this job's sweeper actually searched over
            keys |= {str(k) for k in (OmegaConf.select(OmegaConf.load(hydra_yaml), "hydra.sweeper.params") or {})}
        eps = next((float(o.split("=", 1)[1]) for o in ovr if o.startswith("epsilon=")), None)
        chosen = [o for o in ovr if o.split("=", 1)[0].lstrip("+") in keys]
        metrics_path = job / "metrics.json"
        rmse, data, priv = math.nan, "", None
        if metrics_path.exists():
            m = json.loads(metrics_path.read_text())
            rmse, data, priv = float(m.get("test_rmse", math.nan)), str(m.get("data", "")), m.get("privacy", {}).get("epsilon")
            if eps is None:
                eps = float(m["epsilon"])
            if not data.endswith(VALIDATION_SUFFIX):
                raise ConfigError(f"stage-1 run {job} was scored on '{data}', not on a validation split: "
                                  "tuning must never read the test split")
        if eps is None:
            continue
        trials.append(Trial(str(job), method, eps, chosen, rmse, data, priv))
    return trials


def fixed_as_run(job_dir: str | Path, fixed: list[str]) -> list[str]:
    """The grid file's fixed ``key=value`` settings, with the values the job actually ran with (its .hydra/config.yaml)."""
    cfg = OmegaConf.load(Path(job_dir) / ".hydra" / "config.yaml")
    out = []
    for item in fixed:
        key = item.split("=", 1)[0]
        value = OmegaConf.select(cfg, key, throw_on_missing=False)
        out.append(f"{key}={value}" if value is not None else item)
    return out


def select_best(trials: list[Trial], fixed: list[str]) -> dict[float, Choice]:
    """Per epsilon: the trial with the lowest finite validation RMSE (ties: first by path). Its chosen overrides: its swept
    grid overrides plus the grid's fixed keys with the values read back from the trial's own ``.hydra/config.yaml``."""
    by_eps: dict[float, list[Trial]] = {}
    for t in trials:
        by_eps.setdefault(t.epsilon, []).append(t)
    out = {}
    for eps, ts in sorted(by_eps.items()):
        ok = sorted((t for t in ts if math.isfinite(t.validation_rmse)), key=lambda t: (t.validation_rmse, t.path))
        if not ok:
            raise ConfigError(f"{ts[0].method} at epsilon={eps:g}: all {len(ts)} stage-1 runs failed")
        best = ok[0]
        swept_keys = {o.split("=", 1)[0].lstrip("+") for o in best.overrides}
        extra = [o for o in fixed_as_run(best.path, fixed) if o.split("=", 1)[0] not in swept_keys]
        out[eps] = Choice(best.method, eps, best.overrides + extra, best.validation_rmse, best.path, len(ts),
                          len(ts) - len(ok), best.privacy_epsilon, [t.validation_rmse for t in ts])
    return out


def write_selected(choices: dict[str, dict[float, Choice]], path: Path, meta: dict[str, Any]) -> None:
    """``selected.yaml``: the study's settings and, per method and epsilon, the chosen overrides."""
    doc = {"study": meta, "selected": {m: {f"{e:g}": asdict(c) for e, c in cs.items()} for m, cs in choices.items()}}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def write_stage2_configs(choices: dict[float, Choice], folds: list[int], root: Path, prefix: str) -> list[str]:
    """One ``# @package _global_`` config per (epsilon, fold) in ``root/selected/``; returns their names.

    Each file holds ``epsilon``, ``data.fold`` and the chosen overrides parsed as Hydra parses them
    (``OmegaConf.from_dotlist``), so ``train.py -m +selected=a,b,...`` trains exactly the chosen
    configuration on every fold.
    """
    group = root / "selected"
    group.mkdir(parents=True, exist_ok=True)
    names = []
    for k, (eps, c) in enumerate(sorted(choices.items())):
        for fold in folds:
            name = f"{prefix}_{k:02d}_f{fold}"
            body = OmegaConf.to_container(OmegaConf.from_dotlist([o.lstrip("+") for o in c.overrides]))
            body = {"epsilon": eps, "data": {"fold": fold}, **body}
            text = (f"# @package _global_\n# {c.method} at epsilon={eps:g}, fold {fold}: chosen by stage-1 run {c.run}\n"
                    f"# (validation RMSE {c.validation_rmse:.4f}; overrides {' '.join(c.overrides)})\n")
            (group / f"{name}.yaml").write_text(text + yaml.safe_dump(body, sort_keys=False))
            names.append(name)
    return names
