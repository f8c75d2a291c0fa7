"""Every ``conf/data/*.yaml`` composed through the real Hydra config loads the dataset it names.

A dataset request must never fall back to another dataset (``data=ml-1m`` once loaded ML-100K u1
because the runner dropped the ``name`` key). MovieLens comes from ``$DPREC_DATA`` when it is there;
otherwise a synthetic stand-in with the same file layout is written (with the spec's counts shrunk
for ML-1M), so the test runs everywhere and checks the routing either way.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from dprec_torch.data import movielens
from dprec_torch.data.movielens import MovieLensSpec
from dprec_torch.data.synthetic import generate_synthetic
from dprec_torch.training.run import instantiate_node, train
from tests.helpers import CONF_DIR, tiny_cfg
from tests.data.test_data_movielens import write_fake_ml100k

DATA_CONFIGS = sorted(p.stem for p in Path(CONF_DIR, "data").glob("*.yaml"))


def _real(name: str) -> Path | None:
    root = os.environ.get("DPREC_DATA")
    spec = movielens.SPECS[name]
    if root and (Path(root) / name / spec.ratings_file).is_file():
        return Path(root)
    return None


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> dict[str, object]:
    """A DPREC_DATA holding ml-100k and ml-1m (real where present) and a custom ratings file."""
    root = tmp_path_factory.mktemp("data")
    out: dict[str, object] = {"root": root, "ml1m_spec": None}
    for name in ("ml-100k", "ml-1m"):
        real = _real(name)
        if real is not None:
            (root / name).symlink_to(real / name)
    if not (root / "ml-100k").exists():
        write_fake_ml100k(root / "ml-100k")
    if not (root / "ml-1m").exists():
        u, i, r = generate_synthetic(120, 80, 3000, seed=5)
        (root / "ml-1m").mkdir()
        lines = "".join(f"{a + 1}::{b + 1}::{int(c)}::0\n" for a, b, c in zip(u, i, r))
        (root / "ml-1m" / "ratings.dat").write_text(lines)
        n_users, n_items = len(np.unique(u)), len(np.unique(i))
        out["ml1m_spec"] = MovieLensSpec("ml-1m", "https://example.invalid/ml-1m.zip", "ratings.dat", "::",
                                         len(u), n_users, n_items)
    u, i, r = generate_synthetic(50, 30, 700, seed=3)
    custom = root / "custom.csv"
    custom.write_text("user,item,rating\n" + "".join(f"{a},{b},{int(c)}\n" for a, b, c in zip(u, i, r)))
    out["custom"] = custom
    return out


def _expected(config: str, data_root: dict) -> tuple[str, int | None, int | None]:
    """(dataset name, n_users, n_items) the config must load."""
    base = config.removesuffix("-val")
    if base in movielens.SPECS:
        spec = data_root["ml1m_spec"] if base == "ml-1m" and data_root["ml1m_spec"] else movielens.SPECS[base]
        return base, spec.n_users, spec.n_items
    return base, None, None


@pytest.mark.parametrize("config", DATA_CONFIGS)
def test_every_data_config_loads_the_dataset_it_names(config, data_root, monkeypatch):
    monkeypatch.setenv("DPREC_DATA", str(data_root["root"]))
    if data_root["ml1m_spec"] is not None:
        monkeypatch.setitem(movielens.SPECS, "ml-1m", data_root["ml1m_spec"])
    overrides = [f"data={config}"]
    if config == "custom":
        overrides.append(f"data.path={data_root['custom']}")
    cfg = tiny_cfg(*overrides)
    dataset = instantiate_node(cfg.data)
    name, n_users, n_items = _expected(config, data_root)
    assert dataset.name.split("+")[0] == name
    if n_users is not None:
        assert (dataset.n_users, dataset.n_items) == (n_users, n_items)
    record = dataset.record()
    assert record["name"] == dataset.name and record["n_users"] == dataset.n_users
    assert record["source"], "the dataset's source must be recorded"


def test_train_records_the_dataset_as_loaded(data_root, monkeypatch, tmp_path):
    """``train.py data=ml-1m model=pcc`` reports ML-1M (not ML-100K) in metrics.json."""
    monkeypatch.setenv("DPREC_DATA", str(data_root["root"]))
    spec = data_root["ml1m_spec"]
    if spec is not None:
        monkeypatch.setitem(movielens.SPECS, "ml-1m", spec)
    else:  # real ML-1M: one fold, small k, no baselines, to keep the test quick
        spec = movielens.SPECS["ml-1m"]
    overrides = ["data=ml-1m", "model=pcc", "mechanism=none", "compare_baselines=false", "model.k=50",
                 f"output_dir={tmp_path}", "device=cpu", "tensorboard=false"]
    cfg = tiny_cfg(*overrides)
    metrics = train(cfg)
    saved = json.loads((tmp_path / "metrics.json").read_text())
    for m in (metrics, saved):
        assert m["data"] == "ml-1m"
        assert m["dataset"]["name"] == "ml-1m"
        assert (m["dataset"]["n_users"], m["dataset"]["n_items"]) == (spec.n_users, spec.n_items)
        assert m["dataset"]["n_ratings"] == spec.n_ratings
        assert "ml-1m" in m["dataset"]["source"]
        assert sum(f["train"] + f["test"] for f in m["dataset"]["folds"].values()) == spec.n_ratings
