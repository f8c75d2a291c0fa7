"""MovieLens ML-100K and ML-1M (Wang & Tang, Sec. 5.1), found locally or downloaded once.

Lookup order for ``<name>``: ``data_dir`` (argument, ``data.data_dir``) or ``$DPREC_DATA``, then the cache
``$DPREC_CACHE`` (default ``~/.cache/dprec``). A folder is accepted when it holds the dataset's ratings file, either
as ``<dir>/<name>/`` or as ``<dir>`` itself. Otherwise the GroupLens zip is downloaded (urllib, with a timeout),
extracted into a temporary folder inside the cache, validated, and only then renamed into place, so a killed
download never leaves a half-written dataset behind.

Every load validates the documented counts (ML-100K: 100,000 ratings, 943 users, 1,682 items, all rated; ML-1M:
1,000,209 ratings, 6,040 users, 3,706 rated of 3,883 catalogued movies), so a truncated or edited copy fails
loudly instead of producing wrong numbers.

Item universe: items are indexed by the public catalogue (``movies.dat``, ``u.item``;
:func:`~dprec_torch.data.item_features.read_catalog`): every catalogued movie gets an index, rated or
not, in catalogue order, so the index reads no rating (an index of the rated items would reveal which
movies someone rated, test split included). A rating of a movie the catalogue does not list is an error.
Without the catalogue file beside the ratings the index falls back to the rated items, with a warning,
and the dataset record and privacy scope say that this universe is treated as public. ML-100K rates all
1,682 catalogued items and its ids are 1..1682 in both orders, so its index is unchanged.

Folds: ML-100K uses the official ``u1..u5`` ``.base``/``.test`` files; ML-1M a
seeded 90/10 hold-out repeated ``n_folds`` times (:mod:`splits`). Both share one
id space: the catalogue's items and the users of the whole ratings file. The
rating scale is 1..5.
MovieLens data is licensed: never copy it into the repository.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from http.client import HTTPException
from urllib.error import URLError
from urllib.request import urlopen

import numpy as np

from dprec_torch.data.preprocess import build_dataset
from dprec_torch.data.ratings import ITEM_UNIVERSE, Fold, ItemUniverse, RatingDataset, RatingScale
from dprec_torch.data.item_features import METADATA_FILES, Catalog, MovieLensMetadata, attach_item_features, read_catalog
from dprec_torch.data.readers import RawRatings, build_id_space, catalog_id_space, encode, read_ratings
from dprec_torch.data.splits import holdout_folds, select_folds
from dprec_torch.errors import ConfigError, DataError

log = logging.getLogger(__name__)

DOWNLOAD_TIMEOUT_S = 60.0
MOVIELENS_SCALE = RatingScale(1.0, 5.0)


@dataclass(frozen=True)
class MovieLensSpec:
    """A MovieLens release's documented counts. ``n_items`` is the item universe (the catalogue's size);
    ``n_rated_items`` the items with a rating, when fewer (None: every item is rated)."""

    name: str
    url: str
    ratings_file: str
    sep: str
    n_ratings: int
    n_users: int
    n_items: int
    n_rated_items: int | None = None

    @property
    def rated_items(self) -> int:
        return self.n_items if self.n_rated_items is None else self.n_rated_items


SPECS: dict[str, MovieLensSpec] = {
    "ml-100k": MovieLensSpec("ml-100k", "https://files.grouplens.org/datasets/movielens/ml-100k.zip", "u.data", "\t", 100_000, 943, 1_682),
    "ml-1m": MovieLensSpec("ml-1m", "https://files.grouplens.org/datasets/movielens/ml-1m.zip", "ratings.dat", "::", 1_000_209, 6_040,
                           3_883, 3_706),
}


def _spec(name: str) -> MovieLensSpec:
    if name not in SPECS:
        raise ConfigError(f"unknown MovieLens dataset {name!r}: valid names are {', '.join(SPECS)} (or data=custom / data=synthetic)")
    return SPECS[name]


def cache_dir() -> Path:
    """``$DPREC_CACHE`` or ``~/.cache/dprec``."""
    return Path(os.environ.get("DPREC_CACHE") or Path.home() / ".cache" / "dprec").expanduser()


def _holds(folder: Path, spec: MovieLensSpec) -> bool:
    return (folder / spec.ratings_file).is_file()


def _search_roots(data_dir: str | None) -> list[Path]:
    """Where ``name`` is looked for: ``data_dir`` (else ``$DPREC_DATA``), then the cache."""
    roots = [Path(data_dir).expanduser()] if data_dir else []
    if not data_dir and os.environ.get("DPREC_DATA"):
        roots.append(Path(os.environ["DPREC_DATA"]).expanduser())
    roots.append(cache_dir())
    return roots


def find_movielens(name: str, data_dir: str | None = None) -> Path | None:
    """The folder holding ``name``'s extracted files if it is already on disk, else None (no download)."""
    spec = _spec(name)
    for root in _search_roots(data_dir):
        for folder in (root / name, root):
            if _holds(folder, spec):
                return folder
    return None


def locate_movielens(name: str, data_dir: str | None = None) -> Path:
    """The folder holding ``name``'s extracted files; downloads into the cache when absent."""
    found = find_movielens(name, data_dir)
    return found if found is not None else download_movielens(name, [str(r) for r in _search_roots(data_dir)])


def download_movielens(name: str, searched: list[str] | None = None) -> Path:
    """Download, extract and validate ``name`` into the cache; atomic (temp folder + rename)."""
    spec = _spec(name)
    dest = cache_dir() / name
    where = ", ".join(searched or [str(cache_dir())])
    log.info("%s not found under %s; downloading %s", name, where, spec.url)
    try:
        with urlopen(spec.url, timeout=DOWNLOAD_TIMEOUT_S) as resp:
            payload = resp.read()
    except (URLError, OSError, ValueError, HTTPException) as err:
        raise DataError(f"{name} not found (searched {where}) and the download from {spec.url} failed ({getattr(err, 'reason', err)}); "
                        f"download and unzip it yourself, then set DPREC_DATA to the folder that contains {name}/") from None
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{name}.", suffix=".tmp"))
    try:
        try:
            with zipfile.ZipFile(io.BytesIO(payload)) as zf:
                zf.extractall(tmp)
        except zipfile.BadZipFile:
            raise DataError(f"the download from {spec.url} is not a valid zip; retry, or set DPREC_DATA to a local copy") from None
        folder = tmp / name if _holds(tmp / name, spec) else tmp
        if not _holds(folder, spec):
            raise DataError(f"the zip from {spec.url} has no {spec.ratings_file}; set DPREC_DATA to a local copy of {name}")
        fix = f"the download from {spec.url} is corrupt: retry, or set DPREC_DATA to a local copy"
        validate_counts(read_ratings(folder / spec.ratings_file, sep=spec.sep, header=False, duplicates="error", cache=False),
                        spec, fix)  # no parsed-cache entry for a temp file that is renamed or deleted next
        if dest.exists():
            if _holds(dest, spec):  # a concurrent download won the race; keep theirs
                return dest
            raise DataError(f"{dest} exists but has no {spec.ratings_file}: delete that folder and retry")
        os.replace(folder, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("%s saved to %s", name, dest)
    return dest


def validate_counts(
    raw: RawRatings, spec: MovieLensSpec, fix: str = "the copy is incomplete or modified: replace it (or delete it to re-download)"
) -> tuple[np.ndarray, np.ndarray]:
    """Check the documented numbers of ratings, users and rated items; returns the sorted raw ids (rated items)."""
    user_ids, item_ids = build_id_space(raw)
    got = (len(raw), int(user_ids.shape[0]), int(item_ids.shape[0]))
    want = (spec.n_ratings, spec.n_users, spec.rated_items)
    if got != want:
        raise DataError(
            f"{raw.path}: {got[0]:,} ratings, {got[1]:,} users, {got[2]:,} items, but {spec.name} has "
            f"{want[0]:,}/{want[1]:,}/{want[2]:,}; {fix}"
        )
    return user_ids, item_ids


def read_movielens_catalog(folder: Path, spec: MovieLensSpec) -> Catalog | None:
    """``folder``'s catalogue, checked against the documented count, or None (with a warning) when absent."""
    path = folder / METADATA_FILES[spec.name][0]  # the public catalogue (movies.dat, u.item)
    if not path.is_file():
        log.warning("%s: no %s beside %s, so items are indexed by the rated items (treated as public); copy %s "
                    "from the %s zip to index them by the public catalogue", folder, path.name, spec.ratings_file,
                    path.name, spec.name)
        return None
    catalog = read_catalog(path)
    if len(catalog) != spec.n_items:
        raise DataError(f"{path}: {len(catalog):,} items, but {spec.name}'s catalogue has {spec.n_items:,}; the file "
                        "is incomplete or modified: replace it with the original from the zip")
    return catalog


def load_movielens(name: str = "ml-100k", fold: int | str = 1, min_user_ratings: int = 0, max_user_ratings: int | None = None,
                   n_folds: int = 5, test_fraction: float = 0.1, seed: int = 0, data_dir: str | None = None) -> RatingDataset:
    """Load ML-100K (official folds u1..u5) or ML-1M (seeded hold-outs) with train-side preprocessing."""
    spec = _spec(name)
    if name == "ml-100k" and n_folds != 5:
        raise ConfigError(f"ml-100k has exactly 5 official folds (u1..u5): data.n_folds must be 5, got {n_folds!r}")
    wanted = select_folds(fold, n_folds)
    folder = locate_movielens(name, data_dir)
    opts = dict(header=False, rating_scale=MOVIELENS_SCALE, duplicates="error")
    raw = read_ratings(folder / spec.ratings_file, sep=spec.sep, **opts)
    user_ids, item_ids = validate_counts(raw, spec)
    catalog = read_movielens_catalog(folder, spec)
    if catalog is not None:
        user_ids, item_ids = catalog_id_space(catalog.item_ids, raw, catalog=str(catalog.path))
    universe = ItemUniverse(int(item_ids.shape[0])) if catalog is None else catalog.universe()
    if name == "ml-100k":
        ref = f"{folder / spec.ratings_file}" + ("" if catalog is None else f" (users) / the catalogue {catalog.path} (items)")
        folds = []
        for k in wanted:  # at most 5 official folds
            parts = [read_ratings(folder / f"u{k}.{ext}", sep="\t", **opts) for ext in ("base", "test")]
            train, test = (encode(p, user_ids, item_ids, MOVIELENS_SCALE, ref) for p in parts)
            folds.append(Fold(k, train, test, name=f"u{k}"))
    else:
        whole = encode(raw, user_ids, item_ids, MOVIELENS_SCALE)
        folds = holdout_folds(whole, wanted, test_fraction, seed, user_ids, item_ids)  # keyed by raw ids
    report = {"source": str(folder), "n_ratings": len(raw), "duplicates_dropped": 0, ITEM_UNIVERSE: universe.describe()}
    dataset = build_dataset(name, folds, user_ids.tolist(), item_ids.tolist(), MOVIELENS_SCALE, min_user_ratings, max_user_ratings, seed,
                            report)
    for f in dataset.folds:  # what the privacy scope reads (privacy.scope.privacy_scope)
        f.train.meta[ITEM_UNIVERSE] = f.test.meta[ITEM_UNIVERSE] = universe
    if catalog is not None:  # public catalogue metadata: features built only if a model asks for them
        attach_item_features(dataset, MovieLensMetadata(str(folder), name, dataset.item_ids, catalog))
    log.info("%s: items indexed by %s", name, universe.describe())
    return dataset
