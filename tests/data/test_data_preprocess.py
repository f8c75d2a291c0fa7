"""Per-user cap tau (Wang & Tang Sec. 4.3) and minimum-ratings filter (Sec. 3), on hand-built ratings."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dprec_torch.data import build_dataset, cap_user_ratings, filter_min_user_ratings, load_synthetic
from dprec_torch.data.preprocess import stable_id_keys
from dprec_torch.data.ratings import Fold, Ratings, RatingScale
from dprec_torch.errors import ConfigError

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
    capped, dropped = cap_user_ratings(r, 3, 0)
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
    a, _ = cap_user_ratings(r, 2, 11)
    b, _ = cap_user_ratings(r, 2, 11)
    assert triples(a) == triples(b)
    kept_sets = {frozenset(triples(cap_user_ratings(r, 2, s)[0])) for s in range(10)}
    assert len(kept_sets) > 1


def test_cap_is_uniform_within_a_user():
    """Each of a user's 10 ratings survives tau=5 with probability 1/2 over seeds (400 seeds: sd 0.025)."""
    r = build([0] * 10, list(range(10)), n_users=1)
    hits = torch.zeros(10)
    for seed in range(400):  # repetitions of a statistical check, not a loop over ratings
        capped, _ = cap_user_ratings(r, 5, seed)
        hits[capped.items] += 1
    assert torch.all((hits / 400 - 0.5).abs() < 0.1)


def test_cap_rejects_bad_tau_and_handles_empty():
    r = build(USERS, ITEMS)
    for tau in (0, -3, 2.5, True):
        with pytest.raises(ConfigError, match="max_user_ratings"):
            cap_user_ratings(r, tau, 0)
    empty, dropped = cap_user_ratings(build([], []), 3, 0)
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
    capped, dropped = cap_user_ratings(r, tau, seed)
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


# ------------------------------------------------------------------------------ the cap is a per-user function
def load_raw(raw_users: list, raw_items: list, tau: int, seed: int = 5):
    """The loaders' path: raw ids -> a contiguous id map BUILT FROM THE DATA -> build_dataset with a cap."""
    uid, iid = np.unique(np.asarray(raw_users)), np.unique(np.asarray(raw_items))
    users = torch.from_numpy(np.searchsorted(uid, np.asarray(raw_users)))
    items = torch.from_numpy(np.searchsorted(iid, np.asarray(raw_items)))
    values = torch.ones(len(raw_users))
    r = Ratings(users, items, values, len(uid), len(iid), SCALE)
    fold = Fold(1, r, r.select(torch.arange(min(3, len(r)))), "f1")
    ds = build_dataset("raw", [fold], uid.tolist(), iid.tolist(), SCALE, 0, tau, seed)
    return ds, ds.folds[0].train


def capped_profiles(ds, train) -> dict:
    """raw user id -> set of raw item ids kept by the cap."""
    out: dict = {}
    for u, i in zip(train.users.tolist(), train.items.tolist()):  # test-side bookkeeping only
        out.setdefault(ds.user_ids[u], set()).add(ds.item_ids[i])
    return out


@pytest.mark.parametrize("text_ids", [False, True])
def test_removing_one_user_leaves_every_other_capped_profile_identical(text_ids):
    """Old code: one random stream over all ratings, so removing a user reshuffled the others' caps."""
    gen = torch.Generator().manual_seed(0)
    n_users, n_items, n = 40, 60, 1500
    raw_u = (torch.randint(0, n_users, (n,), generator=gen) * 7 + 3).tolist()  # sparse raw ids
    raw_i = torch.randint(0, n_items, (n,), generator=gen).tolist()
    pairs = sorted(set(zip(raw_u, raw_i)), key=lambda p: (p[1] * 31 + p[0]) % 97)  # deduplicate, scramble order
    if text_ids:
        pairs = [(f"user-{u}", f"item{i}") for u, i in pairs]
    raw_u, raw_i = [p[0] for p in pairs], [p[1] for p in pairs]
    ds, train = load_raw(raw_u, raw_i, tau=12)
    full = capped_profiles(ds, train)
    assert max(len(v) for v in full.values()) == 12  # the cap binds
    for victim in sorted(set(raw_u))[::7]:  # several neighbours, incl. the smallest raw id (shifts every index)
        keep = [k for k, u in enumerate(raw_u) if u != victim]
        ds2, train2 = load_raw([raw_u[k] for k in keep], [raw_i[k] for k in keep], tau=12)
        nb = capped_profiles(ds2, train2)
        assert victim not in nb
        assert nb == {u: v for u, v in full.items() if u != victim}


def test_mechanism_cap_is_per_user_too():
    """training/run.py::mechanism_fold (the runner's tau for user-level mechanisms) uses the same keys."""
    from omegaconf import OmegaConf

    from dprec_torch.training.run import mechanism_fold

    cfg = OmegaConf.create({"seed": 3, "model": {"name": "mf"}, "mechanism": {
        "_target_": "dprec_torch.mechanisms.sgld.ScaledPosteriorSGLD", "max_user_ratings": 9}})
    gen = torch.Generator().manual_seed(1)
    raw_u = torch.randint(0, 30, (900,), generator=gen).tolist()
    raw_i = torch.randint(0, 80, (900,), generator=gen).tolist()
    pairs = sorted(set(zip(raw_u, raw_i)))
    raw_u, raw_i = [p[0] for p in pairs], [p[1] for p in pairs]
    ds, _ = load_raw(raw_u, raw_i, tau=10_000)
    full = capped_profiles(ds, mechanism_fold(cfg, ds.folds[0]).train)
    assert max(len(v) for v in full.values()) == 9
    keep = [k for k, u in enumerate(raw_u) if u != raw_u[0]]
    ds2, _ = load_raw([raw_u[k] for k in keep], [raw_i[k] for k in keep], tau=10_000)
    nb = capped_profiles(ds2, mechanism_fold(cfg, ds2.folds[0]).train)
    assert nb == {u: v for u, v in full.items() if u != raw_u[0]}


def test_nested_caps_agree_and_text_keys_are_stable():
    """data.max_user_ratings then the runner's smaller tau keep the smallest keys of one order."""
    r = build([0] * 10 + [1] * 4, list(range(10)) + list(range(4)), n_users=2)
    once, _ = cap_user_ratings(r, 3, 7)
    twice, _ = cap_user_ratings(cap_user_ratings(r, 6, 7)[0], 3, 7)
    assert triples(once) == triples(twice)
    a = stable_id_keys(["ab", "b", "héllo"])
    b = stable_id_keys(["ab", "a-much-longer-id", "héllo", "b"])  # a wider id list pads differently
    assert a.tolist() == [b[0].item(), b[3].item(), b[2].item()]


@settings(max_examples=30, deadline=None)
@given(
    pairs=st.sets(st.tuples(st.integers(0, 12), st.integers(0, 15)), min_size=2, max_size=120),
    tau=st.integers(1, 6),
    seed=st.integers(0, 2**40),
    pick=st.integers(0, 10**6),
)
def test_cap_neighbour_property(pairs, tau, seed, pick):
    """For any data, tau, seed and removed user: every other user's capped profile is unchanged."""
    pairs = sorted(pairs, key=lambda p: hash((p, seed)) % 1009)  # an arbitrary file order
    raw_u, raw_i = [p[0] * 3 + 1 for p in pairs], [p[1] for p in pairs]
    ds, train = load_raw(raw_u, raw_i, tau=tau, seed=seed)
    full = capped_profiles(ds, train)
    victim = sorted(set(raw_u))[pick % len(set(raw_u))]
    keep = [k for k, u in enumerate(raw_u) if u != victim]
    if not keep:
        return
    ds2, train2 = load_raw([raw_u[k] for k in keep], [raw_i[k] for k in keep], tau=tau, seed=seed)
    assert capped_profiles(ds2, train2) == {u: v for u, v in full.items() if u != victim}
