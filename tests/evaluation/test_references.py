"""Every run is compared: the private model beside non-private PCC/COS on the same split and k,
and beside DP item means + user offset at its epsilon, in the final table, metrics.json, TensorBoard,
``evaluate.py run=<dir>``, ``load_run`` and the sweep report's figure; ``log_private_diagnostics`` governs
only what is computed from the training data for the private model."""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch

import dprec_torch
from dprec_torch.data.ratings import Fold, Ratings, RatingScale
from dprec_torch.evaluation.baselines import (DP_MEANS, DPMeansOffset, dp_reference_target, reference_hparams,
                                              reference_info, reference_label)
from dprec_torch.training.evaluate import evaluate, evaluate_run
from dprec_torch.training.run import comparison_table
from tests.helpers import tiny_cfg

BASE = ["data=synthetic", "device=cpu", "mechanism.epochs=1", "baseline_k=20"]
LABELS = ("PCC (non-private reference)", "COS (non-private reference)")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DPREC_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def sgld_run(tmp_path_factory):
    """``python train.py mechanism=sgld epsilon=20``, shrunk: the README's second command."""
    out = tmp_path_factory.mktemp("sgld")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DPREC_CACHE", str(out.parent / "sgld-cache"))
        # an explicit noise seed: evaluate.py then redraws the same DP reference (a secret run draws a fresh one)
        return dprec_torch.train([*BASE, "mechanism=sgld", "epsilon=20", "tensorboard=true", "noise_seed=0", f"output_dir={out}"])


def test_private_run_lists_model_pcc_cos_and_dp_means(sgld_run):
    saved = json.loads((sgld_run.dir / "metrics.json").read_text())
    assert set(saved["baselines"]) == {"PCC", "COS", DP_MEANS}
    info = saved["baseline_info"]
    assert [info[n]["label"] for n in ("PCC", "COS")] == list(LABELS) and not info["PCC"]["private"]
    # the reference is drawn at the run's reported epsilon (the accounted chain's figure: at most the typed 20)
    assert info[DP_MEANS]["private"] and info[DP_MEANS]["epsilon"] == saved["privacy"]["epsilon"] <= 20
    assert info[DP_MEANS]["epsilon"] == pytest.approx(20, rel=0.01) and info[DP_MEANS]["relation"] == "user"
    table = comparison_table(saved)
    rows = table.splitlines()
    assert rows[1].startswith("pnbm_lowrank (sgld)")  # the default model
    assert any(r.startswith(LABELS[0]) for r in rows) and any(r.startswith(LABELS[1]) for r in rows)
    eps = f"{info[DP_MEANS]['epsilon']:g}"
    assert any(r.startswith(f"DP item means + user offset (user level, eps={eps}, separate release)") for r in rows)
    # the scope says what the references are and that epsilon does not cover them
    not_covered = " ".join(saved["privacy"]["scope"]["not_covered"])
    assert "reference baselines PCC/COS" in not_covered and "NON-PRIVATE" in not_covered
    assert f"SEPARATE release at pure epsilon={eps} (user level)" in not_covered


def test_tensorboard_carries_the_references(sgld_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(sgld_run.dir / "tb" / "fold1"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"reference/pcc/test_rmse", "reference/cos/test_rmse", "reference/dp_means_offset/test_rmse"} <= tags
    assert acc.Scalars("reference/pcc/test_rmse")[0].value == pytest.approx(sgld_run.baselines["PCC"]["rmse"])
    # the hparams table (TensorBoard keeps only the first hparams summary of a run) holds the references too
    hparams = b"".join(p.read_bytes() for p in (sgld_run.dir / "tb" / "fold1").rglob("events.*"))
    assert b"hparam/pcc_test_rmse" in hparams and b"hparam/cos_test_rmse" in hparams


def test_evaluate_run_and_load_run_show_the_same_references(sgld_run, tmp_path):
    ev, table = evaluate_run(sgld_run.dir, torch.device("cpu"))
    for name in ("PCC", "COS", DP_MEANS):  # same split, same k, same seeded DP draw: the same figures
        assert ev["baselines"][name]["rmse"] == sgld_run.baselines[name]["rmse"]
    assert all(label in table for label in LABELS) and "DP item means + user offset" in table
    # the CLI path: python evaluate.py run=<dir>
    cfg = tiny_cfg(f"run={sgld_run.dir}", "device=cpu", f"output_dir={tmp_path}", config_name="evaluate")
    metrics, cli_table = evaluate(cfg)
    assert set(json.loads((tmp_path / "metrics.json").read_text())["baselines"]) == {"PCC", "COS", DP_MEANS}
    assert cli_table == table
    off, off_table = evaluate_run(sgld_run.dir, torch.device("cpu"), compare_baselines=False)
    assert "baselines" not in off and "compare_baselines=false" in off_table

    again = dprec_torch.load_run(sgld_run.dir)
    assert again.baselines == sgld_run.baselines and set(again.baselines) == {"PCC", "COS", DP_MEANS}
    assert [again.baseline_labels[n] for n in ("PCC", "COS")] == list(LABELS)
    assert again.table() == comparison_table(json.loads((sgld_run.dir / "metrics.json").read_text()))


def test_compare_baselines_false_turns_them_off(tmp_path):
    run = dprec_torch.train([*BASE, "mechanism=dpsgd", "epsilon=2", "compare_baselines=false", "tensorboard=false",
                             f"output_dir={tmp_path}"])
    assert run.baselines == {} and "baselines" not in run.metrics and "baseline_info" not in run.metrics
    assert not any("reference" in s for s in run.privacy["scope"]["not_covered"])
    assert "(no reference baselines: compare_baselines=false)" in run.table()


def test_non_private_run_has_pcc_cos_but_no_dp_reference(tmp_path):
    run = dprec_torch.train([*BASE, "mechanism=none", "epsilon=inf", "tensorboard=false", f"output_dir={tmp_path}"])
    assert set(run.baselines) == {"PCC", "COS"}
    assert all(label in run.table() for label in LABELS)


# ------------------------------------------------------------------------------ the DP reference itself
def _fold() -> Fold:
    scale = RatingScale(1.0, 5.0)
    users = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])
    items = torch.tensor([0, 1, 2, 0, 1, 0, 1, 2])
    values = torch.tensor([5.0, 4.0, 5.0, 2.0, 1.0, 4.0, 3.0, 4.0])
    train = Ratings(users, items, values, 4, 4, scale)
    test = Ratings(torch.tensor([1, 3, 0]), torch.tensor([2, 0, 3]), torch.tensor([2.0, 3.0, 4.0]), 4, 4, scale)
    return Fold(1, train, test)


def test_dp_means_offset_equation_at_a_huge_epsilon():
    """With (almost) no noise: r^_ui = clip(r~_i + sum_{R_u} (r - r~) / (|R_u| + beta)), r~ = the shrunk item means."""
    fold = _fold()
    ref = DPMeansOffset(1e9, "rating", seed=0, beta=1.0).fit(fold.train)
    exact = fold.train.item_means()
    assert torch.allclose(ref.item_avg_, exact, atol=1e-4)  # noise-free limit of the posterior mean
    e = fold.train.values - exact[fold.train.items]
    b0 = float(e[fold.train.users == 0].sum()) / (3 + 1.0)
    pred = ref.predict(torch.tensor([0, 3, 0]), torch.tensor([1, 0, 9]))
    assert float(pred[0]) == pytest.approx(min(max(float(exact[1]) + b0, 1.0), 5.0), abs=1e-4)
    assert float(pred[1]) == pytest.approx(float(exact[0]), abs=1e-4)  # user without ratings: the DP item mean
    assert float(pred[2]) == pytest.approx(ref.global_avg_, abs=1e-4)  # unknown item: the released global mean


def test_dp_means_offset_is_clipped_and_seeded():
    fold = _fold()
    a = DPMeansOffset(0.1, "user", seed=3).fit(fold.train).predict(fold.test.users, fold.test.items)
    b = DPMeansOffset(0.1, "user", seed=3).fit(fold.train).predict(fold.test.users, fold.test.items)
    c = DPMeansOffset(0.1, "user", seed=4).fit(fold.train).predict(fold.test.users, fold.test.items)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert bool(((a >= 1.0) & (a <= 5.0)).all())


@pytest.mark.parametrize("report,configured,expected", [
    ({"epsilon": 2.0, "relation": "user"}, 2.0, (2.0, "user")),
    ({"epsilon": 1.0, "relation": "rating"}, 1.0, (1.0, "rating")),
    ({"epsilon": 3.0, "relation": "rating (value change: ...)"}, 3.0, (3.0, "rating")),
    ({"epsilon": None, "relation": "user"}, 20.0, (20.0, "user")),  # SGLD / paper forms: the epsilon typed
    ({"epsilon": math.inf, "relation": None}, math.inf, None),  # non-private
    ({"epsilon": 1.0, "relation": "event: one liked element ..."}, 1.0, None),  # no release for that relation
])
def test_dp_reference_target(report, configured, expected):
    assert dp_reference_target(report, configured) == expected


def test_reference_hparams_names():
    refs = {"PCC": {"rmse": 0.9, "mae": 0.7, "fallback_rate": 0.0}, DP_MEANS: {"rmse": 1.0}}
    assert reference_hparams(refs) == {"hparam/pcc_test_rmse": 0.9, "hparam/pcc_test_mae": 0.7,
                                       "hparam/dp_means_offset_test_rmse": 1.0}


def test_labels_of_old_runs_default_to_non_private():
    assert reference_label("PCC") == LABELS[0]
    info = reference_info(50, (1.0, "rating"))
    assert reference_label(DP_MEANS, info).startswith("DP item means + user offset (rating level, eps=1")


# ------------------------------------------------------------------------------ the sweep report's figure
def test_report_figure_draws_the_references(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from dprec_torch.study.report import build_report
    from dprec_torch.training.run import train

    sweep = tmp_path / "sweep"
    for eps in ("1", "10"):
        train(tiny_cfg(*BASE, "mechanism=dpsgd", f"epsilon={eps}", "tensorboard=false", f"output_dir={sweep}/eps{eps}"))
    figures = []
    original_close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.append(fig) or original_close(fig))
    build_report(sweep)
    (fig,) = figures
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    runs = [json.loads(p.read_text()) for p in sorted(sweep.rglob("metrics.json"))]
    for r in runs:  # provable runs: log_private_diagnostics (auto: off) keeps train-side figures out, not the references
        assert r["privacy"]["epsilon"] < math.inf and DP_MEANS in r["baselines"]
        assert all("train_rmse" not in row and "grad_norm" not in row for row in r["history"]["1"])
    for name, label in zip(("PCC", "COS"), LABELS):
        y = lines[label].get_ydata()
        assert len(set(y)) == 1 and y[0] == pytest.approx(sum(r["baselines"][name]["rmse"] for r in runs) / len(runs))
    relation = runs[0]["baseline_info"][DP_MEANS]["relation"]
    dp = lines[f"{DP_MEANS} ({relation}) at each ε (separate DP release)"]
    assert list(dp.get_xdata()) == [1.0, 10.0]
    assert list(dp.get_ydata()) == pytest.approx([r["baselines"][DP_MEANS]["rmse"] for r in runs])  # eps1, eps10
    base = {r["method"]: float(r["rmse_mean"]) for r in csv.DictReader(open(sweep / "baselines.csv"))}
    assert set(base) == {"PCC", "COS"}
    dp_rows = list(csv.DictReader(open(sweep / "references_dp.csv")))
    assert [float(r["epsilon"]) for r in dp_rows] == [1.0, 10.0]
    md = (sweep / "report.md").read_text()
    assert all(label in md for label in LABELS) and "separate DP release at this ε" in md
