"""MovieLens loading: $DPREC_DATA (or a fake ml-100k built from synthetic data), cache, download, folds.

The real ML-100K is used when ``$DPREC_DATA/ml-100k`` exists; otherwise the
tests write a fake with the same documented counts (100,000 / 943 / 1,682 and
five 80K/20K folds) and run the very same code path. Nothing is skipped.
"""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path
from urllib.error import URLError

import numpy as np
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from dprec_torch.data import load_movielens, locate_movielens, movielens
from dprec_torch.data.movielens import MovieLensSpec
from dprec_torch.data.synthetic import generate_synthetic
from dprec_torch.errors import ConfigError, DataError

CONF = Path(__file__).resolve().parents[2] / "conf" / "data"
FOLD_FILES = [f"u{k}.{ext}" for k in range(1, 6) for ext in ("base", "test")]


def _lines(u: np.ndarray, i: np.ndarray, r: np.ndarray, sep: str) -> str:
    return "".join(f"{a}{sep}{b}{sep}{int(c)}{sep}{874965758 + a}\n" for a, b, c in zip(u.tolist(), i.tolist(), r.tolist()))


def write_fake_ml100k(folder: Path) -> Path:
    """u.data + u1..u5 base/test with ML-100K's counts, from synthetic ratings (never real data)."""
    folder.mkdir(parents=True)
    u, i, r = generate_synthetic(943, 1682, 100_000, seed=11)
    u, i = u + 1, i + 1  # MovieLens ids start at 1
    (folder / "u.data").write_text(_lines(u, i, r, "\t"))
    part = np.random.default_rng(0).permutation(100_000) % 5
    for k in range(1, 6):
        (folder / f"u{k}.base").write_text(_lines(u[part != k - 1], i[part != k - 1], r[part != k - 1], "\t"))
        (folder / f"u{k}.test").write_text(_lines(u[part == k - 1], i[part == k - 1], r[part == k - 1], "\t"))
    return folder


@pytest.fixture(scope="module")
def ml100k_root(tmp_path_factory) -> Path:
    """A folder holding ``ml-100k/``: ``$DPREC_DATA`` when it has it, else a fake."""
    env = os.environ.get("DPREC_DATA")
    if env and (Path(env) / "ml-100k" / "u.data").is_file():
        return Path(env)
    root = tmp_path_factory.mktemp("fake-data")
    write_fake_ml100k(root / "ml-100k")
    return root


@pytest.fixture
def no_env(monkeypatch, tmp_path):
    """No $DPREC_DATA and an empty cache; any download attempt fails like a machine offline."""
    monkeypatch.delenv("DPREC_DATA", raising=False)
    monkeypatch.setenv("DPREC_CACHE", str(tmp_path / "cache"))

    def offline(url, timeout=None):
        raise URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(movielens, "urlopen", offline)
    return tmp_path / "cache"


def keys(r) -> set[tuple[int, int]]:
    return set(zip(r.users.tolist(), r.items.tolist()))


# ------------------------------------------------------------------ ml-100k
def test_ml100k_all_official_folds(ml100k_root):
    ds = load_movielens("ml-100k", fold="all", data_dir=str(ml100k_root))
    assert ds.report["n_ratings"] == 100_000
    assert (ds.n_users, ds.n_items) == (943, 1682)
    assert ds.user_ids == list(range(1, 944)) and ds.item_ids == list(range(1, 1683))
    assert (ds.scale.lo, ds.scale.hi) == (1.0, 5.0)
    assert [(f.index, f.name) for f in ds.folds] == [(k, f"u{k}") for k in range(1, 6)]
    for f in ds.folds:
        assert (len(f.train), len(f.test)) == (80_000, 20_000)
        assert (f.train.n_users, f.train.n_items) == (943, 1682) == (f.test.n_users, f.test.n_items)
        assert not keys(f.train) & keys(f.test)
    # the five official test sets partition u.data
    assert len(set().union(*(keys(f.test) for f in ds.folds))) == 100_000


def test_ml100k_from_env_matches_u1_files(ml100k_root, monkeypatch):
    monkeypatch.setenv("DPREC_DATA", str(ml100k_root))
    assert locate_movielens("ml-100k") == ml100k_root / "ml-100k"
    ds = load_movielens("ml-100k", fold=1)
    test = np.loadtxt(ml100k_root / "ml-100k" / "u1.test", dtype=np.int64)
    fold = ds.folds[0]
    # raw id k+1 is contiguous index k
    assert keys(fold.test) == set(zip((test[:, 0] - 1).tolist(), (test[:, 1] - 1).tolist()))
    order = np.lexsort((test[:, 1], test[:, 0]))
    got = fold.test.sorted_by_user().values.numpy()
    assert np.array_equal(got, test[order, 2].astype(np.float32))


def test_ml100k_preprocessing_touches_train_only(ml100k_root):
    ds = load_movielens("ml-100k", fold=1, min_user_ratings=21, max_user_ratings=100, data_dir=str(ml100k_root))
    f, stats = ds.folds[0], ds.report["folds"]["u1"]
    assert len(f.test) == 20_000
    counts = f.train.user_counts()
    assert int(counts.max()) <= 100 and int(counts[counts > 0].min()) >= 21
    assert stats["train"] == len(f.train) == 80_000 - stats["min_filter_dropped_ratings"] - stats["cap_dropped_ratings"]
    assert stats["cap_dropped_ratings"] > 0 and stats["capped_users"] > 0


def test_hydra_yaml_ml100k(ml100k_root):
    cfg = OmegaConf.create({"seed": 0, "data": OmegaConf.load(CONF / "ml-100k.yaml")})
    cfg.data.data_dir = str(ml100k_root)
    cfg.data.fold = 2
    ds = instantiate(cfg.data)
    assert cfg.data.name == "ml-100k" and [f.name for f in ds.folds] == ["u2"]


def test_ml100k_bad_options(ml100k_root):
    with pytest.raises(ConfigError, match="out of range: use 1..5 or all"):
        load_movielens("ml-100k", fold=0, data_dir=str(ml100k_root))
    with pytest.raises(ConfigError, match="exactly 5 official folds"):
        load_movielens("ml-100k", n_folds=3, data_dir=str(ml100k_root))
    with pytest.raises(ConfigError) as err:
        load_movielens("ml-10m")
    assert "ml-100k, ml-1m" in str(err.value)


# ------------------------------------------------------- cache and download
def test_cache_is_searched_after_dprec_data(ml100k_root, no_env, monkeypatch):
    monkeypatch.setenv("DPREC_CACHE", str(ml100k_root))
    assert locate_movielens("ml-100k") == ml100k_root / "ml-100k"


def test_no_network_is_one_line_naming_dprec_data(no_env):
    with pytest.raises(DataError) as err:
        load_movielens("ml-100k")
    msg = str(err.value)
    assert "\n" not in msg and "DPREC_DATA" in msg and "ml-100k.zip" in msg
    assert not (no_env / "ml-100k").exists()


def _zip_of(folder: Path, names: list[str], prefix: str) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name in names:
            zf.write(folder / name, f"{prefix}/{name}")
    return buf.getvalue()


class _Response(io.BytesIO):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_download_extracts_validates_and_renames(ml100k_root, no_env, monkeypatch):
    payload = _zip_of(ml100k_root / "ml-100k", ["u.data", *FOLD_FILES], "ml-100k")
    seen = []

    def fake_urlopen(url, timeout=None):
        seen.append((url, timeout))
        return _Response(payload)

    monkeypatch.setattr(movielens, "urlopen", fake_urlopen)
    ds = load_movielens("ml-100k", fold=5)
    assert seen == [("https://files.grouplens.org/datasets/movielens/ml-100k.zip", movielens.DOWNLOAD_TIMEOUT_S)]
    assert (len(ds.folds[0].train), len(ds.folds[0].test)) == (80_000, 20_000)
    assert sorted(p.name for p in no_env.iterdir()) == ["ml-100k", "parsed"]  # no temp leftovers; parsed: the arrays cache of the load
    load_movielens("ml-100k", fold=1)  # second call: found in the cache, no new download
    assert len(seen) == 1


def test_corrupt_download_leaves_no_cache(ml100k_root, no_env, monkeypatch, tmp_path):
    short = tmp_path / "short"
    short.mkdir()
    lines = (ml100k_root / "ml-100k" / "u.data").read_text().splitlines(keepends=True)
    (short / "u.data").write_text("".join(lines[:-10]))  # as if the transfer was cut
    payload = _zip_of(short, ["u.data"], "ml-100k")
    monkeypatch.setattr(movielens, "urlopen", lambda url, timeout=None: _Response(payload))
    with pytest.raises(DataError) as err:
        locate_movielens("ml-100k")
    assert "99,990 ratings" in str(err.value) and "is corrupt" in str(err.value) and "\n" not in str(err.value)
    assert not no_env.exists() or list(no_env.iterdir()) == []
    monkeypatch.setattr(movielens, "urlopen", lambda url, timeout=None: _Response(b"<html>not a zip</html>"))
    with pytest.raises(DataError, match="not a valid zip"):
        locate_movielens("ml-100k")


def test_modified_local_copy_fails_validation(ml100k_root, tmp_path):
    folder = tmp_path / "ml-100k"
    folder.mkdir()
    lines = (ml100k_root / "ml-100k" / "u.data").read_text().splitlines(keepends=True)
    (folder / "u.data").write_text("".join(lines[:50_000]))
    with pytest.raises(DataError, match="incomplete or modified"):
        load_movielens("ml-100k", data_dir=str(tmp_path))


def test_fold_file_with_unknown_id(ml100k_root, tmp_path):
    folder = tmp_path / "ml-100k"
    folder.mkdir()
    (folder / "u.data").write_bytes((ml100k_root / "ml-100k" / "u.data").read_bytes())
    (folder / "u1.base").write_text("1\t1\t3\t0\n")
    (folder / "u1.test").write_text("1\t1\t3\t0\n2\t1\t4\t0\n9999\t2\t4\t0\n")
    with pytest.raises(DataError) as err:
        load_movielens("ml-100k", data_dir=str(tmp_path))
    assert "u1.test:3:" in str(err.value) and "9999" in str(err.value)
    (folder / "u2.base").unlink(missing_ok=True)
    with pytest.raises(DataError, match="u2.base: ratings file not found"):
        load_movielens("ml-100k", fold=2, data_dir=str(tmp_path))


# -------------------------------------------------------------------- ml-1m
def test_ml1m_holdouts_from_colon_file(tmp_path, monkeypatch):
    """ML-1M's code path on a small '::' file (the documented counts are swapped for the fixture's)."""
    u, i, r = generate_synthetic(60, 40, 600, seed=2)
    folder = tmp_path / "ml-1m"
    folder.mkdir()
    (folder / "ratings.dat").write_text(_lines(u + 1, i + 1, r, "::"))
    spec = MovieLensSpec("ml-1m", "https://example.invalid/ml-1m.zip", "ratings.dat", "::", 600, 60, 40)
    monkeypatch.setitem(movielens.SPECS, "ml-1m", spec)
    ds = load_movielens("ml-1m", fold="all", seed=4, data_dir=str(tmp_path))
    assert [f.name for f in ds.folds] == [f"holdout-{k}" for k in range(1, 6)]
    assert ds.user_ids == list(range(1, 61))
    for f in ds.folds:
        assert len(f.train) + len(f.test) == 600 and 30 <= len(f.test) <= 90  # ~10 %: a keyed Bernoulli per rating
        assert len(keys(f.train) | keys(f.test)) == 600
    with pytest.raises(ConfigError, match="use 1..3 or all"):
        load_movielens("ml-1m", fold=4, n_folds=3, data_dir=str(tmp_path))
    cfg = OmegaConf.create({"seed": 4, "data": OmegaConf.load(CONF / "ml-1m.yaml")})
    cfg.data.data_dir = str(tmp_path)
    cfg.data.fold = 2
    assert keys(instantiate(cfg.data).folds[0].test) == keys(ds.folds[1].test)
