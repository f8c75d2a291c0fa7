"""experiments/studies/private_frontier.py and its presets.

The headline's configurations are chosen on the OTHER dataset's validation folds from a frozen grid; no choice reads
the tested people's validation or test numbers; the presets pick a configuration per typed epsilon and their runs
say where it was chosen.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dprec_torch.errors import ConfigError
from dprec_torch.privacy.provenance import hyperparameter_provenance, pick_epsilon, preset_choice
from tests.helpers import tiny_cfg

ROOT = Path(__file__).resolve().parents[2]


def _study():
    spec = importlib.util.spec_from_file_location("private_frontier_under_test", ROOT / "experiments" / "studies" / "private_frontier.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


KNN, NONE = {"estimator": "knn", "k": 5}, {"estimator": "none"}


def _fake_study(tmp_path, monkeypatch, pf, rmse):
    """A two-entry grid (none, knn) on two fake folds per dataset; ``run_one`` returns ``rmse(config, fold, eps)`` where
    ``fold`` is ``(data, k)`` for a test split and ``("val", data, k)`` for a validation split."""
    calls = []
    monkeypatch.setattr(pf, "OUT", tmp_path)
    for name in ("GRID_FILE", "SELECTION_FILE", "RUNS_FILE", "E2E_FILE"):
        monkeypatch.setattr(pf, name, tmp_path / getattr(pf, name).name)
    monkeypatch.setattr(pf, "BASE", {("noisy_gram", "user"): {"relation": "user"}})
    monkeypatch.setattr(pf, "GRID", {("noisy_gram", "user"): [NONE, KNN]})
    monkeypatch.setattr(pf, "EPS", [1.0, 10.0])
    monkeypatch.setattr(pf, "LOADERS", {d: (lambda k, d=d: (d, k)) for d in ("ml-1m", "ml-100k")})
    monkeypatch.setattr(pf, "validation_fold", lambda fold, frac, seed: ("val",) + fold)
    monkeypatch.setattr(pf, "universe", lambda fold: "fake universe")

    def run_one(mech, cfg, eps, fold, seed=None):
        calls.append((fold, cfg.get("estimator"), eps, seed))
        return {"rmse": rmse(cfg, fold, eps), "fit_seconds": 0.0}

    monkeypatch.setattr(pf, "run_one", run_one)
    return calls


def _prefers(val: dict[str, str], test: float = 0.5):
    """Validation RMSE 0.9 for ``val[data]``'s estimator, 1.0 for the other; every test split scores ``test``."""
    def rmse(cfg, fold, eps):
        if fold[0] == "val":
            return 0.9 if cfg["estimator"] == val[fold[1]] else 1.0
        return test
    return rmse


def _tuned(tmp_path, monkeypatch, pf, rmse):
    calls = _fake_study(tmp_path, monkeypatch, pf, rmse)
    grid = pf.freeze_grid()
    for d in ("ml-1m", "ml-100k"):
        pf.tune(d, 2, grid)
    tuning = json.loads((tmp_path / "tuning.json").read_text())
    return calls, grid, tuning


def test_each_dataset_is_tested_with_the_other_datasets_choice_and_never_reads_a_test_split_to_choose(tmp_path, monkeypatch):
    pf = _study()
    calls, grid, tuning = _tuned(tmp_path, monkeypatch, pf, _prefers({"ml-1m": "knn", "ml-100k": "none"}))
    assert {c[0][0] for c in calls} == {"val"}  # tuning ran on validation splits only
    assert {c[3] for c in calls} == {None}  # secret noise: no run is given a seed
    sel = pf.write_selection(tuning, grid)
    assert sel["grid_sha256"] == grid["sha256"] and json.loads(pf.SELECTION_FILE.read_text()) == json.loads(json.dumps(sel))
    assert sel["sources"]["ml-1m"]["noisy_gram/user/1"]["chosen"]["estimator"] == "knn"
    assert sel["sources"]["ml-100k"]["noisy_gram/user/1"]["chosen"]["estimator"] == "none"
    runs = pf.load_runs()
    res = {d: pf.test(pf.load_selection(tuning, grid), d, 2, runs) for d in ("ml-1m", "ml-100k")}
    for data, other in (("ml-1m", "none"), ("ml-100k", "knn")):  # ML-1M runs ML-100K's choice and vice versa
        row = res[data]["rows"]["noisy_gram/user/1"]
        assert row["chosen_on"] != data and row["config"]["estimator"] == other
        assert {f["config"]["estimator"] for f in row["folds"].values()} == {other}
        assert {f["noise"] for f in row["folds"].values()} == {"secret"}  # a fresh 256-bit key per run, none published
        assert {f["splits"] for f in row["folds"].values()} == {pf.SPLITS}
    calls.clear()
    for d in ("ml-1m", "ml-100k"):
        pf.test(pf.load_selection(tuning, grid), d, 2, pf.load_runs())
    assert calls == []  # every test run is cached under (data, fold, mechanism, relation, eps, universe, splits, config)
    monkeypatch.setattr(pf, "SPLITS", "another split protocol")
    pf.test(pf.load_selection(tuning, grid), "ml-1m", 2, pf.load_runs())
    assert calls and {c[0][0] for c in calls} == {"ml-1m"}  # a run made on other splits is not reused


def test_changing_the_target_datasets_validation_or_test_numbers_does_not_move_its_choice(tmp_path, monkeypatch):
    pf = _study()
    _, grid, tuning = _tuned(tmp_path, monkeypatch, pf, _prefers({"ml-1m": "knn", "ml-100k": "none"}))
    before = pf.selection_record(tuning, grid)
    # ML-1M's validation now prefers 'none' by a mile: the choice USED ON ML-1M (made on ML-100K) must not move
    for fold in tuning["by_fold"]["ml-1m"].values():
        for cell in fold.values():
            for t in cell["tried"]:
                t["rmse"] = 0.1 if t["config"]["estimator"] == "knn" else 5.0
    after = pf.selection_record(tuning, grid)
    assert after["sources"]["ml-100k"] == before["sources"]["ml-100k"]
    assert pf.transferred(after, "ml-1m", "noisy_gram", "user", 1.0) == pf.transferred(before, "ml-1m", "noisy_gram", "user", 1.0)
    # and ML-1M's test numbers: picking a mechanism for a target reads the source's validation only
    sel = {"sources": {"ml-100k": {"noisy_gram/user/1": {"validation_rmse": 0.95}, "dpals/user/1": {"validation_rmse": 0.97}}}}
    assert pf.pick_mechanism(sel, "ml-1m", "user", 1.0) == ("noisy_gram", 0.95)


def test_selection_is_the_lowest_mean_over_the_source_folds_ties_to_the_earlier_entry(tmp_path, monkeypatch):
    pf = _study()

    def rmse(cfg, fold, eps):  # ML-100K: fold 1 prefers knn by 0.05, fold 2 prefers none by 0.2 -> none on the mean
        if fold[0] != "val":
            return 0.5
        if fold[1] == "ml-1m":
            return 1.0  # an exact tie: the earlier entry (none)
        return {1: {"knn": 0.90, "none": 0.95}, 2: {"knn": 1.20, "none": 1.00}}[fold[2]][cfg["estimator"]]

    _, grid, tuning = _tuned(tmp_path, monkeypatch, pf, rmse)
    sel = pf.selection_record(tuning, grid)
    c = sel["sources"]["ml-100k"]["noisy_gram/user/10"]
    assert c["chosen"]["estimator"] == "none" and c["mean_validation_rmse"] == pytest.approx([0.975, 1.05])
    assert c["margin_to_next"] == pytest.approx(0.075) and c["folds"] == 2 and c["chosen_on"] == "ml-100k"
    assert sel["sources"]["ml-1m"]["noisy_gram/user/1"]["chosen"]["estimator"] == "none"


def test_the_frozen_grid_refuses_a_grid_changed_after_selection(tmp_path, monkeypatch):
    pf = _study()
    _, grid, tuning = _tuned(tmp_path, monkeypatch, pf, _prefers({"ml-1m": "knn", "ml-100k": "none"}))
    pf.write_selection(tuning, grid)
    assert pf.frozen_grid()["sha256"] == grid["sha256"]
    # a grid entry added in the script after the selection: every later stage refuses
    monkeypatch.setattr(pf, "GRID", {("noisy_gram", "user"): [NONE, KNN, {"estimator": "ease"}]})
    with pytest.raises(ConfigError, match="changed after the grid was frozen"):
        pf.frozen_grid()
    with pytest.raises(ConfigError, match="the grid is frozen"):
        pf.freeze_grid()
    # grid.json edited by hand
    monkeypatch.setattr(pf, "GRID", {("noisy_gram", "user"): [NONE, KNN]})
    rec = json.loads(pf.GRID_FILE.read_text())
    rec["cells"]["noisy_gram/user"][1]["k"] = 7
    pf.GRID_FILE.write_text(json.dumps(rec))
    with pytest.raises(ConfigError, match="edited after it was frozen"):
        pf.frozen_grid()
    # a selection made on another grid, or no longer matching tuning.json
    with pytest.raises(ConfigError, match="another grid"):
        pf.load_selection(tuning, {**grid, "sha256": "0" * 64})
    tuning["by_fold"]["ml-100k"]["1"]["noisy_gram/user/1"]["tried"][1]["rmse"] = 0.0
    tuning["by_fold"]["ml-100k"]["2"]["noisy_gram/user/1"]["tried"][1]["rmse"] = 0.0
    with pytest.raises(ConfigError, match="rerun --stage select"):
        pf.load_selection(tuning, grid)


# ---------------------------------------------------------------------------------------------- presets and provenance
def _selected(rel: str, source: str, eps: float) -> dict:
    sel = json.loads((ROOT / "docs" / "results" / "private_frontier" / "selection.json").read_text())
    return sel["sources"][source][f"noisy_gram/{rel}/{eps:g}"]["chosen"]


def test_pick_epsilon_is_the_nearest_validated_at_or_below_else_the_smallest():
    assert [pick_epsilon([1.0, 10.0], e) for e in (0.1, 1.0, 2.0, 9.9, 10.0, 20.0, float("inf"))] == [1, 1, 1, 1, 10, 10, 10]


@pytest.mark.parametrize("rel", ["rating", "user"])
@pytest.mark.parametrize(("data", "source"), [("ml-1m", "ml-100k"), ("ml-100k", "ml-1m"), ("synthetic", "ml-1m"), ("custom", "ml-1m")])
@pytest.mark.parametrize(("typed", "validated"), [(0.5, 1.0), (1.0, 1.0), (5.0, 1.0), (10.0, 10.0), (20.0, 10.0)])
def test_the_preset_trains_the_choice_for_the_typed_epsilon_made_on_other_people(rel, data, source, typed, validated):
    cfg = tiny_cfg(f"+experiment=private_{rel}", f"epsilon={typed}", f"data={data}")
    want = _selected(rel, source, validated)
    if want.get("item_features") is True:  # validated with the catalogue: the preset says auto (on where one is attached)
        want = {**want, "item_features": "auto"}
    model = OmegaConf.to_container(cfg.model, resolve=True)
    assert {k: model[k] for k in want} == want
    choice = preset_choice(cfg)
    assert (choice["chosen_on"], choice["epsilon"]) == (source, validated)
    assert choice["shares_people"] == ("unknown" if data == "custom" else False)


def test_a_command_line_value_wins_over_the_preset_and_the_report_names_it():
    cfg = tiny_cfg("+experiment=private_user", "epsilon=1", "data=ml-100k", "model.k=7")
    assert cfg.model.k == 7
    prov = hyperparameter_provenance(cfg)
    assert prov["user_values"] == ["k"] and "model.k" in prov["statement"]


def test_provenance_says_where_the_choice_was_made_and_whether_it_shares_people():
    prov = hyperparameter_provenance(tiny_cfg("+experiment=private_user", "epsilon=10", "data=ml-1m"))
    assert prov["chosen_on"] == "ml-100k" and prov["shares_people"] is False and prov["validated_epsilon"] == 10.0
    assert "ML-100K" in prov["statement"] and "end to end" in prov["statement"]
    custom = hyperparameter_provenance(tiny_cfg("+experiment=private_rating", "epsilon=1", "data=custom"))
    assert custom["shares_people"] == "unknown" and "unknown" in custom["statement"]
    plain = hyperparameter_provenance(tiny_cfg("model=noisy_gram", "epsilon=1"))
    assert plain["chosen_on"] == "not recorded" and plain["statement"].startswith("package defaults (chosen on not recorded")
    # a preset whose only source is the training data's own people says the selection is not counted
    cfg = tiny_cfg("+experiment=private_user", "epsilon=1", "data=ml-1m")
    cfg.preset.sources = ["ml-1m"]
    same = hyperparameter_provenance(cfg)
    assert same["shares_people"] is True and "NOT counted in epsilon" in same["statement"]


def test_the_written_presets_hold_one_choice_per_source_and_validated_epsilon(tmp_path, monkeypatch):
    pf = _study()
    monkeypatch.setattr(pf, "EXPERIMENTS", tmp_path)
    sel = json.loads((ROOT / "docs" / "results" / "private_frontier" / "selection.json").read_text())
    pf.write_experiments(sel)
    for rel in ("rating", "user"):
        text = (tmp_path / f"private_{rel}.yaml").read_text()
        assert text == (ROOT / "conf" / "experiment" / f"private_{rel}.yaml").read_text()  # the committed file is the script's
        assert text.startswith("# @package _global_") and "python train.py model=" not in text  # no long command lines
        body = OmegaConf.create(text)
        assert body.preset.grid_sha256 == sel["grid_sha256"] and list(body.preset.sources) == ["ml-1m", "ml-100k"]
        assert {(c.chosen_on, c.epsilon) for c in body.preset.choices} == {(s, e) for s in ("ml-1m", "ml-100k") for e in (1.0, 10.0)}


def test_a_presets_run_reports_where_its_hyperparameters_came_from(tmp_path):
    """The runner writes :func:`hyperparameter_provenance` into the run's privacy report (training/run.py)."""
    from dprec_torch.training.run import train

    cfg = tiny_cfg("+experiment=private_rating", "epsilon=1", "data=synthetic", "device=cpu", "compare_baselines=false",
                   "tensorboard=false", f"output_dir={tmp_path}")
    metrics = train(cfg)
    prov = metrics["privacy"]["hyperparameters"]
    assert prov["chosen_on"] == "ml-1m" and prov["shares_people"] is False and "private_rating" in prov["statement"]


@pytest.mark.parametrize(("data", "source", "shared"), [("ml-100k", "ml-1m", False), ("ml-1m", "ml-100k", False),
                                                       ("custom", None, "unknown")])
def test_tuned_defaults_say_whose_ratings_chose_them(data, source, shared):
    """The low-rank PNBM's defaults were chosen on the OTHER dataset's people for each of ML-100K and ML-1M (the size rule
    and the re-checked constants); custom data cannot say whose people it holds."""
    prov = hyperparameter_provenance(tiny_cfg("model=pnbm_lowrank", "mechanism=sgld", "epsilon=20", f"data={data}"))
    assert prov["shares_people"] == shared
    if source is not None:
        assert prov["chosen_on"] == source
