"""D2P: groups, substitution probabilities, Eq. (12) and the kNN recommendations on hand-computed toys."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from dprec_torch.data.ratings import Ratings, RatingScale
from dprec_torch.errors import ConfigError, DataError
from dprec_torch.predictors.d2p import (
    D2P,
    alter_ego,
    calibrate,
    epsilon_eq12,
    epsilon_prop1,
    form_groups,
    like_threshold,
    substitution_matrix,
)
from dprec_torch.training.run import instantiate_node
from dprec_torch.seeding import noise_generator

SCALE = RatingScale(1.0, 5.0)
CONF = Path(__file__).resolve().parents[2] / "conf" / "model" / "d2p.yaml"

# G_lambda for 4 items: {0,1}, {0,1,2}, {1,2}, {3}
GROUPS = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 0], [0, 0, 0, 1]], dtype=torch.bool)


def test_substitution_probabilities_by_hand() -> None:
    # p = 0.5, p* = 0.2: base = p (1-p*) / N = 0.1; group share = (1-p)(1-p*) / |G| = 0.4 / |G|
    sub = substitution_matrix(GROUPS, p=0.5, p_star=0.2)
    assert sub[0].tolist() == pytest.approx([0.2 + 0.2 + 0.1, 0.2 + 0.1, 0.1, 0.1])
    assert sub[1].tolist() == pytest.approx([0.4 / 3 + 0.1, 0.2 + 0.4 / 3 + 0.1, 0.4 / 3 + 0.1, 0.1])
    assert sub[3].tolist() == pytest.approx([0.1, 0.1, 0.1, 0.2 + 0.4 + 0.1])
    assert sub.sum(1).tolist() == pytest.approx([1.0] * 4)


def test_sampled_substitutions_match_the_probabilities() -> None:
    reps = 60000
    gen = noise_generator(0)
    for s in (0, 1, 3):
        elem = torch.full((reps,), s)
        out = alter_ego(torch.zeros(reps, dtype=torch.long), elem, GROUPS, 0.5, 0.2, gen)
        freq = torch.bincount(out, minlength=4).double() / reps
        assert freq.tolist() == pytest.approx(substitution_matrix(GROUPS, 0.5, 0.2)[s].tolist(), abs=0.01)


def test_epsilon_eq12_by_hand() -> None:
    # N = 4, |G|min = 1: ln(1 + (0.2 + 0.5*0.8/1) / (0.5*0.8/4)) = ln 7
    assert epsilon_eq12(0.5, 0.2, 4, 1) == pytest.approx(math.log(7))
    # Eq. (13), p* = 0: ln(1 + (1-p) N / (p |G|))
    assert epsilon_eq12(0.3, 0.0, 100, 4) == pytest.approx(math.log(1 + 0.7 * 100 / (0.3 * 4)))
    assert epsilon_eq12(1.0, 0.0, 100, 4) == 0.0  # p = 1: every item replaced uniformly
    assert epsilon_eq12(0.5, 1.0, 100, 4) == float("inf")  # p* = 1: original profiles
    assert epsilon_eq12(0.0, 0.0, 100, 4) == float("inf")


def test_prop1_equals_eq12_when_the_smallest_group_is_isolated() -> None:
    sub = substitution_matrix(GROUPS, 0.5, 0.2)
    assert epsilon_prop1(sub) == pytest.approx(epsilon_eq12(0.5, 0.2, 4, 1))


def test_prop1_is_below_eq12_when_groups_cover_everything() -> None:
    full = torch.ones(3, 3, dtype=torch.bool)
    sub = substitution_matrix(full, 0.5, 0.2)
    base = 0.5 * 0.8 / 3 + 0.5 * 0.8 / 3
    assert epsilon_prop1(sub) == pytest.approx(math.log((0.2 + base) / base))
    assert epsilon_prop1(sub) < epsilon_eq12(0.5, 0.2, 3, 3)


@pytest.mark.parametrize("eps", [3.0, 5.0])
def test_calibration_hits_eq12_exactly(eps: float) -> None:
    p, p_star = calibrate(eps, 0.5, 100, 5)
    assert epsilon_eq12(p, p_star, 100, 5) == pytest.approx(eps)
    if eps == 3.0:  # p* = 0 would still exceed 3 at p = 0.5: p is raised (Eq. 13 solved for p)
        assert p_star == 0.0 and p == pytest.approx(100 / (100 + 5 * math.expm1(3.0)))
    else:
        c = math.expm1(5.0) * 0.5 / 100
        assert p == 0.5 and p_star == pytest.approx((c - 0.1) / (1 + c - 0.1))


def test_groups_and_neighbouring_groups_by_hand() -> None:
    cos = torch.tensor([[1, 0.6, 0.3, 0], [0.6, 1, 0.45, 0], [0.3, 0.45, 1, 0], [0, 0, 0, 1.0]])
    # lambda = 1: cos > 1/2 -> GRP = {0,1}, {0,1}, {2}, {3}; no group shares with {2}
    g1 = form_groups(cos, 1.0)
    assert g1.int().tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    # lambda = 1.5: cos > 0.4 -> GRP = {0,1}, {0,1,2}, {1,2}, {3}; sharing groups pull in item 2 for item 0
    g2 = form_groups(cos, 1.5)
    assert g2.int().tolist() == [[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 0], [0, 0, 0, 1]]
    # no neighbouring groups (Def. 4 with K = 0): just GRP
    g0 = form_groups(cos, 1.5, neighbor_groups=0)
    assert g0.int().tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 0], [0, 0, 0, 1]]
    # lambda = 0 is classical DP: every group is the item itself
    assert torch.equal(form_groups(cos, 0.0), torch.eye(4, dtype=torch.bool))


def test_like_threshold_is_relative_to_the_scale() -> None:
    assert like_threshold(RatingScale(1, 5), 0.75) == 4.0
    assert like_threshold(RatingScale(-10, 10), 0.75) == 5.0
    assert like_threshold(RatingScale(0, 1), 0.5) == 0.5


def _toy() -> Ratings:
    # likes (>= 4): u0 {0,1} (+ item 2 rated 2), u1 {0,1,3}, u2 {1,3,4}, u3 {4}
    u = [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
    i = [0, 1, 2, 0, 1, 3, 1, 3, 4, 4]
    v = [5, 4, 2, 4, 5, 4, 4, 5, 4, 5]
    return Ratings(torch.tensor(u), torch.tensor(i), torch.tensor(v, dtype=torch.float32), 4, 5, SCALE)


def test_nonprivate_user_knn_by_hand() -> None:
    model = D2P(epsilon=float("inf"), k=2).fit(_toy())
    # u0: neighbours u1 (cos 2/sqrt6) and u2 (1/sqrt6); item 3 liked by both, item 4 by u2; 0,1,2 rated
    assert model.recommend(torch.tensor([0]), 3).tolist() == [[3, 4, -1]]
    one = D2P(epsilon=float("inf"), k=1).fit(_toy())
    assert one.recommend(torch.tensor([0]), 2).tolist() == [[3, -1]]  # only u1: item 3
    assert set(one.recommend(torch.tensor([3]), 2)[0].tolist()) == {1, 3}  # only u2 overlaps u3
    assert model.privacy_report()["epsilon"] == float("inf")


def test_nonprivate_item_knn_by_hand() -> None:
    model = D2P(epsilon=float("inf"), k=4, mode="item").fit(_toy())
    # u3 likes {4}: score(i) = cos(i, 4): item 3 -> 1/2, item 1 -> 1/sqrt6, item 0 -> 0 (no rec)
    assert model.recommend(torch.tensor([3]), 3).tolist() == [[3, 1, -1]]


def test_private_fit_reports_eq12_and_is_seeded() -> None:
    a = D2P(epsilon=float("inf"), p=0.4, p_star=0.3, lam=1.0, seed=2).fit(_toy())
    b = D2P(epsilon=float("inf"), p=0.4, p_star=0.3, lam=1.0, seed=2).fit(_toy())
    users = torch.arange(4)
    assert torch.equal(a.recommend(users, 2), b.recommend(users, 2))
    rep = a.privacy_report()
    # groups built from the private likes -> Eq. (12) only conditional, no defended epsilon
    assert rep["epsilon"] == float("inf")
    assert rep["epsilon_nominal"] == pytest.approx(epsilon_eq12(0.4, 0.3, 5, a.g_min_))
    assert "CONDITIONAL on the lambda-groups" in rep["epsilon_nominal_scope"]
    assert rep["epsilon_prop1"] <= rep["epsilon_nominal"] + 1e-9
    assert rep["p_star"] == 0.3 and rep["delta"] == 0.0


def test_finite_epsilon_calibrates_p_star() -> None:
    model = D2P(epsilon=4.0, p=0.5, seed=0).fit(_toy())
    assert model.privacy_report()["epsilon_nominal"] == pytest.approx(4.0)
    assert 0.0 <= model.p_star_used_ < 1.0


def test_explicit_p_star_above_the_epsilon_is_refused() -> None:
    with pytest.raises(ConfigError, match="drop model.p_star"):
        D2P(epsilon=1.0, p=0.5, p_star=0.9).fit(_toy())


def test_bad_config_and_data_raise_readable_errors() -> None:
    with pytest.raises(ConfigError, match="mode"):
        D2P(mode="both")
    with pytest.raises(ConfigError, match="p="):
        D2P(p=1.5)
    low = Ratings(torch.tensor([0]), torch.tensor([0]), torch.tensor([1.0]), 1, 1, SCALE)
    with pytest.raises(DataError, match="like threshold"):
        D2P().fit(low)
    with pytest.raises(DataError, match="user ids"):
        D2P(epsilon=float("inf")).fit(_toy()).recommend(torch.tensor([9]), 2)


def test_yaml_instantiates_with_top_level_keys() -> None:
    cfg = OmegaConf.merge(OmegaConf.create({"epsilon": float("inf"), "seed": 4, "noise_seed": 4, "delta": 1e-6}), OmegaConf.load(CONF))
    model = instantiate_node(cfg.model)  # the path train.py takes (drops the bookkeeping `name`)
    assert isinstance(model, D2P) and model.task == "topn" and model.seed == 4
