"""Accountant values pinned: Laplace composition, exact subsampling amplification, Opacus calls, calibration."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opacus.accountants import RDPAccountant

from dprec_torch.errors import ConfigError
from dprec_torch.privacy import analysis as A
from dprec_torch.privacy import calibration as C
from dprec_torch.privacy.accountants import PureDPAccountant


def test_exact_amplification_pinned():
    assert A.amplified_epsilon(1.0, 0.1) == pytest.approx(0.1585650787404291, rel=1e-14)  # ln(1 + 0.1 (e - 1))
    assert A.amplified_epsilon(2.0, 1.0) == 2.0
    assert A.amplified_epsilon(10.0, 0.01) == pytest.approx(math.log(1 + 0.01 * (math.exp(10) - 1)))
    assert A.amplified_epsilon(0.5, 0.2) < 0.5  # amplification helps
    assert A.amplified_epsilon(5.0, 0.2) > 0.2 * 5.0  # ... but Theorem 1's linear q eps UNDER-states large eps


def test_basic_composition_with_reserved_and_group_pinned():
    # 0.5 + 2 * 10 * ln(1 + 0.1 (e^0.3 - 1))
    expect = 0.5 + 2 * 10 * math.log1p(0.1 * math.expm1(0.3))
    assert A.composed_epsilon(0.3, 0.1, 10, reserved=0.5, group=2) == pytest.approx(expect, rel=1e-14)
    assert A.laplace_step_epsilon(1.0, 10, 0.1) == pytest.approx(0.7186731924870722, rel=1e-12)
    acc = PureDPAccountant()
    acc.step(0.7186731924870722, 0.1, steps=10)
    assert acc.get_epsilon() == pytest.approx(1.0, rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(total=st.floats(0.01, 50), steps=st.integers(1, 5000), q=st.floats(1e-4, 1.0),
       frac=st.floats(0.0, 0.95), group=st.sampled_from([1, 2]))
def test_calibrated_laplace_never_overshoots(total, steps, q, frac, group):
    """Property: the per-step eps solved from the target composes back to it, never above it."""
    reserved = frac * total
    eps_s = A.laplace_step_epsilon(total, steps, q, reserved, group)
    got = A.composed_epsilon(eps_s, q, steps, reserved, group)
    assert got <= total * (1 + 1e-9)
    assert got == pytest.approx(total, rel=1e-7)


def test_nothing_left_for_the_steps_is_a_config_error():
    with pytest.raises(ConfigError, match="leaves nothing"):
        A.laplace_step_epsilon(1.0, 5, 0.1, reserved=1.0)


def test_opacus_rdp_and_prv_pinned():
    assert C.gaussian_epsilon([(1.0, 0.01, 1000)], 1e-5) == pytest.approx(2.1013652716430564, rel=1e-9)
    ref = RDPAccountant()
    ref.history = [(1.0, 0.01, 1000)]
    assert C.gaussian_epsilon([(1.0, 0.01, 1000)], 1e-5) == pytest.approx(ref.get_epsilon(1e-5), rel=1e-12)
    assert C.gaussian_epsilon([(1.0, 0.01, 1000)], 1e-5, "prv") == pytest.approx(1.8383716376346455, rel=1e-3)
    # a one-off release (q = 1) composes in the same accountant and costs something
    assert C.gaussian_epsilon([(5.0, 1.0, 2), (1.0, 0.01, 1000)], 1e-5) == pytest.approx(2.408779807685216, rel=1e-9)


@pytest.mark.parametrize("target,q,steps,prior", [(1.0, 0.5, 2, [(8.0, 1.0, 2)]), (5.0, 0.1, 30, []), (0.5, 1.0, 1, [])])
def test_calibrate_hits_the_target_from_below(target, q, steps, prior):
    sigma = C.calibrate_gaussian(target, 1e-6, q, steps, prior=prior).sigma
    eps = C.gaussian_epsilon(prior + [(sigma, q, steps)], 1e-6)
    assert eps <= target
    assert eps >= target * 0.99


def test_paper_dpsgd_whole_update_analysis():
    a = A.analyse_dpsgd_paper(epsilon=1.0, steps=1, q=1.0, phi=4.0, floor_c=10.0, max_profile=3)
    assert a.sensitivity["ratio_whole_to_paper"] == 12  # 2 n (n - 1) with n = 3
    assert a.epsilon == math.inf  # exact item means are released
    assert a.extra["per_step_epsilon_true"] == pytest.approx(12.0)
    assert a.extra["epsilon_upper_bound_with_public_means"] == pytest.approx(12.0)
    assert a.claimed == 1.0
    b = A.analyse_dpsgd_paper(1.0, 10, 0.1, 4.0, 10.0, 3, item_means_private=True)
    assert b.epsilon == pytest.approx(10 * A.amplified_epsilon(2 * 3 * 2 * 1.0 / (0.1 * 10), 1 - 0.9**3))


def test_dpsgd_l1_and_gaussian_analyses():
    a = A.analyse_dpsgd_l1(1.0, 4, 0.5, clip_norm=2.0, mean_epsilon=0.5)
    assert a.epsilon == pytest.approx(1.0) and a.relation == "user" and a.sensitivity["add_remove"] == 2.0
    d = a.as_dict()
    assert d["epsilon_step"] == pytest.approx(math.log1p(math.expm1(0.5 / 4) / 0.5))
    r = A.analyse_dpsgd_l1(1.0, 4, 0.5, 2.0, 0.5, relation="rating")
    assert r.sensitivity["group_factor"] == 2 and r.extra["epsilon_step"] < d["epsilon_step"]
    # the Gaussian mechanisms' accountant (sigma 1, q 0.01, 1000 steps, delta 1e-5; Opacus RDP)
    assert C.gaussian_epsilon([(1.0, 0.01, 1000)], 1e-5) == pytest.approx(2.1013652716430564, rel=1e-9)
