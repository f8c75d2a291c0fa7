"""Harness cases for the splits: the neighbour is the whole input FILE minus one user.

Every user-level epsilon is a statement about two training sets that differ by one user's ratings. The package
draws those training sets itself (seeded hold-out folds of one file: ``data=custom data.path=...``, ML-1M; the
``*-val`` validation splits carved from a fold's train), so the statement holds only if *other users' ratings stay
put when one user is added or removed*. The harness's other neighbours (:mod:`tests.privacy.test_sensitivity_harness`)
start from a training set; these start one step earlier, from the input file, and rebuild everything a loader
builds -- the id map (contiguous user ids shift), the split, the cap -- from the file minus one user:

* :func:`file_minus_user` writes that file (the original's lines, minus every line of the user's);
* :func:`load_split` loads a file as a run would (``load_custom``: its id map and hold-out folds, or those folds'
  validation splits: :data:`SPLIT_KINDS`);
* :func:`check_file_neighbour` compares the two by RAW (user id, item id, rating): every other user's train and test
  ratings must be the same in every fold, and, for each given user-level :class:`~.case.SensitivityCase`, the
  release on the two train sets (same seed) must move by at most the stated sensitivity.

It returns the violations (an empty list when the splits are per-user); ``tests/data/test_per_user_splits.py`` runs it on
ML-100K's ``u.data`` (or a generated file when the data is absent) and checks that the package's earlier positional
split fails it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from dprec_torch.data.custom import load_custom
from dprec_torch.data.preprocess import stable_id_keys
from dprec_torch.data.ratings import RatingDataset, Ratings
from dprec_torch.data.readers import read_ratings
from dprec_torch.data.validation import with_validation
from dprec_torch.errors import DataError
from dprec_torch.privacy_harness.case import SensitivityCase

#: what a run draws from one file: its seeded hold-out folds, and those folds' validation splits (``*-val``)
SPLIT_KINDS = ("holdout", "validation")
TOL = 1e-5


def file_minus_user(path: str | Path, user: Any, dest: str | Path, **read_opts: Any) -> Path:
    """``path`` without the lines of raw user id ``user`` (every other line, byte for byte), written to ``dest``."""
    path, dest = Path(path), Path(dest)
    raw = read_ratings(path, cache=False, **read_opts)
    mine = raw.users == np.asarray(user, dtype=raw.users.dtype)
    if not mine.any():
        raise DataError(f"{path}: user {user!r} has no ratings")
    drop = set((raw.lines[mine] - 1).tolist())
    lines = path.read_text().splitlines(keepends=True)
    dest.write_text("".join(line for k, line in enumerate(lines) if k not in drop))
    if (read_ratings(dest, cache=False, **read_opts).users == np.asarray(user, dtype=raw.users.dtype)).any():
        raise DataError(f"{path}: user {user!r} has duplicate lines; remove them first")  # duplicates="last" dropped some
    return dest


def load_split(path: str | Path, kind: str, seed: int = 0, fold: int | str = "all", **opts: Any) -> RatingDataset:
    """``path`` loaded as ``data=custom data.path=<path>`` loads it (``kind="holdout"``), or the validation splits of
    those folds (``kind="validation"``, as ``data=*-val``)."""
    if kind not in SPLIT_KINDS:
        raise ValueError(f"kind must be one of {SPLIT_KINDS}, got {kind!r}")
    dataset = load_custom(path=str(path), fold=fold, seed=seed, **opts)
    return with_validation(dataset, 0.1, seed) if kind == "validation" else dataset


def raw_triples(ratings: Ratings, dataset: RatingDataset) -> set[tuple[Any, Any, float]]:
    """``ratings`` as a set of (raw user id, raw item id, rating): comparable across id maps."""
    users, items = np.asarray(dataset.user_ids), np.asarray(dataset.item_ids)
    return set(zip(users[ratings.users.cpu().numpy()].tolist(), items[ratings.items.cpu().numpy()].tolist(),
                   ratings.values.cpu().tolist()))


def _table(ratings: Ratings, dataset: RatingDataset, drop_user: Any = None) -> tuple[np.ndarray, ...]:
    """``ratings`` as sorted columns (raw user key, raw item key, rating) -- without ``drop_user`` -- for a vectorised
    equality test across id maps (:func:`raw_triples` is the readable, slower form)."""
    users = stable_id_keys(list(dataset.user_ids)).numpy()[ratings.users.cpu().numpy()]
    items = stable_id_keys(list(dataset.item_ids)).numpy()[ratings.items.cpu().numpy()]
    values = ratings.values.cpu().numpy()
    if drop_user is not None:
        keep = users != int(stable_id_keys([drop_user])[0])
        users, items, values = users[keep], items[keep], values[keep]
    order = np.lexsort((values, items, users))
    return users[order], items[order], values[order]


def _same(a: tuple[np.ndarray, ...], b: tuple[np.ndarray, ...]) -> bool:
    return all(x.shape == y.shape and np.array_equal(x, y) for x, y in zip(a, b))


def check_file_neighbour(dataset: RatingDataset, neighbour: RatingDataset, user: Any,
                         cases: Sequence[SensitivityCase] = (), seed: int = 0) -> list[str]:
    """The violations of "other users' ratings stay put" between ``dataset`` (the whole file) and ``neighbour`` (the
    file minus raw user ``user``, loaded the same way), fold by fold; and, for each user-level case, of its stated
    sensitivity between the two folds' train sets (a release whose shape depends on the user count is skipped).
    """
    problems: list[str] = []
    if [f.name for f in dataset.folds] != [f.name for f in neighbour.folds]:
        return [f"folds differ: {[f.name for f in dataset.folds]} vs {[f.name for f in neighbour.folds]}"]
    for fd, fn in zip(dataset.folds, neighbour.folds):
        for side in ("train", "test"):
            if _same(_table(getattr(fd, side), dataset, user), _table(getattr(fn, side), neighbour)):
                continue
            ours = {t for t in raw_triples(getattr(fd, side), dataset) if t[0] != user}
            theirs = raw_triples(getattr(fn, side), neighbour)
            problems.append(f"{fd.name} {side}: removing user {user!r} moved {len(ours ^ theirs)} other ratings")
        for case in cases:
            if case.relation != "user":
                continue
            base, other = case.release(fd.train, seed, False), case.release(fn.train, seed, False)
            if base is None or other is None or base.total.shape != other.total.shape:
                continue
            bound = base.stated if base.stated is not None else case.claimed(fd.train.n_items)
            diff = other.total - base.total
            moved = float(torch.linalg.vector_norm(diff.double(), ord=case.norm)) if diff.numel() else 0.0
            if moved > bound * (1 + TOL) + 1e-6:
                problems.append(f"{fd.name} {case.name}: the file minus user {user!r} moved the release by "
                                f"{moved:.6g} > the stated sensitivity {bound}")
    return problems
