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
    rep = {e["data"]: e for e in ledger_report(tmp_path)["entries"]}
    e = rep["ml-100k"]
    assert e["runs"] == 3 and e["validation_runs"] == 1
    assert e["epsilon_user_level"] == pytest.approx(1.75)
    assert e["epsilon_rating_level"] == pytest.approx(3.5)  # user eps => 2 eps at rating level
    assert e["delta"] == pytest.approx(1e-6)
    assert any("TEST split" in w for w in e["warnings"])  # two test-split runs on the same data
    m = rep["ml-1m"]
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


def test_folds_of_one_dataset_are_the_same_people(tmp_path):
    """ML-100K's folds share all 943 users: two single-fold runs at eps = 1 cost 2 on ONE entry (defect 5)."""
    write_run(tmp_path, "f1", eps=1.0, folds=(1,))
    write_run(tmp_path, "f2", eps=1.0, folds=(2,))
    (e,) = ledger_report(tmp_path)["entries"]
    assert e["data"] == "ml-100k" and e["folds"] == [1, 2] and e["runs"] == 2
    assert e["epsilon_user_level"] == pytest.approx(2.0) and e["epsilon_rating_level"] == pytest.approx(4.0)
    assert not any("TEST split" in w for w in e["warnings"])  # different folds: not the same cell


def test_fold_all_run_charges_every_model_it_released(tmp_path):
    """``data.fold=all`` trains five models on the same people: five times the per-model epsilon."""
    write_run(tmp_path, "all", eps=1.0, delta=1e-6, folds=(1, 2, 3, 4, 5))
    (e,) = ledger_report(tmp_path)["entries"]
    assert e["models"] == 5 and e["epsilon_user_level"] == pytest.approx(5.0) and e["delta"] == pytest.approx(5e-6)
    (r,) = e["per_run"]
    assert r["epsilon_per_model"] == pytest.approx(1.0) and r["models"] == 5


def test_per_fold_privacy_records_win(tmp_path):
    d = tmp_path / "r"
    d.mkdir()
    (d / "metrics.json").write_text(json.dumps({
        "data": "ml-100k", "mechanism": "x", "test_rmse": 0.9,
        "folds": [{"fold": 1, "privacy_epsilon": 1.0}, {"fold": 2, "privacy_epsilon": 3.0}],
        "privacy": {"epsilon": 1.0, "relation": "user", "delta": 0.0}}))
    (e,) = ledger_report(tmp_path)["entries"]
    assert e["epsilon_user_level"] == pytest.approx(4.0)


def test_per_query_mechanism_is_charged_its_composition(tmp_path):
    """A per-query report (Park & Acharya's laplace_output) costs eps x released values, not eps."""
    d = tmp_path / "old"
    d.mkdir()
    (d / "metrics.json").write_text(json.dumps({
        "data": "ml-100k", "mechanism": "laplace_output", "test_rmse": 1.0, "folds": [{"fold": 1}],
        "privacy": {"epsilon": 0.5, "relation": "rating", "delta": 0.0, "released_values": 20000,
                    "epsilon_scope": "per released prediction (per query), as in Park & Acharya"}}))
    (e,) = ledger_report(tmp_path)["entries"]
    assert e["epsilon_rating_level"] == pytest.approx(10000.0)
    assert e["epsilon_user_level"] == math.inf


def test_laplace_output_report_is_charged_as_headlined(tmp_path):
    """The mechanism's own report (headline = composed total) is charged once, not composed twice."""
    from dprec_torch.mechanisms.output_perturbation import LaplaceOutput
    from dprec_torch.predictors.slope_one import SlopeOne
    from tests.helpers import toy_ratings

    train = toy_ratings([[5, 3, None], [4, None, 1], [None, 2, 5]])
    wrapped = LaplaceOutput(epsilon=0.5, seed=0).wrap(SlopeOne(T=1, phi_m=1)).fit(train)
    wrapped.release(torch.zeros(10, dtype=torch.long), torch.ones(10, dtype=torch.long))
    priv = wrapped.privacy_report()
    d = tmp_path / "new"
    d.mkdir()
    (d / "metrics.json").write_text(json.dumps({"data": "toy", "mechanism": "laplace_output", "test_rmse": 1.0,
                                                "folds": [{"fold": 1}], "privacy": priv}))
    (e,) = ledger_report(tmp_path)["entries"]
    assert e["epsilon_rating_level"] == pytest.approx(10 * priv["epsilon_per_query"]) == pytest.approx(priv["epsilon"])


def test_cli(tmp_path, capsys):
    from scripts import ledger

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


def test_a_real_fold_all_run_is_charged_five_models(tmp_path):
    """End to end: ``data.fold=all`` trains five models on the same synthetic people; the ledger charges 5 eps."""
    from dprec_torch.training.run import train
    from tests.helpers import tiny_cfg

    cfg = tiny_cfg("data=synthetic", "data.fold=all", "device=cpu", "compare_baselines=false", "tensorboard=false",
                   "mechanism=dpsgd", "epsilon=1", "mechanism.epochs=1", f"output_dir={tmp_path / 'run'}")
    m = train(cfg)
    assert len(m["folds"]) == 5 and all(f["privacy_epsilon"] == pytest.approx(1.0) for f in m["folds"])
    (e,) = ledger_report(tmp_path)["entries"]
    assert e["models"] == 5 and e["epsilon_user_level"] == pytest.approx(5.0)


def test_a_missing_delta_is_not_established_never_zero(tmp_path):
    """SGLD's report has a finite exact-sample figure and delta None; old code booked delta = 0."""
    write_run(tmp_path, "pure", eps=1.0, delta=0.0)
    write_run(tmp_path, "chain", eps=2.0, delta=None)
    (e,) = ledger_report(tmp_path)["entries"]
    assert math.isnan(e["delta"]) and math.isinf(e["epsilon_user_level"])
    assert "not established" in format_ledger(ledger_report(tmp_path))
    (tmp_path / "chain" / "metrics.json").unlink()
    (e,) = ledger_report(tmp_path)["entries"]
    assert e["delta"] == 0.0 and e["epsilon_user_level"] == pytest.approx(1.0)
