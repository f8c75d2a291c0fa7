"""Per-user splits: removing one user from a single-file dataset moves no other user's rating.

Every split the package draws -- the seeded hold-out folds of one file (``data=custom data.path=...``, ML-1M) and
the validation splits carved from a fold's train (``data=*-val``) -- is keyed per rating by (seed, fold, raw user id,
raw item id). The neighbour here is the whole input FILE minus one user, loaded from scratch (id map, split, cap
rebuilt), compared with the full file's by raw (user id, item id, rating): :mod:`dprec_torch.privacy_harness.split_cases`.
ML-100K's ``u.data`` (and ML-1M's ``ratings.dat``) when ``$DPREC_DATA`` holds them, else generated files of the same
format: never a silent pass.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from dprec_torch.data import movielens, splits
from dprec_torch.data.custom import load_custom
from dprec_torch.data.item_features import read_catalog
from dprec_torch.data.preprocess import stable_id_keys
from dprec_torch.data.ratings import Fold, Ratings, RatingScale
from dprec_torch.data.readers import build_id_space, read_ratings
from dprec_torch.data.synthetic import generate_synthetic
from dprec_torch.data.validation import validation_fold, with_validation
from dprec_torch.privacy_harness import registry
from dprec_torch.privacy_harness.split_cases import (SPLIT_KINDS, check_file_neighbour, file_minus_user, load_split,
                                                     raw_triples)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DPREC_CACHE", str(tmp_path / "cache"))  # parsed-file cache of the files written here


def generated_rows(n_users: int, n_items: int, n_ratings: int, seed: int = 0) -> np.ndarray:
    """(raw user, raw item, rating, timestamp) rows whose raw ids are NOT the contiguous ids (shuffled, offset)."""
    u, i, r = generate_synthetic(n_users, n_items, n_ratings, seed=seed)
    rng = np.random.default_rng(seed + 1)
    user_raw = rng.permutation(n_users) * 7 + 3
    item_raw = rng.permutation(n_items) * 5 + 11
    order = rng.permutation(u.shape[0])  # file order unrelated to ids
    return np.stack([user_raw[u], item_raw[i], r.astype(np.int64), 880000000 + np.arange(u.shape[0])], 1)[order]


def write_rows(path: Path, rows: np.ndarray, sep: str = "\t") -> Path:
    path.write_text("".join(sep.join(str(int(x)) for x in row) + "\n" for row in rows))
    return path


def udata(tmp_path: Path) -> Path:
    """ML-100K's u.data if $DPREC_DATA has it, else a generated file of the same shape and format."""
    root = os.environ.get("DPREC_DATA")
    if root and (Path(root) / "ml-100k" / "u.data").is_file():
        return Path(root) / "ml-100k" / "u.data"
    return write_rows(tmp_path / "u.data", generated_rows(943, 1682, 100_000))


def first_user(path: Path) -> int:
    return int(re.split(r"::|\s|,", path.read_text(), maxsplit=1)[0])


def busiest_user(path: Path) -> int:
    users = np.loadtxt(path, dtype=np.int64, usecols=0)
    values, counts = np.unique(users, return_counts=True)
    return int(values[np.argmax(counts)])


# ------------------------------------------------------------------ the file minus one user
@pytest.mark.parametrize("kind", SPLIT_KINDS)
def test_removing_one_user_from_udata_moves_no_other_rating(tmp_path, kind):
    """u.data as data=custom (all 5 hold-out folds, and their validation splits), minus its first user and minus its
    busiest one: every other user's train and test ratings are the same, by raw ids, in every fold."""
    path = udata(tmp_path)
    opts = dict(rating_scale=[1, 5], seed=0)
    full = load_split(path, kind, **opts)
    assert len(full.folds) == 5
    for user in (first_user(path), busiest_user(path)):
        minus = file_minus_user(path, user, tmp_path / f"minus-{user}.data")
        neighbour = load_split(minus, kind, **opts)
        assert neighbour.n_users == full.n_users - 1  # the id map really was rebuilt
        assert check_file_neighbour(full, neighbour, user) == []
        for fd in full.folds:  # and the removed user was really in the split (not a vacuous pass)
            assert any(t[0] == user for t in raw_triples(fd.train, full) | raw_triples(fd.test, full))


def test_removing_one_user_with_a_cap_and_a_min_filter_moves_no_other_rating(tmp_path):
    path = udata(tmp_path)
    opts = dict(rating_scale=[1, 5], seed=4, min_user_ratings=25, max_user_ratings=60, fold=2)
    user = busiest_user(path)
    full = load_split(path, "validation", **opts)
    neighbour = load_split(file_minus_user(path, user, tmp_path / "minus.data"), "validation", **opts)
    assert check_file_neighbour(full, neighbour, user) == []


def test_string_ids_are_keyed_by_their_text(tmp_path):
    rows = generated_rows(60, 40, 1200, seed=3)
    text = "".join(f"user-{u},item-{i},{r}\n" for u, i, r, _ in rows)
    path = tmp_path / "named.csv"
    path.write_text("user,item,rating\n" + text)
    full = load_split(path, "holdout", rating_scale=[1, 5], seed=2)
    user = "user-" + str(int(rows[len(rows) // 2, 0]))
    neighbour = load_split(file_minus_user(path, user, tmp_path / "minus.csv"), "holdout", rating_scale=[1, 5], seed=2)
    assert check_file_neighbour(full, neighbour, user) == []


def _fake_ml1m(folder: Path, rows: np.ndarray, n_movies: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_rows(folder / "ratings.dat", rows, "::")
    (folder / "movies.dat").write_text("".join(f"{m}::Movie {m} (1990)::Drama\n" for m in range(1, n_movies + 1)))
    return folder


def _load_ml1m(monkeypatch, folder: Path, **kw):
    """load_movielens("ml-1m") of ``folder``, its documented counts set to the folder's (a file minus a user, or a
    generated stand-in, has other counts than the real release)."""
    raw = read_ratings(folder / "ratings.dat", sep="::", header=False)
    users, items = build_id_space(raw)
    spec = replace(movielens.SPECS["ml-1m"], n_ratings=len(raw), n_users=users.shape[0],
                   n_items=len(read_catalog(folder / "movies.dat")), n_rated_items=items.shape[0])
    monkeypatch.setitem(movielens.SPECS, "ml-1m", spec)
    return movielens.load_movielens("ml-1m", data_dir=str(folder), fold="all", seed=0, **kw)


def _check_ml1m(tmp_path: Path, monkeypatch, src: Path) -> None:
    user = first_user(src / "ratings.dat")
    dst = tmp_path / "minus" / "ml-1m"
    dst.mkdir(parents=True)
    (dst / "movies.dat").write_bytes((src / "movies.dat").read_bytes())
    file_minus_user(src / "ratings.dat", user, dst / "ratings.dat")
    full, neighbour = _load_ml1m(monkeypatch, src), _load_ml1m(monkeypatch, dst)
    assert full.item_ids == neighbour.item_ids and neighbour.n_users == full.n_users - 1  # the catalogue's items
    assert check_file_neighbour(full, neighbour, user) == []
    assert check_file_neighbour(with_validation(full), with_validation(neighbour), user) == []


def test_ml1m_folds_keep_other_users_put(tmp_path, monkeypatch):
    """The ML-1M loader's seeded folds (its catalogue id space) on an ML-1M-format stand-in: ratings.dat minus one
    user, reloaded."""
    rows = generated_rows(300, 200, 8000, seed=5)
    rows[:, 1] = (rows[:, 1] - 11) // 5 + 1  # catalogue ids 1..200
    _check_ml1m(tmp_path, monkeypatch, _fake_ml1m(tmp_path / "full" / "ml-1m", rows, 220))  # 20 movies nobody rated


@pytest.mark.slow
def test_real_ml1m_folds_keep_other_users_put(tmp_path, monkeypatch):
    """The same on the real ML-1M (the review found 179,960 ratings moved by the positional split)."""
    real = Path(os.environ.get("DPREC_DATA") or "/nonexistent") / "ml-1m"
    if not (real / "ratings.dat").is_file() or not (real / "movies.dat").is_file():
        pytest.skip("ML-1M not under $DPREC_DATA (the stand-in test above covers the loader)")
    src = tmp_path / "full" / "ml-1m"
    src.mkdir(parents=True)
    for name in ("ratings.dat", "movies.dat"):
        (src / name).write_bytes((real / name).read_bytes())
    _check_ml1m(tmp_path, monkeypatch, src)


# ------------------------------------------------------------------ the harness case: releases on the neighbour
def small_file(tmp_path: Path) -> Path:
    """10 users x 6 items (every item rated by >= 2 users, so the item map survives a removal), raw ids not contiguous."""
    rng = np.random.default_rng(11)
    rows = [(100 + 13 * u, 7 + 3 * i, int(rng.integers(1, 6)), 0) for u in range(10) for i in range(6)
            if rng.random() < 0.75 or i == u % 6]
    return write_rows(tmp_path / "small.tsv", np.array(rows)[rng.permutation(len(rows))])


def user_cases():
    return [c for b in registry.registered_classes().values() for c in b() if c.relation == "user" and c.max_items >= 6]


@pytest.mark.parametrize("kind", SPLIT_KINDS)
def test_user_level_releases_hold_on_the_file_minus_one_user(tmp_path, kind):
    """Every registered user-level case: its release on the train set drawn from the file and on the one drawn from
    the file minus one user (ids, split and cap rebuilt) moves by at most the stated sensitivity."""
    path = small_file(tmp_path)
    cases = user_cases()
    assert len(cases) >= 10
    opts = dict(rating_scale=[1, 5], seed=1, fold="all", n_folds=2, test_fraction=0.2)
    full = load_split(path, kind, **opts)
    for user in (100, 100 + 13 * 9):
        neighbour = load_split(file_minus_user(path, user, tmp_path / f"minus-{user}.tsv"), kind, **opts)
        assert check_file_neighbour(full, neighbour, user, cases, seed=1) == []


def _positional_mask(ratings, fold_index, test_fraction, seed, user_keys=None, item_keys=None):
    """The earlier positional split: one randperm over rating positions."""
    gen = torch.Generator().manual_seed(splits.derive_seed(seed, fold_index, splits.SPLIT_STREAM))
    perm = torch.randperm(len(ratings), generator=gen)
    mask = torch.zeros(len(ratings), dtype=torch.bool)
    mask[perm[: int(round(test_fraction * len(ratings)))]] = True
    return mask


def test_the_harness_catches_a_positional_split(tmp_path, monkeypatch):
    """Mutation: the old positional split moves other users' ratings, and some user-level release then moves by more
    than its stated sensitivity on the file neighbour; the harness must say both."""
    path = small_file(tmp_path)
    monkeypatch.setattr(splits, "holdout_mask", _positional_mask)
    opts = dict(rating_scale=[1, 5], seed=1, fold="all", n_folds=2, test_fraction=0.2)
    full = load_split(path, "holdout", **opts)
    neighbour = load_split(file_minus_user(path, 100, tmp_path / "minus.tsv"), "holdout", **opts)
    problems = check_file_neighbour(full, neighbour, 100, user_cases(), seed=1)
    assert any("other ratings" in p for p in problems)
    assert any("stated sensitivity" in p for p in problems)


# ------------------------------------------------------------------ the split itself
def test_test_fraction_is_close_to_the_requested_one(tmp_path):
    path = udata(tmp_path)
    for frac in (0.1, 0.2, 0.05):
        ds = load_custom(path=str(path), rating_scale=[1, 5], fold="all", test_fraction=frac, seed=3)
        n = len(ds.folds[0].train) + len(ds.folds[0].test)
        sd = math.sqrt(n * frac * (1 - frac))
        for f in ds.folds:
            assert len(f.train) + len(f.test) == n
            assert abs(len(f.test) - frac * n) <= 4 * sd, (frac, f.name, len(f.test))
        sizes = {len(f.test) for f in ds.folds}
        assert len(sizes) > 1  # a Bernoulli per rating, not a fixed count


def test_fold_alone_is_the_same_fold_of_all_and_folds_differ(tmp_path):
    path = udata(tmp_path)
    every = load_custom(path=str(path), rating_scale=[1, 5], fold="all", seed=9)
    third = load_custom(path=str(path), rating_scale=[1, 5], fold=3, seed=9)
    assert raw_triples(third.folds[0].test, third) == raw_triples(every.folds[2].test, every)
    tests = [frozenset(raw_triples(f.test, every)) for f in every.folds]
    assert len(set(tests)) == 5
    overlap = len(tests[0] & tests[1]) / len(tests[0])
    assert abs(overlap - 0.1) < 0.02  # independent across folds: ~test_fraction of fold 1's test is in fold 2's


def test_split_ignores_rating_order_and_the_id_map():
    """The same raw ratings, stored in another order under another contiguous id map: the same (raw user, raw item)
    pairs are held out."""
    rows = generated_rows(80, 50, 1500, seed=7)

    def split(perm_users: np.ndarray, order: np.ndarray) -> set[tuple[int, int]]:
        raw_users = np.unique(rows[:, 0])[perm_users]  # contiguous id k <-> raw_users[k]
        raw_items = np.unique(rows[:, 1])
        r = rows[order]
        lookup = np.argsort(raw_users)
        users = lookup[np.searchsorted(raw_users[lookup], r[:, 0])]
        items = np.searchsorted(raw_items, r[:, 1])
        data = Ratings(torch.from_numpy(users), torch.from_numpy(items), torch.from_numpy(r[:, 2].astype(np.float32)),
                       raw_users.shape[0], raw_items.shape[0], RatingScale(1, 5))
        assert (raw_users[users] == r[:, 0]).all()
        _, test = splits.holdout_indices(data, 2, 0.3, 5, stable_id_keys(raw_users), stable_id_keys(raw_items))
        return set(zip(raw_users[users[test.numpy()]].tolist(), raw_items[items[test.numpy()]].tolist()))

    rng = np.random.default_rng(0)
    n_users = np.unique(rows[:, 0]).shape[0]
    a = split(np.arange(n_users), np.arange(rows.shape[0]))
    b = split(rng.permutation(n_users), rng.permutation(rows.shape[0]))
    assert a == b and 0.2 < len(a) / rows.shape[0] < 0.4


def test_holdout_indices_refuses_a_bare_count():
    with pytest.raises(TypeError, match="raw user and item ids"):
        splits.holdout_indices(100, 1, 0.1, 0)


def test_validation_keeps_its_per_user_count_rule(tmp_path):
    """Each user with >= 2 training ratings gives round(fraction |R_u|) of them (at least 1, never all); the ratings
    it gives are those of smallest keyed hash, so they depend on the user's raw id and own ratings only."""
    ds = load_custom(path=str(udata(tmp_path)), rating_scale=[1, 5], fold=1, seed=0)
    fold = ds.folds[0]
    for frac in (0.1, 0.3):
        val = validation_fold(fold, frac, seed=2)
        counts = fold.train.user_counts()
        want = torch.round(counts.double() * frac).long().clamp_min(1)
        want = torch.where(counts >= 2, torch.minimum(want, counts - 1), torch.zeros_like(want))
        assert torch.equal(val.test.user_counts(), want)
        assert torch.equal(val.train.user_counts() + val.test.user_counts(), counts)
        assert raw_triples(val.train, ds) | raw_triples(val.test, ds) == raw_triples(fold.train, ds)
    assert raw_triples(validation_fold(fold, 0.1, 2).test, ds) != raw_triples(validation_fold(fold, 0.1, 3).test, ds)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_splits_are_the_same_on_cuda(tmp_path):
    ds = load_custom(path=str(udata(tmp_path)), rating_scale=[1, 5], fold=1, seed=0)
    train = ds.folds[0].train
    whole = Ratings(torch.cat([train.users, ds.folds[0].test.users]), torch.cat([train.items, ds.folds[0].test.items]),
                    torch.cat([train.values, ds.folds[0].test.values]), train.n_users, train.n_items, train.scale,
                    dict(train.meta))
    cpu = splits.holdout_mask(whole, 4, 0.1, 7)
    gpu = splits.holdout_mask(whole.to("cuda"), 4, 0.1, 7)
    assert gpu.device.type == "cuda" and torch.equal(cpu, gpu.cpu())
    fold = ds.folds[0]
    v_cpu = validation_fold(fold, 0.1, 1)
    v_gpu = validation_fold(Fold(fold.index, fold.train.to("cuda"), fold.test.to("cuda"), fold.name), 0.1, 1)
    assert torch.equal(v_cpu.test.users, v_gpu.test.users.cpu()) and torch.equal(v_cpu.test.items, v_gpu.test.items.cpu())
