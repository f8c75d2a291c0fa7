"""Fast, validating readers for delimited rating files (user, item, rating[, timestamp]).

A file is read once, split into tokens with one C-level ``str.split`` over the whole text, and each column is
converted with one ``np.fromiter(map(...))``. Per-line field counts are checked with numpy on the raw bytes, so a
malformed line is found without a Python loop over lines; a loop runs only on the error path, to name the offending
``file:line``. ML-1M's 1M lines parse in about a second or two on one core.

Conventions (documented in ``conf/data/custom.yaml``):

* ``sep``: ``"auto"`` looks at the first non-blank line and picks ``::``, then tab, then comma, else runs of
  whitespace. Aliases: ``tab``, ``comma``, ``whitespace``.
* ``header``: ``"auto"`` treats the first non-blank line as a header when its rating field (3rd) is not a number;
  ``True``/``False`` force it.
* Blank lines are skipped. Every other line must have 3 or 4 fields, the same count as the first data line. A 4th
  field (timestamp) is accepted and ignored.
* Ids are integers when the first data line's id parses as one (then every id in that column must); otherwise
  they are kept as strings.
* Duplicate (user, item) pairs: ``duplicates="last"`` keeps the last occurrence in file order (counted and
  logged); ``"error"`` raises with both line numbers.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dprec_torch.data.ratings import Ratings, RatingScale
from dprec_torch.errors import ConfigError, DataError

log = logging.getLogger(__name__)

_SEP_ALIASES: dict[str, str | None] = {"auto": "auto", "tab": "\t", "\\t": "\t", "\t": "\t", "comma": ",", ",": ",", "::": "::",
                                        "whitespace": None, "space": None, " ": None, ";": ";", "|": "|"}
_DUPLICATE_POLICIES = ("last", "error")
_HEADER_WORDS: dict[str, bool | str] = {"auto": "auto", "true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
# lookup table: the bytes Python's str.split() treats as whitespace in ASCII text
_WS_TABLE = np.zeros(256, dtype=bool)
_WS_TABLE[[9, 10, 11, 12, 13, 28, 29, 30, 31, 32]] = True


@dataclass
class RawRatings:
    """One file's ratings with their raw ids, before the shared id space is built; ``lines`` (the 1-based file line
    of every row) lets later checks (unknown id, out-of-range rating) still point at ``file:line``."""

    path: Path
    users: np.ndarray  # int64, or str when the file's ids are not numeric
    items: np.ndarray
    values: np.ndarray  # float64
    lines: np.ndarray  # int64, 1-based line numbers
    duplicates_dropped: int = 0

    def __len__(self) -> int:
        return int(self.values.shape[0])

    def select(self, index: np.ndarray) -> "RawRatings":
        return replace(self, users=self.users[index], items=self.items[index], values=self.values[index], lines=self.lines[index])


# --------------------------------------------------------------------- options
def parse_sep(sep: str | None) -> str | None:
    """Normalise ``data.sep``: ``"auto"``, a literal separator, or ``None`` for whitespace."""
    if sep is None:
        return None
    if sep in _SEP_ALIASES:
        return _SEP_ALIASES[sep]
    if isinstance(sep, str) and sep and "\n" not in sep:
        return sep
    raise ConfigError(f"data.sep={sep!r} is not a separator: use auto, tab, comma, '::', whitespace or a literal string")


def parse_header(header: Any) -> bool | str:
    """Normalise ``data.header`` to ``True``, ``False`` or ``"auto"``."""
    if header is None or isinstance(header, bool):
        return "auto" if header is None else header
    if isinstance(header, str) and header.lower() in _HEADER_WORDS:
        return _HEADER_WORDS[header.lower()]
    raise ConfigError(f"data.header={header!r} is invalid: use auto, true or false")


def parse_duplicates(policy: str) -> str:
    if policy not in _DUPLICATE_POLICIES:
        raise ConfigError(f"data.duplicates={policy!r} is invalid: use one of {', '.join(_DUPLICATE_POLICIES)}")
    return policy


def parse_scale(rating_scale: Any) -> RatingScale | None:
    """``None``, a :class:`RatingScale`, or a ``[lo, hi]`` pair (lists from Hydra included)."""
    if rating_scale is None or isinstance(rating_scale, RatingScale):
        return rating_scale
    try:
        lo, hi = (float(x) for x in rating_scale)
    except (TypeError, ValueError):
        raise ConfigError(f"data.rating_scale={rating_scale!r} is invalid: give [lo, hi], e.g. data.rating_scale=[1,5]") from None
    if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
        raise ConfigError(f"data.rating_scale=[{lo:g}, {hi:g}] is invalid: need finite lo < hi")
    return RatingScale(lo, hi)


def _sep_name(sep: str | None) -> str:
    return {None: "whitespace", "\t": "tabs", ",": "commas", "::": "'::'"}.get(sep, repr(sep))


def detect_sep(line: str) -> str | None:
    """Guess the separator of one line: ``::``, tab, comma, else whitespace (``None``)."""
    for sep in ("::", "\t", ","):
        if sep in line:
            return sep
    return None


# ------------------------------------------------------------ vectorised split
def _per_line_counts(mask: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Number of True entries of ``mask`` in each line ``[starts[k], ends[k])`` (one ``reduceat``, no loop). ``mask``
    must be False on newline bytes: each sum runs from a non-empty line's start to the next one's, over newlines only."""
    out = np.zeros(starts.shape[0], dtype=np.int64)
    nonempty = ends > starts
    if nonempty.any():
        out[nonempty] = np.add.reduceat(mask, starts[nonempty], dtype=np.int64)
    return out


def _tokenize(body: str, sep: str | None, path: Path) -> tuple[Sequence[str], np.ndarray, np.ndarray]:
    """``(tokens, tokens_per_line, blank)`` of ``body``: for a literal ``sep`` every line contributes ``count(sep) + 1``
    tokens (blank lines one empty token); for whitespace, blank lines contribute none."""
    data = body.encode()
    sep_bytes = sep.encode() if sep is not None else b""
    if len(sep_bytes) > 1:
        # multi-byte separator ("::"): count it as one marker byte; newlines and blanks are unchanged
        if b"\x00" in data:
            raise DataError(f"{path}: contains NUL bytes; it is not a text ratings file")
        data = data.replace(sep_bytes, b"\x00")
        sep_bytes = b"\x00"
    b = np.frombuffer(data, dtype=np.uint8)
    newlines = np.flatnonzero(b == 10)
    starts = np.concatenate(([0], newlines + 1))
    ends = np.concatenate((newlines, [b.shape[0]]))
    ws = _WS_TABLE[b]
    blank = _per_line_counts(~ws, starts, ends) == 0
    if sep is None:
        tokens: Sequence[str] = body.split()
        token_start = ~ws
        token_start[1:] &= ws[:-1]
        per_line = _per_line_counts(token_start, starts, ends)
    else:
        tokens = body.replace(sep, "\n").split("\n")
        per_line = _per_line_counts(b == sep_bytes[0], starts, ends) + 1
    return tokens, per_line, blank


# ------------------------------------------------------------------- columns
def _bad_token(tokens: Sequence[str], convert: Any) -> int:
    """Index of the first token ``convert`` rejects (error path only)."""
    for k, tok in enumerate(tokens):
        try:
            convert(tok)
        except (ValueError, OverflowError):
            return k
    return -1


def _parse_ids(col: Sequence[str], what: str, path: Path, lines: np.ndarray) -> np.ndarray:
    """Integer ids if the first id is an integer (then all must be), else stripped strings."""
    try:
        int(col[0])
    except ValueError:
        return np.char.strip(np.asarray(col, dtype=str))
    try:
        return np.fromiter(map(int, col), dtype=np.int64, count=len(col))
    except (ValueError, OverflowError):
        k = _bad_token(col, lambda t: np.int64(int(t)))
        raise DataError(f"{path}:{lines[k]}: {what} id {col[k].strip()!r} is not an integer, "
                        "but the ids in this file are numeric") from None


def _parse_values(col: Sequence[str], path: Path, lines: np.ndarray, scale: RatingScale | None) -> np.ndarray:
    try:
        values = np.fromiter(map(float, col), dtype=np.float64, count=len(col))
    except ValueError:
        k = _bad_token(col, float)
        raise DataError(f"{path}:{lines[k]}: rating {col[k].strip()!r} is not a number") from None
    bad = ~np.isfinite(values)
    if bad.any():
        k = int(np.argmax(bad))
        raise DataError(f"{path}:{lines[k]}: rating {col[k].strip()!r} is not finite; remove or fix that line")
    if scale is not None:
        _check_in_scale(values, scale, path, lines, "; fix the line or set data.rating_scale")
    return values


def _check_in_scale(values: np.ndarray, scale: RatingScale, path: Path, lines: np.ndarray, fix: str = "") -> None:
    bad = (values < scale.lo) | (values > scale.hi)
    if bad.any():
        k = int(np.argmax(bad))
        raise DataError(f"{path}:{lines[k]}: rating {values[k]:g} is outside the rating scale [{scale.lo:g}, {scale.hi:g}]{fix}")


def _pair_codes(users: np.ndarray, items: np.ndarray) -> np.ndarray:
    """One int64 key per (user, item) pair, for duplicate detection."""
    if users.dtype.kind == items.dtype.kind == "i":
        u0, i0 = int(users.min()), int(items.min())
        span = int(items.max()) - i0 + 1
        if (int(users.max()) - u0 + 1) * span < 2**62:  # integer ids: offset arithmetic, no unique()
            return (users - u0) * span + (items - i0)
    _, u = np.unique(users, return_inverse=True)
    item_keys, i = np.unique(items, return_inverse=True)
    return u.astype(np.int64).ravel() * len(item_keys) + i.astype(np.int64).ravel()


def _log_dropped(path: Path, dropped: int) -> None:
    log.warning("%s: %d duplicate (user, item) ratings dropped, keeping the last occurrence of each", path, dropped)


def resolve_duplicates(raw: RawRatings, policy: str = "last") -> RawRatings:
    """Apply the duplicate policy: keep each pair's last occurrence in file order, or raise."""
    policy = parse_duplicates(policy)
    if len(raw) == 0:
        return raw
    key = _pair_codes(raw.users, raw.items)
    sk = np.sort(key)
    if not (sk[1:] == sk[:-1]).any():  # the common case: a plain sort, no argsort
        return raw
    order = np.argsort(key, kind="stable")  # file order within each pair
    sk = key[order]
    dup_sorted = np.flatnonzero(sk[1:] == sk[:-1])
    if policy == "error":
        later = order[dup_sorted + 1]
        first_dup = later[np.argmin(raw.lines[later])]  # the earliest line that repeats a pair
        earlier = order[np.searchsorted(sk, key[first_dup])]
        raise DataError(
            f"{raw.path}:{raw.lines[first_dup]}: duplicate rating for user {raw.users[first_dup]}, item "
            f"{raw.items[first_dup]} (first at line {raw.lines[earlier]}); set data.duplicates=last to keep the last one"
        )
    last = np.ones(len(key), dtype=bool)
    last[dup_sorted] = False  # in a run of equal keys only the final (latest) entry survives
    keep = np.sort(order[last])
    dropped = len(raw) - keep.shape[0]
    _log_dropped(raw.path, dropped)
    out = raw.select(keep)
    out.duplicates_dropped = raw.duplicates_dropped + dropped
    return out


# ------------------------------------------------------------- parsed cache
# files from 256 KiB: ML-1M's 16.5 MB take ~1 s to parse, ~0.03 s to load parsed; ML-100K's u.data + u1.base +
# u1.test (4 MB) ~0.28 s and ~0.01 s, a tenth of `python train.py`'s start-up
PARSED_CACHE_MIN_BYTES = 256 * 2**10


def _parsed_cache_path(path: Path, options: tuple) -> Path | None:
    """Where the parsed arrays of ``path`` read with ``options`` are kept, or None (small file, cache off). The key holds
    the file's resolved path, size, inode and mtime (ns): an edited file is parsed again. ``DPREC_PARSED_CACHE=0``: off."""
    import hashlib
    import os

    if os.environ.get("DPREC_PARSED_CACHE", "1") == "0":
        return None
    st = path.stat()
    if st.st_size < PARSED_CACHE_MIN_BYTES:
        return None
    key = repr((str(path.resolve()), st.st_size, st.st_ino, st.st_mtime_ns, options)).encode()
    root = Path(os.environ.get("DPREC_CACHE") or Path.home() / ".cache" / "dprec").expanduser()
    return root / "parsed" / f"{path.name}-{hashlib.sha1(key).hexdigest()[:16]}.npz"


def _load_parsed(cache: Path, path: Path) -> RawRatings | None:
    try:
        with np.load(cache, allow_pickle=False) as z:
            return RawRatings(path, z["users"], z["items"], z["values"], z["lines"], int(z["duplicates_dropped"]))
    except (OSError, KeyError, ValueError):  # missing or unreadable: parse the file
        return None


def _save_parsed(cache: Path, raw: RawRatings) -> None:
    if raw.users.dtype == object or raw.users.dtype.kind == "U" or raw.items.dtype.kind == "U":
        return  # string ids: not worth a pickle-free format
    import io

    from dprec_torch.io import atomic_write_bytes

    buf = io.BytesIO()
    np.savez(buf, users=raw.users, items=raw.items, values=raw.values, lines=raw.lines, duplicates_dropped=np.int64(raw.duplicates_dropped))
    try:
        atomic_write_bytes(cache, buf.getvalue())
    except OSError as err:  # a read-only cache must not fail the run
        log.debug("parsed-ratings cache not written (%s)", err)


# ---------------------------------------------------------------------- read
def read_ratings(path: str | Path, sep: str | None = "auto", header: bool | str = "auto", rating_scale: Any = None,
                 duplicates: str = "last", cache: bool = True) -> RawRatings:
    """Read one delimited ratings file; every problem is one ``DataError`` line with ``file:line``.

    A big file's parsed arrays are kept in ``$DPREC_CACHE/parsed`` (:func:`_parsed_cache_path`), so the next run of the
    same file with the same options skips the parse. ``cache=False``: neither read nor write it (a file about to be
    moved or deleted, e.g. a download being checked).
    """
    path = Path(path)
    sep = parse_sep(sep)
    header = parse_header(header)
    scale = parse_scale(rating_scale)
    parse_duplicates(duplicates)
    if not path.is_file():
        raise DataError(f"{path}: ratings file not found; check the path (data.path / data.train_path / data.test_path)")
    cache = _parsed_cache_path(path, (sep, header, None if scale is None else (scale.lo, scale.hi), duplicates)) if cache else None
    if cache is not None and cache.exists():
        raw = _load_parsed(cache, path)
        if raw is not None:
            if raw.duplicates_dropped:
                _log_dropped(path, raw.duplicates_dropped)
            return raw
    raw = _parse_file(path, sep, header, scale, duplicates)
    if cache is not None:
        _save_parsed(cache, raw)
    return raw


def _parse_file(path: Path, sep: str | None, header: bool | str, scale: RatingScale | None, duplicates: str) -> RawRatings:
    """:func:`read_ratings` without the cache."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except OSError as err:
        raise DataError(f"{path}: cannot read the file ({err.strerror or err}); check its permissions") from None
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text (byte {err.start}: {err.reason}); re-save the file as UTF-8") from None
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")

    # first non-blank line: decides the separator and whether it is a header
    pos, line_no, first = 0, 0, None
    while pos <= len(text):
        end = text.find("\n", pos)
        end = len(text) if end < 0 else end
        line_no += 1
        if text[pos:end].strip():
            first = text[pos:end]
            break
        pos = end + 1
    if first is None:
        raise DataError(f"{path}: file has no ratings (empty)")
    if sep == "auto":
        sep = detect_sep(first)
    fields = first.split() if sep is None else first.split(sep)
    # a header: forced, or (auto) its rating field (3rd) is not a number
    is_header = header is True or (header == "auto" and len(fields) >= 3 and _bad_token(fields[2:3], float) == 0)
    body_start, line_offset = (min(end + 1, len(text)), line_no) if is_header else (0, 0)
    body = text[body_start:]
    if body.endswith("\n"):
        body = body[:-1]

    tokens, per_line, blank = _tokenize(body, sep, path)
    data_idx = np.flatnonzero(~blank)
    if data_idx.size == 0:
        raise DataError(f"{path}: file has no ratings (only a header)")
    lines = data_idx.astype(np.int64) + 1 + line_offset
    n_fields = int(per_line[data_idx[0]])
    if n_fields not in (3, 4):
        raise DataError(
            f"{path}:{lines[0]}: expected 3 or 4 fields (user, item, rating[, timestamp]) separated by "
            f"{_sep_name(sep)}, found {n_fields}; set data.sep if the separator is different"
        )
    wrong = per_line[data_idx] != n_fields
    if wrong.any():
        k = int(np.argmax(wrong))
        raise DataError(
            f"{path}:{lines[k]}: expected {n_fields} fields separated by {_sep_name(sep)} (as on line {lines[0]}), "
            f"found {int(per_line[data_idx[k]])}"
        )
    if len(tokens) != int(per_line.sum()):
        # only unusual Unicode whitespace can desynchronise the byte count from str.split
        raise DataError(f"{path}: could not split the file into fields; set data.sep explicitly")
    if data_idx.size != per_line.shape[0] or per_line.sum() != data_idx.size * n_fields:
        # drop blank lines' tokens (vectorised gather on an object array)
        offsets = np.cumsum(per_line) - per_line
        gather = (offsets[data_idx][:, None] + np.arange(n_fields)).ravel()
        tokens = np.asarray(tokens, dtype=object)[gather]
    users = _parse_ids(tokens[0::n_fields], "user", path, lines)
    items = _parse_ids(tokens[1::n_fields], "item", path, lines)
    values = _parse_values(tokens[2::n_fields], path, lines, scale)
    return resolve_duplicates(RawRatings(path, users, items, values, lines), duplicates)


# ------------------------------------------------------------------ id space
def build_id_space(*raws: RawRatings) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique raw user and item ids over all given files: contiguous index k <-> raw id."""
    for what in ("users", "items"):
        kinds = {getattr(r, what).dtype.kind for r in raws}
        if len(kinds) > 1:
            names = ", ".join(f"{r.path} ({'numeric' if getattr(r, what).dtype.kind == 'i' else 'text'})" for r in raws)
            raise DataError(f"{what[:-1]} ids are numeric in some files and text in others: {names}")
    return np.unique(np.concatenate([r.users for r in raws])), np.unique(np.concatenate([r.items for r in raws]))


def catalog_id_space(catalog_ids: np.ndarray, *raws: RawRatings, catalog: str) -> tuple[np.ndarray, np.ndarray]:
    """The id space of ratings indexed by a public catalogue: users as in :func:`build_id_space`, items = ``catalog_ids``
    in catalogue order, rated or not. A rating of an item the catalogue does not list is one :class:`DataError`
    naming ``file:line`` and the catalogue (``catalog``: its path, for the message)."""
    user_ids, _ = build_id_space(*raws)
    catalog_ids = np.asarray(catalog_ids)
    reference = f"the catalogue {catalog} ({catalog_ids.shape[0]:,} items)"
    for raw in raws:
        if len(raw) and (raw.items.dtype.kind in "iu") != (catalog_ids.dtype.kind in "iu"):
            raise DataError(f"{raw.path}: item ids are {'numeric' if raw.items.dtype.kind in 'iu' else 'text'} but "
                            f"{reference} lists {'numeric' if catalog_ids.dtype.kind in 'iu' else 'text'} ids")
        _index_of(raw.items, catalog_ids, "item", raw, reference, "a rating must name a catalogued item; check that "
                  "the ratings and the catalogue come from the same dataset")
    return user_ids, catalog_ids


def _index_of(raw_ids: np.ndarray, space: np.ndarray, what: str, raw: RawRatings, reference: str, fix: str = "") -> np.ndarray:
    """Position of every raw id in ``space`` (distinct ids, any order: a catalogue's order is kept)."""
    ascending = space.shape[0] < 2 or bool(np.all(space[1:] > space[:-1]))
    order = None if ascending else np.argsort(space, kind="stable")
    look = space if order is None else space[order]
    idx = np.searchsorted(look, raw_ids)
    ok = idx < look.shape[0]
    ok[ok] = look[idx[ok]] == raw_ids[ok]
    if not ok.all():
        k, bad = int(np.argmin(ok)), int((~ok).sum())
        more = f" ({bad:,} of the file's ratings name {what} ids outside it)" if bad > 1 else ""
        raise DataError(f"{raw.path}:{raw.lines[k]}: {what} id {raw_ids[k]} does not appear in {reference}{more}"
                        + (f"; {fix}" if fix else ""))
    return (idx if order is None else order[idx]).astype(np.int64)


def encode(raw: RawRatings, user_ids: np.ndarray, item_ids: np.ndarray, scale: RatingScale, reference: str = "the dataset") -> Ratings:
    """Map a file's raw ids into the shared contiguous id space and build a CPU :class:`Ratings`."""
    _check_in_scale(raw.values, scale, raw.path, raw.lines)
    users = _index_of(raw.users, user_ids, "user", raw, reference)
    items = _index_of(raw.items, item_ids, "item", raw, reference)
    return Ratings(torch.from_numpy(users), torch.from_numpy(items), torch.from_numpy(raw.values.astype(np.float32)),
                   n_users=int(user_ids.shape[0]), n_items=int(item_ids.shape[0]), scale=scale, meta={"source": str(raw.path)})


def infer_scale(*raws: RawRatings) -> RatingScale:
    """``[min, max]`` of the ratings in all files (used when ``data.rating_scale`` is not given)."""
    lo = min(float(r.values.min()) for r in raws if len(r))
    hi = max(float(r.values.max()) for r in raws if len(r))
    if not lo < hi:
        raise DataError(f"every rating in {raws[0].path} equals {lo:g}: set data.rating_scale=[lo,hi] explicitly")
    log.info("rating scale inferred from the data: [%g, %g]", lo, hi)
    return RatingScale(lo, hi)

