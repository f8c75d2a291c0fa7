"""Train a recommender under a privacy mechanism: ``python train.py mechanism=sgld epsilon=20``."""

from __future__ import annotations

import logging
import sys

import hydra
from omegaconf import DictConfig

from dprec_torch.errors import DprecError
from dprec_torch.training.run import comparison_table, train

log = logging.getLogger("train")


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float:
    try:
        metrics = train(cfg)
    except DprecError as err:
        log.error("%s", err)
        sys.exit(2)
    log.info("final: test RMSE %.4f | privacy epsilon %s", metrics.get("test_rmse", float("nan")), metrics["privacy"].get("epsilon"))
    print(comparison_table(metrics))
    return float(metrics.get("test_rmse", float("nan")))


if __name__ == "__main__":
    main()
