"""Exponential-mechanism top-k (Park & Acharya Sec. 4): exact sampler vs brute force, and the birth-death chain."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
import torch

from dprec_torch.data.ratings import Ratings, RatingScale
from dprec_torch.errors import ConfigError
from dprec_torch.mechanisms.exponential_topk import (
    BirthDeathChain,
    ExponentialTopK,
    mask_to_ids,
    sample_topk_exact,
    topk_log_prob,
    topk_log_weights,
    window_candidates,
    window_chain,
)
from dprec_torch.predictors.slope_one import SlopeOne
from dprec_torch.seeding import noise_generator

SCORES = torch.tensor([[4.6, 1.2, 3.9, 2.5, 4.1, 1.0, 3.3]], dtype=torch.float64)


def brute_force(scores: torch.Tensor, eligible: torch.Tensor, k: int, eps: float, delta: float) -> dict[tuple, float]:
    """P(S) ∝ exp(eps * sum_{j in S} c_j / (2 delta)) over every k-subset of eligible items (Eq. (28))."""
    items = [j for j in range(scores.shape[1]) if eligible[0, j]]
    sets = list(itertools.combinations(items, k))
    logits = torch.tensor([eps * float(scores[0, list(s)].sum()) / (2 * delta) for s in sets], dtype=torch.float64)
    return dict(zip(sets, torch.softmax(logits, 0).tolist()))


def test_exact_log_prob_matches_enumeration() -> None:
    eligible = torch.ones_like(SCORES, dtype=torch.bool)
    eligible[0, 4] = False
    truth = brute_force(SCORES, eligible, 3, 2.0, 4.0)
    logw = topk_log_weights(SCORES, eligible, 2.0, 4.0)
    sets = torch.tensor(list(truth))
    got = topk_log_prob(logw.expand(len(sets), -1), sets).exp()
    torch.testing.assert_close(got, torch.tensor(list(truth.values()), dtype=torch.float64))


def test_exact_sampler_frequencies_match_enumeration() -> None:
    eligible = torch.ones_like(SCORES, dtype=torch.bool)
    eligible[0, 4] = False
    truth = brute_force(SCORES, eligible, 3, 2.0, 4.0)
    n = 60_000
    logw = topk_log_weights(SCORES, eligible, 2.0, 4.0).expand(n, -1).contiguous()
    draws = mask_to_ids(sample_topk_exact(logw, 3, noise_generator(0)), 3)
    assert not bool((draws[:, None, :] == 4).any())  # the ineligible item never appears
    freq = Counter(map(tuple, draws.tolist()))
    worst = max(abs(freq.get(s, 0) / n - p) / math.sqrt(p * (1 - p) / n) for s, p in truth.items())
    assert worst < 5.0  # every set within 5 standard errors


def test_window_candidates_by_hand() -> None:
    # k = 3, N1 = 2, N2 = 2: drop position 2 or 1 of S_0, add from the window {3, 4}, then {5, 6}
    drop, add, valid = window_candidates(torch.tensor([7, 6]), 3, 2, 2, 7)
    assert drop.tolist() == [-1, 2, 2, 1, 1, 2, 2, 1, 1]
    assert add.tolist() == [-1, 3, 4, 3, 4, 5, 6, 5, 6]
    assert valid[0].all() and valid[1].tolist() == [True] * 6 + [False, True, False]  # position 6 missing


def _tridiagonal(chain: BirthDeathChain, row: int) -> torch.Tensor:
    up, down = chain.p_up[row], chain.p_down[row]
    n = int(torch.isfinite(chain.log_w[row]).sum())
    p = torch.zeros(n, n, dtype=torch.float64)
    for j in range(n):  # a handful of states: build the DTMC of Eq. (34)
        if j + 1 < n:
            p[j, j + 1] = up[j]
        if j > 0:
            p[j, j - 1] = down[j]
        p[j, j] = 1 - p[j].sum()
    return p


def test_chain_stationary_law_is_eq28_on_its_candidates() -> None:
    eligible = torch.ones_like(SCORES, dtype=torch.bool)
    chain, members = window_chain(SCORES, eligible, 2, 3.0, 4.0, n1=2, n2=2)
    p = _tridiagonal(chain, 0)
    assert float(p.min()) >= 0.0  # Eq. (36): dt = 1/U_s keeps every p_jj >= 0
    evals, evecs = torch.linalg.eig(p.T)
    pi = evecs[:, torch.argmin((evals - 1).abs())].real
    pi = pi / pi.sum()
    n = p.shape[0]
    sets = members[0, :n]
    exact = topk_log_prob(topk_log_weights(SCORES, eligible, 3.0, 4.0).expand(n, -1), sets).exp()
    torch.testing.assert_close(pi, exact / exact.sum(), atol=1e-10, rtol=0)


def test_chain_matches_exact_distribution_when_k_is_1() -> None:
    """k = 1, N1 = 1: the window covers every item, so the chain's law is the whole of Eq. (28)."""
    eligible = torch.ones_like(SCORES, dtype=torch.bool)
    truth = brute_force(SCORES, eligible, 1, 4.0, 4.0)
    n_chains = 20_000
    chain, members = window_chain(SCORES.expand(n_chains, -1), eligible.expand(n_chains, -1), 1, 4.0, 4.0, n1=1, n2=3)
    state = chain.run(400, noise_generator(1))
    items = members[torch.arange(n_chains), state, 0]
    freq = torch.bincount(items, minlength=SCORES.shape[1]).double() / n_chains
    want = torch.tensor([truth[(j,)] for j in range(SCORES.shape[1])], dtype=torch.float64)
    assert float((freq - want).abs().max()) < 0.015


def _fitted(sampler: str, eps: float, seed: int = 0):
    u = torch.tensor([0, 0, 1, 1, 2, 2, 2, 3, 3, 3])
    i = torch.tensor([0, 1, 0, 2, 1, 2, 3, 0, 3, 4])
    r = torch.tensor([5, 3, 3, 4, 2, 5, 4, 1, 2, 5], dtype=torch.float32)
    train = Ratings(u, i, r, 4, 7, RatingScale(1.0, 5.0))
    return ExponentialTopK(epsilon=eps, seed=seed, sampler=sampler, n_iter=50).wrap(SlopeOne(T=1, phi_m=0)).fit(train)


def test_recommender_returns_private_unrated_sets() -> None:
    rec = _fitted("exact", 1.0)
    out = rec.recommend(torch.tensor([0, 1, 2, 3]), 3)
    assert out.shape == (4, 3)
    rated = {0: {0, 1}, 1: {0, 2}, 2: {1, 2, 3}, 3: {0, 3, 4}}
    for row, user in zip(out.tolist(), range(4)):
        assert not (set(row) & rated[user]) and len(set(row)) == 3
    torch.testing.assert_close(_fitted("exact", 1.0).recommend(torch.tensor([0, 1, 2, 3]), 3), out)  # seeded
    assert _fitted("mcmc", 1.0).recommend(torch.tensor([3]), 5).tolist() == [[1, 2, 5, 6, -1]]  # only 4 unrated


class FixedScores:
    """Any model with ``score(users)`` works; these scores have no ties, so the top-k is unique."""

    def fit(self, train: Ratings) -> "FixedScores":
        return self

    def score(self, users: torch.Tensor) -> torch.Tensor:
        return SCORES.expand(users.numel(), -1) - 0.01 * users[:, None]


def test_infinite_and_huge_epsilon_give_true_top_k() -> None:
    train = Ratings(torch.tensor([0, 1]), torch.tensor([0, 2]), torch.tensor([5.0, 4.0]), 2, 7, RatingScale(1.0, 5.0))
    users = torch.tensor([0, 1])
    truth = [[2, 4, 6], [0, 4, 6]]  # top-3 of SCORES without the rated item (0 for user 0, 2 for user 1)
    for sampler, eps in (("exact", math.inf), ("mcmc", math.inf), ("exact", 1e5), ("mcmc", 1e5)):
        rec = ExponentialTopK(epsilon=eps, sampler=sampler, n_iter=30).wrap(FixedScores()).fit(train)
        assert rec.recommend(users, 3).tolist() == truth, sampler  # log-space: no overflow at eps = 1e5


def test_privacy_report_is_honest_about_mcmc() -> None:
    exact, mcmc = _fitted("exact", 0.5).privacy_report(), _fitted("mcmc", 0.5).privacy_report()
    assert exact["epsilon"] == 0.5 and exact["sensitivity"] == 4.0
    assert mcmc["epsilon"] is None and "NO epsilon" in mcmc["analysis"]


def test_relation_is_one_score_entry_not_a_rating(tmp_path) -> None:
    """The epsilon protects one entry of a user's score row: the label must not say ``rating`` (defect 7)."""
    import json

    from dprec_torch.privacy.ledger import ledger_report

    rep = _fitted("exact", 0.5).privacy_report()
    assert rep["relation"].split()[0] == "score-entry" and "not a training rating" in rep["relation"]
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "metrics.json").write_text(json.dumps({"data": "toy", "mechanism": "exponential_topk",
                                                             "folds": [{"fold": 1}], "privacy": rep}))
    (e,) = ledger_report(tmp_path)["entries"]
    assert e["epsilon_rating_level"] == math.inf and e["epsilon_user_level"] == math.inf  # no training-data claim


def test_bad_config() -> None:
    with pytest.raises(ConfigError, match="sampler"):
        ExponentialTopK(epsilon=1, sampler="gibbs")
    with pytest.raises(ConfigError, match="Eq. \\(36\\)"):
        BirthDeathChain(torch.tensor([[0.0, -0.1, -5.0]], dtype=torch.float64), dt=1.0)


# ----------------------------------------------------------------------------- privacy statement
def _toy_train() -> Ratings:
    return Ratings(torch.tensor([0, 1]), torch.tensor([0, 2]), torch.tensor([5.0, 4.0]), 2, 7, RatingScale(1.0, 5.0))


def test_a_sensitivity_below_the_score_range_is_refused() -> None:
    """Delta < the clipped range understates how far one score entry moves f(S): the old code only logged a
    warning and still reported the epsilon (fails on it)."""
    with pytest.raises(ConfigError, match="below the width 4"):
        ExponentialTopK(epsilon=1.0, sensitivity=1.0).wrap(FixedScores()).fit(_toy_train())
    paper = ExponentialTopK(epsilon=1.0, sensitivity=5.0).wrap(FixedScores()).fit(_toy_train())  # U_r = 5: looser, fine
    assert paper.privacy_report()["sensitivity"] == 5.0 and paper.privacy_report()["epsilon"] == 1.0


def test_report_states_relation_sensitivity_noise_and_accountant() -> None:
    rec = ExponentialTopK(epsilon=0.5, sampler="exact").wrap(FixedScores()).fit(_toy_train())
    rep = rec.privacy_report()
    assert rep["relation"].startswith("score-entry") and rep["sensitivity"] == 4.0
    assert "clip(c_ij, 1, 5)" in rep["sensitivity_of"] and "exp(eps f(S) / (2*4.0))" in rep["noise"]
    assert "basic composition" in rep["accountant"] and "parallel" in rep["accountant"]


def test_accountant_composes_the_sets_released_to_one_user() -> None:
    """Each set is eps-DP for its user's row; two sets for user 0 cost 2 eps (fails on the old code, whose
    report kept the per-set figure)."""
    rec = ExponentialTopK(epsilon=0.5, sampler="exact").wrap(FixedScores()).fit(_toy_train())
    assert rec.privacy_report()["epsilon"] == 0.5  # before any draw: the cost of the first one
    rec.recommend(torch.tensor([0, 1]), 2)
    assert rec.privacy_report()["epsilon"] == 0.5  # one set per user: parallel composition
    rec.recommend(torch.tensor([0]), 3)
    rep = rec.privacy_report()
    assert rep["epsilon"] == 1.0 and rep["epsilon_per_set"] == 0.5 and rep["max_sets_per_user"] == 2


class _NonFiniteScores(FixedScores):
    def score(self, users: torch.Tensor) -> torch.Tensor:
        s = super().score(users).clone()
        s[:, 1], s[:, 3], s[:, 5] = float("nan"), float("inf"), -float("inf")
        return s


def test_non_finite_scores_stay_within_the_calibrated_range() -> None:
    """One entry set to NaN/inf must still move f(S) by <= Delta: NaN -> lo, +-inf -> the range ends (the old
    clamp kept NaN, which poisoned the exponent of every set holding that item)."""
    rec = ExponentialTopK(epsilon=1.0, sampler="exact").wrap(_NonFiniteScores()).fit(_toy_train())
    s = rec.scores(torch.tensor([0, 1]))
    assert s[:, 1].tolist() == [1.0, 1.0] and s[:, 3].tolist() == [5.0, 5.0] and s[:, 5].tolist() == [1.0, 1.0]
    assert rec.recommend(torch.tensor([0, 1]), 3).ge(0).all()  # full sets: no NaN weight drops an item
