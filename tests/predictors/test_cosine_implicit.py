"""Cosine item-to-item on purchases (Park & Acharya Eqs. (7)-(8)) and Theorem 3.2's Delta f."""

from __future__ import annotations

import math

import pytest
import torch

from dprec_torch.data.ratings import Ratings, RatingScale
from dprec_torch.errors import DataError
from dprec_torch.mechanisms.output_perturbation import LaplaceOutput
from dprec_torch.predictors.cosine_implicit import CosineImplicit, cosine_sensitivity

SCALE = RatingScale(1.0, 5.0)
R2 = 1 / math.sqrt(2)


def toy() -> Ratings:
    """Purchases (rating 5): u0 {0,1}, u1 {0,2}, u2 {1,2,3}; u3 rated item 3 with 2 (not a purchase)."""
    u = [0, 0, 1, 1, 2, 2, 2, 3]
    i = [0, 1, 0, 2, 1, 2, 3, 3]
    r = [5, 5, 5, 5, 5, 5, 5, 2]
    return Ratings(torch.tensor(u), torch.tensor(i), torch.tensor(r, dtype=torch.float32), 4, 4, SCALE)


def test_similarity_by_hand() -> None:
    # Eq. (7): |p_0| = |p_1| = |p_2| = sqrt 2, |p_3| = 1; s01 = s02 = s12 = 1/2, s13 = s23 = 1/sqrt 2, s03 = 0
    s = CosineImplicit(T=1, threshold=4.0).fit(toy()).sim_
    want = torch.tensor(
        [[1, 0.5, 0.5, 0], [0.5, 1, 0.5, R2], [0.5, 0.5, 1, R2], [0, R2, R2, 1]], dtype=torch.float64
    )
    torch.testing.assert_close(s, want)


def test_scores_by_hand() -> None:
    m = CosineImplicit(T=1, threshold=4.0).fit(toy())
    got = m.raw_predict(torch.tensor([0, 0, 1, 3]), torch.tensor([2, 3, 1, 0]))
    # Eq. (8): u0 -> i2: (s02 + s12)/2 = 0.5; i3: (0 + 1/sqrt2)/2; u1 -> i1: (0.5 + 0.5)/2
    # u3 has no purchases (< T): normalised popularity of item 0 = 2/2
    torch.testing.assert_close(got, torch.tensor([0.5, R2 / 2, 0.5, 1.0], dtype=torch.float64))


def test_threshold_none_counts_every_rating() -> None:
    m = CosineImplicit(T=1, threshold=None).fit(toy())
    assert int(m.purchase_counts_[3]) == 1 and m.served_[3]
    with pytest.raises(DataError, match="threshold"):
        CosineImplicit(threshold=6.0).fit(toy())


def test_recommend_excludes_rated_items() -> None:
    m = CosineImplicit(T=1, threshold=4.0).fit(toy())
    rec = m.recommend(torch.tensor([0, 3]), 3)
    assert rec[0].tolist() == [2, 3, -1]
    assert sorted(rec[1].tolist()) == [0, 1, 2]  # u3 rated item 3 (below threshold): still excluded


def test_delta_f_formula_and_report() -> None:
    assert cosine_sensitivity(20) == pytest.approx(0.1)
    assert CosineImplicit(T=4).output_sensitivity() == pytest.approx(0.5)
    wrapped = LaplaceOutput(epsilon=1.0).wrap(CosineImplicit(T=20)).fit(toy())
    report = wrapped.privacy_report()
    assert report["sensitivity"] == pytest.approx(0.1) and report["noise_scale"] == pytest.approx(0.1)
    assert report["epsilon_per_query"] == pytest.approx(10.0)  # only the range bound 1 is defended: eps * T / 2
    assert report["epsilon"] == 0.0 and report["released_values"] == 0  # headline: the total over releases (none yet)


def test_theorem_3_2_fails_when_the_queried_item_is_bought() -> None:
    """A new buyer of item j changes every s_kj at once: p_hat_ij moves by 1/sqrt 2 >> 2/T."""
    T = 20
    j, ks = 0, list(range(1, T + 1))
    attacked, newcomer = 0, 1
    u = [attacked] * T + [newcomer] * T
    i = ks + ks
    r = [5.0] * (2 * T)
    base = Ratings(torch.tensor(u), torch.tensor(i), torch.tensor(r), 2, T + 1, SCALE)
    plus = Ratings(torch.tensor(u + [newcomer]), torch.tensor(i + [j]), torch.tensor(r + [5.0]), 2, T + 1, SCALE)
    q = (torch.tensor([attacked]), torch.tensor([j]))
    before = CosineImplicit(T=T).fit(base).raw_predict(*q)
    after = CosineImplicit(T=T).fit(plus).raw_predict(*q)
    assert float(before) == 0.0 and float(after) == pytest.approx(R2)
    assert float(after - before) > 7 * cosine_sensitivity(T)


def test_yaml_instantiates() -> None:
    from dprec_torch.training.run import instantiate_node
    from tests.helpers import tiny_cfg

    cfg = tiny_cfg("model=cosine_implicit")
    assert cfg.mechanism.name == "none"
    model = instantiate_node(cfg.model)
    assert isinstance(model, CosineImplicit) and model.T == 20 and model.threshold == 4.0
