"""The seam Protocols of dprec_torch/interfaces.py say what each real class is; every optional capability is a base-class
member with a neutral default (BaseModel, MechanismOptimizer) that the models override, and the sites read it directly."""

from __future__ import annotations

import inspect
import re
import typing
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from dprec_torch import interfaces as I
from dprec_torch.errors import ConfigError
from dprec_torch.mechanisms.exponential_topk import ExponentialTopK
from dprec_torch.mechanisms.gaussian import GaussianDPSGD
from dprec_torch.mechanisms.output_perturbation import LaplaceOutput
from dprec_torch.mechanisms.sgd import MapSGD
from dprec_torch.mechanisms.base import MechanismOptimizer
from dprec_torch.mechanisms.context import TrainingContext
from dprec_torch.mechanisms.dpsgd import is_pnbm
from dprec_torch.models.base import BaseModel
from dprec_torch.models.mf import MF
from dprec_torch.models.pnbm import PNBM
from dprec_torch.models.pnbm_lowrank import LowRankPNBM
from dprec_torch.models.pnbm_topk import PNBMTopK
from dprec_torch.predictors.knn import ItemKNN
from dprec_torch.predictors.slope_one import SlopeOne
from dprec_torch.training.run import training_mechanism
from tests.helpers import tiny_fold

ROOT = Path(__file__).resolve().parents[1]


def _overrides(model, name: str) -> bool:
    return getattr(type(model), name) is not getattr(BaseModel, name)


def test_models_are_trainable_and_override_the_base_model_defaults():
    pnbm, topk, mf = PNBM(12), PNBMTopK(12, sparse_k=3, support="random"), MF(5, 12)
    lowrank = LowRankPNBM(12)
    for m in (pnbm, topk, mf, lowrank):
        assert isinstance(m, I.TrainableModel) and isinstance(m, BaseModel)
    assert is_pnbm(pnbm) and not any(is_pnbm(m) for m in (topk, mf, lowrank))  # dense S: per-user clipping
    assert _overrides(pnbm, "project_") and _overrides(topk, "project_") and not _overrides(mf, "project_")
    assert _overrides(pnbm, "fused_step") and not any(_overrides(m, "fused_step") for m in (topk, mf, lowrank))
    assert _overrides(lowrank, "training_targets") and not _overrides(pnbm, "training_targets")
    assert _overrides(pnbm, "sgld_prior_precision") and _overrides(mf, "sgld_prior_precision")
    assert all(m.centres_on_item_means and m.reads_own_ratings for m in (pnbm, topk, lowrank))
    assert not mf.centres_on_item_means and not mf.reads_own_ratings
    assert mf.per_example_grad_norms is not None and lowrank.per_example_grad_norms is not None
    assert pnbm.per_example_grad_norms is None and topk.per_example_grad_norms is None
    assert mf.visit_penalty is not None and mf.batch_visits is not None and pnbm.visit_penalty is pnbm.batch_visits is None
    assert mf.clip_training_predictions and not pnbm.clip_training_predictions
    assert mf.gradient_reduction == lowrank.gradient_reduction == "mean" and pnbm.gradient_reduction == "sum"
    assert mf.dpsgd_perturb_residuals and not pnbm.dpsgd_perturb_residuals
    assert not mf.reads_history and pnbm.reads_history
    assert mf.fallback == "mean" and pnbm.fallback is None and topk.privacy_caveat is None
    assert all(hasattr(I, name) for name in I.__all__)


def test_the_base_model_defaults_are_neutral():
    """No projection, trained on the ratings, no fused step, no prior correction; the default needs nothing else."""
    m, values = BaseModel(), torch.tensor([1.0, 4.0])
    batch = SimpleNamespace(values=values)
    assert m.project_() is None and m.training_targets(batch) is values
    assert m.fused_step(batch, values, 1.0) is None and m.sgld_prior_precision(None, 1.0) == []
    assert m.gradient_reduction == "sum" and m.reads_history and m.fallback_ is None and m.privacy_caveat is None
    assert MechanismOptimizer.elementwise_residual_clip(None) is None  # no element-wise clamp declared


def test_predictors_and_mechanisms_are_what_the_protocols_say():
    knn, slope = ItemKNN(k=5), SlopeOne(T=1)
    assert isinstance(knn, I.FittedPredictor) and isinstance(knn, I.Predictor) and isinstance(knn, I.ReportsPrivacy)
    assert hasattr(slope, "output_sensitivity") and isinstance(slope, I.Scorer)  # what laplace_output asks
    assert not hasattr(knn, "output_sensitivity") and not isinstance(knn, I.Scorer)
    assert issubclass(LaplaceOutput, I.OutputMechanism) and issubclass(ExponentialTopK, I.OutputMechanism)
    assert not issubclass(GaussianDPSGD, I.OutputMechanism)
    fold = tiny_fold()
    model = PNBM(fold.train.n_items).attach(fold.train)
    ctx = TrainingContext(1, 1, len(fold.train), fold.train.n_users, fold.train.scale, model=model)
    assert isinstance(MapSGD(model.parameters(), ctx, lr=0.1), I.TrainingMechanism)


def test_mean_fallback_lives_in_interfaces_and_stays_importable_from_predictors():
    from dprec_torch.predictors.base import MeanFallback, Predictor

    assert MeanFallback is I.MeanFallback and Predictor is I.Predictor
    for path in ("models/pnbm.py", "models/pnbm_topk.py", "models/release.py"):
        imports = re.findall(r"^\s*(?:from|import) (dprec_torch\.\S+)", (ROOT / "dprec_torch" / path).read_text(), re.M)
        assert not [m for m in imports if m.startswith("dprec_torch.predictors")], path  # models import from below


def test_an_output_mechanism_on_a_trained_model_is_one_config_error_line():
    cfg = OmegaConf.create({"model": {"name": "pnbm"}, "mechanism": {
        "name": "laplace_output", "_target_": "dprec_torch.mechanisms.output_perturbation.LaplaceOutput"}})
    with pytest.raises(ConfigError, match="privatises fitted predictors") as err:
        training_mechanism(cfg)
    assert "\n" not in str(err.value)
    cfg.mechanism = {"name": "gaussian", "_target_": "dprec_torch.mechanisms.gaussian.GaussianDPSGD"}
    assert training_mechanism(cfg) is GaussianDPSGD


PROBE_FREE = ["mechanisms/dpsgd_paper.py", "mechanisms/gaussian.py", "mechanisms/sgld.py", "training/run.py",
              "training/trainer.py", "training/evaluate.py", "mechanisms/dpsgd.py", "mechanisms/dpsgd_mf.py",
              "mechanisms/base.py", "mechanisms/context.py", "mechanisms/sgd.py", "mechanisms/none.py",
              "mechanisms/builtin.py", "predictors/d2p.py", "predictors/mcsherry.py"]


#: the output mechanisms take any predictor or scorer (no shared base to hold a default): they ask these members
DUCK_TYPED = {"mechanisms/output_perturbation.py": {"output_sensitivity", "raw_predict", "scale", "score_range",
                                                     "sensitivity_report"},
              "mechanisms/exponential_topk.py": {"score_range"}}


@pytest.mark.parametrize("path", PROBE_FREE + list(DUCK_TYPED))
def test_no_hasattr_probes_at_the_converted_sites(path):
    text = (ROOT / "dprec_torch" / path).read_text()
    probes = re.findall(r"\b(?:hasattr|getattr)\(.*", text)
    asked = re.findall(r"\bhasattr\([\w.]+, \"(\w+)\"\)", text)
    assert len(asked) == len(probes) and set(asked) <= DUCK_TYPED.get(path, set()), (
        f"{path} probes with {probes}: read a base-class default (BaseModel, MechanismOptimizer) or a seam Protocol")


def test_the_seams_are_seen_statically_on_every_python():
    """Python >= 3.12 checks runtime protocols with ``inspect.getattr_static``, blind to an nn.Module's parameters and
    buffers (the GPU image once failed every PNBM that way). The seams declare methods and plain attributes only, so
    every real model, predictor and mechanism has each member statically: the stock check agrees with ``hasattr``."""
    fold = tiny_fold()
    pnbm = PNBM(fold.train.n_items).attach(fold.train)
    ctx = TrainingContext(1, 1, len(fold.train), fold.train.n_users, fold.train.scale, model=pnbm)
    cases = {I.TrainableModel: [pnbm, PNBMTopK(12, sparse_k=3, support="random"), MF(3, 4), LowRankPNBM(4)],
             I.FittedPredictor: [ItemKNN(k=5), SlopeOne(T=1)], I.Scorer: [SlopeOne(T=1)],
             I.TrainingMechanism: [MapSGD(pnbm.parameters(), ctx, lr=0.1)]}
    for proto, objs in cases.items():
        members = getattr(proto, "__protocol_attrs__", None) or typing._get_protocol_attrs(proto)
        for obj in objs:
            assert isinstance(obj, proto)
            for name in members:
                inspect.getattr_static(obj, name)  # AttributeError where Python >= 3.12 would fail the check


class _ProtocolOnly(torch.nn.Module):
    """Every TrainableModel member, but no BaseModel: the runner refuses it at set-up, in one line."""

    task, name = "rating", "protocol-only"
    attach = restore = batch_predict = surrogate_loss = gradient_entry_bound = predict = lambda self, *args: None


def test_the_runner_refuses_a_trained_model_without_the_base_defaults():
    from dprec_torch.training.run import build_model

    cfg = OmegaConf.create({"model": {"name": "toy", "_target_": f"{__name__}._ProtocolOnly"}})
    assert isinstance(_ProtocolOnly(), I.TrainableModel)
    with pytest.raises(ConfigError, match="model=toy must subclass dprec_torch.models.base.BaseModel"):
        build_model(cfg, tiny_fold())
