"""The shared predictor contract, run for every rating predictor that lives outside the core tests."""

from __future__ import annotations

import pytest
import torch

from dprec_torch.mechanisms.output_perturbation import LaplaceOutput
from dprec_torch.predictors.slope_one import SlopeOne
from tests.contract import PredictorContract


class SlopeOneFallback:
    """Slope One's documented fallback (Eq. (6) with no usable pairs): an unserved or unknown
    user gets the global mean; an unknown item gets the user's mean (global mean if unknown)."""

    def expected_unknown_user(self, train, item):
        return train.global_mean

    def expected_unknown_item(self, train, user):
        return float(train.user_means()[user])


class TestSlopeOneContract(SlopeOneFallback, PredictorContract):
    def make_predictor(self):
        return SlopeOne(T=1, phi_m=0)


class TestSlopeOneLaplaceContract(SlopeOneFallback, PredictorContract):
    """Noisy releases are clipped to the scale and deterministic under the seed."""

    tolerance = 1e-3  # Lap(Delta f / 1e6) noise

    def make_predictor(self):
        return LaplaceOutput(epsilon=1e6, seed=0).wrap(SlopeOne(T=1, phi_m=1))


# ---------------------------------------------------------------------------------- fallback rate
def _fallback_predictors():
    from dprec_torch.predictors.knn import ItemKNN
    from dprec_torch.predictors.mcsherry import McSherryMironov
    from dprec_torch.predictors.pncf import PNCF

    return {
        "pcc": lambda: ItemKNN("pearson", k=20),
        "cos": lambda: ItemKNN("cosine", k=20),
        "pncf": lambda: PNCF(epsilon=float("inf"), k=5),
        "pncf_private": lambda: PNCF(epsilon=1.0, k=5, seed=0),
        "mcsherry": lambda: McSherryMironov(epsilon=float("inf")),
        "slope_one": lambda: SlopeOne(T=1, phi_m=0),
    }


@pytest.mark.parametrize("name", list(_fallback_predictors()))
def test_neighbourhood_predictors_record_their_fallback_rate(name: str) -> None:
    """Every neighbourhood predictor counts the pairs its fallback answered; the evaluator puts the share
    into the fold's metrics (``test_fallback_rate`` in metrics.json)."""
    from dprec_torch.evaluation.cross_validate import score_predictor
    from dprec_torch.predictors.base import BasePredictor
    from tests.helpers import tiny_fold

    fold = tiny_fold()
    model = _fallback_predictors()[name]().fit(fold.train)
    assert isinstance(model, BasePredictor)  # the base that holds fallback_rate_ (None until predict counts)
    known_u, known_i = int(fold.train.users[0]), int(fold.train.items[0])
    model.predict(torch.tensor([fold.train.n_users + 3, known_u]), torch.tensor([known_i, fold.train.n_items + 3]))
    assert model.fallback_rate_ == 1.0  # an unknown user and an unknown item
    metrics = score_predictor(model, fold, topn=5)
    assert 0.0 <= metrics["fallback_rate"] < 0.5
