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
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dprec_torch.data.preprocess import build_dataset
from dprec_torch.data.ratings import Fold, RatingDataset
from dprec_torch.data.readers import build_id_space, encode, infer_scale, parse_scale, read_ratings
from dprec_torch.data.splits import check_test_fraction, holdout_folds, select_folds
from dprec_torch.errors import ConfigError


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
    }
    return build_dataset(
        name, folds, user_ids.tolist(), item_ids.tolist(), scale, min_user_ratings, max_user_ratings, seed, report
    )
