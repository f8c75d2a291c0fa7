"""Sensitivity harness: every registered mechanism's stated sensitivity survives adversarial neighbours.

For every case of :mod:`dprec_torch.privacy_harness.registry` (built-ins: :mod:`dprec_torch.privacy_harness.sensitivity_cases`),
hypothesis draws tiny datasets built to sit on the edges -- users whose D is exactly the floor C (4 ratings
at S = 1, 7 at S = 0.5), users at exactly tau and tau + 1, a single user, empty users, ties, only extreme
ratings -- and checks on what the mechanism's own code releases that
  (a) every materialised per-unit clipped contribution has norm <= c, and they sum to the release;
  (b) removing one unit (or changing one rating's value, when the relation covers it) moves the released
      pre-noise aggregate by at most the sensitivity the mechanism object states.
Neighbours: a removed user is also tried with the id map REBUILT as the loader would (contiguous
ids shift; every dataset carries raw-id keys in ``meta`` as ``build_dataset`` stores them), and a changed rating
is tried at every value of the scale, not only the extreme.
Then: every mechanism class is registered or declared non-private.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import dprec_torch
from dprec_torch.data.preprocess import ITEM_KEYS, USER_KEYS, stable_id_keys
from dprec_torch.data.ratings import Ratings, RatingScale
from dprec_torch.mechanisms.base import MechanismOptimizer
from dprec_torch.privacy_harness import registry
from dprec_torch.privacy_harness.registry import SensitivityCase

SCALE = RatingScale(1, 5)
VALUES = (1.0, 5.0, 3.0, 1.0, 5.0, 2.0, 4.5)  # extremes twice as likely; ties are frequent
SCALE_VALUES = (1.0, 2.0, 3.0, 4.0, 5.0)  # a changed rating is tried at each of them
REBUILT = "ids rebuilt"  # a neighbour whose id map the loader rebuilt (contiguous user ids shift)
TOL = 1e-5
NON_FINITE = (float("nan"), float("inf"), -float("inf"))  # a score entry may be any float

CASES = [case for builder in registry.registered_classes().values() for case in builder()]
HARNESS = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def p_norm(x: torch.Tensor, p: float) -> torch.Tensor:
    if x.shape[-1] == 0:  # nothing released
        return torch.zeros(x.shape[:-1], dtype=torch.float64)
    return torch.linalg.vector_norm(x.double(), ord=p, dim=-1)


@st.composite
def edge_datasets(draw, max_items: int, tau: int | None) -> Ratings:
    """1-5 users over 2..max_items items; profile sizes favour the floor (4, 7), tau, tau + 1, 0, 1 and all items."""
    m = draw(st.integers(2, max_items))
    n_users = draw(st.integers(1, 5))
    special = [0, 1, 4, 7, m] + ([tau, tau + 1] if tau else [])
    users, items, values = [], [], []
    for u in range(n_users):
        size = min(m, draw(st.sampled_from(special) | st.integers(0, m)))
        its = draw(st.permutations(list(range(m))))[:size]
        const = draw(st.booleans())  # a constant profile (all 1s or all 5s): zero centred variance
        vals = [draw(st.sampled_from((1.0, 5.0)))] * size if const else \
            draw(st.lists(st.sampled_from(VALUES), min_size=size, max_size=size))
        users += [u] * size
        items += its
        values += vals
    # raw ids, keyed as build_dataset keys them (the tau cap and per-user samples read these, not the contiguous ids)
    raw_users = draw(st.lists(st.integers(0, 10**6), min_size=n_users, max_size=n_users, unique=True))
    meta = {USER_KEYS: stable_id_keys(raw_users), ITEM_KEYS: stable_id_keys([f"item-{j}" for j in range(m)])}
    return Ratings(torch.tensor(users, dtype=torch.long), torch.tensor(items, dtype=torch.long),
                   torch.tensor(values, dtype=torch.float32), n_users, m, SCALE, meta)


def without(data: Ratings, keep: torch.Tensor) -> Ratings:
    return Ratings(data.users[keep], data.items[keep], data.values[keep], data.n_users, data.n_items, data.scale,
                   dict(data.meta))


def rebuilt(data: Ratings, user: int) -> Ratings:
    """``data`` without ``user``, its id map rebuilt as the loader would: later users shift down by one."""
    keep = data.users != user
    meta = dict(data.meta)
    if USER_KEYS in meta:
        meta[USER_KEYS] = torch.cat([meta[USER_KEYS][:user], meta[USER_KEYS][user + 1:]])
    users = data.users[keep]
    return Ratings(users - (users > user).long(), data.items[keep], data.values[keep], data.n_users - 1, data.n_items,
                   data.scale, meta)


def changed(data: Ratings, index: int, value: float | None = None) -> Ratings:
    v = data.values.clone()
    if value is None:
        value = SCALE.lo if float(v[index]) > (SCALE.lo + SCALE.hi) / 2 else SCALE.hi  # the largest change
    v[index] = value
    return Ratings(data.users, data.items, v, data.n_users, data.n_items, data.scale, dict(data.meta))


def neighbours(case: SensitivityCase, data: Ratings, draw) -> list[tuple[str, Ratings]]:
    """Up to three neighbours of ``data`` under the case's relation, chosen by hypothesis."""
    out = []
    n = len(data)
    if case.relation == "user":
        for u in draw(st.lists(st.integers(0, data.n_users - 1), min_size=1, max_size=2, unique=True)):
            out.append((f"remove user {u}", without(data, data.users != u)))
            if data.n_users > 1:
                out.append((f"remove user {u}, {REBUILT}", rebuilt(data, u)))
    elif n:
        picks = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=2, unique=True))
        for k in picks:
            if case.relation == "rating":
                out.append((f"remove rating {k}", without(data, torch.arange(n) != k)))
                u = int(data.users[k])
                if int((data.users == u).sum()) == 1 and data.n_users > 1:  # the user's last rating: u leaves the id map
                    out.append((f"remove rating {k} (user {u}'s last), {REBUILT}", rebuilt(data, u)))
            if case.relation == "rating_value" or case.also_change:
                for value in SCALE_VALUES:
                    if value != float(data.values[k]):
                        out.append((f"change rating {k} to {value:g}", changed(data, k, value)))
            if case.relation == "score_entry":  # the case maps rating k to one score entry: any new value, or the default
                for value in (draw(st.sampled_from(VALUES + (3.0,))), SCALE.lo, SCALE.hi, *NON_FINITE):
                    out.append((f"set entry of rating {k} to {value}", changed(data, k, value)))
                out.append((f"reset entry of rating {k}", without(data, torch.arange(n) != k)))
    return out


def check_case(case: SensitivityCase, data: Ratings, seed: int, draw) -> bool:
    """Checks (a) and (b) on ``data``; False when the mechanism refuses ``data`` (nothing released)."""
    base = case.release(data, seed, True)
    if base is None:
        return False
    # what the noise is calibrated to: the mechanism object's own figure where it states one
    claimed = case.claimed(data.n_items)
    bound = base.stated if base.stated is not None else claimed
    if base.units is not None and base.units.numel():
        assert torch.allclose(base.units.sum(0), base.total, atol=1e-5, rtol=1e-4), f"{case.name}: units do not add up"
        if case.clip_bound is not None:
            norms = p_norm(base.units, case.norm)
            assert float(norms.max()) <= case.clip_bound * (1 + TOL) + 1e-7, \
                f"{case.name}: a clipped contribution has norm {float(norms.max()):.6g} > c = {case.clip_bound}"
    for what, other in neighbours(case, data, draw):
        rel = case.release(other, seed, False)
        if rel is None:
            continue
        if REBUILT in what and rel.total.shape != base.total.shape:
            continue  # the release has a row per user (MF's user factors): no entry-wise comparison exists
        moved = float(p_norm(rel.total - base.total, case.norm))
        assert moved <= bound * (1 + TOL) + 1e-6, \
            f"{case.name}: {what} moved the release by {moved:.6g} > the stated sensitivity {bound}"
    assert bound == pytest.approx(claimed), f"{case.name}: the mechanism states {bound}, the case {claimed}"
    return True


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_stated_sensitivity_holds_on_adversarial_neighbours(case):
    @HARNESS
    @given(data=st.data(), seed=st.integers(0, 5))
    def run(data, seed):
        assume(check_case(case, data.draw(edge_datasets(case.max_items, case.tau)), seed, data.draw))

    run()


# ---------------------------------------------------------------- the D = C floor, deterministically
def floor_dataset() -> Ratings:
    """Users of exactly 4 ratings (D = C = 3 at S = 1), extreme and tied values, plus a 1-rating user."""
    rows = [(0, [0, 1, 2, 3], [5, 1, 5, 1]), (1, [1, 2, 3, 4], [5, 5, 5, 5]), (2, [0, 2, 4, 5], [1, 5, 2, 5]),
            (3, [5], [5])]
    u = [r for r, its, _ in rows for _ in its]
    i = [j for _, its, _ in rows for j in its]
    v = [float(x) for _, _, vals in rows for x in vals]
    return Ratings(torch.tensor(u), torch.tensor(i), torch.tensor(v), 4, 6, SCALE)


def pnbm_user_cases():
    """The full-S PNBM cases (the floor D = C is a property of Eq. (2)'s denominator; the low-rank form divides by
    sqrt(n_u) and has its own clip cases in tests/models/test_pnbm_lowrank.py)."""
    return [c for c in CASES if "pnbm" in c.name and "lowrank" not in c.name and c.relation == "user"
            and c.clip_bound is not None and c.tau is None]


@pytest.mark.parametrize("case", pnbm_user_cases(), ids=lambda c: c.name)
def test_every_user_at_the_floor_is_clipped_to_c(case):
    from dprec_torch.privacy_harness import sensitivity_cases as sc

    data = floor_dataset()
    assert float(sc.public_S(6, 0).sum(1)[0]) == 5.0  # seed 0: constant S = 1, so D = 3 = C for 4-rating users
    rel = case.release(data, 0, True)
    norms = p_norm(rel.units, case.norm)
    assert float(norms.max()) <= case.clip_bound * (1 + TOL)
    assert float(norms.max()) >= case.clip_bound * (1 - 1e-3)  # the floor users really are clipped (not vacuous)


def test_harness_catches_a_gradient_that_disagrees_with_the_norm_at_the_floor(monkeypatch):
    """Mutation check (the floor's kink): a released gradient whose floor drops the |s| term at
    D = C (autograd's `>` at the kink) while the clipped norm keeps it ([D >= C]) must fail check (a): the
    floor users' released contributions then exceed c. So the harness can fail on that bug."""
    from dprec_torch.models import pnbm

    def strict(raw, active, floor_c):  # forward value unchanged, derivative 0 at D = C
        return pnbm.FlooredDenominator.apply(raw, raw.detach() > floor_c, float(floor_c))

    monkeypatch.setattr(pnbm, "floored", strict)
    for case in [c for c in pnbm_user_cases() if c.release.__qualname__.startswith("_dpsgd_l1")][:1] + \
            [c for c in pnbm_user_cases() if c.norm == 2][:1]:
        with pytest.raises(AssertionError, match="clipped contribution"):
            check_case(case, floor_dataset(), 0, lambda s: [0])


# ---------------------------------------------------------------- registration is enforced
def _all_modules():
    for info in pkgutil.walk_packages(dprec_torch.__path__, "dprec_torch."):
        if info.name.startswith(("dprec_torch.mechanisms", "dprec_torch.predictors")):
            importlib.import_module(info.name)


def _subclasses(cls):
    out, todo = set(), [cls]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in out:
                out.add(sub)
                todo.append(sub)
    return out


# Classes whose privacy_report can print a finite epsilon but that have no harness case yet: registry.PENDING
# (``module.Class``; check_claim lets them run with a warning). Registering a class must remove it (checked below).
PENDING = registry.PENDING


def _reporting_classes() -> dict[str, type]:
    """Every dprec_torch class (mechanisms, predictors) that defines or inherits a privacy_report."""
    _all_modules()
    out = {}
    for name, mod in list(sys.modules.items()):
        if name.startswith(("dprec_torch.predictors", "dprec_torch.mechanisms")) and mod is not None:
            for cname, cls in inspect.getmembers(mod, inspect.isclass):
                if cls.__module__ == name and callable(getattr(cls, "privacy_report", None)):
                    out[cname] = cls
    return out


def test_every_mechanism_and_predictor_is_harnessed_declared_or_pending():
    """A class that reports privacy is registered (harnessed), declared non-private, or a listed known gap."""
    reg, nonpriv = registry.registered_classes(), registry.non_private_classes()
    classes = _reporting_classes()
    for sub in _subclasses(MechanismOptimizer) | {MechanismOptimizer}:
        if sub.__module__.startswith("dprec_torch"):
            classes[sub.__name__] = sub
    missing = sorted(n for n, c in classes.items()
                     if c not in reg and c not in nonpriv and registry.qualified_name(c) not in PENDING)
    assert not missing, f"classes that report privacy with no sensitivity harness: {missing} (see privacy_harness/registry.py)"
    assert not {registry.qualified_name(c) for c in reg} & set(PENDING), \
        "a registered class is still listed in registry.PENDING: remove it"
    assert set(PENDING) <= {registry.qualified_name(c) for c in classes.values()}, "a PENDING entry names no class"


def test_declared_non_private_predictors_report_no_finite_epsilon():
    """The non-private declarations are checked, not trusted: fit each on tiny data, its epsilon must be inf/None."""
    from tests.helpers import tiny_fold

    train = tiny_fold().train
    checked = 0
    for cls in registry.non_private_classes():
        if issubclass(cls, MechanismOptimizer):
            continue
        pred = cls()
        pred = pred.fit(train) if hasattr(pred, "fit") else pred
        eps = pred.privacy_report().get("epsilon")
        assert eps is None or eps == float("inf"), f"{cls.__name__} is declared non-private but reports {eps}"
        checked += 1
    assert checked >= 4


def test_check_claim_refuses_a_finite_epsilon_without_a_harness():
    from dprec_torch.errors import ConfigError

    class Unregistered:
        pass

    registry.check_claim(Unregistered(), {"epsilon": float("inf")})
    registry.check_claim(Unregistered(), {"epsilon": None})
    with pytest.raises(ConfigError, match="no sensitivity harness"):
        registry.check_claim(Unregistered(), {"epsilon": 1.0})


# ---------------------------------------------------------------- the fitted predictors' cases can fail
def _case(prefix: str) -> SensitivityCase:
    return next(c for c in CASES if c.name.startswith(prefix))


def test_harness_catches_an_exponent_that_overstates_the_topk_epsilon(monkeypatch):
    """Mutation: a sampler exponent of eps f / Delta (the eps/2 of Eq. (28) dropped) moves the utility it implies by
    2 Delta for one score entry; check (b) must fail on the exponential_topk case."""
    from dprec_torch.mechanisms import exponential_topk as et

    data = Ratings(torch.tensor([0, 0]), torch.tensor([0, 1]), torch.tensor([5.0, 1.0]), 1, 3, SCALE)
    draw = lambda s: [0] if "lists" in repr(s) else 1.0  # noqa: E731  (entry of rating 0: 7 -> -1, clipped 5 -> 1)
    assert check_case(_case("exponential_topk default"), data, 0, draw)  # Eq. (28) as implemented holds...
    real = et.topk_log_weights
    monkeypatch.setattr(et, "topk_log_weights", lambda s, e, eps, d: real(s, e, 2 * eps, d))
    with pytest.raises(AssertionError, match="moved the release"):
        check_case(_case("exponential_topk default"), data, 0, draw)  # ...the doubled exponent does not


def test_harness_catches_a_covariance_sensitivity_without_the_max_over_counts(monkeypatch):
    """Mutation: McSherry's covariance bound taken at c = 0 only (B^2, a user's first rating) is understated for a
    user who already has ratings; check (b) must catch it (a 6-rating user loses an extreme rating: ~2.8 B^2)."""
    from dprec_torch.predictors import mcsherry

    case = _case("mcsherry cov B=0.25 beta_p=1")
    data = Ratings(torch.zeros(6, dtype=torch.long), torch.tensor([1, 0, 4, 3, 2, 5]),
                   torch.tensor([5.0, 1.0, 3.0, 3.0, 3.0, 1.0]), 1, 6, SCALE)
    assert check_case(case, data, 1, lambda s: [0])  # the real bound holds...
    monkeypatch.setattr(mcsherry, "covariance_sensitivity", lambda b, alpha, beta_p, max_count: b * b)
    with pytest.raises(AssertionError, match="moved the release"):
        check_case(case, data, 1, lambda s: [0])  # ...the c = 0 bound does not


def test_mcsherry_stated_sensitivities_are_what_fit_calibrates_to():
    """The harness reads release_sensitivities(); fit must use exactly those figures for its noise."""
    from dprec_torch.predictors.mcsherry import McSherryMironov
    from tests.helpers import tiny_fold

    train = tiny_fold().train
    model = McSherryMironov(epsilon=1.0).fit(train)
    stated = model.release_sensitivities(train.scale, train.n_items)
    rep = model.privacy_report()["sensitivity"]
    assert model.sensitivities_ == stated and rep["cov_l2"] == stated["cov"] and rep["msum_l1"] == stated["msum"]


# ---------------------------------------------------------------- runtime enforcement (training/run.py)
@pytest.mark.parametrize("overrides", [("model=mcsherry", "epsilon=1"),
                                       ("model=slope_one", "mechanism=exponential_topk", "epsilon=1")],
                         ids=["mcsherry", "exponential_topk"])
def test_fit_fold_refuses_a_finite_epsilon_from_an_unregistered_predictor(monkeypatch, overrides):
    """fit_fold checks the claim before scoring: the same run passes registered and fails unregistered."""
    from dprec_torch.errors import ConfigError
    from dprec_torch.mechanisms.exponential_topk import ExponentialTopKRecommender
    from dprec_torch.predictors.mcsherry import McSherryMironov
    from dprec_torch.training.run import fit_fold
    from tests.helpers import tiny_cfg, tiny_fold

    cfg, fold = tiny_cfg("data=synthetic", "device=cpu", *overrides), tiny_fold()
    record = fit_fold(cfg, fold, torch.device("cpu"))
    assert record["privacy"]["epsilon"] == 1.0
    cls = McSherryMironov if "model=mcsherry" in overrides else ExponentialTopKRecommender
    registry.registered_classes()  # the built-ins are loaded before one is taken away
    monkeypatch.delitem(registry._BUILDERS, cls)
    with pytest.raises(ConfigError, match="no sensitivity harness"):
        fit_fold(cfg, fold, torch.device("cpu"))


def test_check_claim_lets_a_pending_class_run_with_a_warning(monkeypatch, caplog):
    from dprec_torch.errors import ConfigError

    class Gap:
        pass

    with pytest.raises(ConfigError):
        registry.check_claim(Gap(), {"epsilon": 2.0})
    monkeypatch.setitem(registry.PENDING, registry.qualified_name(Gap), "a known gap")
    registry.check_claim(Gap(), {"epsilon": 2.0})
    assert "known gap" in caplog.text
    with pytest.raises(ConfigError, match="must be a number"):
        registry.check_claim(Gap(), {"epsilon": "one"})
