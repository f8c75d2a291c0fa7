"""The Protocols of dprec_torch/interfaces.py say what each real class is, and the probe sites use them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dprec_torch import interfaces as I
from dprec_torch.errors import ConfigError
from dprec_torch.mechanisms.exponential_topk import ExponentialTopK
from dprec_torch.mechanisms.gaussian import GaussianDPSGD
from dprec_torch.mechanisms.output_perturbation import LaplaceOutput
from dprec_torch.mechanisms.sgd import MapSGD
from dprec_torch.mechanisms.context import TrainingContext
from dprec_torch.models.mf import MF
from dprec_torch.models.pnbm import PNBM
from dprec_torch.models.pnbm_topk import PNBMTopK
from dprec_torch.predictors.knn import ItemKNN
from dprec_torch.predictors.slope_one import SlopeOne
from dprec_torch.training.run import training_mechanism
from tests.helpers import tiny_fold

ROOT = Path(__file__).resolve().parents[1]


def test_models_are_what_the_protocols_say():
    pnbm, topk, mf = PNBM(12), PNBMTopK(12, sparse_k=3, support="random"), MF(5, 12)
    for m in (pnbm, topk, mf):
        assert isinstance(m, I.TrainableModel)
    assert isinstance(pnbm, I.ItemSimilarityModel) and not isinstance(topk, I.ItemSimilarityModel)
    assert isinstance(pnbm, I.SupportsProjection) and isinstance(topk, I.SupportsProjection)
    assert isinstance(pnbm, I.HasItemMeans) and not isinstance(mf, I.HasItemMeans)
    assert isinstance(mf, I.FactorModel) and not isinstance(pnbm, I.FactorModel)
    assert isinstance(mf, I.SupportsPerExampleNorms) and not isinstance(pnbm, I.SupportsPerExampleNorms)
    assert isinstance(mf, I.ClipsTrainingPredictions) and not isinstance(mf, I.SupportsProjection)
    assert isinstance(pnbm, I.SupportsPriorPrecision)
    assert isinstance(mf, I.DeclaresGradientReduction) and isinstance(mf, I.PerturbsResiduals)
    assert not isinstance(pnbm, I.DeclaresGradientReduction)  # PNBM: the default "sum"
    assert all(hasattr(I, name) for name in I.__all__)


def test_predictors_and_mechanisms_are_what_the_protocols_say():
    knn, slope = ItemKNN(k=5), SlopeOne(T=1)
    assert isinstance(knn, I.FittedPredictor) and isinstance(knn, I.Predictor) and isinstance(knn, I.ReportsPrivacy)
    assert isinstance(slope, I.HasOutputSensitivity) and isinstance(slope, I.Scorer)
    assert not isinstance(knn, I.HasOutputSensitivity) and not isinstance(knn, I.Scorer)
    assert issubclass(LaplaceOutput, I.OutputMechanism) and issubclass(ExponentialTopK, I.OutputMechanism)
    assert not issubclass(GaussianDPSGD, I.OutputMechanism)
    fold = tiny_fold()
    model = PNBM(fold.train.n_items).attach(fold.train)
    ctx = TrainingContext(1, 1, len(fold.train), fold.train.n_users, fold.train.scale, model=model)
    assert isinstance(MapSGD(model.parameters(), ctx, lr=0.1), I.TrainingMechanism)


def test_mean_fallback_lives_in_interfaces_and_stays_importable_from_predictors():
    from dprec_torch.predictors.base import MeanFallback, Predictor, ReportsFallback

    assert MeanFallback is I.MeanFallback and Predictor is I.Predictor and ReportsFallback is I.ReportsFallback
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


PROBE_FREE = ["mechanisms/dpsgd_paper.py", "mechanisms/gaussian.py", "mechanisms/sgld.py",
              "mechanisms/output_perturbation.py", "mechanisms/exponential_topk.py", "training/run.py",
              "training/trainer.py", "training/evaluate.py", "mechanisms/dpsgd.py", "mechanisms/dpsgd_mf.py",
              "mechanisms/base.py", "mechanisms/context.py", "mechanisms/sgd.py", "mechanisms/none.py",
              "mechanisms/builtin.py", "predictors/d2p.py", "predictors/mcsherry.py"]


@pytest.mark.parametrize("path", PROBE_FREE)
def test_no_hasattr_probes_at_the_converted_sites(path):
    text = (ROOT / "dprec_torch" / path).read_text()
    probes = re.findall(r"\b(?:hasattr|getattr)\(.*", text)
    assert not probes, f"{path} probes with {probes}: ask a Protocol of dprec_torch/interfaces.py"


def test_protocols_see_module_parameters_on_every_python():
    """Python >= 3.12 checks runtime protocols with ``inspect.getattr_static``, blind to an nn.Module's parameters
    and buffers (GPU image: every PNBM failed ``isinstance(model, ItemSimilarityModel)``). Each protocol uses the
    hasattr metaclass, and a PNBM/MF passes the checks the mechanisms make."""
    import inspect as _inspect
    import typing as _typing

    from dprec_torch import interfaces
    from dprec_torch.models.mf import MF
    from dprec_torch.models.pnbm import PNBM

    protocols = [c for _, c in _inspect.getmembers(interfaces, _inspect.isclass)
                 if c.__module__ == interfaces.__name__ and getattr(c, "_is_protocol", False) and c is not _typing.Protocol]
    assert protocols and all(isinstance(c, interfaces._AttributeProtocolMeta) for c in protocols)
    pnbm = PNBM(4)
    assert isinstance(pnbm, interfaces.ItemSimilarityModel) and isinstance(pnbm, interfaces.HasItemMeans)
    assert not isinstance(pnbm, interfaces.FactorModel)
    mf = MF(3, 4)
    assert isinstance(mf, interfaces.FactorModel) and not isinstance(mf, interfaces.ItemSimilarityModel)
