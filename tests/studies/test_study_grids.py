"""Per-dataset stage-1 search spaces: ``scripts/study.py dataset=ml-1m`` reads
``conf/grid/<mechanism>_<model>[_<search>]_ml-1m.yaml`` where it exists, and those files write the paper's
per-rating MF step for an ML-1M fold (n = 900,188 training ratings, 11.25 x an ML-100K fold's 80,000)."""

from __future__ import annotations

import re

import pytest
import yaml
from omegaconf import OmegaConf

from dprec_torch.study.pipeline import CONF, grid_file

ML1M_FILES = sorted(p.stem for p in (CONF / "grid").glob("*_ml-1m.yaml"))


def _cfg(dataset: str, search: str = "cpu"):
    return OmegaConf.create({"dataset": dataset, "search": search, "grid_root": None})


@pytest.mark.parametrize("search", ["cpu", "paper", "repo"])
def test_the_dataset_grid_wins_where_it_exists(search):
    m = {"mechanism": "sgld_paper", "model": "mf"}
    name, path = grid_file(_cfg("ml-1m", search), m)
    suffix = "" if search == "paper" else f"_{search}"
    assert name == f"sgld_paper_mf{suffix}_ml-1m" and path.exists()
    assert grid_file(_cfg("ml-100k", search), m)[0] == f"sgld_paper_mf{suffix}"  # no ML-100K file: the generic one


def test_a_method_without_a_dataset_grid_uses_the_generic_one():
    assert grid_file(_cfg("ml-1m"), {"mechanism": "dpsgd_paper", "model": "pnbm"})[0] == "dpsgd_paper_pnbm_cpu"


def _lr_choices(stem: str) -> list[float]:
    params = yaml.safe_load((CONF / "grid" / f"{stem}.yaml").read_text())["hydra"]["sweeper"]["params"]
    return [float(v) for v in re.findall(r"[-+0-9.e]+", params["mechanism.lr"].removeprefix("choice"))]


@pytest.mark.parametrize("stem", [s for s in ML1M_FILES if "_mf" in s])
def test_ml1m_mf_steps_are_the_ml100k_steps_times_the_rating_ratio(stem):
    """Every lr of an ML-1M MF grid is an lr of the matching ML-100K grid x 11.25 (the per-rating eta kept)."""
    base = set(round(v * 11.25, 9) for v in _lr_choices(stem.removesuffix("_ml-1m")))
    assert ML1M_FILES and set(round(v, 9) for v in _lr_choices(stem)) <= base
