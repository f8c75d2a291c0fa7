"""One visible hop from a config key to its class.

The rule, for every ``conf/mechanism/X.yaml``: ``mechanism=X`` composes ONE class whatever the model, and that class
lives in ``dprec_torch/mechanisms/X.py``, or ``X.yaml`` names it itself (one ``_target_`` away, not inherited through a
defaults chain: the aliases ``dpsgd_l1`` and ``sgld_paper``, and ``laplace_output`` in ``output_perturbation.py``). A
``conf/tuned/<mechanism>_<model>.yaml`` sets values only: no ``_target_``, no defaults list. Where one key trains some
models by another class (``gaussian`` + PNBM: ``GaussianPNBM``; ``sgld`` + the low-rank PNBM: ``ClippedSGLD``;
``dpsgd_paper`` + MF: DPSGD-MF), one table says so (``dprec_torch/forms.py``, ``FORMS``), and the run is the one the
form's own key gives, but for its label. ``none`` and ``builtin`` name classes too: what they do to a fitted predictor is asked of the class, never of the
key's name.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml
from hydra.utils import get_class
from omegaconf import OmegaConf

from dprec_torch.config import check_config
from dprec_torch.errors import ConfigError
from dprec_torch.privacy.relations import form_target, node_relation
from dprec_torch.training.checkpoint import upgrade_recorded
from dprec_torch.training.run import setup_training, training_mechanism, wrapped_by_mechanism
from tests.helpers import CONF_DIR, tiny_cfg

MECHANISMS = sorted(p.stem for p in Path(CONF_DIR, "mechanism").glob("*.yaml"))
MODELS = sorted(p.stem for p in Path(CONF_DIR, "model").glob("*.yaml"))


def raw(group: str, name: str) -> dict:
    return yaml.safe_load(Path(CONF_DIR, group, f"{name}.yaml").read_text()) or {}


def tiny_fold():
    from dprec_torch.data.synthetic import load_synthetic

    return load_synthetic(preset="tiny", fold=1, seed=3).folds[0]


@pytest.mark.parametrize("key", MECHANISMS)
def test_a_mechanism_key_is_one_target_from_its_class(key):
    """``mechanism=X`` with every model: one class, in ``mechanisms/X.py`` or named by ``X.yaml`` itself."""
    targets = {model: tiny_cfg(f"mechanism={key}", f"model={model}").mechanism.get("_target_") for model in MODELS}
    assert len(set(targets.values())) == 1, f"mechanism={key}: the class changes with the model: {targets}"
    target = targets[MODELS[0]]
    assert target, f"conf/mechanism/{key}.yaml names no class: give it a _target_"
    node = raw("mechanism", key)
    in_own_file = target.rpartition(".")[0] == f"dprec_torch.mechanisms.{key}"
    named_here = node.get("_target_") == target and "defaults" not in node
    assert in_own_file or named_here, (f"mechanism={key} composes {target}: move the class to dprec_torch/mechanisms/{key}.py "
                                       f"or name it in conf/mechanism/{key}.yaml itself (no defaults chain)")
    assert isinstance(get_class(target), type)


def test_no_tuned_file_sets_a_class_or_a_defaults_list():
    paths = sorted(Path(CONF_DIR, "tuned").glob("*.yaml"))
    assert paths
    for path in paths:
        node = yaml.safe_load(path.read_text()) or {}
        assert "_target_" not in node, f"{path.name} swaps the class: name the class that trains a model in dprec_torch/forms.py FORMS"
        assert "defaults" not in node, f"{path.name} pulls in another file: a tuned file sets plain values only"


def test_the_option_list_of_config_yaml_names_every_mechanism():
    line = next(x for x in Path(CONF_DIR, "config.yaml").read_text().splitlines() if x.strip().startswith("- mechanism:"))
    named = set(re.findall(r"[a-z][a-z0-9_]*", line.split("#", 1)[1]))
    assert not set(MECHANISMS) - named, f"conf/config.yaml's mechanism options miss {sorted(set(MECHANISMS) - named)}"


FORMS = [  # (key, the key that names the form itself, model, the form's class)
    ("gaussian", "gaussian_pnbm", "pnbm", "dprec_torch.mechanisms.gaussian.GaussianPNBM"),
    ("dpsgd_paper", "dpsgd_mf", "mf", "dprec_torch.mechanisms.dpsgd_mf.DPSGDMF"),
]


@pytest.mark.parametrize("via,own,model,form", FORMS)
def test_a_model_form_is_the_run_its_own_key_gives(via, own, model, form):
    """``mechanism=gaussian model=pnbm`` builds GaussianPNBM from the same numbers as ``mechanism=gaussian_pnbm``
    (``dpsgd_paper`` + MF: DPSGD-MF as ``mechanism=dpsgd_mf``): the same class, arguments, release and report."""
    common = ("data=synthetic", "device=cpu", f"model={model}", "epsilon=1", "noise_seed=0")
    hop, direct = tiny_cfg(f"mechanism={via}", *common), tiny_cfg(f"mechanism={own}", *common)
    check_config(hop)
    a, b = OmegaConf.to_container(hop.mechanism), OmegaConf.to_container(direct.mechanism)
    assert a.pop("name") == via and b.pop("name") == own  # the run's label is kept (results tables, ledger)
    assert a.pop("_target_") == raw("mechanism", via)["_target_"] and b.pop("_target_") == form
    assert a == b and list(a) == list(b)
    x, y = setup_training(hop, tiny_fold(), torch.device("cpu")), setup_training(direct, tiny_fold(), torch.device("cpu"))
    assert type(x.optimizer) is type(y.optimizer) and f"{type(x.optimizer).__module__}.{type(x.optimizer).__name__}" == form
    assert x.optimizer.privacy_report() == y.optimizer.privacy_report()
    tensors = [dict([*s.model.named_parameters(), *s.model.named_buffers()]) for s in (x, y)]
    assert tensors[0].keys() == tensors[1].keys() and tensors[0]
    for name, p in tensors[0].items():
        assert torch.equal(p, tensors[1][name]), name  # the same prepare(): the same DP item means and start, draw for draw


def test_the_table_names_the_class_of_each_key_and_family():
    """One table, (the key's class, the model family) -> the class that trains it; every other pair: the key's class."""
    from dprec_torch import forms
    from dprec_torch.mechanisms.base import MechanismOptimizer
    from dprec_torch.models.mf import MF
    from dprec_torch.models.pnbm import PNBM
    from dprec_torch.models.pnbm_lowrank import LowRankPNBM

    m = "dprec_torch.mechanisms."
    assert forms.FORMS == {
        (m + "gaussian.GaussianDPSGD", "pnbm"): m + "gaussian.GaussianPNBM",
        (m + "gaussian.GaussianDPSGD", "pnbm_lowrank"): m + "gaussian.GaussianPNBM",
        (m + "sgld.ScaledPosteriorSGLD", "pnbm_lowrank"): m + "clipped_sgld.ClippedSGLD",
        (m + "dpsgd_paper.DPSGDLaplace", "mf"): m + "dpsgd_mf.DPSGDMF",
    }
    for (key, family), form in forms.FORMS.items():
        assert issubclass(get_class(key), MechanismOptimizer) and issubclass(get_class(form), MechanismOptimizer)
        assert family in forms.MODEL_FAMILIES.values()
        model = next(get_class(p) for p, f in forms.MODEL_FAMILIES.items() if f == family)
        assert forms.mechanism_class(get_class(key), model) is get_class(form)  # a model class ...
        assert forms.form_path(key, f"{model.__module__}.{model.__qualname__}") == form  # ... or its dotted path
    assert forms.mechanism_class(get_class(m + "sgld.ScaledPosteriorSGLD"), PNBM) is get_class(m + "sgld.ScaledPosteriorSGLD")
    assert forms.mechanism_class(get_class(m + "gaussian.GaussianDPSGD"), MF) is get_class(m + "gaussian.GaussianDPSGD")
    assert forms.form_path(m + "gaussian.GaussianDPSGD", None) == m + "gaussian.GaussianDPSGD"
    assert forms.form_path(m + "sgld.ScaledPosteriorSGLD", LowRankPNBM(4)) == m + "clipped_sgld.ClippedSGLD"  # an instance
    # the documented alias model=pnbm model.similarity=lowrank is the low-rank family
    cfg = tiny_cfg("mechanism=sgld", "model=pnbm", "model.similarity=lowrank")
    assert form_target(cfg.mechanism, cfg.model) == m + "clipped_sgld.ClippedSGLD"


def test_a_form_reads_the_typed_delta_even_where_its_key_file_has_none():
    """sgld.yaml (the posterior chain's keys) has no delta; the clipped chain reached by the alias must still be
    calibrated at the typed top-level delta, never at its own default."""
    from dprec_torch.config import form_node

    cfg = tiny_cfg("mechanism=sgld", "model=pnbm", "model.similarity=lowrank", "delta=1e-8")
    assert "delta" not in cfg.mechanism
    assert form_node(cfg.mechanism, cfg.model).delta == 1e-8


def test_each_form_is_decided_by_the_bound_model():
    from dprec_torch.mechanisms.clipped_sgld import ClippedSGLD
    from dprec_torch.mechanisms.dpsgd_mf import DPSGDMF
    from dprec_torch.mechanisms.dpsgd_paper import DPSGDLaplace
    from dprec_torch.mechanisms.gaussian import GaussianDPSGD
    from dprec_torch.mechanisms.gaussian import GaussianPNBM
    from dprec_torch.mechanisms.sgld import ScaledPosteriorSGLD

    fold = tiny_fold()
    for mechanism, model, cls in (("gaussian", "pnbm", GaussianPNBM), ("gaussian", "mf", GaussianDPSGD),
                                  ("gaussian", "pnbm_lowrank", GaussianPNBM), ("dpsgd_paper", "mf", DPSGDMF),
                                  ("dpsgd_paper", "pnbm", DPSGDLaplace), ("sgld", "pnbm_lowrank", ClippedSGLD),
                                  ("sgld", "pnbm", ScaledPosteriorSGLD)):
        cfg = tiny_cfg("data=synthetic", "device=cpu", f"mechanism={mechanism}", f"model={model}", "epsilon=1")
        check_config(cfg)
        opt = setup_training(cfg, fold, torch.device("cpu")).optimizer
        assert type(opt) is cls, (mechanism, model, type(opt))
        # the config check resolves the same form from the model's class, before any model exists
        assert form_target(cfg.mechanism, cfg.model) == f"{cls.__module__}.{cls.__name__}"
        if (mechanism, model) == ("gaussian", "pnbm_lowrank"):
            assert opt.lowrank
    # the relation the config check reads is the form's (DPSGD-MF: one rating's value; Alg. 1: none defended)
    assert node_relation(tiny_cfg("mechanism=dpsgd_paper", "model=mf").mechanism, tiny_cfg("model=mf").model) == "rating_value"
    cfg = tiny_cfg("mechanism=dpsgd_paper", "model=pnbm")
    assert node_relation(cfg.mechanism, cfg.model) is None
    cfg = tiny_cfg("mechanism=gaussian", "model=pnbm")
    assert node_relation(cfg.mechanism, cfg.model) == "user"


@pytest.mark.parametrize("overrides,match", [
    (("mechanism=gaussian", "model=mf", "+mechanism.mean_fraction=0.5"), r"mechanism\.mean_fraction is not a parameter of GaussianDPSGD"),
    (("mechanism=dpsgd_paper", "model=pnbm", "+mechanism.e_max=3"), r"mechanism\.e_max is not a parameter of DPSGDLaplace"),
])
def test_a_form_key_on_the_other_model_is_one_line(overrides, match):
    """A form's own key on a model the key's class trains is refused by the config check, before any data is read."""
    cfg = tiny_cfg("data=synthetic", "device=cpu", "epsilon=1", *overrides)
    with pytest.raises(ConfigError, match=match) as err:
        check_config(cfg)
    assert "\n" not in str(err.value)


def test_a_key_the_form_cannot_take_is_one_line():
    cfg = tiny_cfg("data=synthetic", "device=cpu", "epsilon=1", "mechanism=gaussian", "model=pnbm",
                   "mechanism.noise_multiplier=1.0")
    check_config(cfg)
    with pytest.raises(ConfigError, match=r"noise_multiplier=1\.0 is not supported with PNBM") as err:
        setup_training(cfg, tiny_fold(), torch.device("cpu"))
    assert "\n" not in str(err.value)


def test_the_split_classes_refuse_the_other_model():
    for mechanism, model in (("dpsgd_mf", "pnbm"), ("gaussian_pnbm", "mf")):
        cfg = tiny_cfg("data=synthetic", "device=cpu", f"mechanism={mechanism}", f"model={model}", "epsilon=1")
        with pytest.raises(ConfigError) as err:
            setup_training(cfg, tiny_fold(), torch.device("cpu"))
        assert "\n" not in str(err.value)


def test_none_and_builtin_leave_a_fitted_predictor_as_fitted_by_their_class():
    for overrides, wraps in ((("model=pcc",), False), (("model=noisy_gram",), False), (("model=slope_one",), False),
                             (("model=slope_one", "mechanism=laplace_output"), True),
                             (("model=cosine_implicit", "mechanism=exponential_topk"), True)):
        assert wrapped_by_mechanism(tiny_cfg(*overrides)) is wraps, overrides
    assert tiny_cfg("model=pncf").mechanism._target_ == "dprec_torch.mechanisms.builtin.BuiltIn"
    # the class decides, not the label
    cfg = tiny_cfg("model=slope_one", "mechanism=laplace_output")
    cfg.mechanism.name = "none"
    assert wrapped_by_mechanism(cfg)
    cfg = tiny_cfg("model=pcc")
    cfg.mechanism.name = "whatever"
    assert not wrapped_by_mechanism(cfg)
    # the wrong side, one line each naming the fix
    with pytest.raises(ConfigError, match="use mechanism=none or an output mechanism") as err:
        wrapped_by_mechanism(tiny_cfg("model=slope_one", "mechanism=dpsgd"))
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"fitted predictor's own mechanism.*choose mechanism=none") as err:
        training_mechanism(tiny_cfg("model=pnbm", "mechanism=builtin"))
    assert "\n" not in str(err.value)


def test_a_run_recorded_before_the_renames_still_resolves():
    for old, new in (("dprec_torch.mechanisms.dpsgd_l1.ClippedLaplaceDPSGD", "dprec_torch.mechanisms.dpsgd.ClippedLaplaceDPSGD"),
                     ("dprec_torch.mechanisms.dpsgd.DPSGDLaplace", "dprec_torch.mechanisms.dpsgd_paper.DPSGDLaplace"),
                     ("dprec_torch.mechanisms.sgd.MapSGD", "dprec_torch.mechanisms.none.NoMechanism"),
                     ("dprec_torch.mechanisms.gaussian_pnbm.GaussianPNBM", "dprec_torch.mechanisms.gaussian.GaussianPNBM"),
                     ("dprec_torch.mechanisms.dpsgd_mf.DPSGDMF", "dprec_torch.mechanisms.dpsgd_mf.DPSGDMF")):
        cfg = upgrade_recorded(OmegaConf.create({"mechanism": {"_target_": old, "name": "x"}}))
        assert cfg.mechanism._target_ == new and isinstance(get_class(new), type)
    cfg = upgrade_recorded(OmegaConf.create({"model": {"name": "pncf"}, "mechanism": {"name": "builtin"}}))
    assert cfg.mechanism._target_ == "dprec_torch.mechanisms.builtin.BuiltIn" and not wrapped_by_mechanism(cfg)


def test_a_retired_key_names_its_replacement_in_one_line():
    cfg = tiny_cfg("mechanism=dpsgd_paper", "model=mf", "+mechanism.perturb_residuals=true")
    with pytest.raises(ConfigError, match=r"mechanism\.perturb_residuals is no longer a key: .*mechanism=dpsgd_mf") as err:
        check_config(cfg)
    assert "\n" not in str(err.value)


def test_relation_is_the_neighbouring_relation_and_unit_the_sampling_unit():
    """dpsgd_l1 on MF at relation=rating, unit=rating: the instance's relation is the configured (defended)
    relation, and the report states it; the class value is only the default (user)."""
    from dprec_torch.mechanisms.dpsgd import ClippedLaplaceDPSGD

    cfg = tiny_cfg("data=synthetic", "device=cpu", "mechanism=dpsgd_l1", "model=mf", "epsilon=2",
                   "mechanism.relation=rating", "mechanism.unit=rating")
    opt = setup_training(cfg, tiny_fold(), torch.device("cpu")).optimizer
    assert isinstance(opt, ClippedLaplaceDPSGD) and ClippedLaplaceDPSGD.relation == "user"
    assert opt.relation == opt.defended_relation == "rating" and opt.unit == "rating"
    assert str(opt.privacy_report()["relation"]).startswith("rating")
