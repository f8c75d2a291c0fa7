"""Readers and the custom loader: formats, id maps, folds and every bad-input error."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from dprec_torch.data import load_custom, read_ratings
from dprec_torch.data.ratings import RatingScale
from dprec_torch.errors import ConfigError, DataError

CONF = Path(__file__).resolve().parents[2] / "conf" / "data"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def pairs(r) -> set[tuple[int, int, float]]:
    return set(zip(r.users.tolist(), r.items.tolist(), r.values.tolist()))


# ------------------------------------------------------------------ formats
def test_ml100k_tab_format(tmp_path):
    path = write(tmp_path, "u.data", "196\t242\t3\t881250949\n186\t302\t3\t891717742\n22\t377\t1\t878887116\n196\t302\t5\t1\n")
    raw = read_ratings(path)
    assert raw.users.tolist() == [196, 186, 22, 196]
    assert raw.items.tolist() == [242, 302, 377, 302]
    assert raw.values.tolist() == [3.0, 3.0, 1.0, 5.0]
    assert raw.lines.tolist() == [1, 2, 3, 4]


def test_ml1m_colon_format_with_id_maps(tmp_path):
    text = "1::1193::5::978300760\n1::661::3::978302109\n2::1193::4::978298413\n10::661::1::978298413\n"
    path = write(tmp_path, "ratings.dat", text)
    # seed 1: the per-rating keyed split holds out one of the 4 ratings (seed 0 holds out all 4)
    ds = load_custom(path=str(path), rating_scale=[1, 5], fold=1, test_fraction=0.25, seed=1)
    assert ds.user_ids == [1, 2, 10] and ds.item_ids == [661, 1193]
    assert ds.scale == RatingScale(1.0, 5.0)
    fold = ds.folds[0]
    assert (len(fold.train), len(fold.test)) == (3, 1)
    everything = pairs(fold.train) | pairs(fold.test)
    # raw (1, 1193, 5) -> (0, 1); (10, 661, 1) -> (2, 0)
    assert everything == {(0, 1, 5.0), (0, 0, 3.0), (1, 1, 4.0), (2, 0, 1.0)}
    assert fold.train.n_users == fold.test.n_users == 3


def test_movielens_latest_csv_header_half_stars(tmp_path):
    text = "userId,movieId,rating,timestamp\n1,1,4.0,964982703\n1,3,0.5,964981247\n2,3,3.5,964982224\n"
    path = write(tmp_path, "ratings.csv", text)
    raw = read_ratings(path)
    assert raw.lines.tolist() == [2, 3, 4]
    assert raw.values.tolist() == [4.0, 0.5, 3.5]
    train = tmp_path / "ratings.csv"
    test = write(tmp_path, "test.csv", "userId,movieId,rating,timestamp\n2,1,5.0,1\n")
    ds = load_custom(train_path=str(train), test_path=str(test))
    assert ds.scale == RatingScale(0.5, 5.0)  # inferred from min/max of both files
    assert [f.name for f in ds.folds] == ["given"]
    assert pairs(ds.folds[0].test) == {(1, 0, 5.0)}


def test_whitespace_blank_lines_string_ids_and_forced_header(tmp_path):
    path = write(tmp_path, "r.txt", "user item rating\n\nalice  m1 4\n   \nbob m2   2\n\n")
    raw = read_ratings(path, sep="whitespace", header=True)
    assert raw.users.tolist() == ["alice", "bob"] and raw.lines.tolist() == [3, 5]
    assert raw.values.tolist() == [4.0, 2.0]
    raw = read_ratings(write(tmp_path, "s.txt", "1 2 3\n"), header=False)
    assert raw.values.tolist() == [3.0]


def test_holdout_folds_are_seeded_and_share_the_id_space(tmp_path):
    lines = [f"{u}\t{i}\t{(u + i) % 5 + 1}" for u in range(1, 11) for i in range(1, 11)]
    path = write(tmp_path, "r.tsv", "\n".join(lines) + "\n")
    all_folds = load_custom(path=str(path), fold="all", seed=7)
    assert [f.name for f in all_folds.folds] == [f"holdout-{k}" for k in range(1, 6)]
    for f in all_folds.folds:
        assert len(f.train) + len(f.test) == 100 and 2 <= len(f.test) <= 20  # ~10 %: a keyed Bernoulli per rating
        assert not pairs(f.train) & pairs(f.test)
        assert len(pairs(f.train) | pairs(f.test)) == 100
    tests = [frozenset(pairs(f.test)) for f in all_folds.folds]
    assert len(set(tests)) == 5  # independent draws, not copies
    third = load_custom(path=str(path), fold=3, seed=7).folds[0]
    assert third.index == 3 and pairs(third.test) == pairs(all_folds.folds[2].test)
    other_seed = load_custom(path=str(path), fold=3, seed=8).folds[0]
    assert pairs(other_seed.test) != pairs(third.test)


def test_duplicates_keep_last_and_are_reported(tmp_path):
    path = write(tmp_path, "d.csv", "1,1,2\n1,2,3\n1,1,5\n2,1,4\n")
    raw = read_ratings(path)
    assert raw.duplicates_dropped == 1
    assert list(zip(raw.users.tolist(), raw.items.tolist(), raw.values.tolist())) == [(1, 2, 3.0), (1, 1, 5.0), (2, 1, 4.0)]
    ds = load_custom(train_path=str(path), test_path=str(write(tmp_path, "t.csv", "2,2,1\n")))
    assert ds.report["duplicates_dropped"] == 1


def test_hydra_custom_yaml_instantiates(tmp_path):
    path = write(tmp_path, "r.csv", "\n".join(f"{u},{i},{1 + (u * i) % 5}" for u in range(8) for i in range(5)) + "\n")
    cfg = OmegaConf.create({"seed": 3, "data": OmegaConf.load(CONF / "custom.yaml")})
    cfg.data.path = str(path)
    cfg.data.rating_scale = [1, 5]
    ds = instantiate(cfg.data)
    assert cfg.data.name == "custom" and ds.name == "custom"
    assert (len(ds.folds[0].train), len(ds.folds[0].test)) == (36, 4)
    assert ds.folds[0].train.values.dtype == torch.float32


# ------------------------------------------------------------------- errors
def test_missing_file(tmp_path):
    with pytest.raises(DataError) as err:
        load_custom(path=str(tmp_path / "nope.csv"))
    assert "nope.csv" in one_line(err) and "not found" in str(err.value)


@pytest.mark.parametrize(
    "text, line, words",
    [
        ("1\t2\t3\n4\t5\n", 2, "expected 3 fields"),
        ("1\t2\t3\t4\n4\t5\t3\t1\t9\n", 2, "expected 4 fields"),
        ("1\t2\n", 1, "expected 3 or 4 fields"),
        ("1,2,3\n1,x,3\n", 2, "item id 'x' is not an integer"),
        ("1,2,3\n2.5,2,3\n", 2, "user id '2.5' is not an integer"),
        ("1,2,3\n\n1,3,good\n", 3, "rating 'good' is not a number"),
        ("1,2,3\n1,3,nan\n", 2, "not finite"),
        ("1,2,3\n1,3,inf\n", 2, "not finite"),
        ("1::2::3\n1::3::3::7::8\n", 2, "'::'"),
    ],
)
def test_malformed_lines_name_file_and_line(tmp_path, text, line, words):
    path = write(tmp_path, "bad.txt", text)
    with pytest.raises(DataError) as err:
        read_ratings(path)
    assert f"bad.txt:{line}:" in one_line(err)
    assert words in str(err.value)


def test_rating_out_of_given_scale(tmp_path):
    path = write(tmp_path, "r.csv", "1,1,3\n1,2,6\n")
    with pytest.raises(DataError) as err:
        load_custom(path=str(path), rating_scale=[1, 5])
    assert "r.csv:2:" in one_line(err) and "rating scale [1, 5]" in str(err.value) and "data.rating_scale" in str(err.value)


def test_duplicate_policy_error(tmp_path):
    path = write(tmp_path, "d.csv", "1,1,2\n1,2,3\n2,2,3\n1,1,5\n")
    with pytest.raises(DataError) as err:
        read_ratings(path, duplicates="error")
    msg = one_line(err)
    assert "d.csv:4:" in msg and "line 1" in msg and "data.duplicates=last" in msg
    with pytest.raises(ConfigError):
        read_ratings(path, duplicates="first")


def test_empty_file_and_header_only(tmp_path):
    with pytest.raises(DataError, match="no ratings"):
        read_ratings(write(tmp_path, "e.csv", "\n\n"))
    with pytest.raises(DataError, match="no ratings"):
        read_ratings(write(tmp_path, "h.csv", "user,item,rating\n"))


def test_empty_splits(tmp_path):
    path = write(tmp_path, "r.csv", "1,1,3\n1,2,4\n2,1,5\n")
    with pytest.raises(DataError) as err:
        load_custom(path=str(path), test_fraction=0.01)  # 3 ratings at 1 %: none held out (seed 0)
    assert "test set has no ratings" in one_line(err) and "data.test_fraction" in str(err.value)
    with pytest.raises(DataError) as err:
        load_custom(path=str(path), test_fraction=0.4, min_user_ratings=50)
    assert "empty after preprocessing" in one_line(err) and "data.min_user_ratings" in str(err.value)


def test_bad_options(tmp_path):
    path = write(tmp_path, "r.csv", "1,1,3\n1,2,4\n")
    test = write(tmp_path, "t.csv", "1,3,3\n")
    with pytest.raises(ConfigError, match="out of range: use 1..5 or all"):
        load_custom(path=str(path), fold=6)
    with pytest.raises(ConfigError, match="single fold"):
        load_custom(train_path=str(path), test_path=str(test), fold=2)
    with pytest.raises(ConfigError, match="either data.path"):
        load_custom(path=str(path), train_path=str(path), test_path=str(test))
    with pytest.raises(ConfigError, match="needs data.path"):
        load_custom(train_path=str(path))
    with pytest.raises(ConfigError, match="rating_scale"):
        load_custom(path=str(path), rating_scale=[5, 1])
    with pytest.raises(ConfigError, match="data.header"):
        load_custom(path=str(path), header="maybe")
    with pytest.raises(ConfigError, match="test_fraction"):
        load_custom(path=str(path), test_fraction=1.5)


def test_mixed_id_kinds_across_files(tmp_path):
    a = write(tmp_path, "a.csv", "1,1,3\n")
    b = write(tmp_path, "b.csv", "bob,1,4\n")
    with pytest.raises(DataError) as err:
        load_custom(train_path=str(a), test_path=str(b))
    assert "numeric in some files" in one_line(err)


def test_big_files_are_parsed_once_then_read_from_the_parsed_cache(tmp_path, monkeypatch):
    """Start-up: ML-1M's 1 M lines take ~1 s to parse; the parsed arrays are kept, keyed by the file's stat."""
    import numpy as np

    from dprec_torch.data import readers

    monkeypatch.setenv("DPREC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(readers, "PARSED_CACHE_MIN_BYTES", 0)
    f = write(tmp_path, "r.dat", "1::10::5::0\n2::10::3::0\n1::11::4::0\n1::10::2::0\n")  # one duplicate, last kept
    first = read_ratings(f, sep="::", rating_scale=[1, 5])
    assert len(list((tmp_path / "cache" / "parsed").iterdir())) == 1

    def no_parse(*args, **kwargs):
        raise AssertionError("parsed again")

    monkeypatch.setattr(readers, "_parse_file", no_parse)
    again = read_ratings(f, sep="::", rating_scale=[1, 5])
    for name in ("users", "items", "values", "lines"):
        assert np.array_equal(getattr(first, name), getattr(again, name)) and getattr(again, name).dtype == getattr(first, name).dtype
    assert again.duplicates_dropped == first.duplicates_dropped == 1
    with pytest.raises(AssertionError, match="parsed again"):  # other options: another key
        read_ratings(f, sep="::", rating_scale=[0, 5])
    f.write_text("1::10::5::0\n2::10::3::0\n3::12::1::0\n")  # an edited file is parsed again
    with pytest.raises(AssertionError, match="parsed again"):
        read_ratings(f, sep="::", rating_scale=[1, 5])


def test_parsed_cache_skips_small_files_string_ids_and_bad_files(tmp_path, monkeypatch):
    from dprec_torch.data import readers

    monkeypatch.setenv("DPREC_CACHE", str(tmp_path / "cache"))
    read_ratings(write(tmp_path, "small.dat", "1::10::5\n"), sep="::")  # under PARSED_CACHE_MIN_BYTES
    monkeypatch.setattr(readers, "PARSED_CACHE_MIN_BYTES", 0)
    read_ratings(write(tmp_path, "s.csv", "alice,x,5\nbob,y,3\n"), sep=",")  # string ids: not cached
    bad = write(tmp_path, "bad.dat", "1::10::5\n2::10\n")
    for _ in range(2):  # an error is raised every time, never cached
        with pytest.raises(DataError, match="bad.dat:2"):
            read_ratings(bad, sep="::")
    assert not (tmp_path / "cache" / "parsed").exists()
