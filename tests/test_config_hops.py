"""One visible hop from a config key to its class (issue 16, "Interfaces"; STYLE.md "A key names its class").

``mechanism=X`` -> ``conf/mechanism/X.yaml`` -> ``_target_`` -> one file. A ``conf/tuned/<mechanism>_<model>.yaml``
tunes numbers; where a model needs another mechanism class (PNBM's Gaussian form, MF's DPSGD-MF) the tuned file
names no class: it points at that mechanism's own yaml (``defaults: [/mechanism/<X>@_here_]``) and keeps the run's
label, so ``mechanism=gaussian model=pnbm`` is exactly ``mechanism=gaussian_pnbm model=pnbm`` but for the name.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from dprec_torch.config import check_config
from dprec_torch.errors import ConfigError
from dprec_torch.training.run import setup_training
from tests.helpers import CONF_DIR


def composed(*overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_no_tuned_file_names_a_class():
    for path in sorted(Path(CONF_DIR, "tuned").glob("*.yaml")):
        raw = yaml.safe_load(path.read_text()) or {}
        assert "_target_" not in raw, f"{path.name} swaps the class: give it its own conf/mechanism/<name>.yaml"
        for entry in raw.get("defaults", []):
            assert isinstance(entry, str) and entry.startswith("/mechanism/") and entry.endswith("@_here_") \
                or entry == "_self_", f"{path.name}: a tuned file may only point at one conf/mechanism/ file"


@pytest.mark.parametrize("via,own,model,target", [
    ("gaussian", "gaussian_pnbm", "pnbm", "dprec_torch.mechanisms.gaussian_pnbm.GaussianPNBM"),
    ("dpsgd_paper", "dpsgd_mf", "mf", "dprec_torch.mechanisms.dpsgd_mf.DPSGDMF"),
])
def test_the_tuned_hop_composes_the_mechanism_file_exactly(via, own, model, target):
    hop = composed(f"mechanism={via}", f"model={model}")
    direct = composed(f"mechanism={own}", f"model={model}")
    assert hop.mechanism._target_ == target == direct.mechanism._target_
    assert Path(CONF_DIR, "mechanism", f"{own}.yaml").exists()
    assert hop.mechanism.name == via and direct.mechanism.name == own  # the run's label is kept
    a, b = OmegaConf.to_container(hop), OmegaConf.to_container(direct)
    a["mechanism"].pop("name"), b["mechanism"].pop("name")
    assert a == b
    assert list(hop.mechanism.keys()) == list(direct.mechanism.keys())


def test_the_split_classes_refuse_the_other_model():
    for mechanism, model in (("dpsgd_mf", "pnbm"), ("gaussian_pnbm", "mf")):
        cfg = composed("data=synthetic", "device=cpu", f"mechanism={mechanism}", f"model={model}", "epsilon=1")
        from dprec_torch.data.synthetic import load_synthetic

        fold = load_synthetic(preset="tiny", fold=1, seed=3).folds[0]
        with pytest.raises(ConfigError) as err:
            setup_training(cfg, fold, torch.device("cpu"))
        assert "\n" not in str(err.value)


def test_a_retired_key_names_its_replacement_in_one_line():
    cfg = composed("mechanism=dpsgd_paper", "model=mf", "+mechanism.perturb_residuals=true")
    with pytest.raises(ConfigError, match=r"mechanism\.perturb_residuals is no longer a key: .*mechanism=dpsgd_mf") as err:
        check_config(cfg)
    assert "\n" not in str(err.value)


def test_relation_is_the_neighbouring_relation_and_unit_the_sampling_unit():
    """dpsgd_l1 on MF at relation=rating, unit=rating: the instance's relation is the configured (defended)
    relation, and the report states it; the class value is only the default (user)."""
    from dprec_torch.data.synthetic import load_synthetic
    from dprec_torch.mechanisms.dpsgd_l1 import ClippedLaplaceDPSGD

    cfg = composed("data=synthetic", "device=cpu", "mechanism=dpsgd_l1", "model=mf", "epsilon=2",
                   "mechanism.relation=rating", "mechanism.unit=rating")
    fold = load_synthetic(preset="tiny", fold=1, seed=3).folds[0]
    opt = setup_training(cfg, fold, torch.device("cpu")).optimizer
    assert isinstance(opt, ClippedLaplaceDPSGD) and ClippedLaplaceDPSGD.relation == "user"
    assert opt.relation == opt.defended_relation == "rating" and opt.unit == "rating"
    assert str(opt.privacy_report()["relation"]).startswith("rating")
