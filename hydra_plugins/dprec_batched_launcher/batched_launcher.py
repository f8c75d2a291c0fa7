"""A Hydra launcher that runs each group of jobs sharing data and model shape in one process.

``python train.py -m epsilon=0.1,0.5,1 seed=0,1 hydra/launcher=batched`` (``conf/hydra/launcher/batched.yaml``).

Like Hydra's BasicLauncher, every job goes through ``hydra.core.utils.run_job`` with its own
sweep config, so each keeps its own run dir (``.hydra/``, ``config_resolved.json``,
``metrics.json``, TensorBoard log, checkpoint) and job number. Unlike it, the jobs are ordered
by group -- same resolved ``cfg.data`` (its ``seed`` included), same ``model._target_`` and
``device`` -- and each group runs inside ``dprec_torch.sweep_cache.sharing()``: the dataset is
read and split once, each fold is moved to the device once, and the non-private PCC/COS
baselines are fitted once per fold; imports and numba compilation are paid once per process.
Each job's config is composed once: the launcher takes the composition the sweeper made to
validate the batch (:class:`ComposedOnce`). A job's TensorBoard writer is closed in the background
(``dprec_torch.training.tb_close``), all of them before ``launch`` returns.
The numbers are those of separate runs (tests/training/test_batched_launcher.py). Groups run one after
another; past one device use the joblib or submitit launchers (docs/performance.md, Sweeps).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger(__name__)

GROUPS_FILE = "batched_groups.json"


def group_key(cfg: DictConfig, keys: Sequence[str]) -> str:
    """The jobs whose ``keys`` (dotted paths of the job config) resolve alike share one process and cache.

    A key that cannot be resolved before the job runs (e.g. it reads ``${hydra:...}``) makes the
    job a group of its own, never a wrong share.
    """
    parts: dict[str, Any] = {}
    for k in keys:
        try:
            node = OmegaConf.select(cfg, k, throw_on_missing=True)
            parts[k] = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
        except Exception as err:  # noqa: BLE001 - unresolvable: do not share
            return f"unshared:{id(cfg)}:{type(err).__name__}"
    return json.dumps(parts, sort_keys=True, default=str)


def group_jobs(configs: Sequence[DictConfig], keys: Sequence[str]) -> list[list[int]]:
    """Indices of ``configs`` grouped by :func:`group_key`, groups in order of their first job."""
    groups: dict[str, list[int]] = {}
    for i, cfg in enumerate(configs):
        groups.setdefault(group_key(cfg, keys), []).append(i)
    return list(groups.values())


class ComposedOnce:
    """The sweep's config loader, keeping each job config ``load_sweep_config`` composes until the launcher takes it.

    Hydra's sweepers compose every job of a batch to validate it (``Sweeper.validate_batch_is_legal``) and then
    the launcher composed it again (3.4 s of a 7-job sweep on the H200 machine, issue 28). Both compose the same
    master config with the same overrides in this process, so :meth:`take` hands the launcher the sweeper's
    composition (once: the launcher changes it); a job nobody validated is composed by :meth:`take` itself.
    Everything else goes to the wrapped loader.
    """

    def __init__(self, loader: Any) -> None:
        self._loader = loader
        self._composed: dict[tuple[int, tuple[str, ...]], list[DictConfig]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        cfg = self._loader.load_sweep_config(master_config, sweep_overrides)
        self._composed.setdefault((id(master_config), tuple(sweep_overrides)), []).append(cfg)
        return cfg

    def take(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        """The job's config: the one composed to validate it, else a fresh composition (kept by nobody)."""
        kept = self._composed.get((id(master_config), tuple(sweep_overrides)))
        return kept.pop(0) if kept else self._loader.load_sweep_config(master_config, sweep_overrides)

    def forget(self) -> None:
        """Drop what no launch took (a sweeper that validates more than it launches)."""
        self._composed.clear()


class BatchedLauncher(Launcher):
    """Runs the sweep's jobs in this process, one group (shared data and model shape) at a time."""

    def __init__(self, group_by: Sequence[str] = ("data", "model._target_", "device"), share: bool = True) -> None:
        self.group_by = list(group_by)
        self.share = bool(share)
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function
        if not isinstance(hydra_context.config_loader, ComposedOnce):  # the sweeper holds this same context
            hydra_context.config_loader = ComposedOnce(hydra_context.config_loader)  # type: ignore[assignment]

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        setup_globals()
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)

        loader = self.hydra_context.config_loader
        assert isinstance(loader, ComposedOnce)
        configs = []
        for idx, overrides in enumerate(job_overrides):
            cfg = loader.take(self.config, list(overrides))
            with open_dict(cfg):
                cfg.hydra.job.id = initial_job_idx + idx
                cfg.hydra.job.num = initial_job_idx + idx
            configs.append(cfg)
        loader.forget()
        groups = group_jobs(configs, self.group_by) if self.share else [[i] for i in range(len(configs))]
        log.info("Launching %d jobs in %d group(s) sharing %s, one process", len(configs), len(groups), ", ".join(self.group_by))

        from dprec_torch.sweep_cache import sharing  # imports torch: here, never at plugin discovery
        from dprec_torch.training.tb_close import wait_closed

        runs: list[JobReturn | None] = [None] * len(configs)
        record = []
        for g, members in enumerate(groups):
            t0 = time.perf_counter()
            with sharing() as cache:
                for i in members:
                    log.info("\t#%d (group %d) : %s", initial_job_idx + i, g, " ".join(filter_overrides(job_overrides[i])))
                    runs[i] = run_job(hydra_context=self.hydra_context, task_function=self.task_function, config=configs[i],
                                      job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
                    configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
            record.append({"group": g, "jobs": [initial_job_idx + i for i in members],
                           "failed": [initial_job_idx + i for i in members if runs[i].status == JobStatus.FAILED],
                           "seconds": time.perf_counter() - t0, **cache.stats()})
            log.info("group %d: %d job(s) in %.1f s; shared objects built %s, reused %s", g, len(members),
                     record[-1]["seconds"], dict(cache.built), dict(cache.reused))
        wait_closed()  # every job's TensorBoard log is complete when the launch returns
        _write_record(sweep_dir / GROUPS_FILE, record)
        return runs  # type: ignore[return-value]


def _write_record(path: Path, record: list[dict[str, Any]]) -> None:
    """Append this launch's groups (a sweeper may call launch() once per batch of jobs)."""
    from dprec_torch.io import atomic_write_json

    old = json.loads(path.read_text()) if path.exists() else []
    atomic_write_json(path, old + record)
