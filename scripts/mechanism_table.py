"""docs/extending.md's "which class trains which model" block, generated from the class table (``dprec_torch/forms.py``) and
the config check: ``python scripts/mechanism_table.py`` (``--check`` exits 1 when the page differs).

Each cell composes ``mechanism=<key> model=<family>`` and sets the run up as the runner does (``training.run.validate``
then ``setup_training`` and one step on the synthetic ``tiny`` preset): a pair any of them refuses shows "refused",
any other the class of the mechanism it built.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dprec_torch.errors import ConfigError  # noqa: E402

MECHANISMS = ("none", "dpsgd", "dpsgd_l1", "sgld", "gaussian", "gaussian_pnbm", "dpsgd_paper", "dpsgd_mf", "sgld_paper")
MODELS = ("pnbm_lowrank", "pnbm", "mf")


def cell(mechanism: str, model: str) -> str:
    import torch
    from hydra import compose, initialize_config_dir

    from dprec_torch.data.synthetic import load_synthetic
    from dprec_torch.training.run import setup_training, validate
    from dprec_torch.training.trainer import Trainer

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"mechanism={mechanism}", f"model={model}", "data=synthetic", "epsilon=1",
                                           "device=cpu", "noise_seed=0"])
    try:
        validate(cfg)
        setup = setup_training(cfg, load_synthetic(preset="tiny", fold=1, seed=0).folds[0], torch.device("cpu"))
        Trainer(setup.model, setup.optimizer, setup.sampler, 1)._step()  # a refusal may come with the first step
        return f"`{type(setup.optimizer).__name__}`"
    except ConfigError:
        return "refused"


def table() -> str:
    lines = ["| `mechanism=` | " + " | ".join(f"`model={m}`" for m in MODELS) + " |", "|---" * (len(MODELS) + 1) + "|"]
    lines += [f"| `{k}` | " + " | ".join(cell(k, m) for m in MODELS) + " |" for k in MECHANISMS]
    return "\n".join(lines)


def main() -> None:
    from dprec_torch.study.markers import splice

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the README instead of writing it")
    args = ap.parse_args()
    body = table()
    readme = ROOT / "docs" / "extending.md"
    if args.check:
        sys.exit(0 if f"<!-- mechanism-classes:start -->\n{body}\n<!-- mechanism-classes:end -->" in readme.read_text() else 1)
    splice(readme, "mechanism-classes", body)


if __name__ == "__main__":
    main()
