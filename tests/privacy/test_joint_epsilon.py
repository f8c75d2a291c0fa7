"""``data.fold=all`` releases one model per fold, all trained on the same people. The run reports each
fold model's epsilon and the joint epsilon of all of them, composed by the mechanism's own accountant, and the CLI's
last line and the ledger show the joint figure. Google's dp-accounting PLD accountant checks the Gaussian ones."""

from __future__ import annotations

import json
import math

import pytest

from dprec_torch.privacy.calibration import gaussian_epsilon
from dprec_torch.privacy.ledger import JOBS_COMPOSE, format_ledger, joint_epsilon, ledger_report, run_privacy
from dprec_torch.training.run import comparison_table, train
from tests.helpers import tiny_cfg

BASE = ["data=synthetic", "data.fold=all", "device=cpu", "compare_baselines=false", "tensorboard=false",
        "mechanism.epochs=1"]
FOLDS = 5  # the synthetic preset's n_folds


def run(tmp_path, *overrides: str) -> dict:
    cfg = tiny_cfg(*BASE, f"output_dir={tmp_path}", *overrides)
    return train(cfg)


def pld_epsilon(history, times: int, delta: float) -> float:
    """Google's dp-accounting PLD accountant over ``times`` copies of a (sigma, q, steps) history (independent of Opacus)."""
    pytest.importorskip("dp_accounting")
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    pld = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    for sigma, q, steps in history:
        event = dp_event.GaussianDpEvent(sigma)
        pld.compose(event if q >= 1 else dp_event.PoissonSampledDpEvent(q, event), int(steps) * times)
    return pld.get_epsilon(delta)


def check_common(tmp_path, m: dict) -> dict:
    p = m["privacy"]
    assert json.loads((tmp_path / "metrics.json").read_text())["privacy"]["epsilon"] == pytest.approx(p["epsilon"])
    assert len(m["folds"]) == FOLDS and p["joint"]["models"] == FOLDS and p["joint"]["folds"] == [1, 2, 3, 4, 5]
    assert p["epsilon_per_fold"] == [f["privacy_epsilon"] for f in m["folds"]]
    assert p["epsilon_per_model"] == pytest.approx(max(p["epsilon_per_fold"]))
    assert p["epsilon"] == p["joint"]["epsilon"] and p["epsilon_scope"].startswith("joint")
    assert "share people" in p["epsilon_scope"] and "same people" in p["joint"]["statement"]
    last = comparison_table(m).splitlines()[-1]  # the CLI's last line: the joint figure first
    assert f"epsilon={p['epsilon']:.6g}" in last and f"joint over the {FOLDS} fold models" in last
    # the ledger charges the joint figure once (never the joint figure per fold, nor the basic sum on top of it)
    (e,) = ledger_report(tmp_path)["entries"]
    assert e["models"] == FOLDS and e["epsilon_user_level"] == pytest.approx(p["epsilon"])
    return p


@pytest.mark.parametrize("mechanism,eps", [("gaussian", 4), ("sgld", 20)])
def test_gaussian_fold_models_compose_by_their_accountant_checked_by_pld(tmp_path, mechanism, eps):
    m = run(tmp_path, f"mechanism={mechanism}", f"epsilon={eps}")
    p = check_common(tmp_path, m)
    one, delta = p["epsilon_per_model"], p["delta"]
    assert delta == p["delta_per_model"] == pytest.approx(1e-6)  # RDP composes at the same delta
    assert one <= eps * (1 + 1e-9) and one < p["epsilon"] < FOLDS * one  # tighter than the basic sum
    hist = p["accountant_history_per_model"]
    assert any(q == 1.0 for _, q, _ in hist)  # the DP item means are in each fold model's history
    assert gaussian_epsilon(hist, delta, p["accountant_name"]) == pytest.approx(one, rel=1e-9)
    assert len(p["accountant_history"]) == FOLDS * len(hist)
    assert gaussian_epsilon(p["accountant_history"], delta, p["accountant_name"]) == pytest.approx(p["epsilon"], rel=1e-12)
    independent = pld_epsilon(hist, FOLDS, delta)
    assert independent <= p["epsilon"] * (1 + 1e-3)  # RDP is an upper bound of the PLD figure ...
    assert p["epsilon"] <= 1.25 * independent  # ... and not a loose one


def test_pure_epsilon_fold_models_add_up(tmp_path):
    m = run(tmp_path, "mechanism=dpsgd", "epsilon=10")
    p = check_common(tmp_path, m)
    assert p["delta"] == 0.0 and p["epsilon_per_fold"] == [pytest.approx(10.0)] * FOLDS
    assert p["epsilon"] == pytest.approx(sum(p["epsilon_per_fold"])) == pytest.approx(50.0)


def test_one_fold_keeps_its_own_report(tmp_path):
    report = {"epsilon": 3.0, "delta": 0.0, "relation": "user"}
    assert run_privacy([report], [1]) == report


def test_null_and_infinite_epsilons_stay_so():
    null = run_privacy([{"epsilon": None, "delta": None, "relation": "user"}] * 3)
    assert null["epsilon"] is None and null["joint"]["epsilon"] is None and null["epsilon_per_model"] is None
    mixed = joint_epsilon([{"epsilon": 1.0, "delta": 0.0}, {"epsilon": None}])
    assert mixed["epsilon"] is None
    assert math.isinf(run_privacy([{"epsilon": math.inf, "delta": 0.0, "relation": None}] * 2)["epsilon"])


def test_per_query_and_basic_composition():
    per_query = {"epsilon": 0.5, "delta": 0.0, "released_values": 10, "epsilon_scope": "per released prediction (per query)"}
    rec = run_privacy([per_query] * 2)
    assert rec["epsilon"] == pytest.approx(10.0) and rec["epsilon_scope"].startswith("joint")
    assert rec["epsilon_scope_per_model"] == per_query["epsilon_scope"]
    approx_dp = joint_epsilon([{"epsilon": 1.0, "delta": 1e-6}, {"epsilon": 2.0, "delta": 1e-6}])
    assert approx_dp["epsilon"] == pytest.approx(3.0) and approx_dp["delta"] == pytest.approx(2e-6)


def test_joint_of_histories_matches_pld():
    """The composition function itself on a typical history (item means + subsampled steps), against PLD."""
    hist = [[3.0, 1.0, 1], [1.1, 0.05, 200]]
    delta = 1e-6
    one = {"epsilon": gaussian_epsilon(hist, delta), "delta": delta, "accountant_name": "rdp", "accountant_history": hist}
    joint = joint_epsilon([one] * 5)
    independent = pld_epsilon(hist, 5, delta)
    assert independent <= joint["epsilon"] * (1 + 1e-3) and joint["epsilon"] <= 1.25 * independent
    assert joint_epsilon([joint, one])["epsilon"] == pytest.approx(joint_epsilon([one] * 6)["epsilon"])  # associative


def write(root, name: str, privacy: dict, folds=(1,)):
    d = root / name
    d.mkdir(parents=True)
    (d / "metrics.json").write_text(json.dumps({"data": "ml-100k", "mechanism": "gaussian", "model": "pnbm_lowrank",
                                                "epsilon": 4.0, "test_rmse": 0.95,
                                                "folds": [{"fold": f, "test_rmse": 0.95, "test_mae": 0.75} for f in folds],
                                                "privacy": privacy}))


def test_ledger_composes_jobs_on_the_same_people_and_says_so(tmp_path):
    """Two sweep jobs (one of them fold=all) on one dataset: the basic sum, and the same accountant's composition."""
    hist, delta = [[3.0, 1.0, 1], [1.1, 0.05, 200]], 1e-6
    one = {"epsilon": gaussian_epsilon(hist, delta), "delta": delta, "relation": "user", "accountant_name": "rdp",
           "accountant_history": hist}
    write(tmp_path, "a", one)
    write(tmp_path, "b", run_privacy([one] * 5, [1, 2, 3, 4, 5]), folds=(1, 2, 3, 4, 5))
    rep = ledger_report(tmp_path)
    (e,) = rep["entries"]
    joint5 = joint_epsilon([one] * 5)["epsilon"]
    assert e["models"] == 6 and e["epsilon_user_level"] == pytest.approx(one["epsilon"] + joint5)
    assert e["delta"] == pytest.approx(2 * delta)
    assert e["composed"]["epsilon"] == pytest.approx(joint_epsilon([one] * 6)["epsilon"])
    assert e["composed"]["epsilon"] < e["epsilon_user_level"]
    assert e["composed"]["delta"] == delta
    text = format_ledger(rep)
    assert JOBS_COMPOSE in text and "composed by their accountant" in text


def test_sweep_report_states_that_jobs_compose(tmp_path, capsys, monkeypatch):
    import sys

    from scripts import report

    hist, delta = [[3.0, 1.0, 1], [1.1, 0.05, 200]], 1e-6
    one = {"epsilon": gaussian_epsilon(hist, delta), "delta": delta, "relation": "user", "accountant_name": "rdp",
           "accountant_history": hist, "mechanism": "gaussian"}
    write(tmp_path, "a", one)
    write(tmp_path, "b", one)
    monkeypatch.setattr(sys, "argv", ["report.py", str(tmp_path)])
    report.main()
    out = capsys.readouterr().out
    assert JOBS_COMPOSE in out
