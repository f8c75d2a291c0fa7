"""The epsilon a user types is the epsilon they get.

``mechanism=sgld`` and ``mechanism=dpsgd`` are the provable forms whose reported epsilon equals the typed
one; Wang & Tang's forms as printed are one explicit choice away (``sgld_paper``, ``dpsgd_paper``) and say
plainly that they defend nothing for PNBM. Also pinned here: the SGLD log-likelihood bound B follows the
model's real error range (PNBM reaches |e| = 2 phi, so the paper's B = phi^2 tau understates the sample's
epsilon 4x), and the per-epoch log line says what its epsilon figures cover.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
import torch

from dprec_torch.data.ratings import RatingScale
from dprec_torch.mechanisms.context import TrainingContext
from dprec_torch.mechanisms.sgld import ScaledPosteriorSGLD, error_bound
from dprec_torch.models.batching import full_batch
from dprec_torch.models.pnbm import PNBM
from dprec_torch.training.run import train
from tests.helpers import tiny_cfg, tiny_fold, toy_ratings

pytestmark = pytest.mark.filterwarnings("ignore:Optimal order is the largest alpha")
BASE = ["data=synthetic", "device=cpu", "compare_baselines=false", "tensorboard=false", "mechanism.epochs=1"]


def compose_cfg(tmp_path: Path, *overrides: str):
    return tiny_cfg(*BASE, f"output_dir={tmp_path}", *overrides)


@pytest.mark.parametrize("mechanism,model,eps", [("dpsgd", "pnbm", 1.0), ("dpsgd", "mf", 1.0), ("dpsgd_paper", "mf", 5.0)])
def test_reported_epsilon_is_the_typed_epsilon(tmp_path, mechanism, model, eps):
    m = train(compose_cfg(tmp_path, f"mechanism={mechanism}", f"model={model}", f"epsilon={eps:g}"))
    assert m["epsilon"] == eps and m["mechanism"] == mechanism
    assert m["privacy"]["epsilon"] == pytest.approx(eps, rel=1e-9)
    assert math.isfinite(m["test_rmse"])


@pytest.mark.parametrize("model", ["pnbm", "mf"])
def test_sgld_defends_no_epsilon_while_the_chain_is_unaccounted(tmp_path, model):
    """The posterior-sampling argument gives (eps, (1 + e^eps) delta) with delta the chain's distance
    from the posterior (~1 after 20 steps), so no epsilon is printed; the exact-sample figure sits beside it."""
    m = train(compose_cfg(tmp_path, "mechanism=sgld", f"model={model}", "epsilon=20"))
    rep = m["privacy"]
    assert rep["epsilon"] is None and rep["delta"] is None and "not established" in rep["delta_note"]
    assert rep["epsilon_if_exact_sample"] == pytest.approx(20.0, rel=1e-9)
    assert all(math.isinf(r["epsilon_spent"]) for r in m["history"][1])


def test_sgld_default_is_rho_1_with_dp_item_means_and_says_delta_is_not_established(tmp_path):
    m = train(compose_cfg(tmp_path, "mechanism=sgld", "model=pnbm", "epsilon=20"))
    rep = m["privacy"]
    assert rep["relation"] == "user" and rep["temperature"] == 1.0
    assert rep["delta"] is None and "not established" in rep["guarantee"] and "EXACT sample" in rep["guarantee"]
    assert rep["epsilon_item_means"] == pytest.approx(0.9 * 20) and rep["epsilon_sample"] == pytest.approx(0.1 * 20)
    assert rep["item_means"]["epsilon"] == pytest.approx(18.0) and rep["item_means"]["relation"] == "user"
    assert rep["sensitivity"]["error_bound_e_max"] == 8.0  # PNBM on a 1-5 scale: 2 phi
    assert rep["prior"]["H_correction"] is False  # H is built from item counts: not data-independent


def test_paper_forms_are_one_explicit_choice_away(tmp_path):
    sg = train(compose_cfg(tmp_path / "s", "mechanism=sgld_paper", "model=pnbm", "epsilon=20"))["privacy"]
    assert sg["epsilon"] is None and sg["temperature"] == 0.004
    # the sample of S alone: eps/rho, times (2 phi / phi)^2 because PNBM's error reaches 2 phi
    assert sg["epsilon_for_sample_only"] == pytest.approx(20 / 0.004 * 4)
    assert "exact training item means" in sg["analysis"]
    dp = train(compose_cfg(tmp_path / "d", "mechanism=dpsgd_paper", "model=pnbm", "epsilon=1"))["privacy"]
    assert dp["epsilon"] is None and dp["epsilon_claimed_by_paper"] == 1.0


def test_tuned_files_tune_numbers_never_the_class(tmp_path):
    for mechanism, target in (("dpsgd", "dprec_torch.mechanisms.dpsgd.ClippedLaplaceDPSGD"),
                              ("dpsgd_paper", "dprec_torch.mechanisms.dpsgd_paper.DPSGDLaplace"),
                              ("sgld", "dprec_torch.mechanisms.sgld.ScaledPosteriorSGLD"),
                              ("sgld_paper", "dprec_torch.mechanisms.sgld.ScaledPosteriorSGLD")):
        for model in ("pnbm", "mf"):
            cfg = compose_cfg(tmp_path, f"mechanism={mechanism}", f"model={model}")
            # no tuned file swaps the class (DPSGD-MF trains MF under this key: the table dprec_torch.forms.FORMS)
            assert cfg.mechanism._target_ == target and cfg.mechanism.name == mechanism, (mechanism, model)
    assert compose_cfg(tmp_path, "mechanism=sgld").mechanism.temperature == 1.0
    assert compose_cfg(tmp_path, "mechanism=sgld_paper").mechanism.temperature == 0.004


def test_pnbm_training_error_reaches_twice_the_scale():
    """Eq. (2): r_hat = r_bar_i + a weighted average of centred ratings, so |e| can reach 2 phi > phi."""
    # item 0: everyone else rated it 5 (r_bar_0 = 5); item 1: everyone else rated it 1 (r_bar_1 = 1)
    rows = [[1, 5], [5, 1], [5, 1], [5, 1], [5, 1], [5, 1], [5, 1], [5, 1], [5, 1]]
    train_r = toy_ratings(rows)
    model = PNBM(2, floor_c=0.01, n_neighbors=10).attach(train_r)
    with torch.no_grad():
        model.item_means.copy_(torch.tensor([5.0, 1.0]))  # the extreme means a DP release may produce
        model.S.fill_(1.0).fill_diagonal_(0.0)
    batch = full_batch(train_r, model.item_means)
    err = (model.batch_predict(batch) - batch.values).detach().abs().max()
    span = RatingScale(1, 5).span
    assert float(err) > span  # B = phi^2 tau does not bound this user's log-likelihood
    assert float(err) <= error_bound(model, span) == 2 * span


def pnbm_context(fold, model) -> TrainingContext:
    return TrainingContext(total_steps=3, steps_per_epoch=1, n_ratings=len(fold.train), n_users=fold.train.n_users,
                           scale=fold.train.scale, max_user_ratings=200, model=model)


def test_sgld_prior_is_centred_at_the_start_with_precision_kappa():
    fold = tiny_fold()
    model = PNBM(fold.train.n_items).attach(fold.train)
    opt = ScaledPosteriorSGLD(model.parameters(), pnbm_context(fold, model), epsilon=4.0, lr=0.04, temperature=1.0,
                              likelihood_bound="model", prior_correction=False, prior_kappa=25.0, prior_mean=1.0, weight_decay=0.0,
                              init="constant", init_value=0.5, mean_fraction=0.5, seed=0)
    opt.prepare(model)  # the DP item means, then the start S_0
    assert opt.posterior_scale * opt.param_groups[0]["weight_decay"] == pytest.approx(25.0)  # lambda = kappa 4B / eps_s
    assert opt.delivered_epsilon() == pytest.approx(4.0) and opt.privacy_report()["epsilon_if_exact_sample"] == pytest.approx(4.0)
    off = ~torch.eye(fold.train.n_items, dtype=torch.bool)
    assert bool((model.S.detach()[off] == 0.5).all())  # the data-independent start S_0
    model.S.grad = torch.zeros_like(model.S)
    opt.step()
    # zero likelihood gradient: S - 1 shrinks by (1 - eta kappa / 2) towards the prior centre 1, plus N(0, eta) noise
    moved = model.S.detach()[off]
    assert moved.mean().item() == pytest.approx(1 - 0.5 * (1 - 0.04 * 25 / 2), abs=0.01)
    assert moved.std().item() == pytest.approx(0.04 ** 0.5, rel=0.05)
    assert not torch.equal(model.item_means, fold.train.item_means())  # the DP release replaced the exact means


def test_epoch_log_says_what_its_epsilon_covers(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="dprec_torch.training.trainer"):
        train(compose_cfg(tmp_path / "a", "mechanism=sgld", "model=pnbm", "epsilon=20"))
        train(compose_cfg(tmp_path / "b", "mechanism=dpsgd_paper", "model=pnbm", "epsilon=1"))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("epoch")]
    assert any("defended eps of the released model: none (user level)" in line for line in lines)
    assert any("defended eps of the released model: none (rating level)" in line for line in lines)
    assert all("eps spent so far" in line for line in lines)


def test_lambda_is_set_once(tmp_path):
    """``prior_kappa`` sets lambda = kappa 4B / eps_s; a typed ``weight_decay`` must not be silently replaced."""
    from dprec_torch.errors import ConfigError

    with pytest.raises(ConfigError, match="prior_kappa=null"):
        train(compose_cfg(tmp_path, "mechanism=sgld", "model=mf", "epsilon=10", "mechanism.weight_decay=32000"))
    m = train(compose_cfg(tmp_path, "mechanism=sgld", "model=mf", "epsilon=10", "mechanism.weight_decay=32000",
                          "mechanism.prior_kappa=null"))
    assert m["privacy"]["prior"]["weight_decay_lambda"] == 32000 and m["privacy"]["epsilon_if_exact_sample"] == pytest.approx(10)
