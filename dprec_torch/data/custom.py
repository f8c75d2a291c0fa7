"""Any delimited ratings file: columns user, item, rating and an optional timestamp.

``data.path`` gives one file, split into seeded 90/10 hold-outs (:mod:`splits`);
``data.train_path`` + ``data.test_path`` give an explicit split, loaded as one
fold named ``given``. Separator, header, duplicates and file format rules are
those of :func:`dprec_torch.data.readers.read_ratings` (ML-1M's ``::`` files and
MovieLens-latest CSVs with a header and half-star ratings both read as is).

Item universe. With ``data.catalog_path`` (MovieLens's ``movies.dat`` or ``u.item`` format, or a
CSV ``item_id,title,genres,year`` with that header: :func:`~dprec_torch.data.item_features.read_catalog`) items are
indexed by the public catalogue -- every catalogued item, rated or not, in catalogue order, as the MovieLens loader
does -- and the catalogue's genres and years are attached as public item features (``model.item_features=auto``
turns them on). A malformed catalogue, a rating of an item it does not list, and ids of another kind or another
dataset are each one readable :class:`DataError`. Without a catalogue the index holds the rated items (treated
as public, as the privacy scope says) and no item features are attached.

The rating scale is ``data.rating_scale=[lo,hi]`` when given (ratings outside it
are an error); otherwise ``[min, max]`` of all loaded ratings. Ids are mapped to
one contiguous space built from every loaded file; ``RatingDataset.user_ids[k]``
is the raw id of index ``k``.

Where the scale came from is recorded (``scale_source``: ``declared`` | ``inferred``, in
``RatingDataset.report`` and in every fold's ``Ratings.meta``). An inferred scale is a
function of the private data (its min and max), and every clamp and sensitivity of a
provable mechanism is computed from it, so :func:`check_scale_declared` refuses a run that
reports a finite epsilon on an inferred scale.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import numpy as np

from dprec_torch.data.item_features import Catalog, CatalogFeatures, attach_item_features, read_catalog
from dprec_torch.data.preprocess import build_dataset
from dprec_torch.data.ratings import ITEM_UNIVERSE, Fold, RatingDataset
from dprec_torch.data.readers import RawRatings, build_id_space, catalog_id_space, encode, infer_scale, parse_scale, read_ratings
from dprec_torch.data.splits import check_test_fraction, holdout_folds, select_folds
from dprec_torch.errors import ConfigError, DataError

log = logging.getLogger(__name__)

#: ``Ratings.meta`` / ``RatingDataset.report`` key: ``declared`` (data.rating_scale) or ``inferred`` (data min/max)
SCALE_SOURCE = "scale_source"


def load_custom(path: str | None = None, train_path: str | None = None, test_path: str | None = None, sep: str | None = "auto",
                header: bool | str = "auto", rating_scale: Any = None, duplicates: str = "last", fold: int | str = 1, n_folds: int = 5,
                test_fraction: float = 0.1, min_user_ratings: int = 0, max_user_ratings: int | None = None, seed: int = 0,
                name: str = "custom", catalog_path: str | None = None, catalog_format: str = "auto") -> RatingDataset:
    """Load a user-supplied ratings file (or train/test pair) with train-side preprocessing; ``catalog_path``: see above."""
    if path and (train_path or test_path):
        raise ConfigError("give either data.path or data.train_path + data.test_path, not both")
    if not path and not (train_path and test_path):
        raise ConfigError("data=custom needs data.path=<ratings file>, or both data.train_path and data.test_path")
    scale = parse_scale(rating_scale)
    opts = dict(sep=sep, header=header, rating_scale=scale, duplicates=duplicates)
    if path:
        wanted = select_folds(fold, n_folds)
        check_test_fraction(test_fraction)
        raws = [read_ratings(Path(path).expanduser(), **opts)]
    else:
        try:
            wanted = select_folds(fold, 1)
        except ConfigError:
            raise ConfigError(f"data.fold={fold!r} is out of range: an explicit train/test pair is a single fold (use 1 or all)") from None
        raws = [read_ratings(Path(p).expanduser(), **opts) for p in (train_path, test_path)]
    source = "declared" if scale is not None else "inferred"
    scale = scale or infer_scale(*raws)
    catalog = read_catalog(Path(catalog_path).expanduser(), catalog_format) if catalog_path else None
    if catalog is None:
        user_ids, item_ids = build_id_space(*raws)
    else:
        check_catalog_ids(catalog, raws)
        user_ids, item_ids = catalog_id_space(catalog.item_ids, *raws, catalog=str(catalog.path))
    ref = "the dataset" if catalog is None else f"the dataset (users) / the catalogue {catalog.path} (items)"
    encoded = [encode(r, user_ids, item_ids, scale, ref) for r in raws]
    if path:
        folds = holdout_folds(encoded[0], wanted, test_fraction, seed, user_ids, item_ids)  # keyed by raw ids
    else:
        folds = [Fold(1, encoded[0], encoded[1], name="given")]
    report = {"source": [str(r.path) for r in raws], "n_ratings": sum(len(r) for r in raws),
              "duplicates_dropped": sum(r.duplicates_dropped for r in raws), SCALE_SOURCE: source}
    if catalog is not None:
        report.update({ITEM_UNIVERSE: catalog.universe().describe(), "catalog": str(catalog.path)})
    dataset = build_dataset(name, folds, user_ids.tolist(), item_ids.tolist(), scale, min_user_ratings, max_user_ratings, seed, report)
    for f in dataset.folds:
        f.train.meta[SCALE_SOURCE] = f.test.meta[SCALE_SOURCE] = source
    if catalog is not None:  # public catalogue metadata: the item universe, and features built only if a model asks
        universe = catalog.universe()
        for f in dataset.folds:  # what the privacy scope reads (privacy.scope.privacy_scope)
            f.train.meta[ITEM_UNIVERSE] = f.test.meta[ITEM_UNIVERSE] = universe
        attach_item_features(dataset, CatalogFeatures(catalog, dataset.item_ids))
        log.info("%s: items indexed by %s (%s format); its genres and years are the public item features",
                 name, universe.describe(), catalog.format)
    return dataset


def check_catalog_ids(catalog: Catalog, raws: list[RawRatings]) -> None:
    """One readable line when the ratings' item ids and the catalogue's do not match at all (another dataset, or
    another id scheme). A few unlisted items are :func:`catalog_id_space`'s error (it names ``file:line``)."""
    for raw in raws:
        if not len(raw) or (raw.items.dtype.kind in "iu") != (catalog.item_ids.dtype.kind in "iu"):
            continue  # catalog_id_space names a numeric/text mismatch
        rated = np.unique(raw.items)
        if not np.isin(rated, catalog.item_ids).any():
            raise DataError(f"{catalog.path}: none of the {rated.shape[0]:,} item ids rated in {raw.path} is in the "
                            f"catalogue (ratings: {', '.join(map(str, rated[:3].tolist()))}, ...; catalogue: "
                            f"{', '.join(map(str, catalog.item_ids[:3].tolist()))}, ...): the ids do not match; use the "
                            "catalogue of the same dataset")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_scale_declared(ratings: Any, privacy: dict[str, Any]) -> None:
    """Refuse a finite epsilon resting on a scale inferred from the data (one-line :class:`ConfigError`).

    ``privacy`` is a mechanism's ``privacy_report()``; a finite ``epsilon`` (or per-query epsilon) is a
    claim whose sensitivities and clamps use ``span = hi - lo``. Data loaded with ``data.rating_scale``
    (and every built-in dataset, whose scale is fixed) passes.
    """
    if getattr(ratings, "meta", {}).get(SCALE_SOURCE) != "inferred":
        return
    if _finite(privacy.get("epsilon")) or _finite(privacy.get("epsilon_per_query")):
        lo, hi = ratings.scale.lo, ratings.scale.hi
        raise ConfigError(f"mechanism {privacy.get('mechanism', '?')} reports a finite epsilon, but the rating scale "
                          f"[{lo:g}, {hi:g}] was inferred from the data (its min/max are private): declare it, e.g. "
                          f"data.rating_scale=[{lo:g},{hi:g}]")
