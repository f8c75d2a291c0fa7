"""No rating-level epsilon after per-user preprocessing,
the runner reads the CONFIGURED relation, delta below 1/(privacy units), booleans are booleans."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig

from dprec_torch.cli import check_command_line
from dprec_torch.config import check_config
from dprec_torch.privacy.relations import check_relation_preprocessing, node_relation
from dprec_torch.errors import ConfigError
from tests.helpers import tiny_cfg, tiny_fold

ROOT = Path(__file__).resolve().parents[2]


def _cfg(*overrides: str) -> DictConfig:
    return tiny_cfg("data=synthetic", "device=cpu", *overrides)


# ------------------------------------------------------------------ refused: rating level + a per-user step
@pytest.mark.parametrize("overrides, step, fix", [
    (["mechanism=dpsgd_l1", "mechanism.relation=rating", "mechanism.max_user_ratings=10"],
     "mechanism.max_user_ratings=10", "mechanism.relation=user"),
    (["mechanism.relation=rating", "data.min_user_ratings=21"], "data.min_user_ratings=21", "data.min_user_ratings=0"),
    (["mechanism=dpsgd_l1", "mechanism.relation=rating", "data.max_user_ratings=200"], "data.max_user_ratings=200",
     "data.max_user_ratings=null"),
    (["model=mf", "mechanism=gaussian", "data.min_user_ratings=5"], "data.min_user_ratings=5", "mechanism.unit=user"),
    (["model=noisy_gram", "data.min_user_ratings=21"], "data.min_user_ratings=21", "model.relation=user"),
    (["model=dpals", "model.relation=rating", "data.max_user_ratings=50"], "data.max_user_ratings=50", "model.relation=user"),
    (["model=mcsherry", "data.min_user_ratings=3"], "data.min_user_ratings=3", "data.min_user_ratings=0"),
    (["data=synthetic-val", "model=noisy_gram", "data.dataset.min_user_ratings=21"], "data.dataset.min_user_ratings=21",
     "data.dataset.min_user_ratings=0"),
], ids=["dpsgd_l1 runner cap", "dpsgd min filter", "dpsgd_l1 data cap", "gaussian unit=rating", "noisy_gram",
        "dpals", "mcsherry", "validation split"])
def test_a_rating_level_epsilon_after_a_per_user_step_is_refused(overrides, step, fix):
    cfg = _cfg(*overrides)
    check_config(cfg)  # the keys and numbers are valid: the relation rule refuses it
    with pytest.raises(ConfigError) as err:
        check_relation_preprocessing(cfg)
    msg = str(err.value)
    assert "relation=rating" in msg and step in msg and fix in msg and "\n" not in msg


@pytest.mark.parametrize("overrides", [
    ["mechanism=dpsgd_l1", "mechanism.relation=rating", "mechanism.max_user_ratings=10", "epsilon=inf"],
    ["mechanism=dpsgd_l1", "mechanism.max_user_ratings=10"],  # user level: the cap is a per-user function
    ["data.min_user_ratings=21", "data.max_user_ratings=200"],
    ["mechanism=sgld", "data.min_user_ratings=21"],
    ["model=mf", "mechanism=gaussian", "mechanism.unit=user", "data.min_user_ratings=5"],
    ["model=noisy_gram", "model.relation=user", "data.min_user_ratings=21", "data.max_user_ratings=100"],
    ["model=mf", "mechanism=dpsgd_paper", "data.min_user_ratings=21"],  # DPSGD-MF: one rating's VALUE changes
    ["model=pnbm", "mechanism=dpsgd_paper", "data.min_user_ratings=21"],  # Alg. 1 as printed: no defended epsilon
    ["model=mf", "mechanism=none", "data.min_user_ratings=21"],
    ["model=noisy_gram", "data.min_user_ratings=1"],  # keeps every present user: no step
    ["model=cosine_implicit", "mechanism=laplace_output", "data.min_user_ratings=3"],  # Delta f = the output range
], ids=["non-private", "user cap", "user filter", "sgld", "gaussian unit=user", "noisy_gram user", "dpsgd_mf",
        "dpsgd_paper", "mechanism=none", "min 1", "laplace_output"])
def test_user_level_and_non_private_runs_keep_their_preprocessing(overrides):
    cfg = _cfg(*overrides)
    check_config(cfg)
    check_relation_preprocessing(cfg)


def test_the_cli_prints_one_line_and_exits_non_zero(tmp_path):
    args = ["mechanism=dpsgd_l1", "mechanism.relation=rating", "mechanism.max_user_ratings=10", "data=synthetic"]
    with pytest.raises(ConfigError, match="mechanism.max_user_ratings=10"):
        check_command_line("config", args)
    proc = subprocess.run([sys.executable, "train.py", *args, f"output_dir={tmp_path}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "relation=rating" in lines[0] and "mechanism.max_user_ratings=null" in lines[0]
    assert not (tmp_path / "metrics.json").exists()


# ------------------------------------------------------------------ the runner reads the configured relation
def test_mechanism_fold_caps_by_the_configured_relation_not_the_class_default():
    from dprec_torch.mechanisms.dpsgd import ClippedLaplaceDPSGD
    from dprec_torch.mechanisms.gaussian import GaussianDPSGD
    from dprec_torch.training.run import mechanism_fold

    fold = tiny_fold()
    most = int(fold.train.user_counts().max())
    # dpsgd_l1's class default is user; configured rating (non-private here, so it is allowed): no cap
    cfg = _cfg("mechanism=dpsgd_l1", "mechanism.relation=rating", "mechanism.max_user_ratings=2", "epsilon=inf")
    assert ClippedLaplaceDPSGD.relation == "user" and node_relation(cfg.mechanism) == "rating"
    assert len(mechanism_fold(cfg, fold).train) == len(fold.train)
    # Gaussian's class leaves the relation to mechanism.unit: unit=user is user level, so it is capped
    cfg = _cfg("model=mf", "mechanism=gaussian", "mechanism.unit=user", "+mechanism.max_user_ratings=2")
    assert GaussianDPSGD.relation is None and node_relation(cfg.mechanism) == "user"
    capped = mechanism_fold(cfg, fold).train
    assert most > 2 and int(capped.user_counts().max()) == 2


# ------------------------------------------------------------------ delta below 1 / (privacy units)
def test_delta_at_or_above_one_over_the_units_is_refused():
    from dprec_torch.training.run import check_fold_units, mechanism_fold

    fold = tiny_fold()
    n_ratings, n_users = len(fold.train), int((fold.train.user_counts() > 0).sum())
    cfg = _cfg("model=mf", "mechanism=gaussian", "delta=0.5")
    with pytest.raises(ConfigError, match=rf"mechanism.delta=0.5 is not below 1/{n_ratings} \(relation=rating") as err:
        mechanism_fold(cfg, fold)
    assert "\n" not in str(err.value)
    # the units follow the relation: ratings at rating level, users at user level
    delta = 2.0 / n_ratings
    assert delta < 1 / n_users
    with pytest.raises(ConfigError, match=rf"not below 1/{n_ratings} \(relation=rating: {n_ratings} ratings"):
        check_fold_units(_cfg("model=mf", "mechanism=gaussian", f"delta={delta}"), fold)
    check_fold_units(_cfg("model=mf", "mechanism=gaussian", "mechanism.unit=user", f"delta={delta}"), fold)
    with pytest.raises(ConfigError, match=rf"not below 1/{n_users} \(relation=user: {n_users} users"):
        check_fold_units(_cfg("model=mf", "mechanism=gaussian", "mechanism.unit=user", f"delta={1 / n_users}"), fold)
    # fitted predictors with a delta, and pure-epsilon or non-private runs
    with pytest.raises(ConfigError, match="model.delta=0.5"):
        check_fold_units(_cfg("model=noisy_gram", "delta=0.5"), fold)
    check_fold_units(_cfg("model=noisy_gram", "delta=0.5", "epsilon=inf"), fold)
    check_fold_units(_cfg("mechanism=dpsgd_l1", "delta=0.5"), fold)  # pure epsilon: delta is not in its claim


def test_delta_half_no_longer_trains_to_a_defended_epsilon(tmp_path):
    from dprec_torch.training.run import train

    cfg = _cfg("model=mf", "mechanism=gaussian", "delta=0.5", "mechanism.epochs=1", "tensorboard=false",
               "compare_baselines=false", f"output_dir={tmp_path}")
    with pytest.raises(ConfigError, match="delta=0.5 is not below"):
        train(cfg)
    assert not (tmp_path / "metrics.json").exists()


# ------------------------------------------------------------------ a boolean key takes a boolean
@pytest.mark.parametrize("overrides, bad, good", [
    (["mechanism=sgld", "model=pnbm"], "mechanism.prior_correction=maybe", "mechanism.prior_correction=false"),
    (["mechanism=sgld", "model=pnbm"], "mechanism.prior_correction=1", "mechanism.prior_correction=true"),
    (["model=pcc"], "model.positive_only=maybe", "model.positive_only=false"),
    ([], "resume=maybe", "resume=false"),
    ([], "tensorboard=yes", "tensorboard=false"),
])
def test_a_boolean_key_given_a_non_boolean_is_an_error(overrides, bad, good):
    with pytest.raises(ConfigError) as err:
        check_config(_cfg(*overrides, bad))
    assert str(err.value).startswith(f"{bad} is invalid: it must be true or false")
    with pytest.raises(ConfigError, match="must be true or false"):
        check_command_line("config", [*overrides, bad])
    check_config(_cfg(*overrides, good))


@pytest.mark.parametrize("model", ["noisy_gram", "pnbm_lowrank"])
def test_item_features_maybe_is_an_error_not_truthy(model):
    """item_features may also take a word (``auto``): a value that is neither is refused before any data is read."""
    from dprec_torch.config import instantiate_node

    cfg = _cfg(f"model={model}", "model.item_features=maybe")
    with pytest.raises(ConfigError, match="item_features"):
        check_config(cfg)
        instantiate_node(cfg.model)


def test_mechanism_fold_keeps_the_fold_when_nothing_applies():
    from dprec_torch.training.run import mechanism_fold

    fold = tiny_fold()
    out = mechanism_fold(_cfg(), fold)
    assert out is fold and torch.equal(out.train.values, fold.train.values)
