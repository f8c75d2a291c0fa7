"""The public item catalogue (item universe, titles, genres, release year) and item features built from it.

MovieLens ships each movie's genres and title with its release year (ML-1M ``movies.dat``, ML-100K ``u.item``). That
metadata describes the catalogue, not any user (no rating enters it), so a model that reads it spends no privacy
budget. :func:`read_catalog` reads such a file (ordered item ids, titles, genres, years); the MovieLens loader indexes
items by it (every catalogued item, rated or not, in catalogue order), and :func:`catalog_item_features` turns it into
one row per contiguous item index:

    phi_i = (genre_g / sqrt(#genres of i) for each genre g, one-hot release decade: <1930, 1930s, ..., >=2000)

so every row has the same scale (genre part of norm 1, decade part of norm 1). The loaders attach it to
``Ratings.meta[ITEM_FEATURES]`` when a catalogue is present (``data=custom``: ``data.catalog_path``); predictors with
``item_features=true`` (``auto``: if one is attached) read it there (:class:`~dprec_torch.predictors.noisy_gram.NoisyGram`).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dprec_torch.data.ratings import ItemUniverse
from dprec_torch.errors import ConfigError, DataError

#: key of the public item features in ``Ratings.meta``
ITEM_FEATURES = "item_features"
DECADES = ("<1930", "1930s", "1940s", "1950s", "1960s", "1970s", "1980s", "1990s", ">=2000")
#: the metadata file of each MovieLens release, and its field separator
METADATA_FILES = {"ml-1m": ("movies.dat", "::"), "ml-100k": ("u.item", "|")}
ML100K_GENRES = ("unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary", "Drama",
                 "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller", "War", "Western")
_YEAR = re.compile(r"(\d{4})")


@dataclass
class ItemFeatures:
    """Public per-item features: ``matrix[k]`` belongs to contiguous item index k."""

    matrix: torch.Tensor  # float32 [M, F]
    names: list[str]
    source: str

    def describe(self) -> str:
        return (f"{self.matrix.shape[1]} public item features ({', '.join(self.names[:3])}, ...) from {self.source}: "
                "catalogue metadata that no rating enters, so reading it costs no privacy")


def decade_index(year: int | None) -> int:
    """Position of ``year`` in :data:`DECADES` (unknown year: the 1990s, the catalogue's mode)."""
    if year is None:
        return DECADES.index("1990s")
    return min(max((year - 1920) // 10, 0), len(DECADES) - 1)


def _movies_dat_record(parts: list[str]) -> tuple[int, str, tuple[str, ...], int | None]:
    """``MovieID::Title (Year)::Genre|Genre`` (ML-1M)."""
    raw_id, title, genres = int(parts[0]), parts[1], tuple(parts[2].split("|"))
    found = _YEAR.findall(title)
    return raw_id, title, genres, int(found[-1]) if found else None


def _u_item_record(parts: list[str]) -> tuple[int, str, tuple[str, ...], int | None]:
    """``id|title|release date|video date|url|19 genre flags`` (ML-100K); the year is the release date's."""
    raw_id, title, date = int(parts[0]), parts[1], parts[2]
    flags = [int(f) for f in parts[5:5 + len(ML100K_GENRES)]]
    if len(flags) != len(ML100K_GENRES):
        raise ValueError("too few genre flags")
    found = _YEAR.findall(date)
    return raw_id, title, tuple(g for g, f in zip(ML100K_GENRES, flags) if f), int(found[-1]) if found else None


def _csv_record(parts: list[str]) -> tuple[str, str, tuple[str, ...], int | None]:
    """``item_id,title,genres,year`` (:data:`CSV_HEADER`): genres ``|``-separated (may be empty), year an integer or
    empty. The id stays text here; :func:`read_catalog` makes the ids integers when every one is."""
    if len(parts) != len(CSV_HEADER):
        raise ValueError(f"{len(parts)} fields, expected {len(CSV_HEADER)} ({','.join(CSV_HEADER)}; quote a title that "
                         "holds a comma)")
    raw_id, title, genres, year = (p.strip() for p in parts)
    if not raw_id:
        raise ValueError("the item id is empty")
    if year and not _INTEGER.fullmatch(year):
        raise ValueError(f"year {year!r} is not an integer (leave it empty when unknown)")
    return raw_id, title, tuple(g.strip() for g in genres.split("|") if g.strip()), int(year) if year else None


#: the header of a CSV catalogue (``data.catalog_path`` of ``data=custom``; docs/usage.md)
CSV_HEADER = ("item_id", "title", "genres", "year")
_INTEGER = re.compile(r"[+-]?\d+")
#: catalogue formats: name -> (field separator, record parser); MovieLens's two formats are named after their files
CATALOG_FORMATS = {"movies.dat": ("::", _movies_dat_record), "u.item": ("|", _u_item_record), "csv": (",", _csv_record)}
#: what one line of each format describes, and how to repair a malformed one
_MOVIELENS_RECORD = ("movie record", "replace the file with the original from the dataset's zip")
_RECORD = {"movies.dat": _MOVIELENS_RECORD, "u.item": _MOVIELENS_RECORD,
           "csv": ("catalogue record", "each line after the header is item_id,title,genres,year (genres |-separated; docs/usage.md)")}


@dataclass(frozen=True)
class Catalog:
    """A public item catalogue: every item's raw id in file order, with its title, genres and release year. No rating
    enters it, so an item index (:meth:`universe`) and features (:func:`catalog_item_features`) built from it cost no
    privacy."""

    path: Path
    item_ids: np.ndarray  # raw ids, distinct, in file order: int64, or text (a CSV whose ids are not all integers)
    titles: tuple[str, ...]
    genres: tuple[tuple[str, ...], ...]
    years: tuple[int | None, ...]  # None where the file gives no year
    format: str = "movies.dat"

    def __len__(self) -> int:
        return int(self.item_ids.shape[0])

    def universe(self) -> ItemUniverse:
        """The item universe this catalogue defines (for ``Ratings.meta`` and the dataset record)."""
        return ItemUniverse(len(self), str(self.path))


def catalog_format(path: Path, fmt: str | None = None) -> str:
    """``fmt`` when given (not ``auto``), else from the file's name: ``movies.dat``, ``u.item``, or ``*.csv``."""
    if fmt not in (None, "auto"):
        if fmt not in CATALOG_FORMATS:
            raise DataError(f"{path}: unknown catalogue format {fmt!r}: known formats are {', '.join(CATALOG_FORMATS)} "
                            "(data.catalog_format; auto = from the file's name)")
        return fmt
    if path.name in CATALOG_FORMATS:
        return path.name
    if path.suffix.lower() == ".csv":
        return "csv"
    raise ConfigError(f"{path}: cannot tell the catalogue's format from its name: set data.catalog_format to "
                      f"{', '.join(CATALOG_FORMATS)}")


def _records(path: Path, fmt: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of every non-blank line; a CSV's header is checked and skipped."""
    if fmt != "csv":
        with open(path, encoding="latin-1") as fh:  # the MovieLens files' encoding
            for no, line in enumerate(fh, 1):
                line = line.rstrip("\r\n")
                if line.strip():
                    yield no, line.split(CATALOG_FORMATS[fmt][0])
        return
    with open(path, encoding="utf-8-sig", newline="") as fh:
        reader = csv.reader(fh)
        rows = ((reader.line_num, fields) for fields in reader if any(f.strip() for f in fields))
        for no, fields in rows:  # the first non-blank row: the header
            if tuple(f.strip().lower() for f in fields) != CSV_HEADER:
                raise DataError(f"{path}, line {no}: a CSV catalogue starts with the header "
                                f"{','.join(CSV_HEADER)} (found {','.join(fields)[:80]!r})")
            break
        yield from rows


def read_catalog(path: str | Path, fmt: str | None = None) -> Catalog:
    """Read a catalogue file: ``fmt`` is ``movies.dat``, ``u.item`` or ``csv`` (None or ``auto``: :func:`catalog_format`).

    MovieLens's formats are Latin-1 text, one item per non-blank line; a CSV is UTF-8 with the header :data:`CSV_HEADER`,
    its ids integers when every one is, else text. A malformed line, an id listed twice or an unreadable file is one
    readable :class:`DataError` naming ``file, line N``.
    """
    path = Path(path)
    fmt = catalog_format(path, fmt)
    if not path.is_file():
        raise DataError(f"{path}: catalogue file not found")
    parse, (record, fix) = CATALOG_FORMATS[fmt][1], _RECORD[fmt]
    rows: list[tuple] = []  # (line, raw id, title, genres, year)
    try:
        for no, fields in _records(path, fmt):
            try:
                rows.append((no, *parse(fields)))
            except (IndexError, ValueError) as err:
                raise DataError(f"{path}, line {no}: not a {fmt} {record} ({err}); {fix}") from None
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); save the catalogue as UTF-8") from None
    if not rows:
        raise DataError(f"{path}: the catalogue lists no items")
    lines, ids, titles, genres, years = (list(col) for col in zip(*rows))
    if fmt == "csv":  # integer ids when every id is one (as a ratings file's), else text
        ids = [int(i) for i in ids] if all(_INTEGER.fullmatch(i) for i in ids) else ids
    first_line: dict = {}
    for no, raw_id in zip(lines, ids):
        if raw_id in first_line:
            raise DataError(f"{path}, line {no}: item id {raw_id} is listed twice (first on line "
                            f"{first_line[raw_id]}); a catalogue lists each item once")
        first_line[raw_id] = no
    item_ids = np.asarray(ids, dtype=np.int64) if isinstance(ids[0], int) else np.asarray(ids, dtype=str)
    return Catalog(path, item_ids, tuple(titles), tuple(genres), tuple(years), fmt)


def _id_key(raw) -> int | str:
    """A raw id as a dict key: text stays text, any integer type becomes ``int``."""
    return raw if isinstance(raw, str) else int(raw)


def catalog_item_features(catalog: Catalog, item_ids: list) -> ItemFeatures:
    """The features of every item in ``item_ids`` (raw ids, in contiguous-index order) from ``catalog``; the genre
    columns are every genre the catalogue names (sorted), whichever items are asked for."""
    position = {_id_key(raw): k for k, raw in enumerate(catalog.item_ids.tolist())}
    missing = [i for i in item_ids if _id_key(i) not in position]
    if missing:
        raise DataError(f"{catalog.path} has no record for {len(missing)} rated movie(s) (first: {missing[0]}); "
                        "replace it with the original file")
    names = sorted({g for gs in catalog.genres for g in gs})
    column = {g: k for k, g in enumerate(names)}
    mat = torch.zeros(len(item_ids), len(names) + len(DECADES))
    for k, raw in enumerate(item_ids):
        p = position[_id_key(raw)]
        gs = catalog.genres[p]
        for g in gs:
            mat[k, column[g]] = 1.0 / len(gs) ** 0.5
        mat[k, len(names) + decade_index(catalog.years[p])] = 1.0
    return ItemFeatures(mat, [f"genre:{g}" for g in names] + [f"decade:{d}" for d in DECADES], str(catalog.path))


def movielens_item_features(folder: str | Path, name: str, item_ids: list) -> ItemFeatures:
    """The features of every item in ``item_ids`` (raw ids, in contiguous-index order) from ``folder``'s metadata."""
    if name not in METADATA_FILES:
        raise DataError(f"no public item metadata is known for dataset {name!r}; item features exist for {sorted(METADATA_FILES)}")
    path = Path(folder) / METADATA_FILES[name][0]
    if not path.is_file():
        raise DataError(f"{path} is missing: item_features=true reads the movies' genres and years from it; "
                        f"copy it from the {name} zip next to the ratings (or set item_features=false)")
    return catalog_item_features(read_catalog(path, METADATA_FILES[name][0]), item_ids)


@dataclass
class MovieLensMetadata:
    """A loaded MovieLens dataset's metadata; the feature matrix is built on first use (never, if nobody asks)."""

    folder: str
    name: str
    item_ids: list
    catalog: Catalog | None = None  # already read by the loader (it defines the item universe): not read again
    _cache: ItemFeatures | None = None

    def load(self) -> ItemFeatures:
        if self._cache is None:
            self._cache = (movielens_item_features(self.folder, self.name, self.item_ids) if self.catalog is None
                           else catalog_item_features(self.catalog, self.item_ids))
        return self._cache


@dataclass
class CatalogFeatures:
    """The features of a catalogue attached to a loaded dataset (``data=custom data.catalog_path=...``), built on first use."""

    catalog: Catalog
    item_ids: list
    _cache: ItemFeatures | None = None

    def load(self) -> ItemFeatures:
        if self._cache is None:
            self._cache = catalog_item_features(self.catalog, self.item_ids)
        return self._cache


def item_features_of(ratings, who: str) -> ItemFeatures:
    """The public item features attached to ``ratings`` (``Ratings.meta``), or one readable DataError."""
    entry = ratings.meta.get(ITEM_FEATURES)
    if entry is None:
        raise DataError(f"{who}: item_features=true needs public item metadata, and this dataset has none attached "
                        f"(MovieLens: {', '.join(f for f, _ in METADATA_FILES.values())} beside the ratings; data=custom: "
                        "data.catalog_path); set item_features=false or auto")
    feats = entry.load() if isinstance(entry, (MovieLensMetadata, CatalogFeatures)) else entry
    if not isinstance(feats, ItemFeatures) or feats.matrix.shape[0] != ratings.n_items:
        raise DataError(f"{who}: the attached item features do not cover the dataset's {ratings.n_items} items")
    return feats


def random_item_features(n_items: int, n_genres: int = 5, seed: int = 0) -> ItemFeatures:
    """One random genre per item, drawn from ``seed`` alone (so public by construction): for synthetic data that has
    no catalogue, e.g. the canary audit of a model run with ``item_features=true``."""
    gen = torch.Generator().manual_seed(int(seed))
    genre = torch.randint(0, n_genres, (n_items,), generator=gen)
    return ItemFeatures(torch.nn.functional.one_hot(genre, n_genres).float(), [f"genre:{g}" for g in range(n_genres)],
                        f"random genres (seed {seed}; independent of every rating)")


def attach_item_features(dataset, source: "ItemFeatures | MovieLensMetadata | CatalogFeatures") -> None:
    """Put ``source`` in every fold's train and test ``Ratings.meta`` (one object shared by all folds)."""
    for f in dataset.folds:
        f.train.meta[ITEM_FEATURES] = f.test.meta[ITEM_FEATURES] = source
