"""Train a recommender under a privacy mechanism: ``python train.py mechanism=sgld epsilon=20``."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from dprec_torch.cuda_driver import open_early, settle_early
from dprec_torch.startup import fast_exit, pause_gc, resume_gc, skip_dynamo_import

if __name__ == "__main__":  # the GPU's driver and context open on another core while torch imports (cuda_driver.py)
    open_early(sys.argv[1:], Path(__file__).resolve().parent / "conf" / "config.yaml")
pause_gc()  # no cyclic collection over the objects torch, numba and Hydra load (~0.3 s; dprec_torch/startup.py)
import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from dprec_torch.cli import exit_on_bad_command_line, report_error
from dprec_torch.device import warm_up_early
from dprec_torch.errors import DprecError
from dprec_torch.training.run import comparison_table, train

resume_gc()

log = logging.getLogger("train")


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float:
    skip_dynamo_import()  # 2-3 s of torch._dynamo imports that a run never uses (dprec_torch/startup.py)
    try:
        metrics = train(cfg)
    except DprecError as err:
        log.error("%s", err)
        report_error(err)
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            return float("nan")  # one failed job (e.g. a diverged run) must not abort the whole sweep
        sys.exit(2)
    shown = {k: v for k, v in metrics.items() if k.startswith("test_") and not k.endswith("_std") and isinstance(v, float)}
    joint = metrics["privacy"].get("joint")  # several fold models of the same people: their joint epsilon (run_privacy)
    log.info("final: %s | privacy epsilon %s%s", ", ".join(f"{k} {v:.4f}" for k, v in shown.items()), metrics["privacy"].get("epsilon"),
             f" (joint over {joint['models']} fold models)" if isinstance(joint, dict) else "")
    print(comparison_table(metrics))
    return float(metrics.get("test_rmse", float("nan")))


if __name__ == "__main__":
    checked = exit_on_bad_command_line("config")  # one line + exit 2 where Hydra would print its multi-line report
    if checked is not None:
        warm_up_early(checked.device, sys.argv[1:])  # the CUDA context is made while Hydra sets the run up
    else:
        settle_early(None)  # Hydra flags: open_early opened nothing; no GPU context outlives the check regardless
    main()
    fast_exit()  # the results are written: skip the interpreter's teardown (dprec_torch/startup.py)
