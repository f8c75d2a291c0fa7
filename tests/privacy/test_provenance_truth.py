"""Provenance that is true and the delta ceiling warning.

* a model/mechanism value the user set is "chosen by the user: not counted", never "end to end";
* custom data says the package cannot tell whose people it holds;
* every constant behind a default carries its source as a config value (``chosen_on``), read from the composed config;
* presets keep their provenance;
* delta > 1/(10 N) is warned about in one line; delta >= 1/N stays refused.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dprec_torch.config import check_config, instantiate_node
from dprec_torch.errors import ConfigError
from dprec_torch.privacy.provenance import NOT_RECORDED, chosen_on, hyperparameter_provenance, user_values
from dprec_torch.privacy.relations import check_privacy_units

from tests.helpers import CONF_DIR, tiny_cfg

CONF = Path(CONF_DIR)


# ----------------------------------------------------------------------------------------------- (a) default run
def test_the_default_ml100k_run_is_end_to_end_from_the_config_values():
    prov = hyperparameter_provenance(tiny_cfg())
    assert prov["chosen_on"] == "ml-1m" and prov["shares_people"] is False and prov["user_values"] == []
    assert "(end to end)" in prov["statement"] and "conf/tuned/dpsgd_pnbm_lowrank.yaml" in prov["statement"]


def test_the_source_is_read_from_the_composed_config_not_from_a_file_comment():
    cfg = tiny_cfg()
    cfg.mechanism.chosen_on = "ml-100k"  # the composed value decides, whatever the yaml's comments say
    prov = hyperparameter_provenance(cfg)
    assert prov["shares_people"] is True and "NOT counted in epsilon" in prov["statement"]


# ------------------------------------------------------------------------------------------------ (b) overrides
@pytest.mark.parametrize("override", ["mechanism.lr=3", "mechanism.epochs=7", "model.rank=4", "~mechanism.count_weight"])
def test_a_hyperparameter_override_is_chosen_by_the_user_and_not_counted(override):
    prov = hyperparameter_provenance(tiny_cfg(override))
    key = override.lstrip("~").split("=")[0]
    assert prov["user_values"] == [key]
    assert prov["shares_people"] == "unknown"
    assert f"{key}=" in prov["statement"] and "chosen by the user: not counted" in prov["statement"]
    assert "(end to end)" not in prov["statement"]


def test_an_override_on_the_training_peoples_data_stays_not_counted():
    cfg = tiny_cfg("data=ml-1m", "mechanism.lr=3")
    cfg.mechanism.chosen_on = "ml-1m"  # the other values chosen on the training people themselves
    prov = hyperparameter_provenance(cfg)
    assert prov["shares_people"] is True and "chosen by the user: not counted" in prov["statement"]


@pytest.mark.parametrize("overrides", [
    ("device=cpu", "data.fold=2", "noise_seed=5", "epsilon=3", "delta=1e-7", "seed=4", "tensorboard=false",
     "output_dir=/tmp/x", "compare_baselines=false"),
    ("mechanism=sgld", "mechanism.accountant=prv"), ("mechanism=gaussian", "mechanism.accountant=prv"),
])
def test_overrides_of_non_hyperparameters_keep_the_defaults_provenance(overrides):
    prov = hyperparameter_provenance(tiny_cfg(*overrides))
    assert prov["user_values"] == [] and "chosen by the user" not in prov["statement"]
    assert prov["shares_people"] is False and "(end to end)" in prov["statement"]


def test_a_pcc_k_filled_from_the_dataset_is_the_packages(tmp_path):
    cfg = tiny_cfg("model=pcc", "data=ml-1m")
    assert user_values(cfg) == {}
    cfg.model.k = 50
    assert user_values(cfg) == {"model.k": 50}


def test_a_hydra_command_line_override_counts_even_at_the_packages_value(monkeypatch):
    """In a Hydra job the command line itself says what the user typed (HydraConfig's overrides.task)."""
    from dprec_torch.privacy import provenance

    same = f"mechanism.lr={tiny_cfg().mechanism.lr}"  # the package's own value, whatever it is today
    cfg = tiny_cfg(same)
    assert user_values(cfg) == {}  # the same value as the package's: invisible without the command line
    task = ([same, "device=cpu", "data.fold=2"], {"mechanism": "dpsgd", "model": "pnbm_lowrank"})
    monkeypatch.setattr(provenance, "_hydra_task", lambda: task)
    assert list(user_values(cfg)) == ["mechanism.lr"]
    assert "chosen by the user: not counted" in hyperparameter_provenance(cfg)["statement"]
    # a stale Hydra state of another run (other choices) is not read
    monkeypatch.setattr(provenance, "_hydra_task", lambda: (task[0], {"mechanism": "sgld", "model": "mf"}))
    assert user_values(cfg) == {}


def test_a_run_reports_the_users_value(tmp_path):
    """train(cfg) from Python with a composed config: the privacy report names the override."""
    from dprec_torch.training.run import train

    cfg = tiny_cfg("data=synthetic", "data.preset=tiny", "mechanism=dpsgd", "mechanism.lr=3", "mechanism.epochs=1",
                   "device=cpu", "compare_baselines=false", "tensorboard=false", f"output_dir={tmp_path}")
    prov = train(cfg)["privacy"]["hyperparameters"]
    assert prov["user_values"] == ["mechanism.epochs", "mechanism.lr"]
    assert "mechanism.epochs=1, mechanism.lr=3 chosen by the user: not counted" in prov["statement"]


# ----------------------------------------------------------------------------------------------- (c) custom data
@pytest.mark.parametrize("model", ["pnbm_lowrank", "mf", "noisy_gram"])
def test_custom_data_says_it_cannot_tell_whose_people_it_holds(model):
    prov = hyperparameter_provenance(tiny_cfg("data=custom", "data.path=/data/ml-1m/ratings.dat", f"model={model}"))
    assert prov["shares_people"] == "unknown"
    assert "unknown to the package" in prov["statement"] and "end to end" not in prov["statement"]
    if model != "noisy_gram":
        assert "cannot tell whose people a custom file holds" in prov["statement"]
        assert "cannot claim the choice was made on other people" in prov["statement"]


# -------------------------------------------------------------------------------------------------- (d) presets
def test_a_preset_keeps_its_provenance_and_an_override_of_it_is_the_users():
    prov = hyperparameter_provenance(tiny_cfg("+experiment=private_user", "epsilon=10", "data=ml-1m"))
    assert prov["chosen_on"] == "ml-100k" and prov["shares_people"] is False and prov["user_values"] == []
    assert prov["statement"].startswith("preset private_user") and "(end to end)" in prov["statement"]
    own = hyperparameter_provenance(tiny_cfg("+experiment=private_user", "epsilon=10", "data=ml-1m", "model.support=100"))
    assert own["user_values"] == ["support"] and own["shares_people"] == "unknown"
    assert "model.support=100" in own["statement"] and "chosen by the user: not counted" in own["statement"]
    custom = hyperparameter_provenance(tiny_cfg("+experiment=private_rating", "epsilon=1", "data=custom"))
    assert custom["shares_people"] == "unknown" and "cannot tell whose people a custom file holds" in custom["statement"]


# ------------------------------------------------------------------------------------------- sources as values
def _model_node(path: Path):
    body = OmegaConf.load(path)
    return body.model if "model" in body and "_target_" not in body else body


@pytest.mark.parametrize("path", sorted((CONF / "tuned").glob("*.yaml")) + sorted((CONF / "model").glob("*.yaml"))
                         + sorted((CONF / "mechanism").glob("*.yaml")), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_tuned_model_and_mechanism_file_carries_its_source_as_a_value(path):
    node = _model_node(path) if path.parent.name == "model" else OmegaConf.load(path)
    assert "chosen_on" in node, f"{path} has no chosen_on value"
    assert all(s in ("ml-100k", "ml-1m", "data-independent", NOT_RECORDED) for s in chosen_on(node))
    assert not any(line.startswith("# chosen_on:") for line in path.read_text().splitlines())  # no comment to re-read


def test_the_default_runs_files_say_where_their_numbers_were_chosen():
    cfg = tiny_cfg()
    for node in (cfg.model, cfg.mechanism):  # per population a run trains on
        assert chosen_on(node, "ml-100k") == ["ml-1m"] and chosen_on(node, "ml-1m") == ["ml-100k"]
        assert chosen_on(node, None) == chosen_on(node) == ["ml-1m", "ml-100k"]  # custom data: every source
    for mech in ("dpsgd", "sgld", "gaussian"):
        node = tiny_cfg(f"mechanism={mech}").mechanism
        assert chosen_on(node, "ml-100k") == ["ml-1m"] and chosen_on(node, "ml-1m") == ["ml-100k"], mech
    assert chosen_on(tiny_cfg("mechanism=none").mechanism) == ["ml-1m"]  # the non-private run's numbers: not re-chosen


# ----------------------------------------------------------------------- every default run chosen on other people
#: the default runs (model=pnbm_lowrank, mechanism dpsgd | sgld | gaussian): the population a run trains on -> the one
#: its defaults were chosen on
SOURCE = {"ml-100k": "ml-1m", "ml-1m": "ml-100k"}
#: where each default came from: the size rule's knobs (``auto``; fitted per population: size_rule.FITTED_ON) and the
#: constants of the files (``chosen_on``; checked per population by pnbm_lowrank_size_rule.py constants)
RULE_KNOBS = ("sampling_ratio", "epochs", "lr", "clip_norm", "mean_fraction")
CONSTANTS = {"model": ("rank", "init_std", "clamp_r", "beta_p", "feature_reg"),
             "mechanism": ("mean_prior_std", "mean_popularity_alpha", "mean_popularity_share", "count_weight")}
EVIDENCE = CONF.parent / "docs" / "results" / "pnbm_lowrank" / "size_rule_constants.json"


@pytest.mark.parametrize("mech", ["dpsgd", "sgld", "gaussian"])
@pytest.mark.parametrize("data", ["ml-100k", "ml-1m"])
def test_every_default_run_shares_no_people_with_where_its_defaults_were_chosen(data, mech):
    from dprec_torch.privacy.provenance import DESCRIPTIONS

    prov = hyperparameter_provenance(tiny_cfg(f"data={data}", f"mechanism={mech}"))
    assert prov["shares_people"] is False and prov["chosen_on"] == SOURCE[data] and prov["user_values"] == []
    text = prov["statement"]
    assert f"chosen on {DESCRIPTIONS[SOURCE[data]]}" in text and "(end to end)" in text
    assert "size_rule_constants.json" in text
    if data == "ml-1m":  # truthful: the same values as the earlier choice on ML-1M, found again on ML-100K
        assert "equal the ones first chosen on ML-1M's users" in text and "found them again" in text


def test_each_default_constant_is_pinned_to_where_it_came_from():
    import json

    from dprec_torch.privacy import size_rule

    evidence = json.loads(EVIDENCE.read_text())
    for data, source in SOURCE.items():
        side = evidence["sides"][data]
        # fitted on other people's validation splits: ML-1M users for ML-100K runs, ML-100K u1.base for ML-1M runs
        assert all(s.startswith("ml1m-") for s in side["fitting_sets"]) if data == "ml-100k" \
            else side["fitting_sets"] == ["ml100k"]
        assert "no user of" in size_rule.FITTED_ON[data]
        for mech in ("dpsgd", "sgld", "gaussian"):
            cfg = tiny_cfg(f"data={data}", f"mechanism={mech}")
            assert all(cfg.mechanism[k] == "auto" for k in RULE_KNOBS), mech  # the size rule's
            for node, keys in CONSTANTS.items():
                assert chosen_on(cfg[node], data) == [source], (data, mech, node)
                for key in keys:
                    if key not in cfg[node]:
                        continue  # dpsgd's Laplace means have no popularity prior
                    verdict = side["verdict"][f"{node}.{key}"]
                    # the default is the value the check chose on the other people
                    assert float(cfg[node][key]) == verdict["chosen"], (data, mech, node, key)


@pytest.mark.parametrize(("mech", "model"), [("dpsgd", "pnbm_lowrank"), ("sgld", "pnbm_lowrank"), ("gaussian", "mf"),
                                             ("none", "pcc"), ("builtin", "noisy_gram"), ("dpsgd_paper", "pnbm")])
def test_the_source_key_passes_the_checks_and_never_reaches_a_constructor(mech, model):
    cfg = tiny_cfg(f"mechanism={mech}", f"model={model}")
    check_config(cfg)
    assert "chosen_on" in cfg.mechanism and "chosen_on" in cfg.model
    if mech != "builtin":
        instantiate_node(cfg.mechanism)  # a partial: the key would fail here if it were passed on
    # a misspelt key still fails
    bad = tiny_cfg(f"mechanism={mech}", f"model={model}", "+mechanism.chosen_onn=ml-1m")
    with pytest.raises(ConfigError, match="chosen_onn"):
        check_config(bad)


def test_a_model_is_built_without_the_source_key():
    from dprec_torch.training.run import build_model

    from tests.helpers import tiny_fold

    cfg = tiny_cfg("model=pnbm_lowrank", "device=cpu")
    model = build_model(cfg, tiny_fold())
    assert model is not None


# ------------------------------------------------------------------------------------------------ delta ceiling
def test_delta_above_a_tenth_of_one_over_n_is_warned_in_one_line(caplog):
    cfg = tiny_cfg("mechanism=gaussian", "model=mf", "mechanism.unit=rating", "delta=1e-5")
    with caplog.at_level(logging.WARNING, logger="dprec_torch.privacy.relations"):
        check_privacy_units(cfg, n_ratings=20_000, n_users=500)  # 1/(10 N) = 5e-6 < 1e-5 < 1/N = 5e-5
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert "1/(10 N)" in lines[0] and "set delta=5e-06 or lower" in lines[0] and "20000 ratings" in lines[0]
    assert "fails outright" in lines[0]


def test_delta_within_the_ceiling_is_silent_and_at_one_over_n_refused(caplog):
    cfg = tiny_cfg("mechanism=gaussian", "model=mf", "mechanism.unit=rating", "delta=1e-6")
    with caplog.at_level(logging.WARNING, logger="dprec_torch.privacy.relations"):
        check_privacy_units(cfg, n_ratings=20_000, n_users=500)  # 1e-6 < 5e-6
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    with pytest.raises(ConfigError, match="not below 1/20000"):
        check_privacy_units(tiny_cfg("mechanism=gaussian", "model=mf", "mechanism.unit=rating", "delta=5e-5"),
                            n_ratings=20_000, n_users=500)


def test_the_user_level_ceiling_counts_users(caplog):
    cfg = tiny_cfg("mechanism=sgld", "delta=1e-4")  # the clipped chain: user level, (epsilon, delta)
    with caplog.at_level(logging.WARNING, logger="dprec_torch.privacy.relations"):
        check_privacy_units(cfg, n_ratings=80_000, n_users=943)  # 1/(10 N) = 1.06e-4: 1e-4 is below
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    with caplog.at_level(logging.WARNING, logger="dprec_torch.privacy.relations"):
        check_privacy_units(tiny_cfg("mechanism=sgld", "delta=5e-4"), n_ratings=80_000, n_users=943)
    assert any("943 users" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
