"""The shared predictor contract, run for every rating predictor that lives outside the core tests."""

from __future__ import annotations

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
