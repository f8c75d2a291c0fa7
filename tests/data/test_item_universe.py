"""Items are indexed by the public catalogue: every catalogued movie gets an index, rated or not.

Real MovieLens is used when ``$DPREC_DATA`` holds it; otherwise each test writes a tiny catalogue and ratings
in MovieLens's formats to ``tmp_path`` (with the documented counts swapped for the fixture's) and runs the same
code path. No test is skipped.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from dprec_torch.data import movielens, readers
from dprec_torch.data.custom import load_custom
from dprec_torch.data.item_features import item_features_of, read_catalog
from dprec_torch.data.movielens import MovieLensSpec, load_movielens
from dprec_torch.data.ratings import ItemUniverse
from dprec_torch.data.readers import build_id_space, catalog_id_space, encode, read_ratings
from dprec_torch.data.synthetic import load_synthetic
from dprec_torch.errors import DataError
from dprec_torch.predictors.knn import ItemKNN
from dprec_torch.privacy.scope import item_universe_of, privacy_scope
from tests.data.test_data_movielens import write_fake_ml100k

ML1M_GENRES = ("Action", "Comedy", "Drama", "Horror")


def _real(name: str, *files: str) -> Path | None:
    root = os.environ.get("DPREC_DATA")
    folder = Path(root) / name if root else None
    return folder if folder is not None and all((folder / f).is_file() for f in files) else None


def write_tiny_ml1m(folder: Path, catalog_ids: list[int], rated: list[int], extra_item: int | None = None) -> Path:
    """``movies.dat`` listing ``catalog_ids`` (in that order) and ``ratings.dat`` rating only the ``rated`` ones
    (each by at least two of 30 users); ``extra_item``: one rating of an id the catalogue does not list."""
    folder.mkdir(parents=True, exist_ok=True)
    movies = [f"{i}::Movie {i} ({1930 + 7 * k})::{ML1M_GENRES[k % 4]}|{ML1M_GENRES[(k + 1) % 4]}"
              for k, i in enumerate(catalog_ids)]
    (folder / "movies.dat").write_text("\n".join(movies) + "\n", encoding="latin-1")
    rng = np.random.default_rng(0)
    lines = [f"{u}::{i}::{int(rng.integers(1, 6))}::0" for u in range(1, 31) for i in rated if (u + i) % 3 != 0]
    if extra_item is not None:
        lines.append(f"7::{extra_item}::4::0")
    (folder / "ratings.dat").write_text("\n".join(lines) + "\n")
    return folder


def tiny_spec(folder: Path, n_catalog: int) -> MovieLensSpec:
    raw = read_ratings(folder / "ratings.dat", sep="::", header=False)
    users, items = build_id_space(raw)
    return MovieLensSpec("ml-1m", "https://example.invalid/ml-1m.zip", "ratings.dat", "::", len(raw),
                         len(users), n_catalog, len(items))


# catalogue order is not id order, and the unrated ids 40 and 5 sit inside it
TINY_CATALOG = [10, 3, 40, 7, 5, 22, 31, 8]
TINY_RATED = [10, 3, 7, 22, 31, 8]


@pytest.fixture
def tiny_ml1m(tmp_path, monkeypatch) -> Path:
    folder = write_tiny_ml1m(tmp_path / "ml-1m", TINY_CATALOG, TINY_RATED)
    monkeypatch.setitem(movielens.SPECS, "ml-1m", tiny_spec(folder, len(TINY_CATALOG)))
    return tmp_path


# ----------------------------------------------------------------------------------------------- ML-1M
def test_ml1m_indexes_every_catalogued_movie(tmp_path, monkeypatch):
    real = _real("ml-1m", "ratings.dat", "movies.dat")
    if real is not None:
        root, n_catalog, n_rated = real.parent, 3883, 3706
    else:  # no real ML-1M here: the same code path on a tiny catalogue (never a silent pass)
        write_tiny_ml1m(tmp_path / "ml-1m", TINY_CATALOG, TINY_RATED)
        monkeypatch.setitem(movielens.SPECS, "ml-1m", tiny_spec(tmp_path / "ml-1m", len(TINY_CATALOG)))
        root, n_catalog, n_rated = tmp_path, len(TINY_CATALOG), len(TINY_RATED)
    ds = load_movielens("ml-1m", fold=1, data_dir=str(root))
    catalog = read_catalog(root / "ml-1m" / "movies.dat")
    assert ds.n_items == n_catalog == len(catalog)
    assert ds.item_ids == catalog.item_ids.tolist()  # catalogue order
    fold = ds.folds[0]
    assert fold.train.n_items == fold.test.n_items == n_catalog
    rated = torch.unique(torch.cat([fold.train.items, fold.test.items]))
    assert rated.numel() == n_rated  # the unrated movies have an index and no rating
    assert ds.record()["item_universe"] == f"catalogue movies.dat ({n_catalog} items)"
    assert item_universe_of(fold.train) == ItemUniverse(n_catalog, str(root / "ml-1m" / "movies.dat"))
    assert item_features_of(fold.train, "test").matrix.shape[0] == n_catalog  # features cover unrated movies too


def test_catalogue_order_is_kept_and_every_rating_lands_on_its_movie(tiny_ml1m):
    ds = load_movielens("ml-1m", fold="all", n_folds=2, data_dir=str(tiny_ml1m))
    assert ds.item_ids == TINY_CATALOG
    raw = read_ratings(tiny_ml1m / "ml-1m" / "ratings.dat", sep="::", header=False)
    pairs = set(zip(raw.users.tolist(), raw.items.tolist()))
    for f in ds.folds:
        for part in (f.train, f.test):
            got = {(ds.user_ids[u], ds.item_ids[i]) for u, i in zip(part.users.tolist(), part.items.tolist())}
            assert got <= pairs
    unrated = [ds.item_ids.index(i) for i in (40, 5)]
    assert all(int(f.train.item_counts()[k]) == 0 for f in ds.folds for k in unrated)


def test_a_parsed_ratings_cache_never_freezes_the_universe(tmp_path, monkeypatch):
    """The parsed-ratings cache holds raw ids only: adding the catalogue after a cached parse re-indexes."""
    monkeypatch.setenv("DPREC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(readers, "PARSED_CACHE_MIN_BYTES", 0)
    folder = write_tiny_ml1m(tmp_path / "data" / "ml-1m", TINY_CATALOG, TINY_RATED)
    monkeypatch.setitem(movielens.SPECS, "ml-1m", tiny_spec(folder, len(TINY_CATALOG)))
    catalog_text = (folder / "movies.dat").read_text(encoding="latin-1")
    (folder / "movies.dat").unlink()
    before = load_movielens("ml-1m", data_dir=str(folder.parent))
    assert before.n_items == len(TINY_RATED) and before.record()["item_universe"].startswith("rated items")
    assert list((tmp_path / "cache" / "parsed").iterdir())  # the parse was cached
    (folder / "movies.dat").write_text(catalog_text, encoding="latin-1")
    after = load_movielens("ml-1m", data_dir=str(folder.parent))
    assert after.item_ids == TINY_CATALOG and after.record()["item_universe"] == "catalogue movies.dat (8 items)"


def test_a_missing_catalogue_falls_back_to_the_rated_items_and_says_so(tiny_ml1m, caplog):
    (tiny_ml1m / "ml-1m" / "movies.dat").unlink()
    with caplog.at_level(logging.WARNING, logger="dprec_torch.data.movielens"):
        ds = load_movielens("ml-1m", data_dir=str(tiny_ml1m))
    assert ds.item_ids == sorted(TINY_RATED)
    assert "treated as public" in caplog.text and "movies.dat" in caplog.text
    scope = privacy_scope({"epsilon": 1.0}, None, False, item_universe_of(ds.folds[0].train))
    assert "treated as public" in scope["treated_as_public"][0]


# ------------------------------------------------------------------------------------- unrated items
def test_an_unrated_catalogued_item_gets_the_documented_fallback(tiny_ml1m):
    ds = load_movielens("ml-1m", fold=1, data_dir=str(tiny_ml1m))
    train = ds.folds[0].train
    item = ds.item_ids.index(40)  # catalogued, never rated
    users = torch.tensor([0, 3, 11])
    items = torch.full_like(users, item)
    assert float(train.item_means()[item]) == pytest.approx(train.global_mean)
    for sim in ("pearson", "cosine"):
        model = ItemKNN(similarity=sim, k=5).fit(train)
        assert torch.isfinite(model.sim_).all()  # an empty column gives zero similarities, not NaN
        pred = model.predict(users, items)
        assert torch.allclose(pred, torch.full_like(pred, train.global_mean))  # item mean -> global mean
        assert model.fallback_rate_ == 1.0
        known = model.predict(users, torch.full_like(users, ds.item_ids.index(10)))
        assert torch.isfinite(known).all() and bool(((known >= 1) & (known <= 5)).all())
    feats = item_features_of(train, "test")
    assert float(feats.matrix[item].norm()) > 0  # the unrated movie has its public genres and decade


# ------------------------------------------------------------------------------------------ errors
def test_a_rating_of_an_uncatalogued_item_is_one_readable_error(tmp_path, monkeypatch):
    folder = write_tiny_ml1m(tmp_path / "ml-1m", TINY_CATALOG, TINY_RATED, extra_item=999)
    monkeypatch.setitem(movielens.SPECS, "ml-1m", tiny_spec(folder, len(TINY_CATALOG)))
    with pytest.raises(DataError) as err:
        load_movielens("ml-1m", data_dir=str(tmp_path))
    msg = str(err.value)
    n_lines = len((folder / "ratings.dat").read_text().splitlines())
    assert "\n" not in msg
    assert f"ratings.dat:{n_lines}: item id 999 does not appear in the catalogue" in msg
    assert "movies.dat (8 items)" in msg and "catalogued item" in msg


def test_catalogue_files_are_checked(tmp_path):
    path = tmp_path / "movies.dat"
    path.write_text("1::A (1995)::Drama\n2::B (1996)::Comedy\n1::C (1997)::Drama\n", encoding="latin-1")
    with pytest.raises(DataError, match=r"line 3: item id 1 is listed twice \(first on line 1\)"):
        read_catalog(path)
    path.write_text("1::A (1995)::Drama\nnot a record\n", encoding="latin-1")
    with pytest.raises(DataError, match="line 2: not a movies.dat movie record"):
        read_catalog(path)
    with pytest.raises(DataError, match="unknown catalogue format 'books.csv'"):
        read_catalog(path, "books.csv")
    (tmp_path / "r.dat").write_text("1::a::3\n")
    raw = read_ratings(tmp_path / "r.dat", sep="::")
    with pytest.raises(DataError, match="item ids are text but the catalogue"):
        catalog_id_space(np.array([1, 2]), raw, catalog=str(path))


def test_the_catalogue_reader_returns_ids_titles_genres_years_in_file_order(tmp_path):
    (tmp_path / "movies.dat").write_text("5::Zeta (1927)::Sci-Fi\n2::Alpha::Comedy|Drama\n", encoding="latin-1")
    cat = read_catalog(tmp_path / "movies.dat")
    assert cat.item_ids.tolist() == [5, 2] and cat.titles == ("Zeta (1927)", "Alpha")
    assert cat.genres == (("Sci-Fi",), ("Comedy", "Drama")) and cat.years == (1927, None)
    (tmp_path / "u.item").write_text("1|Toy Story (1995)|01-Jan-1995||http://x|0|0|0|1|1|1|0|0|0|0|0|0|0|0|0|0|0|0|0\n",
                                     encoding="latin-1")
    cat = read_catalog(tmp_path / "u.item")
    assert cat.item_ids.tolist() == [1] and cat.genres == (("Animation", "Children's", "Comedy"),) and cat.years == (1995,)


# ----------------------------------------------------------------------------------------- ML-100K
def test_ml100k_index_is_identical_to_the_rated_items_index(tmp_path):
    """u.item lists the 1,682 rated items with ids 1..1682: the catalogue index equals the old one, so every
    published ML-100K figure stays bit-identical."""
    real = _real("ml-100k", "u.data", "u.item", "u1.base", "u1.test")
    if real is None:  # a fake with a u.item in the real format (never a silent pass)
        real = write_fake_ml100k(tmp_path / "ml-100k")
        flags = "|".join(["0"] * 18 + ["1"])
        (real / "u.item").write_text("".join(f"{i}|Movie {i} (1995)|01-Jan-1995||http://x|{flags}\n"
                                             for i in range(1, 1683)), encoding="latin-1")
    ds = load_movielens("ml-100k", fold="all", data_dir=str(real.parent))
    assert ds.record()["item_universe"] == "catalogue u.item (1682 items)"
    old_users, old_items = build_id_space(read_ratings(real / "u.data", sep="\t", header=False))
    assert ds.item_ids == old_items.tolist() == read_catalog(real / "u.item").item_ids.tolist()
    assert ds.user_ids == old_users.tolist()
    for f in ds.folds:
        for part, ext in ((f.train, "base"), (f.test, "test")):
            old = encode(read_ratings(real / f"u{f.index}.{ext}", sep="\t", header=False), old_users, old_items,
                         ds.scale)
            assert torch.equal(part.users, old.users) and torch.equal(part.items, old.items)
            assert torch.equal(part.values, old.values) and part.n_items == old.n_items


# ------------------------------------------------------------------------------------------- scope
def test_scope_names_the_catalogue_or_says_the_universe_is_treated_as_public(tiny_ml1m, tmp_path):
    report = {"epsilon": 1.0, "mechanism": "gaussian"}
    ml = load_movielens("ml-1m", data_dir=str(tiny_ml1m))
    items, users = privacy_scope(report, None, False, item_universe_of(ml.folds[0].train))["treated_as_public"]
    assert "public catalogue movies.dat (8 items" in items and "costs no privacy" in items
    assert "number of users" in users and "treated as public" in users

    csv = tmp_path / "r.csv"
    csv.write_text("".join(f"{u},{i},{1 + (u * i) % 5}\n" for u in range(1, 40) for i in range(1, 12) if (u + i) % 4))
    custom = load_custom(path=str(csv), rating_scale=[1, 5])
    assert custom.record()["item_universe"] == "rated items (11 items, treated as public)"
    items, users = privacy_scope(report, None, False, item_universe_of(custom.folds[0].train))["treated_as_public"]
    assert "11 items rated anywhere in the data" in items and "treated as public" in items
    assert "number of users" in users and "treated as public" in users

    synthetic = load_synthetic(preset="tiny")
    assert "treated as public" in synthetic.record()["item_universe"]
    plain = privacy_scope(report)["treated_as_public"]
    assert len(plain) == 1 and "item universe" in plain[0] and "number of users" in plain[0]
    assert "treated as public" in plain[0]
