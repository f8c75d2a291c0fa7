"""``run_study(cfg)``: the two-stage study behind ``scripts/study.py`` (Wang & Tang Sec. 5.1 tuning, Sec. 5.2 evaluation).

Stage 1 and stage 2 are plain Hydra multiruns of ``train.py`` (``-m``), launched with the configured
launcher (basic or joblib) and sweeper (basic grid or optuna); this module only builds their
command lines, selects the best stage-1 configuration per (method, epsilon)
(:mod:`dprec_torch.study.selection`) and writes the report (:mod:`dprec_torch.study.report`).

A method is ``<mechanism>-<model>`` with the mechanism's config name; Wang & Tang's figures
(conf/study/fig*.yaml) use the paper-faithful forms ``dpsgd_paper`` and ``sgld_paper``, and their
search spaces are ``conf/grid/<mechanism>_<model>[_<search>].yaml`` (e.g. ``dpsgd_paper_pnbm_cpu.yaml``).

Layout under ``cfg.out``::

    stage1/<mechanism>-<model>/...   validation runs (data=<dataset>-val, fold cfg.tune_fold)
    selected.yaml                    chosen overrides, validation RMSE, configs tried per (method, epsilon)
    stage2_configs/selected/*.yaml   one Hydra config per (method, epsilon, fold) with exactly those overrides
    stage2/<mechanism>-<model>/...   test runs on every fold of cfg.folds
    commands.txt                     every train.py command line, with its wall time
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from dprec_torch.errors import ConfigError
from dprec_torch.study.report import build_report
from dprec_torch.study.selection import Choice, grid_spec, read_trials, select_best, write_selected, write_stage2_configs

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"


def method_name(m: DictConfig | dict) -> str:
    return f"{m['mechanism']}-{m['model']}"


def grid_file(cfg: DictConfig, m: DictConfig | dict) -> tuple[str, Path]:
    """(``+grid=`` option, its file): ``<grid_root or conf>/grid/<mechanism>_<model>[_<search>][_<dataset>].yaml``.

    ``search=paper`` is the full Sec. 5.1 grid (no suffix), ``search=cpu`` the documented thinner one. A file
    with the ``_<dataset>`` suffix (e.g. ``dpsgd_paper_mf_cpu_ml-1m.yaml``) wins where it exists: MF's step sizes
    are written per training rating, so the paper's per-rating eta needs the dataset's rating count.
    """
    suffix = "" if cfg.search == "paper" else f"_{cfg.search}"
    root = Path(cfg.grid_root or CONF) / "grid"
    for name in (f"{m['mechanism']}_{m['model']}{suffix}_{cfg.dataset}", f"{m['mechanism']}_{m['model']}{suffix}"):
        path = root / f"{name}.yaml"
        if path.exists():
            return name, path
    raise ConfigError(f"no search space {path} for {method_name(m)}")


def launcher_overrides(cfg: DictConfig) -> list[str]:
    if cfg.launcher == "basic":
        return []
    if cfg.launcher == "joblib":
        return ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={int(cfg.n_jobs)}"]
    raise ConfigError(f"launcher must be basic or joblib, got {cfg.launcher}")


def stage1_commands(cfg: DictConfig, m: DictConfig | dict, out: Path) -> list[list[str]]:
    """``train.py -m`` command lines of stage 1 for one method (one per epsilon with optuna)."""
    grid, _ = grid_file(cfg, m)
    common = [f"model={m['model']}", f"mechanism={m['mechanism']}", f"data={cfg.dataset}-val",
              f"data.dataset.fold={int(cfg.tune_fold)}", f"seed={int(cfg.seed)}", f"noise_seed={int(cfg.seed)}", f"+grid={grid}",
              *[f"data.dataset.{o}" for o in cfg.data_overrides], *cfg.stage1_overrides, *cfg.overrides,
              *launcher_overrides(cfg)]
    if cfg.grid_root:
        common.append(f"hydra.searchpath=[file://{Path(cfg.grid_root).resolve()}]")
    sweep = out / "stage1" / method_name(m)
    if cfg.sweeper == "basic":
        return [common + ["epsilon=" + ",".join(f"{float(e):g}" for e in cfg.study.epsilons), f"hydra.sweep.dir={sweep}"]]
    if cfg.sweeper == "optuna":
        return [common + [f"epsilon={float(e):g}", "hydra/sweeper=optuna", f"hydra.sweeper.n_trials={int(cfg.n_trials)}",
                          "hydra.sweeper.n_jobs=1", "hydra.sweeper.direction=minimize",
                          f"hydra.sweeper.sampler.seed={int(cfg.seed)}",
                          f"hydra.sweeper.study_name={method_name(m)}-eps{float(e):g}",
                          f"hydra.sweep.dir={sweep}/eps{float(e):g}"]
                for e in cfg.study.epsilons]
    raise ConfigError(f"sweeper must be basic or optuna, got {cfg.sweeper}")


def stage2_command(cfg: DictConfig, m: DictConfig | dict, names: list[str], out: Path) -> list[str]:
    """One ``train.py -m`` over the chosen configurations (``+selected=...``) of one method on every fold."""
    return [f"model={m['model']}", f"mechanism={m['mechanism']}", f"data={cfg.dataset}", f"seed={int(cfg.seed)}", f"noise_seed={int(cfg.seed)}",
            f"hydra.searchpath=[file://{(out / 'stage2_configs').resolve()}]", f"+selected={','.join(names)}",
            *[f"data.{o}" for o in cfg.data_overrides], *cfg.stage2_overrides, *cfg.overrides, *launcher_overrides(cfg),
            f"hydra.sweep.dir={out / 'stage2' / method_name(m)}"]


def launch(overrides: list[str], log_file: Path) -> float:
    """Run ``python train.py -m <overrides>`` (a Hydra multirun); returns its wall time in seconds."""
    cmd = [sys.executable, "train.py", "-m", *overrides]
    log.info("launching: %s", " ".join(cmd[1:]))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    with open(log_file, "a") as fh:
        fh.write(f"# {wall:.1f} s, exit {proc.returncode}\n{' '.join(cmd[1:])}\n")
    if proc.returncode != 0:
        raise ConfigError(f"train.py -m failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return wall


def run_stage1(cfg: DictConfig, out: Path) -> dict[str, dict[float, Choice]]:
    """Stage 1 for every method, then the selection per (method, epsilon)."""
    choices = {}
    for m in cfg.study.methods:
        for cmd in stage1_commands(cfg, m, out):
            launch(cmd, out / "commands.txt")
        swept, fixed = grid_spec(grid_file(cfg, m)[1])
        trials = read_trials(out / "stage1" / method_name(m), method_name(m), swept)
        choices[method_name(m)] = select_best(trials, fixed)
        for eps, c in choices[method_name(m)].items():
            log.info("%s eps=%g: %s (validation RMSE %.4f, %d configs)", c.method, eps, " ".join(c.overrides),
                     c.validation_rmse, c.n_configs)
    return choices


def run_stage2(cfg: DictConfig, out: Path, choices: dict[str, dict[float, Choice]]) -> None:
    for m in cfg.study.methods:
        names = write_stage2_configs(choices[method_name(m)], list(cfg.folds), out / "stage2_configs",
                                     method_name(m).replace("-", "_"))
        launch(stage2_command(cfg, m, names, out), out / "commands.txt")


def run_study(cfg: DictConfig) -> Path:
    """Stage 1, selection, stage 2, report; returns the report's ``report.md``."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    choices = run_stage1(cfg, out)
    meta = {"data": cfg.dataset, "grid": cfg.search, "sweeper": cfg.sweeper, "tune_fold": int(cfg.tune_fold),
            "folds": list(cfg.folds), "n_trials": int(cfg.n_trials) if cfg.sweeper == "optuna" else None,
            "methods": [method_name(m) for m in cfg.study.methods],
            "epsilons": [float(e) for e in cfg.study.epsilons], "stage1_seconds": time.perf_counter() - t0}
    write_selected(choices, out / "selected.yaml", meta)
    t1 = time.perf_counter()
    run_stage2(cfg, out, choices)
    meta["stage2_seconds"] = time.perf_counter() - t1
    write_selected(choices, out / "selected.yaml", meta)
    OmegaConf.save(cfg, out / "study_config.yaml")
    return build_report(out / "stage2", cfg.report, ledger_dir=out, selected=out / "selected.yaml")
