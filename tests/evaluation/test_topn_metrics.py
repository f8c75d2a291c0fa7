"""Top-N metrics on a toy ranking whose every number is computed by hand below."""

from __future__ import annotations

import pytest
import torch

from dprec_torch.data.ratings import Ratings, RatingScale
from dprec_torch.evaluation.topn import relevance_mask, topn_metrics

SCALE = RatingScale(1.0, 5.0)


def _test_set() -> Ratings:
    # 4 users x 6 items. Relevant (>= 4): u0 -> {0, 2, 5}; u1 -> {1}; u2 -> none; u3 -> {5}.
    users = [0, 0, 0, 0, 1, 1, 2, 3]
    items = [0, 2, 3, 5, 1, 4, 0, 5]
    values = [5, 4, 2, 4, 4, 3, 3, 5]
    return Ratings(torch.tensor(users), torch.tensor(items), torch.tensor(values, dtype=torch.float32), 4, 6, SCALE)


def test_toy_ranking_by_hand() -> None:
    test = _test_set()
    users = torch.tensor([0, 1, 2, 3])
    recommended = torch.tensor([
        [0, 3, 5],    # u0: hits 0 and 5 (3 is rated 2: not relevant) -> P = 2/3, R = 2/3
        [2, 1, -1],   # u1: hit 1, one pad            -> P = 1/3, R = 1/1
        [0, 1, 2],    # u2: no relevant item: excluded from P/R
        [4, -1, -1],  # u3: no hit                    -> P = 0,   R = 0
    ])
    got = topn_metrics(recommended, users, test, threshold=4.0)
    p = (2 / 3 + 1 / 3 + 0) / 3
    r = (2 / 3 + 1 + 0) / 3
    assert got["precision@3"] == pytest.approx(p)
    assert got["recall@3"] == pytest.approx(r)
    assert got["f1@3"] == pytest.approx(2 * p * r / (p + r))
    # distinct recommended items {0, 1, 2, 3, 4, 5} minus nothing = 6 of 6; pads never count
    assert got["coverage"] == pytest.approx(6 / 6)
    assert got["topn_users"] == 3


def test_coverage_counts_distinct_items_only() -> None:
    test = _test_set()
    users = torch.tensor([0, 3])
    recommended = torch.tensor([[5, 0], [5, -1]])  # distinct {0, 5} of 6 items
    got = topn_metrics(recommended, users, test, threshold=4.0)
    assert got["coverage"] == pytest.approx(2 / 6)
    # u0: 2 hits of N=2, 2 of 3 relevant; u3: 1 hit of N=2, 1 of 1 relevant
    assert got["precision@2"] == pytest.approx((1.0 + 0.5) / 2)
    assert got["recall@2"] == pytest.approx((2 / 3 + 1.0) / 2)


def test_pad_is_never_a_hit_even_when_its_key_collides() -> None:
    # u1's pad (-1) has key 1*6 - 1 = 5 = (u0, item 5), which is relevant for u0.
    test = _test_set()
    hits, n_rel = relevance_mask(torch.tensor([[-1]]), torch.tensor([1]), test, 4.0)
    assert not bool(hits.any())
    assert n_rel.tolist() == [1]


def test_threshold_moves_relevance() -> None:
    test = _test_set()
    recommended = torch.tensor([[3, 4]])
    # threshold 2: u1's items 1 (4) and 4 (3) are relevant; recommending [3, 4] hits item 4 only
    got = topn_metrics(recommended, torch.tensor([1]), test, threshold=2.0)
    assert got["precision@2"] == pytest.approx(1 / 2)
    assert got["recall@2"] == pytest.approx(1 / 2)


def test_no_relevant_user_gives_zero_not_nan() -> None:
    test = _test_set()
    got = topn_metrics(torch.tensor([[0, 1]]), torch.tensor([2]), test, threshold=4.0)
    assert got["precision@2"] == 0.0 and got["recall@2"] == 0.0 and got["f1@2"] == 0.0
    assert got["topn_users"] == 0
