"""A catalogue for any dataset: ``data=custom data.catalog_path=...`` in MovieLens's ``movies.dat``
and ``u.item`` formats or the documented CSV gives the item universe and the public item features;
``model.item_features=auto`` turns them on when a catalogue is attached and says which. Every file is written small
into ``tmp_path`` (no licensed data in the repository)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

import dprec_torch
from dprec_torch.data.custom import load_custom
from dprec_torch.data.item_features import CSV_HEADER, item_features_of, read_catalog
from dprec_torch.data.ratings import ITEM_UNIVERSE
from dprec_torch.errors import ConfigError, DataError
from dprec_torch.models.content import check_item_features
from dprec_torch.predictors.noisy_gram import NoisyGram
from dprec_torch.privacy.scope import item_universe_of

GENRES = ("Action", "Comedy", "Drama", "Horror", "Sci-Fi")
N_USERS, RATED, CATALOGUE = 40, list(range(1, 31)), [33, *range(30, 0, -1), 31, 32]  # 3 catalogued items nobody rated


def write_ratings(path: Path, items: list = RATED, sep: str = "::") -> Path:
    """Every user rates the items with (u + i) % 3 != 0 (about 20 each), seeded values 1..5."""
    rng = np.random.default_rng(0)
    lines = [sep.join(map(str, (u, i, int(rng.integers(1, 6)), 0))) for u in range(1, N_USERS + 1)
             for k, i in enumerate(items) if (u + k) % 3 != 0]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_movies_dat(path: Path, ids: list = CATALOGUE) -> Path:
    rows = [f"{i}::Movie {i} ({1950 + 3 * k})::{GENRES[k % 5]}|{GENRES[(k + 2) % 5]}" for k, i in enumerate(ids)]
    path.write_text("\n".join(rows) + "\n", encoding="latin-1")
    return path


def write_u_item(path: Path, ids: list = CATALOGUE) -> Path:
    rows = []
    for k, i in enumerate(ids):
        flags = ["0"] * 19
        flags[1 + k % 18] = "1"
        rows.append(f"{i}|Movie {i} ({1950 + k})|01-Jan-{1950 + k}||http://example.invalid|" + "|".join(flags))
    path.write_text("\n".join(rows) + "\n", encoding="latin-1")
    return path


def write_csv(path: Path, ids: list = CATALOGUE) -> Path:
    rows = [",".join(CSV_HEADER)]
    for k, i in enumerate(ids):
        year = "" if k == 2 else str(1950 + 3 * k)  # an unknown year is an empty field
        rows.append(f'{i},"Movie {i}, the sequel",{GENRES[k % 5]}|{GENRES[(k + 2) % 5]},{year}')
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def load(ratings: Path, catalog: Path | None, **kw):
    return load_custom(path=str(ratings), catalog_path=None if catalog is None else str(catalog), rating_scale=[1, 5], **kw)


# ------------------------------------------------------------------------------------------ formats
@pytest.mark.parametrize("writer,name", [(write_movies_dat, "movies.dat"), (write_u_item, "u.item"), (write_csv, "items.csv")])
def test_each_format_indexes_items_by_the_catalogue_and_attaches_its_features(tmp_path, writer, name):
    catalog = writer(tmp_path / name)
    data = load(write_ratings(tmp_path / "ratings.dat"), catalog)
    assert data.item_ids == CATALOGUE  # catalogue order, the unrated items included
    fold = data.folds[0]
    assert fold.train.n_items == len(CATALOGUE) and int(fold.train.items.max()) < len(CATALOGUE)
    # the raw item of every rating is the catalogue's id at its index
    assert {data.item_ids[i] for i in fold.train.items.tolist()} <= set(RATED)
    universe = item_universe_of(fold.train)
    assert universe.catalog == str(catalog) and universe.n_items == len(CATALOGUE)
    assert fold.test.meta[ITEM_UNIVERSE] == universe and "catalogue" in data.record()["item_universe"]
    features = item_features_of(fold.train, "test")
    assert features.matrix.shape[0] == len(CATALOGUE) and float(features.matrix.sum()) > 0
    assert features.source == str(catalog)


def test_the_csv_format_quotes_titles_keeps_text_ids_and_empty_years(tmp_path):
    ids = [f"m{i}" for i in CATALOGUE]
    cat = read_catalog(write_csv(tmp_path / "items.csv", ids))
    assert cat.item_ids.tolist() == ids and cat.format == "csv"
    assert cat.titles[0] == "Movie m33, the sequel" and cat.years[2] is None and cat.years[0] == 1950
    assert cat.genres[0] == ("Action", "Drama")
    data = load(write_ratings(tmp_path / "ratings.csv", [f"m{i}" for i in RATED], sep=","), tmp_path / "items.csv")
    assert data.item_ids == ids
    numeric = read_catalog(write_csv(tmp_path / "numeric.csv"))
    assert numeric.item_ids.dtype == np.int64


def test_without_a_catalogue_the_rated_items_are_the_universe_and_no_features_are_attached(tmp_path):
    data = load(write_ratings(tmp_path / "ratings.dat"), None)
    assert data.item_ids == RATED and item_universe_of(data.folds[0].train).catalog is None
    with pytest.raises(DataError, match="data.catalog_path"):
        item_features_of(data.folds[0].train, "noisy_gram")


# ------------------------------------------------------------------------------------------ errors
def _one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_a_malformed_catalogue_is_one_readable_line(tmp_path):
    ratings = write_ratings(tmp_path / "ratings.dat")
    bad = tmp_path / "bad.csv"
    bad.write_text("id,name,genres,year\n1,A,Drama,1990\n")
    with pytest.raises(DataError) as err:
        load(ratings, bad)
    assert "line 1" in _one_line(err) and "item_id,title,genres,year" in str(err.value)
    bad.write_text("item_id,title,genres,year\n1,A,Drama,1990\n2,B,Comedy\n")
    with pytest.raises(DataError) as err:
        load(ratings, bad)
    assert "line 3" in _one_line(err) and "3 fields" in str(err.value)
    bad.write_text("item_id,title,genres,year\n1,A,Drama,nineteen\n")
    with pytest.raises(DataError) as err:
        load(ratings, bad)
    assert "line 2" in _one_line(err) and "year" in str(err.value)
    bad.write_text("item_id,title,genres,year\n1,A,Drama,1990\n1,B,Comedy,1991\n")
    with pytest.raises(DataError) as err:
        load(ratings, bad)
    assert "listed twice" in _one_line(err)
    dat = tmp_path / "movies.dat"
    dat.write_text("1::A (1995)::Drama\nnot a record\n", encoding="latin-1")
    with pytest.raises(DataError) as err:
        load(ratings, dat)
    assert "line 2" in _one_line(err)
    with pytest.raises(ConfigError) as err:  # neither a known name nor .csv: say which key to set
        load(ratings, write_csv(tmp_path / "catalogue.txt"))
    assert "data.catalog_format" in _one_line(err)
    assert load(ratings, tmp_path / "catalogue.txt", catalog_format="csv").n_items == len(CATALOGUE)
    with pytest.raises(DataError) as err:
        load(ratings, tmp_path / "missing.csv")
    assert "not found" in _one_line(err)


def test_a_catalogue_that_misses_rated_items_names_the_rating(tmp_path):
    ratings = write_ratings(tmp_path / "ratings.dat")
    catalog = write_movies_dat(tmp_path / "movies.dat", [i for i in CATALOGUE if i != 7])
    with pytest.raises(DataError) as err:
        load(ratings, catalog)
    msg = _one_line(err)
    assert "ratings.dat:" in msg and "item id 7 does not appear in the catalogue" in msg and "movies.dat" in msg


def test_ids_that_do_not_match_are_one_readable_line(tmp_path):
    ratings = write_ratings(tmp_path / "ratings.dat")
    other = write_movies_dat(tmp_path / "movies.dat", list(range(1001, 1034)))  # another dataset's ids
    with pytest.raises(DataError) as err:
        load(ratings, other)
    assert "the ids do not match" in _one_line(err)
    text = write_csv(tmp_path / "items.csv", [f"m{i}" for i in CATALOGUE])  # text ids against numeric ratings
    with pytest.raises(DataError) as err:
        load(ratings, text)
    assert "item ids are numeric but" in _one_line(err)


# ------------------------------------------------------------------------------------------ item_features=auto
def test_item_features_auto_follows_the_catalogue_and_says_which(tmp_path, caplog):
    ratings = write_ratings(tmp_path / "ratings.dat")
    with_cat = load(ratings, write_movies_dat(tmp_path / "movies.dat")).folds[0]
    without = load(ratings, None).folds[0]
    caplog.set_level(logging.INFO, logger="dprec_torch.models.content")
    on = NoisyGram(epsilon=1.0, item_features="auto", k=10, seed=1).fit(with_cat.train)
    assert on.features_ is not None and on.privacy_report()["public_item_features"]
    off = NoisyGram(epsilon=1.0, item_features="auto", k=10, seed=1).fit(without.train)
    assert off.features_ is None and off.privacy_report()["public_item_features"] is None
    said = [r.getMessage() for r in caplog.records if "item_features=auto" in r.getMessage()]
    assert len(said) == 2 and "-> on" in said[0] and "-> off" in said[1] and "data.catalog_path" in said[1]
    assert check_item_features(True, "x") is True and check_item_features("auto", "x") == "auto"
    with pytest.raises(ConfigError, match="true, false or auto"):
        NoisyGram(item_features="maybe")


BASE = ["device=cpu", "tensorboard=false", "compare_baselines=false", "data=custom", "data.rating_scale=[1,5]"]


def test_the_private_rating_preset_runs_with_a_custom_catalogue(tmp_path):
    """Done-when: data=custom data.catalog_path=<movies.dat> +experiment=private_rating epsilon=1 reads public
    item features; the release of that run is restored in load_run."""
    ratings, movies = write_ratings(tmp_path / "ratings.dat"), write_movies_dat(tmp_path / "movies.dat")
    run = dprec_torch.train([*BASE, f"data.path={ratings}", f"data.catalog_path={movies}", "+experiment=private_rating",
                             "epsilon=1", f"output_dir={tmp_path / 'run'}"])
    assert run.privacy["public_item_features"] and str(movies) in run.privacy["public_item_features"]
    assert run.metrics["dataset"]["n_items"] == len(CATALOGUE)
    assert run.evaluate()["test_rmse"] == pytest.approx(run.metrics["test_rmse"], abs=1e-6)


def test_the_private_rating_preset_runs_without_a_catalogue_and_says_so(tmp_path, caplog):
    """Without a catalogue the preset (model.item_features: auto) runs with public item features off, and one log
    line says so."""
    ratings = write_ratings(tmp_path / "ratings.dat")
    caplog.set_level(logging.INFO, logger="dprec_torch.models.content")
    run = dprec_torch.train([*BASE, f"data.path={ratings}", "+experiment=private_rating", "epsilon=1",
                             f"output_dir={tmp_path / 'run'}"])
    assert run.privacy["public_item_features"] is None
    said = [r.getMessage() for r in caplog.records if "item_features=auto -> off" in r.getMessage()]
    assert len(said) == 1  # one fold, one line
