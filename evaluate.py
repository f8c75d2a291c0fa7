"""Evaluate a predictor by cross-validation (``python evaluate.py model=pcc data.fold=all``)
or a trained run against PCC/COS (``python evaluate.py run=outputs/<date>/<time>``): each fold's model is restored
from its release ``release_fold<k>.pt``, never from the (secret, by default deleted) checkpoint."""

from __future__ import annotations

import logging
import sys

import hydra
from omegaconf import DictConfig

from dprec_torch.cli import exit_on_bad_command_line, report_error
from dprec_torch.errors import DprecError
from dprec_torch.startup import fast_exit
from dprec_torch.training.evaluate import evaluate

log = logging.getLogger("evaluate")


@hydra.main(config_path="conf", config_name="evaluate", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        _, table = evaluate(cfg)
    except DprecError as err:
        log.error("%s", err)
        report_error(err)
        sys.exit(2)
    print(table)


if __name__ == "__main__":
    exit_on_bad_command_line("evaluate")  # one line + exit 2 where Hydra would print its multi-line report
    main()
    fast_exit()  # the results are written: skip the interpreter's teardown (dprec_torch/startup.py)
