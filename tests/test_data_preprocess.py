"""Per-user cap tau (Wang & Tang Sec. 4.3) and minimum-ratings filter (Sec. 3), on hand-built ratings."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dprec_torch.data import cap_user_ratings, filter_min_user_ratings, load_synthetic
from dprec_torch.data.ratings import Ratings, RatingScale
from dprec_torch.errors import ConfigError
from dprec_torch.seeding import make_generator

SCALE = RatingScale(1.0, 5.0)


def build(users: list[int], items: list[int], n_users: int = 4, n_items: int = 10) -> Ratings:
    values = [float(1 + (u + i) % 5) for u, i in zip(users, items)]
    return Ratings(torch.tensor(users), torch.tensor(items), torch.tensor(values), n_users, n_items, SCALE)


# user 0: 5 ratings, user 1: 2, user 2: 3, user 3: none
USERS = [0, 1, 0, 2, 0, 2, 1, 0, 2, 0]
ITEMS = [0, 0, 1, 1, 2, 2, 3, 3, 4, 5]


def triples(r: Ratings) -> list[tuple[int, int, float]]:
    return list(zip(r.users.tolist(), r.items.tolist(), r.values.tolist()))


def test_cap_keeps_min_of_count_and_tau():
    r = build(USERS, ITEMS)
    capped, dropped = cap_user_ratings(r, 3, make_generator(0))
    assert capped.user_counts().tolist() == [3, 2, 3, 0]
    assert dropped == 2 and len(capped) == 8
    assert (capped.n_users, capped.n_items) == (4, 10)
    kept = triples(capped)
    original = triples(r)
    assert set(kept) <= set(original)
    assert kept == [t for t in original if t in set(kept)]  # original order preserved
    # users under the cap keep everything
    assert {t for t in kept if t[0] in (1, 2)} == {t for t in original if t[0] in (1, 2)}


def test_cap_is_deterministic_under_a_seed_and_varies_across_seeds():
    r = build(USERS, ITEMS)
    a, _ = cap_user_ratings(r, 2, make_generator(11))
    b, _ = cap_user_ratings(r, 2, make_generator(11))
    assert triples(a) == triples(b)
    kept_sets = {frozenset(triples(cap_user_ratings(r, 2, make_generator(s))[0])) for s in range(10)}
    assert len(kept_sets) > 1


def test_cap_is_uniform_within_a_user():
    """Each of a user's 10 ratings survives tau=5 with probability 1/2 (400 draws: sd 0.025)."""
    r = build([0] * 10, list(range(10)), n_users=1)
    gen = make_generator(123)
    hits = torch.zeros(10)
    for _ in range(400):  # repetitions of a statistical check, not a loop over ratings
        capped, _ = cap_user_ratings(r, 5, gen)
        hits[capped.items] += 1
    assert torch.all((hits / 400 - 0.5).abs() < 0.1)


def test_cap_rejects_bad_tau_and_handles_empty():
    r = build(USERS, ITEMS)
    for tau in (0, -3, 2.5, True):
        with pytest.raises(ConfigError, match="max_user_ratings"):
            cap_user_ratings(r, tau, make_generator(0))
    empty, dropped = cap_user_ratings(build([], []), 3, make_generator(0))
    assert len(empty) == 0 and dropped == 0


@settings(max_examples=40, deadline=None)
@given(
    users=st.lists(st.integers(0, 5), min_size=1, max_size=60),
    tau=st.integers(1, 8),
    seed=st.integers(0, 2**31),
)
def test_cap_property(users, tau, seed):
    items = list(range(len(users)))  # distinct pairs
    r = build(users, items, n_users=6, n_items=len(users))
    capped, dropped = cap_user_ratings(r, tau, make_generator(seed))
    assert torch.equal(capped.user_counts(), r.user_counts().clamp(max=tau))
    assert dropped == len(r) - len(capped)


def test_min_filter():
    r = build(USERS, ITEMS)
    kept, dropped = filter_min_user_ratings(r, 3)
    assert sorted(set(kept.users.tolist())) == [0, 2] and dropped == 2
    assert kept.user_counts().tolist() == [5, 0, 3, 0]
    same, dropped = filter_min_user_ratings(r, 0)
    assert triples(same) == triples(r) and dropped == 0
    none, dropped = filter_min_user_ratings(r, 6)
    assert len(none) == 0 and dropped == 10
    with pytest.raises(ConfigError, match="min_user_ratings"):
        filter_min_user_ratings(r, -1)


def test_loader_applies_preprocessing_to_train_only_and_reports_it():
    plain = load_synthetic("tiny", fold="all", seed=2)
    prep = load_synthetic("tiny", fold="all", seed=2, min_user_ratings=10, max_user_ratings=20)
    for f0, f1 in zip(plain.folds, prep.folds):
        assert torch.equal(f0.test.users, f1.test.users) and torch.equal(f0.test.values, f1.test.values)
        before = f0.train.user_counts()
        expected = torch.where(before >= 10, before.clamp(max=20), torch.zeros_like(before))
        assert torch.equal(f1.train.user_counts(), expected)
        stats = prep.report["folds"][f1.name]
        assert stats["min_filter_dropped_ratings"] == int(before[before < 10].sum())
        assert stats["min_filter_dropped_users"] == int(((before > 0) & (before < 10)).sum())
        assert stats["cap_dropped_ratings"] == int((before[before >= 10] - 20).clamp(min=0).sum())
        assert stats["train"] == len(f1.train) and stats["test"] == len(f1.test)
    assert prep.report["preprocessing"] == {"min_user_ratings": 10, "max_user_ratings": 20, "applied_to": "train"}
    again = load_synthetic("tiny", fold=2, seed=2, min_user_ratings=10, max_user_ratings=20).folds[0]
    assert triples(again.train) == triples(prep.folds[1].train)
