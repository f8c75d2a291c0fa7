"""Two-stage study (tune per epsilon on validation, evaluate on test): ``python scripts/study.py study=fig1``.

See conf/study.yaml and dprec_torch/study/pipeline.py.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout (its package and hydra_plugins), as from its root
from dprec_torch.cli import check_study, exit_on_bad_command_line, report_error
from dprec_torch.errors import DprecError
from dprec_torch.study.pipeline import run_study

log = logging.getLogger("study")


@hydra.main(config_path="../conf", config_name="study", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        check_study(cfg)
        report = run_study(cfg)
    except DprecError as err:
        log.error("%s", err)
        report_error(err)
        sys.exit(2)
    print(report.read_text())


if __name__ == "__main__":
    exit_on_bad_command_line("study")  # one line + exit 2 where Hydra would print its multi-line report
    main()
