"""Any delimited ratings file: columns user, item, rating and an optional timestamp.

``data.path`` gives one file, split into seeded 90/10 hold-outs (:mod:`splits`);
``data.train_path`` + ``data.test_path`` give an explicit split, loaded as one
fold named ``given``. Separator, header, duplicates and file format rules are
those of :func:`dprec_torch.data.readers.read_ratings` (ML-1M's ``::`` files and
MovieLens-latest CSVs with a header and half-star ratings both read as is).

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

import math
from pathlib import Path
from typing import Any

from dprec_torch.data.preprocess import build_dataset
from dprec_torch.data.ratings import Fold, RatingDataset
from dprec_torch.data.readers import build_id_space, encode, infer_scale, parse_scale, read_ratings
from dprec_torch.data.splits import check_test_fraction, holdout_folds, select_folds
from dprec_torch.errors import ConfigError

#: ``Ratings.meta`` / ``RatingDataset.report`` key: ``declared`` (data.rating_scale) or ``inferred`` (data min/max)
SCALE_SOURCE = "scale_source"


def load_custom(
    path: str | None = None,
    train_path: str | None = None,
    test_path: str | None = None,
    sep: str | None = "auto",
    header: bool | str = "auto",
    rating_scale: Any = None,
    duplicates: str = "last",
    fold: int | str = 1,
    n_folds: int = 5,
    test_fraction: float = 0.1,
    min_user_ratings: int = 0,
    max_user_ratings: int | None = None,
    seed: int = 0,
    name: str = "custom",
) -> RatingDataset:
    """Load a user-supplied ratings file (or train/test pair) with train-side preprocessing."""
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
    user_ids, item_ids = build_id_space(*raws)
    encoded = [encode(r, user_ids, item_ids, scale) for r in raws]
    if path:
        folds = holdout_folds(encoded[0], wanted, test_fraction, seed)
    else:
        folds = [Fold(1, encoded[0], encoded[1], name="given")]
    report = {
        "source": [str(r.path) for r in raws],
        "n_ratings": sum(len(r) for r in raws),
        "duplicates_dropped": sum(r.duplicates_dropped for r in raws),
        SCALE_SOURCE: source,
    }
    dataset = build_dataset(
        name, folds, user_ids.tolist(), item_ids.tolist(), scale, min_user_ratings, max_user_ratings, seed, report
    )
    for f in dataset.folds:
        f.train.meta[SCALE_SOURCE] = f.test.meta[SCALE_SOURCE] = source
    return dataset


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
