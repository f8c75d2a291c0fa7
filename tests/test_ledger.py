"""Privacy ledger totals and warnings; the validation split carved from train."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dprec_torch.data.validation import VALIDATION_SUFFIX, validation_fold, with_validation
from dprec_torch.errors import ConfigError
from dprec_torch.privacy.ledger import collect, format_ledger, ledger_report
from tests.helpers import tiny_fold


def write_run(root, name, data="ml-100k", eps=1.0, relation="user", delta=0.0, folds=(1,), rmse=0.9):
    d = root / name
    d.mkdir(parents=True)
    (d / "metrics.json").write_text(json.dumps({
        "data": data, "mechanism": "x", "test_rmse": rmse, "folds": [{"fold": f} for f in folds],
        "privacy": {"epsilon": eps, "relation": relation, "delta": delta}}))


def test_sums_per_dataset_and_converts_user_to_rating(tmp_path):
    write_run(tmp_path, "a", eps=1.0, relation="user")
    write_run(tmp_path, "b", eps=0.5, relation="user", delta=1e-6)
    write_run(tmp_path, "c", data="ml-100k" + VALIDATION_SUFFIX, eps=0.25, relation="user")  # same users
    write_run(tmp_path, "d", data="ml-1m", eps=3.0, relation="rating")
    rep = {(e["data"], tuple(e["folds"])): e for e in ledger_report(tmp_path)["entries"]}
    e = rep[("ml-100k", (1,))]
    assert e["runs"] == 3 and e["validation_runs"] == 1
    assert e["epsilon_user_level"] == pytest.approx(1.75)
    assert e["epsilon_rating_level"] == pytest.approx(3.5)  # user eps => 2 eps at rating level
    assert e["delta"] == pytest.approx(1e-6)
    assert any("TEST split" in w for w in e["warnings"])  # two test-split runs on the same data
    m = rep[("ml-1m", (1,))]
    assert m["epsilon_rating_level"] == 3.0 and m["epsilon_user_level"] == math.inf  # rating-level says nothing per user
    assert not m["warnings"]
    assert "ml-100k" in format_ledger(ledger_report(tmp_path))


def test_unestablished_epsilon_makes_the_total_infinite(tmp_path):
    write_run(tmp_path, "a", eps=1.0)
    write_run(tmp_path, "b", data="ml-100k" + VALIDATION_SUFFIX, eps=None, relation="rating")
    (e,) = ledger_report(tmp_path)["entries"]
    assert e["epsilon_user_level"] == math.inf
    assert any("no established finite epsilon" in w for w in e["warnings"])
    assert not any("TEST split" in w for w in e["warnings"])  # one test run + one validation run


def test_cli(tmp_path, capsys):
    import ledger

    write_run(tmp_path, "a")
    assert ledger.main([str(tmp_path), "--json", str(tmp_path / "l.json")]) == 0
    assert "privacy ledger" in capsys.readouterr().out
    assert json.loads((tmp_path / "l.json").read_text())["entries"][0]["runs"] == 1
    assert ledger.main([str(tmp_path / "nothing")]) == 2
    assert len(collect(tmp_path)) == 1


def test_validation_fold_is_carved_from_train_only():
    fold = tiny_fold()
    val = validation_fold(fold, 0.2, seed=3)
    key = lambda r: set(zip(r.users.tolist(), r.items.tolist()))  # noqa: E731
    tr, va, orig = key(val.train), key(val.test), key(fold.train)
    assert tr | va == orig and not (tr & va)  # a partition of the original TRAIN
    assert not (va & key(fold.test))
    assert len(va) == pytest.approx(0.2 * len(orig), rel=0.15)
    counts = torch.bincount(val.train.users, minlength=fold.train.n_users)
    had = torch.bincount(fold.train.users, minlength=fold.train.n_users) > 0
    assert bool((counts[had] >= 1).all())  # every user keeps a history
    again = validation_fold(fold, 0.2, seed=3)
    assert torch.equal(again.test.users, val.test.users) and torch.equal(again.test.items, val.test.items)
    assert key(validation_fold(fold, 0.2, seed=4).test) != va
    assert val.name.endswith(VALIDATION_SUFFIX)


def test_with_validation_and_bad_fraction():
    from dprec_torch.data.synthetic import load_synthetic

    ds = with_validation(load_synthetic(preset="tiny", fold=1), 0.1, 0)
    assert ds.name == "synthetic" + VALIDATION_SUFFIX and ds.report["validation"]["fraction"] == 0.1
    with pytest.raises(ConfigError, match="between 0 and 1"):
        validation_fold(tiny_fold(), 1.0)
