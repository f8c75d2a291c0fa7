"""The low-rank PNBM's size rule (dprec_torch/privacy/size_rule.py): knobs from public sizes only, its
noise formula, the means-only fallback, and the wiring (``auto`` in the default files resolved at set-up, recorded in
metrics.json, a command-line number wins)."""

from __future__ import annotations

import json
import math

import pytest
import torch

import dprec_torch
from dprec_torch.errors import ConfigError
from dprec_torch.privacy import size_rule as R
from dprec_torch.training.run import setup_training
from tests.helpers import tiny_cfg

BASE = ["data=synthetic", "device=cpu", "compare_baselines=false", "tensorboard=false"]


@pytest.mark.parametrize("mechanism", ["sgld", "gaussian", "dpsgd"])
def test_the_default_files_ask_the_rule_for_every_knob(mechanism):
    cfg = tiny_cfg(f"mechanism={mechanism}")
    for key in R.MECHANISM_KNOBS:
        assert cfg.mechanism[key] == "auto", key
    assert cfg.model.item_features == "auto"


def test_the_step_puts_the_stated_noise_on_u():
    # (1): nu = eta T C / (mu_U N); the step solved for nu = 0.1 gives back 0.1
    k = R.rule_knobs("sgld", 6040, 3706, 20.0, 1e-6, True)
    mu_u = R.gaussian_mu(20.0, 1e-6) * math.sqrt(1 - k.mean_fraction)
    assert k.sampling_ratio == 1.0
    assert k.noise_per_entry == pytest.approx(k.lr * k.epochs * k.clip_norm / (mu_u * 6040))
    assert k.noise_per_entry <= R.NU_STAR + 1e-12


def test_the_step_grows_with_n_and_epsilon_and_stops_learning_when_noise_wins():
    lrs = [R.rule_knobs("sgld", n, 3000, 20.0, 1e-6, True).lr for n in (2000, 4000)]
    assert lrs[0] <= lrs[1]
    eps = [R.rule_knobs("gaussian", 6040, 3000, e, 1e-6, True).lr for e in (1.0, 2.0)]
    assert eps[0] <= eps[1]
    small = R.rule_knobs("sgld", 300, 3000, 0.5, 1e-6, True)  # tiny N, small eps: the means get the budget
    assert not small.learns and small.mean_fraction == R.MEANS_ONLY_SHARE
    assert not R.rule_knobs("dpsgd", 943, 1682, 1.0, 0.0, True).learns  # the issue's `python train.py`


def test_the_rule_reads_public_sizes_only_and_records_where_it_was_fitted():
    cfg = tiny_cfg(*BASE, "mechanism=sgld", "epsilon=20", "data.preset=tiny")
    from dprec_torch.config import instantiate_node

    fold = instantiate_node(cfg.data).folds[0]
    resolved, rec = R.apply(cfg, fold.train)
    assert rec["inputs"]["n_users"] == int((fold.train.user_counts() > 0).sum())
    assert rec["inputs"]["n_items"] == fold.train.n_items
    assert set(rec["resolved_by_rule"]) == {f"mechanism.{k}" for k in R.MECHANISM_KNOBS}
    assert all(resolved.mechanism[k] != "auto" for k in R.MECHANISM_KNOBS)
    assert cfg.mechanism.lr == "auto"  # the caller's config is not changed
    assert "fitted_on" in rec


def test_a_number_on_the_command_line_wins_and_metrics_record_the_rule(tmp_path):
    dprec_torch.train([*BASE, "data.preset=tiny", "mechanism=sgld", "epsilon=20", "mechanism.lr=3", "noise_seed=1",
                       f"output_dir={tmp_path}"])
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    rule = metrics["privacy"]["size_rule"]
    assert "mechanism.lr" not in rule["resolved_by_rule"] and "mechanism.epochs" in rule["resolved_by_rule"]
    assert metrics["epochs"] == rule["knobs"]["epochs"]
    cfg = tiny_cfg(*BASE, "data.preset=tiny", "mechanism=sgld", "epsilon=20", "mechanism.lr=3")
    from dprec_torch.config import instantiate_node

    fold = instantiate_node(cfg.data).folds[0]
    setup = setup_training(cfg, fold, torch.device("cpu"))
    assert setup.rule is not None and setup.optimizer.step_size() == pytest.approx(3.0)


def test_auto_is_refused_where_the_rule_does_not_apply():
    cfg = tiny_cfg(*BASE, "mechanism=sgld", "epsilon=20", "model=mf")
    from dprec_torch.config import instantiate_node

    with open_dict_(cfg):
        cfg.mechanism.lr = "auto"
    with pytest.raises(ConfigError, match="size rule"):
        R.apply(cfg, instantiate_node(cfg.data).folds[0].train)


def open_dict_(cfg):
    from omegaconf import open_dict

    return open_dict(cfg)


@pytest.mark.parametrize("population,source", [("ml-100k", "ML-1M user subsamples"), ("ml-1m", "ML-100K u1.base")])
def test_where_the_rule_was_fitted_shares_no_people_with_the_data_it_serves(population, source):
    k = R.rule_knobs("sgld", 943, 1682, 20.0, 1e-6, True)
    rec = R.record(k, "sgld", 943, 1682, 20.0, 1e-6, True, population, ["mechanism.lr"])
    assert rec["fitted_on"].startswith(source) and rec["shares_people"] is False
    assert R.record(k, "sgld", 943, 1682, 20.0, 1e-6, True, None, [])["shares_people"] == "unknown"


def test_the_design_card_learns_and_the_issue_defaults_do_not_spend_on_noise():
    # python train.py mechanism=sgld epsilon=20 (ML-100K u1: 943 users): U moves
    card = R.rule_knobs("sgld", 943, 1682, 20.0, 1e-6, True)
    assert card.learns and card.epochs == 20 and card.lr > 1.0 and card.mean_fraction < 0.9
    # python train.py (dpsgd, eps = 1): the means take the budget
    plain = R.rule_knobs("dpsgd", 943, 1682, 1.0, 1e-6, True)
    assert not plain.learns and plain.mean_fraction == R.MEANS_ONLY_SHARE


@pytest.mark.parametrize(("overrides", "want"), [
    (("data=ml-100k", "mechanism=sgld"), 2.0), (("data=ml-100k", "mechanism=dpsgd"), 2.0),
    (("data=ml-1m", "mechanism=gaussian"), 1.0), (("data=ml-1m", "mechanism=sgld"), 1.0),
    (("data=ml-100k", "mechanism=none"), 1.0),  # a mechanism the rule does not cover: the earlier value
    (("data=synthetic", "mechanism=sgld"), 1.0), (("data=custom", "data.path=/x/ratings.dat", "mechanism=sgld"), 1.0),
])
def test_a_constant_chosen_per_population_is_the_rules_and_reaches_the_model(overrides, want):
    from dprec_torch.training.run import build_model
    from tests.helpers import tiny_fold

    cfg = tiny_cfg(*overrides)
    assert cfg.model.clamp_r == want  # ${size_rule:clamp_r}: POPULATION_CONSTANTS, fallback POPULATION_FALLBACK
    assert R.POPULATION_CONSTANTS["clamp_r"] == {"ml-100k": 2.0, "ml-1m": 1.0} and R.POPULATION_FALLBACK["clamp_r"] == 1.0
    assert build_model(cfg, tiny_fold()).clamp_r == want


def test_a_per_population_constant_given_on_the_command_line_is_the_users():
    from dprec_torch.privacy.provenance import hyperparameter_provenance

    prov = hyperparameter_provenance(tiny_cfg("data=ml-100k", "mechanism=sgld", "model.clamp_r=1"))
    assert prov["user_values"] == ["model.clamp_r"] and prov["shares_people"] == "unknown"
    assert "chosen by the user: not counted" in prov["statement"]


def test_the_design_cards_run_moves_u(tmp_path):
    """``python train.py mechanism=sgld epsilon=20`` on ML-100K u1 (synthetic data of ML-100K's size where the files are
    absent): U learns under the rule, so the test RMSE after the last epoch is below the first epoch's."""
    from tests.helpers import ml100k_available

    data = [] if ml100k_available() else ["data=synthetic", "data.preset=ml-100k"]
    m = dprec_torch.train(["mechanism=sgld", "epsilon=20", *data, "compare_baselines=false", "tensorboard=false",
                           "device=cpu", f"output_dir={tmp_path}"]).metrics
    history = next(iter(m["history"].values()))
    assert m["privacy"]["size_rule"]["knobs"]["learns"]
    assert history[-1]["test_rmse"] < history[0]["test_rmse"]
