"""PCC/COS item-kNN: hand-computed similarities and predictions, plus the predictor contract."""

from __future__ import annotations

import math

import pytest
import torch

from dprec_torch.errors import ConfigError
from dprec_torch.predictors import similarity
from dprec_torch.predictors.knn import ItemKNN
from tests.contract import PredictorContract
from tests.helpers import toy_ratings

#      i0    i1    i2    i3    i4
TOY = [
    [5, 3, None, 1, None],  # u0
    [4, None, None, 1, 2],  # u1
    [1, 1, None, 5, 4],  # u2
    [None, 1, 5, 4, None],  # u3
]


def test_cosine_by_hand():
    sim = similarity.cosine(toy_ratings(TOY))
    # i0, i3 co-rated by u0, u1, u2: (5,4,1).(1,1,5) / (|(5,4,1)| |(1,1,5)|) = 14 / sqrt(42 * 27)
    assert float(sim[0, 3]) == pytest.approx(14 / math.sqrt(42 * 27), abs=1e-6)
    # i0, i1 co-rated by u0, u2: (5,1).(3,1) / sqrt(26 * 10)
    assert float(sim[0, 1]) == pytest.approx(16 / math.sqrt(260), abs=1e-6)
    assert float(sim[0, 2]) == 0.0  # no co-raters
    assert torch.allclose(sim, sim.T) and float(sim.diagonal().abs().max()) == 0.0


def test_pearson_by_hand():
    sim = similarity.pearson(toy_ratings(TOY))
    # item means: i0 = 10/3, i3 = 11/4. Centred on co-raters u0,u1,u2:
    x0 = [5 - 10 / 3, 4 - 10 / 3, 1 - 10 / 3]
    x3 = [1 - 2.75, 1 - 2.75, 5 - 2.75]
    num = sum(a * b for a, b in zip(x0, x3))
    den = math.sqrt(sum(a * a for a in x0) * sum(b * b for b in x3))
    assert float(sim[0, 3]) == pytest.approx(num / den, abs=1e-6)
    assert float(sim[0, 3]) < 0  # i0 and i3 are anti-correlated here


def test_cos_prediction_by_hand():
    r = toy_ratings(TOY)
    model = ItemKNN("cosine", k=10).fit(r)
    # u3 rated i1=1, i2=5, i3=4; s(0,1)=16/sqrt(260), s(0,2)=0, s(0,3)=14/sqrt(1134)
    s01, s03 = 16 / math.sqrt(260), 14 / math.sqrt(1134)
    expected = 10 / 3 + (s01 * (1 - 5 / 3) + s03 * (4 - 2.75)) / (s01 + s03)
    assert float(model.predict(torch.tensor([3]), torch.tensor([0]))[0]) == pytest.approx(expected, abs=1e-5)


def test_top_k_keeps_most_similar_only():
    r = toy_ratings(TOY)
    model = ItemKNN("cosine", k=1).fit(r)
    # k = 1: only i1 (s=0.992 > 0.416) counts: r_bar_0 + (1 - 5/3)
    assert float(model.predict(torch.tensor([3]), torch.tensor([0]))[0]) == pytest.approx(10 / 3 - 2 / 3, abs=1e-5)


def test_pcc_positive_only_drops_negative_neighbours():
    r = toy_ratings(TOY)
    signed = ItemKNN("pearson", k=10, positive_only=False).fit(r)
    pos = ItemKNN("pearson", k=10).fit(r)
    assert float(signed.sim_.min()) < 0 and float(pos.sim_.min()) >= 0


@pytest.mark.parametrize("k", [0, -3])
def test_bad_k(k):
    with pytest.raises(ConfigError, match="positive"):
        ItemKNN("pearson", k=k)


def test_unknown_similarity():
    with pytest.raises(ConfigError, match="unknown similarity"):
        ItemKNN("jaccard")


class TestPCCContract(PredictorContract):
    def make_predictor(self):
        return ItemKNN("pearson", k=50)


class TestCOSContract(PredictorContract):
    def make_predictor(self):
        return ItemKNN("cosine", k=50)
