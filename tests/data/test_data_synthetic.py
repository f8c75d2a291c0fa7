"""Synthetic generator: determinism, distinct pairs, sizes, power-law degrees, a learnable signal."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from dprec_torch.data import PRESETS, generate_synthetic, load_synthetic
from dprec_torch.errors import ConfigError

CONF = Path(__file__).resolve().parents[2] / "conf" / "data"


def test_deterministic_under_seed():
    a = generate_synthetic(300, 200, 8000, seed=5)
    b = generate_synthetic(300, 200, 8000, seed=5)
    c = generate_synthetic(300, 200, 8000, seed=6)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[0] * 200 + a[1], c[0] * 200 + c[1])


@pytest.mark.parametrize("preset", ["tiny", "ml-100k"])
def test_sizes_distinct_pairs_and_scale(preset):
    n_users, n_items, n_ratings = PRESETS[preset]
    users, items, ratings = generate_synthetic(n_users, n_items, n_ratings, seed=1)
    assert users.shape == items.shape == ratings.shape == (n_ratings,)
    assert np.unique(users * n_items + items).shape[0] == n_ratings
    assert users.min() >= 0 and users.max() < n_users and items.min() >= 0 and items.max() < n_items
    assert np.array_equal(ratings, np.round(ratings)) and set(np.unique(ratings)) == {1.0, 2.0, 3.0, 4.0, 5.0}
    user_deg = np.bincount(users, minlength=n_users)
    item_deg = np.bincount(items, minlength=n_items)
    assert user_deg.min() >= 5 and item_deg.min() >= 1  # every user has a few ratings, every item one
    # power-law-ish: heavy heads
    assert user_deg.max() >= 4 * np.median(user_deg)
    assert item_deg.max() >= 8 * np.median(item_deg)


def test_explicit_sizes_override_preset_and_dense_requests():
    ds = load_synthetic("ml-1m", n_users=50, n_items=30, n_ratings=400, fold="all")
    assert (ds.n_users, ds.n_items) == (50, 30)
    # a keyed Bernoulli per rating: ~10 % held out (binomial sd 6), every rating on one side
    assert all(len(f.train) + len(f.test) == 400 and 15 <= len(f.test) <= 65 for f in ds.folds)
    u, i, _ = generate_synthetic(10, 10, 90, seed=0)  # 90% dense: drawn without replacement
    assert np.unique(u * 10 + i).shape[0] == 90
    with pytest.raises(ConfigError, match="exceeds"):
        generate_synthetic(10, 10, 101)
    with pytest.raises(ConfigError, match="positive integer"):
        generate_synthetic(0, 10, 5)
    with pytest.raises(ConfigError, match="tiny, ml-100k, ml-1m, ml-20m"):
        load_synthetic("huge")


def test_folds_are_seeded_holdouts():
    ds = load_synthetic("tiny", fold="all", seed=3)
    tests = []
    for k, f in enumerate(ds.folds, start=1):
        assert (f.index, f.name) == (k, f"holdout-{k}")
        assert len(f.train) + len(f.test) == 8000 and abs(len(f.test) - 800) <= 110  # ~10 % (binomial sd 27)
        assert (f.train.n_users, f.train.n_items) == (300, 200)
        tests.append(set(zip(f.test.users.tolist(), f.test.items.tolist())))
    assert len({frozenset(t) for t in tests}) == 5
    again = load_synthetic("tiny", fold=4, seed=3).folds[0]
    assert set(zip(again.test.users.tolist(), again.test.items.tolist())) == tests[3]


def test_tiny_has_signal_beyond_the_item_mean():
    """Item mean + a shrunk per-user offset must beat the item mean: models have something to learn."""
    fold = load_synthetic("tiny", fold=1, seed=0).folds[0]
    train, test = fold.train, fold.test
    item_mean = train.item_means()
    resid = train.values - item_mean[train.items]
    offset = torch.zeros(train.n_users).index_add_(0, train.users, resid) / (train.user_counts() + 5)
    rmse_item = float(((item_mean[test.items] - test.values) ** 2).mean().sqrt())
    pred = (item_mean[test.items] + offset[test.users]).clamp(1, 5)
    rmse_user = float(((pred - test.values) ** 2).mean().sqrt())
    assert rmse_user < rmse_item - 0.02


def test_hydra_yaml_synthetic():
    cfg = OmegaConf.create({"seed": 9, "data": OmegaConf.load(CONF / "synthetic.yaml")})
    cfg.data.fold = "all"
    ds = instantiate(cfg.data)
    assert cfg.data.name == "synthetic" and len(ds.folds) == 5
    assert ds.folds[0].train.scale.lo == 1.0 and ds.folds[0].train.scale.hi == 5.0


def test_ml1m_preset_speed_is_printed():
    start = time.perf_counter()
    users, _, _ = generate_synthetic(*PRESETS["ml-1m"], seed=0)
    print(f"\nsynthetic ml-1m preset ({users.shape[0]:,} ratings) generated in {time.perf_counter() - start:.2f} s")
    assert users.shape[0] == PRESETS["ml-1m"][2]


@pytest.mark.slow
def test_ml20m_preset_generates_without_a_dense_matrix():
    n_users, n_items, n_ratings = PRESETS["ml-20m"]
    start = time.perf_counter()
    users, items, ratings = generate_synthetic(n_users, n_items, n_ratings, seed=0)
    print(f"\nsynthetic ml-20m preset ({n_ratings:,} ratings) generated in {time.perf_counter() - start:.1f} s")
    keys = users * n_items + items
    assert keys.shape == (n_ratings,) and bool((np.diff(keys) > 0).all())  # sorted and distinct
    assert np.bincount(users, minlength=n_users).min() >= 5
