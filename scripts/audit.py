"""Empirical privacy audit: ``python scripts/audit.py mechanism=dpsgd_l1 epsilon=1`` writes audit.json."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout (its package and hydra_plugins), as from its root
from dprec_torch.cli import exit_on_bad_command_line, report_error
from dprec_torch.config import check_config
from dprec_torch.errors import DprecError

log = logging.getLogger("audit")


def audit(cfg: DictConfig) -> dict:
    """Load the data, run the canary audit, write ``audit.json``; returns its contents."""
    from dprec_torch.audit.runner import run_audit
    from dprec_torch.io import atomic_write_json
    from dprec_torch.privacy.relations import check_relation_preprocessing
    from dprec_torch.training.run import instantiate_node, output_dir

    check_config(cfg)
    check_relation_preprocessing(cfg)
    fold = instantiate_node(cfg.data).folds[0]
    probe = fold.test.select(slice(0, int(cfg.audit.probe_ratings)))
    result = run_audit(cfg, fold.train, probe).as_dict()
    out = output_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(Path(out) / "audit.json", result)
    return result


@hydra.main(config_path="../conf", config_name="audit", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        r = audit(cfg)
    except DprecError as err:
        log.error("%s", err)
        report_error(err)
        sys.exit(2)
    log.info("%s: epsilon claimed %s, empirical lower bound %.3f (alpha=%g, %d trials x %d canaries, %d/%d guesses right)",
             r["mechanism"], r["epsilon_claimed"], r["epsilon_lower_bound"], r["alpha"], r["trials"], r["canaries"],
             r["correct"], r["guesses"])


if __name__ == "__main__":
    exit_on_bad_command_line("audit")
    main()
