"""Public item metadata (genres, release decade) as item features.

MovieLens ships each movie's genres and title with its release year (ML-1M ``movies.dat``, ML-100K ``u.item``).
That metadata describes the catalogue, not any user: no rating enters it, so a model that reads it spends no
privacy budget on it. :func:`movielens_item_features` turns it into one row per contiguous item index:

    phi_i = (genre_g / sqrt(#genres of i) for each genre g, one-hot release decade: <1930, 1930s, ..., >=2000)

so every row has the same scale (genre part of norm 1, decade part of norm 1). The loader attaches the matrix to
``Ratings.meta[ITEM_FEATURES]`` when the metadata file is present; predictors with ``item_features=true`` read it
there (:class:`dprec_torch.predictors.noisy_gram.NoisyGram`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from dprec_torch.errors import DataError

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


def _parse(path: Path, name: str) -> dict[int, tuple[list[str], int | None]]:
    """raw movie id -> (genres, year or None), with one readable error per malformed line."""
    sep = METADATA_FILES[name][1]
    out: dict[int, tuple[list[str], int | None]] = {}
    with open(path, encoding="latin-1") as fh:
        for no, line in enumerate(fh, 1):
            line = line.rstrip("\r\n")
            if not line:
                continue
            parts = line.split(sep)
            try:
                if name == "ml-1m":
                    raw_id, title, genres = int(parts[0]), parts[1], parts[2].split("|")
                    found = _YEAR.findall(title)
                else:
                    raw_id, date = int(parts[0]), parts[2]
                    flags = [int(f) for f in parts[5:5 + len(ML100K_GENRES)]]
                    if len(flags) != len(ML100K_GENRES):
                        raise ValueError("too few genre flags")
                    genres = [g for g, f in zip(ML100K_GENRES, flags) if f]
                    found = _YEAR.findall(date)
            except (IndexError, ValueError) as err:
                raise DataError(f"{path}, line {no}: not a {name} movie record ({err}); replace the file with the "
                                "original from the dataset's zip") from None
            out[raw_id] = (genres, int(found[-1]) if found else None)
    return out


def movielens_item_features(folder: str | Path, name: str, item_ids: list) -> ItemFeatures:
    """The features of every item in ``item_ids`` (raw ids, in contiguous-index order) from ``folder``'s metadata."""
    if name not in METADATA_FILES:
        raise DataError(f"no public item metadata is known for dataset {name!r}; item features exist for {sorted(METADATA_FILES)}")
    path = Path(folder) / METADATA_FILES[name][0]
    if not path.is_file():
        raise DataError(f"{path} is missing: item_features=true reads the movies' genres and years from it; "
                        f"copy it from the {name} zip next to the ratings (or set item_features=false)")
    meta = _parse(path, name)
    missing = [i for i in item_ids if int(i) not in meta]
    if missing:
        raise DataError(f"{path} has no record for {len(missing)} rated movie(s) (first: {missing[0]}); replace it with "
                        "the original file")
    genres = sorted({g for gs, _ in meta.values() for g in gs})
    mat = torch.zeros(len(item_ids), len(genres) + len(DECADES))
    for k, raw in enumerate(item_ids):
        gs, year = meta[int(raw)]
        for g in gs:
            mat[k, genres.index(g)] = 1.0 / len(gs) ** 0.5
        mat[k, len(genres) + decade_index(year)] = 1.0
    return ItemFeatures(mat, [f"genre:{g}" for g in genres] + [f"decade:{d}" for d in DECADES], str(path))


@dataclass
class MovieLensMetadata:
    """Where a loaded MovieLens dataset's metadata lives; parsed on first use (a run that never asks for item
    features never reads, or fails on, the file)."""

    folder: str
    name: str
    item_ids: list
    _cache: ItemFeatures | None = None

    def load(self) -> ItemFeatures:
        if self._cache is None:
            self._cache = movielens_item_features(self.folder, self.name, self.item_ids)
        return self._cache


def item_features_of(ratings, who: str) -> ItemFeatures:
    """The public item features attached to ``ratings`` (``Ratings.meta``), or one readable DataError."""
    entry = ratings.meta.get(ITEM_FEATURES)
    if entry is None:
        raise DataError(f"{who}: item_features=true needs public item metadata, and this dataset has none attached "
                        f"(MovieLens: {', '.join(f for f, _ in METADATA_FILES.values())} beside the ratings); set item_features=false")
    feats = entry.load() if isinstance(entry, MovieLensMetadata) else entry
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


def attach_item_features(dataset, source: "ItemFeatures | MovieLensMetadata") -> None:
    """Put ``source`` in every fold's train and test ``Ratings.meta`` (one object shared by all folds)."""
    for f in dataset.folds:
        f.train.meta[ITEM_FEATURES] = f.test.meta[ITEM_FEATURES] = source
