"""Audit: the Clopper-Pearson bound against hand values, guesses, canaries, and tiny end-to-end audits."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import binom

from dprec_torch.audit.bounds import clopper_pearson_lower, epsilon_lower_bound, guesses
from dprec_torch.audit.canaries import make_canaries
from dprec_torch.errors import ConfigError
from tests.helpers import tiny_cfg, tiny_fold


def test_clopper_pearson_hand_values():
    # all r correct: P[Bin(r, p) >= r] = p^r = alpha  =>  p_lo = alpha^(1/r)
    assert clopper_pearson_lower(20, 20, 0.05) == pytest.approx(0.05 ** (1 / 20), rel=1e-12)
    assert epsilon_lower_bound(20, 20, 0.05) == pytest.approx(math.log(0.05 ** 0.05 / (1 - 0.05 ** 0.05)), rel=1e-12)
    # 1 of 1: p_lo = alpha
    assert clopper_pearson_lower(1, 1, 0.1) == pytest.approx(0.1)
    # 8 of 10 at alpha = 0.05: solve P[Bin(10, p) >= 8] = 0.05 by bisection, independently of scipy's beta
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if binom.sf(7, 10, mid) < 0.05 else (lo, mid)
    assert clopper_pearson_lower(8, 10, 0.05) == pytest.approx(lo, abs=1e-10)
    assert clopper_pearson_lower(8, 10, 0.05) == pytest.approx(0.4930987, abs=1e-7)  # pinned
    assert epsilon_lower_bound(0, 10, 0.05) == 0.0 and epsilon_lower_bound(5, 10, 0.05) == 0.0


def test_guesses_count_top_in_and_bottom_out():
    scores = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0, 0.0]])
    inc = torch.tensor([[True, False, True, False, True, False]])
    assert guesses(scores, inc, 2) == (2, 4)  # top-2: in, out (1 right); bottom-2: in, out (1 right)
    assert guesses(scores, torch.tensor([[True, True, False, False, False, False]]), 2) == (4, 4)


def test_canaries_are_distinct_rare_and_included_on_demand():
    train = tiny_fold().train
    for kind in ("user", "rating"):
        c = make_canaries(train, 6, kind, history=3, seed=1)
        assert c.base.n_items == train.n_items + 6
        assert torch.equal(torch.unique(c.target_item), c.target_item)
        none = c.dataset(torch.zeros(6, dtype=torch.bool))
        allc = c.dataset(torch.ones(6, dtype=torch.bool))
        assert len(none) == len(train)
        assert len(allc) == len(train) + (6 * 4 if kind == "user" else 6)
        assert int((allc.items >= train.n_items).sum()) == 6  # only the canary owners rate canary items
    with pytest.raises(ConfigError, match="canary"):
        make_canaries(train, 4, "item")


def test_tiny_audit_runs_and_finds_the_nonprivate_leak(tmp_path):
    """mechanism=none keeps exact item means: the canary item's mean is 5 exactly when it was trained on."""
    from scripts import audit

    cfg = tiny_cfg("mechanism=none", "mechanism.epochs=1", "audit.trials=2", "audit.canaries=10", "audit.canary=rating",
                   f"output_dir={tmp_path}", config_name="audit")
    r = audit.audit(cfg)
    assert (tmp_path / "audit.json").exists()
    assert r["correct"] == r["guesses"] == 2 * 2 * 2  # k = round(0.25 * 10) = 2 per side, 2 trials
    assert r["epsilon_lower_bound"] == pytest.approx(epsilon_lower_bound(8, 8, 0.05))
    for key in ("epsilon_claimed", "epsilon_lower_bound", "alpha", "trials", "mechanism"):
        assert key in r


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", ["dpsgd_l1", "gaussian"])
def test_provable_mechanisms_audit_below_their_epsilon(mechanism, tmp_path):
    """Done-when: at eps = 1 the empirical lower bound of the provable variants is <= 1."""
    from scripts import audit

    cfg = tiny_cfg(f"mechanism={mechanism}", "epsilon=1", "audit.trials=20", f"output_dir={tmp_path}", config_name="audit")
    r = audit.audit(cfg)
    assert r["epsilon_claimed"] == pytest.approx(1.0, rel=0.01)
    assert r["epsilon_lower_bound"] <= 1.0


def test_edge_canaries_sit_at_the_floor_and_at_tau():
    """Edge designs: `floor` canaries have D = C exactly at S = s0 (1 - I); `tau` canaries exactly tau ratings."""
    from dprec_torch.audit.canaries import canary_history
    from dprec_torch.models.batching import make_batch
    from dprec_torch.models.pnbm import PNBM

    train = tiny_fold().train
    h = canary_history("floor", 5, floor_c=10.0, init_value=1.0)
    assert h == 10
    c = make_canaries(train, 4, "floor", history=h, seed=2)
    data = c.dataset(torch.ones(4, dtype=torch.bool))
    model = PNBM(data.n_items, floor_c=10.0).attach(data)
    with torch.no_grad():
        model.S.fill_(1.0)
        model.S.fill_diagonal_(0.0)
    owners = torch.zeros(data.n_users, dtype=torch.bool)
    owners[c.target_user] = True
    batch = make_batch(data, model.item_means, owners[data.users], owners)
    _, raw, active = model.denominator_terms(batch)
    assert torch.all(raw == 10.0) and bool(active.all())  # every canary target sits exactly on the floor
    t = make_canaries(train, 4, "tau", history=canary_history("tau", 5, tau=12), seed=2)
    assert torch.all(t.dataset(torch.ones(4, dtype=torch.bool)).user_counts()[t.target_user] == 12)
    with pytest.raises(ConfigError, match="max_user_ratings"):
        canary_history("tau", 5, tau=None)
    with pytest.raises(ConfigError, match="whole number"):
        canary_history("floor", 5, floor_c=10.0, init_value=3.0)


def test_tau_audit_applies_the_cap_as_train_py_does(tmp_path, caplog):
    """The audit trains through setup_training, so mechanism.max_user_ratings caps the data (the old
    train_once ignored the cap); tau canaries are kept whole."""
    import logging

    from scripts import audit

    cfg = tiny_cfg("mechanism=dpsgd_l1", "epsilon=1", "audit.trials=1", "audit.canaries=4", "audit.canary=tau",
                   "mechanism.max_user_ratings=8", f"output_dir={tmp_path}", config_name="audit")
    with caplog.at_level(logging.INFO, logger="dprec_torch.training.run"):
        r = audit.audit(cfg)
    assert r["canary_kind"] == "tau" and r["guesses"] == 2
    assert any("tau=8" in rec.getMessage() for rec in caplog.records)
