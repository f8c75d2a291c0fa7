"""The low-rank PNBM (``model=pnbm model.similarity=lowrank``, S = U U^T): its equations (against autograd
and, by hypothesis, the clipped step's sensitivity on adversarial datasets), its mechanisms (``gaussian``, the clipped
``sgld`` chain, ``dpsgd``) and their calibration, the SGLD accountant against an independent one, the Trainer path
(train, kill + resume, ``evaluate.py``, ``load_run``) and a canary audit. (The former ``lowrank_dpsgd`` predictor's
tests, moved here with its equations.)"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dprec_torch
from dprec_torch.data.ratings import Ratings, RatingScale
from dprec_torch.config import check_config, form_node
from dprec_torch.errors import ConfigError
from dprec_torch.mechanisms.clipped_sgld import ClippedSGLD
from dprec_torch.models.batching import full_batch
from dprec_torch.models.pnbm import PNBM
from dprec_torch.models.pnbm_lowrank import LowRankPNBM, clipped_sum, per_user_gradients, user_aggregates, user_residuals
from dprec_torch.training import trainer as trainer_mod
from dprec_torch.training.run import setup_training, train
from tests.helpers import tiny_cfg, tiny_fold
from tests.predictors.test_noisy_gram import datasets

LOWRANK = ["model=pnbm", "model.similarity=lowrank", "model.rank=4"]
BASE = ["data=synthetic", "device=cpu", "compare_baselines=false", "tensorboard=false", *LOWRANK]
# the low-rank form's mechanism settings (small: 2 steps an epoch)
GAUSSIAN = ["mechanism=gaussian", "mechanism.lr=5", "mechanism.clip_norm=0.5", "mechanism.sampling_ratio=0.5",
            "mechanism.mean_fraction=0.5", "mechanism.epochs=2"]
# (the alias composes conf/tuned/sgld_pnbm.yaml, the full form's numbers: the clipped chain's own keys are typed; the
# posterior chain's keys of conf/mechanism/sgld.yaml are dropped, ClippedSGLD does not read them)
SGLD = ["mechanism=sgld", "mechanism.lr=5", "+mechanism.clip_norm=0.5", "mechanism.sampling_ratio=0.5",
        "mechanism.mean_fraction=0.5", "+mechanism.delta=${delta}", "+mechanism.accountant=rdp",
        "mechanism.weight_decay=0", "mechanism.epochs=2"]
DPSGD = ["mechanism=dpsgd", "mechanism.lr=5", "mechanism.clip_norm=0.5", "mechanism.sampling_ratio=0.5",
         "mechanism.mean_fraction=0.5", "mechanism.epochs=2"]
NONE = ["mechanism=none", "mechanism.lr=5", "mechanism.beta=1", "mechanism.weight_decay=0", "mechanism.epochs=2"]


def random_ratings(seed: int, n_users: int = 6, n_items: int = 9, density: float = 0.5) -> Ratings:
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(n_users, n_items, generator=gen) < density
    mask[:, 0] = True  # every user has a rating
    users, items = torch.nonzero(mask, as_tuple=True)
    values = torch.randint(1, 6, (users.numel(),), generator=gen).float()
    return Ratings(users, items, values, n_users, n_items, RatingScale(1, 5))


def bound_model(data: Ratings, seed: int = 0, rank: int = 3, init_std: float = 0.5) -> LowRankPNBM:
    model = LowRankPNBM(data.n_items, rank=rank, init_std=init_std, clamp_r=1.0, beta_p=2.0, seed=seed).attach(data)
    with torch.no_grad():  # public means away from the data's own, so the clamp and offsets are exercised
        model.item_means.copy_(torch.linspace(2.0, 4.0, data.n_items))
    return model


# ----------------------------------------------------------------------------------------------- equations
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_per_user_gradient_rows_match_autograd(seed):
    data = random_ratings(seed)
    model = bound_model(data, seed)
    _, y = user_residuals(data.users, data.items, data.values, model.item_means, data.n_users, 2.0, 1.0)
    u = model.U.detach().double()
    rows, norms = per_user_gradients(data.users, data.items, y.double(), u, data.n_users)
    for user in range(data.n_users):
        sel = data.users == user
        uu = u.clone().requires_grad_(True)
        p, w = user_aggregates(data.users[sel], data.items[sel], y[sel].double(), uu, data.n_users)
        ui = uu[data.items[sel]]
        f = (ui * p[user]).sum(1) - (ui * ui).sum(1) * y[sel].double() * w
        loss = ((y[sel].double() - f) ** 2).sum()
        (grad,) = torch.autograd.grad(loss, uu)
        expect = torch.zeros_like(u).index_add_(0, data.items[sel], rows[sel])
        assert torch.allclose(grad, expect, atol=1e-10)
        assert float(norms[user]) == pytest.approx(float(grad.norm()), rel=1e-9)


def test_offsets_and_residuals_are_the_dpals_step_0():
    from dprec_torch.predictors.dpals import user_residuals as dpals_residuals

    data = random_ratings(3)
    means = torch.linspace(2.0, 4.0, data.n_items)
    b, y = user_residuals(data.users, data.items, data.values, means, data.n_users, 5.0, 1.0)
    b0, y0 = dpals_residuals(data, means, 5.0, 1.0)
    assert torch.equal(b, b0) and torch.equal(y, y0.float())


def test_prediction_is_eq2_with_s_equal_u_ut_over_the_other_rated_items():
    """r_hat_ui = r_bar_i + b_u + n_u^(-1/2) sum_{j in R_u, j != i} s_ij y_uj, S = U U^T (dense, by hand), rated or not."""
    data = random_ratings(4)
    model = bound_model(data, 4)
    b, y = user_residuals(data.users, data.items, data.values, model.item_means, data.n_users, 2.0, 1.0)
    S = (model.U @ model.U.T).detach().double()
    users = torch.arange(data.n_users).repeat_interleave(data.n_items)
    items = torch.arange(data.n_items).repeat(data.n_users)
    got = model.predict(users, items).double()
    known = model.fallback_.known(users, items)  # an item nobody rated gets the fallback (checked elsewhere)
    assert int(known.sum()) > data.n_users
    for k in torch.nonzero(known).flatten().tolist():
        u, i = int(users[k]), int(items[k])
        sel = (data.users == u) & (data.items != i)
        f = (S[i, data.items[sel]] * y[sel].double()).sum() / math.sqrt(int((data.users == u).sum()))
        expect = min(max(float(model.item_means[i]) + float(b[u]) + float(f), 1.0), 5.0)
        assert float(got[k]) == pytest.approx(expect, abs=1e-5)


def test_surrogate_gradient_is_the_sum_of_scaled_user_gradients():
    data = random_ratings(5)
    model = bound_model(data, 5)
    batch = full_batch(data, model.item_means)
    residuals = (model.batch_predict(batch) - model.training_targets(batch)).detach()
    scale = torch.linspace(0.2, 1.0, data.n_users)  # a per-user clip factor
    model.surrogate_loss(batch, residuals * scale[batch.rows]).backward()
    rows, norms = model.per_user_gradient_rows(batch, residuals)
    assert rows.dtype == norms.dtype == torch.float64  # the norms are those of the rows surrogate_loss releases
    expect = torch.zeros_like(model.U, dtype=torch.float64).index_add_(0, batch.items, rows * scale[batch.rows][:, None])
    assert model.U.grad.dtype == torch.float64 and torch.allclose(model.U.grad, expect, atol=1e-12)  # no rounding before noise
    _, y = user_residuals(data.users, data.items, data.values, model.item_means, data.n_users, 2.0, 1.0)
    _, ref = per_user_gradients(data.users, data.items, y, model.U.detach(), data.n_users)  # lowrank_dpsgd's norms
    assert torch.allclose(model.per_example_grad_norms(batch, residuals, "user").double(), ref[batch.users].double(), rtol=1e-5)


def test_the_similarity_key_picks_the_form_and_a_bad_one_is_one_line():
    """``model=pnbm model.similarity=lowrank`` builds the low-rank PNBM with its own keys; the composed node is kept."""
    from dprec_torch.config import resolve_model_node
    from dprec_torch.training.run import build_model

    cfg = tiny_cfg("data=synthetic", "device=cpu", "model=pnbm", "model.similarity=lowrank", "model.rank=2",
                      "mechanism=gaussian", "epsilon=1")
    check_config(cfg)
    model = build_model(cfg, tiny_fold())
    assert type(model) is LowRankPNBM and model.U.shape[1] == 2
    assert cfg.model.similarity == "lowrank" and "floor_c" in cfg.model  # the run's config is not edited
    assert "floor_c" not in resolve_model_node(cfg.model)
    full = tiny_cfg("data=synthetic", "device=cpu", "model=pnbm", "mechanism=gaussian", "epsilon=1")
    assert type(build_model(full, tiny_fold())) is PNBM and "rank" in full.model
    cfg.model.similarity = "low"
    with pytest.raises(ConfigError, match="model.similarity must be one of"):
        check_config(cfg)
    with pytest.raises(ConfigError, match="full-S form"):
        LowRankPNBM(7).gradient_entry_bound(1.0)


# ------------------------------------------------------------- equations on adversarial datasets (hypothesis)
def _autograd_user_gradient(items: torch.Tensor, y: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """dL_u/dU by autograd from the definition f_ui = n^(-1/2) sum_{j != i} s_ij y_uj, S = U U^T."""
    uu = u.clone().requires_grad_(True)
    s = uu[items] @ uu[items].t()
    s = s - torch.diag(torch.diagonal(s))
    f = (s @ y) / math.sqrt(items.numel())
    (g,) = torch.autograd.grad(((y - f) ** 2).sum(), uu)
    return g


@settings(max_examples=40, deadline=None)
@given(data=st.data(), d=st.integers(1, 3), seed=st.integers(0, 10**6))
def test_per_user_gradients_match_autograd(data, d, seed):
    r = data.draw(datasets())
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(r.n_items, d, generator=gen, dtype=torch.float64)
    y = torch.randn(len(r), generator=gen, dtype=torch.float64)
    rows, norms = per_user_gradients(r.users, r.items, y, u, r.n_users)
    for user in range(r.n_users):
        sel = r.users == user
        mine = torch.zeros_like(u).index_add_(0, r.items[sel], rows[sel])
        ref = _autograd_user_gradient(r.items[sel], y[sel], u)
        assert torch.allclose(mine, ref, atol=1e-9)
        assert float(norms[user]) == pytest.approx(float(ref.norm()), abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), clip=st.floats(0.01, 10.0), scale=st.floats(0.01, 5.0), seed=st.integers(0, 10**6))
def test_clipped_step_moves_at_most_c_when_a_user_leaves(data, clip, scale, seed):
    r = data.draw(datasets())
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(r.n_items, 2, generator=gen, dtype=torch.float64) * scale
    y = torch.randn(len(r), generator=gen, dtype=torch.float64).clamp(-1, 1)

    def step(keep: torch.Tensor) -> torch.Tensor:
        # the other users' residuals are unchanged by a neighbour (public means, each user's own offset)
        rows, norms = per_user_gradients(r.users[keep], r.items[keep], y[keep], u, r.n_users)
        return clipped_sum(r.users[keep], r.items[keep], rows, norms, clip, r.n_items)

    user = data.draw(st.integers(0, r.n_users - 1))
    full = step(torch.ones(len(r), dtype=torch.bool))
    own = step(r.users == user)
    assert float(own.norm()) <= clip * (1 + 1e-9)  # the user's clipped contribution
    assert torch.allclose(full - step(r.users != user), own, atol=1e-9)  # removing the user removes exactly it


# ---------------------------------------------------------------------------------------------- mechanisms
def one_step(*overrides: str):
    cfg = tiny_cfg(*BASE, *overrides)
    fold = tiny_fold()
    setup = setup_training(cfg, fold, torch.device("cpu"))
    u0 = setup.model.U.detach().clone()
    trainer = trainer_mod.Trainer(setup.model, setup.optimizer, setup.sampler, 1)
    trainer._step()
    return setup, u0


def test_one_gaussian_step_is_the_lowrank_dpsgd_step():
    """q = 1, no noise (epsilon=inf): U_1 = U_0 - lr clip-sum / (q N), lowrank_dpsgd's update."""
    setup, u0 = one_step(*GAUSSIAN, "epsilon=inf", "mechanism.sampling_ratio=1.0", "mechanism.epochs=1")
    train_ = setup.fold.train
    _, y = user_residuals(train_.users, train_.items, train_.values, setup.model.item_means, train_.n_users, 5.0, 1.0)
    rows, norms = per_user_gradients(train_.users, train_.items, y, u0, train_.n_users)
    g = clipped_sum(train_.users, train_.items, rows, norms, 0.5, train_.n_items)
    expect = u0 - 5.0 * g / train_.n_users
    assert torch.allclose(setup.model.U.detach(), expect, atol=1e-6)


def test_the_clipped_sgld_chain_at_a_constant_step_is_gaussian_dp_sgd(tmp_path, monkeypatch):
    """Same noise keys, same (eps, delta), same C, q, lr: the same sigma, the same draws, the same U. (Two jobs that
    differ in their config draw independent keys under one noise_seed; the job label is pinned here so both draw
    the same.)"""
    from dprec_torch.training import run as run_module

    monkeypatch.setattr(run_module, "job_label", lambda cfg: "one-job")
    g = train(tiny_cfg(*BASE, *GAUSSIAN, "epsilon=5", "noise_seed=7", f"output_dir={tmp_path / 'g'}"))
    s = train(tiny_cfg(*BASE, *SGLD, "epsilon=5", "noise_seed=7", f"output_dir={tmp_path / 's'}"))
    assert s["test_rmse"] == g["test_rmse"]
    rep = s["privacy"]
    assert rep["noise"]["noise_multiplier"] == g["privacy"]["noise"]["noise_multiplier"]
    ug = torch.load(tmp_path / "g" / "release_fold1.pt", weights_only=True)["state"]["U"]
    us = torch.load(tmp_path / "s" / "release_fold1.pt", weights_only=True)["state"]["U"]
    assert torch.equal(ug, us)


def test_sgld_epsilon_matches_an_independent_pld_accountant():
    """The chain's own numbers -- step eta, temperature rho, clip C, q, N, T and the item-mean multiplier -- give the
    subsampled-Gaussian history; Google's dp-accounting PLD accountant composes it independently of Opacus.
    (dp-accounting is a test-only dependency: ``pip install --no-deps dp-accounting dm-tree``, its attrs<24 pin
    aside; without it ``test_sgld_rdp_figure_bounds_the_prv_figure`` is the cross-check.)"""
    dp_accounting = pytest.importorskip("dp_accounting")
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    for accountant, rel in (("rdp", 0.15), ("prv", 0.01)):
        setup, _ = one_step(*SGLD, "epsilon=4", "delta=1e-5", f"mechanism.accountant={accountant}", "mechanism.epochs=5")
        opt, ctx = setup.optimizer, setup.optimizer.context
        rep = opt.privacy_report()
        n = ctx.n_users
        # sigma from the chain's step: noise std sqrt(rho eta) over the step's sensitivity eta C / (q N)
        sigma = math.sqrt(opt.rho * opt.eta1) / (opt.eta1 * opt.clip_norm / (opt.sampling_ratio * n))
        assert sigma == pytest.approx(rep["noise"]["noise_multiplier"], rel=1e-9)
        pld = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
        pld.compose(dp_event.GaussianDpEvent(opt.mean_sigma))
        pld.compose(dp_event.PoissonSampledDpEvent(opt.sampling_ratio, dp_event.GaussianDpEvent(sigma)), ctx.total_steps)
        independent = pld.get_epsilon(1e-5)
        assert rep["delta"] == 1e-5 and rep["epsilon"] <= 4.0 + 1e-9
        assert independent <= rep["epsilon"] * (1 + 1e-3)  # Opacus's figure is an upper bound ...
        assert rep["epsilon"] == pytest.approx(independent, rel=rel)  # ... and a tight one (PRV: within 1 %)
        assert dp_accounting is not None


def test_sgld_rdp_figure_bounds_the_prv_figure():
    """Opacus's two accountants on the same chain history: PRV (numerical composition) <= RDP, within 10 %."""
    from dprec_torch.privacy.opacus_accounting import OpacusAccountant

    setup, _ = one_step(*SGLD, "epsilon=4", "mechanism.epochs=5")
    rep = setup.optimizer.privacy_report()
    prv = OpacusAccountant("prv")
    for sigma, q, steps in rep["accountant_history"]:
        prv.step(sigma, q, steps=int(steps))
    assert prv.get_epsilon(rep["delta"]) <= rep["epsilon"] <= 1.1 * prv.get_epsilon(rep["delta"])


def test_sgld_reports_epsilon_delta_and_accountant_and_the_full_form_stays_null():
    setup, _ = one_step(*SGLD, "epsilon=10", "mechanism.accountant=prv")
    rep = setup.optimizer.privacy_report()
    assert rep["relation"] == "user" and isinstance(rep["delta"], float) and math.isfinite(rep["epsilon"])
    assert "Opacus PRV" in rep["accountant"] and rep["epsilon_if_exact_sample"] is None
    assert "does not apply" in rep["posterior_sampling"]
    with pytest.raises(ConfigError, match="mechanism.clip_norm"):  # the low-rank form is the accounted chain only
        check_config(tiny_cfg(*BASE, "mechanism=sgld", "epsilon=10"))
    with pytest.raises(ConfigError, match="mechanism.decay is not read by ClippedSGLD"):  # typed on the command line
        form_node(tiny_cfg(*BASE, *SGLD, "epsilon=10").mechanism, LowRankPNBM, {"decay"})
    full = setup_training(tiny_cfg("data=synthetic", "device=cpu", "mechanism=sgld", "epsilon=10", "model=pnbm"),
                          tiny_fold(), torch.device("cpu"))
    assert full.optimizer.privacy_report()["epsilon"] is None  # the M x M chain: no defended epsilon


@pytest.mark.parametrize("mech", ["gaussian", "sgld", "dpsgd"])
def test_the_low_rank_cases_are_registered_with_the_harness(mech):
    from dprec_torch.mechanisms.dpsgd import ClippedLaplaceDPSGD
    from dprec_torch.mechanisms.gaussian import GaussianPNBM
    from dprec_torch.mechanisms.sgld import ScaledPosteriorSGLD
    from dprec_torch.privacy_harness.registry import builder_for

    cls = {"gaussian": GaussianPNBM, "sgld": ClippedSGLD, "dpsgd": ClippedLaplaceDPSGD}[mech]
    names = [c.name for c in builder_for(cls)()]
    assert any(n.startswith(f"{mech} lowrank-pnbm step") for n in names)
    if mech == "sgld":  # the clipped chain trains the low-rank PNBM only; the posterior chain keeps its own cases
        assert names and all("lowrank-pnbm" in n for n in names)
        assert not any("lowrank-pnbm" in c.name for c in builder_for(ScaledPosteriorSGLD)())
    else:
        assert any("lowrank-pnbm" not in n for n in names)  # the full form's cases are kept


def test_a_neighbour_moves_one_steps_clipped_sum_by_at_most_c():
    """Direct form of the harness claim on an adversarial profile set (one user with every item at the extremes)."""
    from dprec_torch.privacy_harness.lowrank_pnbm_cases import gaussian_cases

    data = random_ratings(6, n_users=5, n_items=8, density=0.9)
    data = Ratings(data.users, data.items, torch.where(data.users == 0, 5.0, data.values), 5, 8, data.scale)
    case = gaussian_cases()[0]
    base = case.release(data, 1, True)
    assert float(base.units.norm(dim=1).max()) <= case.clip_bound * (1 + 1e-5)
    for u in range(data.n_users):
        keep = data.users != u
        other = case.release(Ratings(data.users[keep], data.items[keep], data.values[keep], 5, 8, data.scale), 1, False)
        assert float((other.total - base.total).norm()) <= case.sensitivity * (1 + 1e-5)


# ------------------------------------------------------------------------------------------ the Trainer path
@pytest.mark.parametrize("mech", ["none", "gaussian", "sgld", "dpsgd"])
def test_trains_under_every_mechanism_through_the_api(tmp_path, mech):
    overrides = {"none": NONE, "gaussian": GAUSSIAN, "sgld": SGLD, "dpsgd": DPSGD}[mech]
    eps = "epsilon=inf" if mech == "none" else "epsilon=8"
    run = dprec_torch.train([*BASE, *overrides, eps, f"output_dir={tmp_path}", "noise_seed=1"])
    m = run.metrics
    assert math.isfinite(m["test_rmse"]) and m["test_rmse"] < 1.5 and len(next(iter(m["history"].values()))) == 2
    assert isinstance(run.model(), LowRankPNBM)
    if mech != "none":
        assert m["privacy"]["relation"] == "user" and m["privacy"]["epsilon"] == pytest.approx(8.0, rel=0.02)
    # load_run restores the released model (U, the DP item means, the fallback) and reproduces its test RMSE
    assert run.evaluate()["test_rmse"] == pytest.approx(m["test_rmse"], abs=1e-12)


def test_training_learns_beyond_the_item_means_without_noise(tmp_path):
    start = dprec_torch.train([*BASE, *NONE, "epsilon=inf", "mechanism.epochs=1", "mechanism.lr=1e-9",
                               f"output_dir={tmp_path / 'a'}"]).metrics["test_rmse"]
    trained = dprec_torch.train([*BASE, *NONE, "epsilon=inf", "mechanism.epochs=30", "model.init_std=0.1",
                                 f"output_dir={tmp_path / 'b'}"]).metrics["test_rmse"]
    assert trained < start - 0.005  # 0.006-0.008 over seeds 0-2 on the per-user keyed split of the synthetic data


@pytest.mark.parametrize("mech", ["none", "gaussian", "sgld", "dpsgd"])
def test_kill_and_resume_gives_the_same_metrics_and_epsilon(tmp_path, monkeypatch, mech):
    overrides = {"none": NONE, "gaussian": GAUSSIAN, "sgld": SGLD, "dpsgd": DPSGD}[mech]
    eps = "epsilon=inf" if mech == "none" else "epsilon=6"
    args = [*BASE, *overrides, eps, "noise_seed=5", "mechanism.epochs=3"]
    full = train(tiny_cfg(*args, f"output_dir={tmp_path / 'full'}"))
    original = trainer_mod.Trainer._epoch_metrics

    def kill(self, epoch, fold, train_rmse):
        if epoch == 2:
            raise KeyboardInterrupt("simulated kill -9 during epoch 2")
        return original(self, epoch, fold, train_rmse)

    monkeypatch.setattr(trainer_mod.Trainer, "_epoch_metrics", kill)
    with pytest.raises(KeyboardInterrupt):
        train(tiny_cfg(*args, f"output_dir={tmp_path / 'cut'}", "resume=true"))  # resumable: a checkpoint every epoch
    monkeypatch.setattr(trainer_mod.Trainer, "_epoch_metrics", original)
    resumed = train(tiny_cfg(*args, f"output_dir={tmp_path / 'cut'}", "resume=true"))
    assert resumed["test_rmse"] == full["test_rmse"]
    assert resumed["privacy"].get("epsilon_spent") == full["privacy"].get("epsilon_spent")  # none: not reported
    assert resumed["privacy"]["epsilon"] == full["privacy"]["epsilon"]


def test_tensorboard_gets_the_epochs(tmp_path):
    dprec_torch.train([*BASE, *GAUSSIAN, "epsilon=8", "tensorboard=true", f"output_dir={tmp_path}"])
    assert list((tmp_path / "tb" / "fold1").glob("events.out.tfevents.*"))
    assert json.loads((tmp_path / "metrics.json").read_text())["privacy"]["epsilon"] < 8.0 + 1e-9


@pytest.mark.parametrize("mech", ["none", "gaussian", "sgld", "dpsgd"])
def test_evaluate_py_scores_the_released_model(tmp_path, mech):
    from dprec_torch.training.evaluate import evaluate_run

    overrides = {"none": NONE, "gaussian": GAUSSIAN, "sgld": SGLD, "dpsgd": DPSGD}[mech]
    eps = "epsilon=inf" if mech == "none" else "epsilon=4"
    m = train(tiny_cfg(*BASE, *overrides, eps, f"output_dir={tmp_path}"))
    ev, _ = evaluate_run(Path(tmp_path), torch.device("cpu"), compare_baselines=False)
    assert ev["test_rmse"] == m["test_rmse"]


@pytest.mark.parametrize("mech", ["sgld", "gaussian", "dpsgd", "none"])
def test_model_pnbm_lowrank_composes_with_its_tuned_numbers(mech):
    """``model=pnbm_lowrank`` picks conf/tuned/<mechanism>_pnbm_lowrank.yaml: the design card's chain is the clipped one."""
    eps = "epsilon=inf" if mech == "none" else "epsilon=20"
    cfg = tiny_cfg("data=synthetic", "device=cpu", "model=pnbm_lowrank", f"mechanism={mech}", eps)
    setup = setup_training(cfg, tiny_fold(), torch.device("cpu"))
    assert isinstance(setup.model, LowRankPNBM)
    rep = setup.optimizer.privacy_report()
    if mech == "sgld":
        assert cfg.mechanism.max_user_ratings is None  # the clip bounds a user: no tau cap drops ratings
        assert len(setup.fold.train) == len(tiny_fold().train)
        assert isinstance(setup.optimizer, ClippedSGLD) and rep["delta"] == 1e-6 and rep["epsilon"] <= 20.0
        assert rep["epsilon"] == pytest.approx(20.0, rel=0.01)
    if mech == "none":
        assert cfg.mechanism.beta == 1.0 and cfg.mechanism.unit == "user"


# --------------------------------------------------------------------------------- calibration (gaussian)
def _history_epsilon(history, delta: float, accountant: str = "rdp") -> float:
    from dprec_torch.privacy.opacus_accounting import OpacusAccountant

    acc = OpacusAccountant(accountant)
    for sigma, q, steps in history:
        acc.step(sigma, q, steps=int(steps))
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("eps", [0.5, 1.0, 10.0])
def test_gaussian_noise_is_the_smallest_that_meets_the_target_and_the_means_leave_room(eps):
    """sigma of the steps is the smallest (to the calibration's tolerance) whose history [(item means), (sigma, q, T)]
    meets eps; a large item-mean share (0.9) still leaves room for the steps."""
    setup, _ = one_step(*GAUSSIAN, f"epsilon={eps}", "mechanism.mean_fraction=0.9", "mechanism.epochs=3")
    opt = setup.optimizer
    steps = opt.context.total_steps
    hist = [(opt.mean_sigma, 1.0, 1)]
    assert _history_epsilon([*hist, (opt.noise_multiplier, opt.sampling_ratio, steps)], 1e-6) <= eps * (1 + 1e-9)
    assert _history_epsilon([*hist, (opt.noise_multiplier * 0.98, opt.sampling_ratio, steps)], 1e-6) > eps
    assert _history_epsilon(hist, 1e-6) < eps  # the means alone: the share 0.9 of mu^2
    rep = opt.privacy_report()
    assert rep["epsilon"] <= eps * (1 + 1e-9) and rep["relation"] == "user" and rep["item_means"]["relation"] == "user"


def test_prv_calibrates_tighter_than_rdp_and_reports_its_own_epsilon():
    rdp, _ = one_step(*GAUSSIAN, "epsilon=2", "mechanism.accountant=rdp", "mechanism.epochs=5")
    prv, _ = one_step(*GAUSSIAN, "epsilon=2", "mechanism.accountant=prv", "mechanism.epochs=5")
    assert prv.optimizer.noise_multiplier < rdp.optimizer.noise_multiplier
    rep = prv.optimizer.privacy_report()
    assert rep["epsilon"] <= 2.0 * (1 + 1e-9) and "prv" in rep["accountant"].lower()


def test_item_means_alone_over_budget_is_one_line():
    with pytest.raises(ConfigError):
        one_step(*GAUSSIAN, "epsilon=0.01", "delta=1e-9", "mechanism.mean_fraction=0.999999", "mechanism.epochs=50")


@pytest.mark.parametrize("bad", ["model.rank=0", "model.init_std=0", "model.clamp_r=-1", "model.feature_reg=0",
                                 "model.item_features=maybe", "mechanism.mean_fraction=1.0", "+mechanism.count_weight=-1",
                                 "mechanism.accountant=gdp"])
def test_bad_config_is_one_line(bad):
    with pytest.raises(ConfigError):
        setup_training(tiny_cfg(*BASE, *GAUSSIAN, "epsilon=1", bad), tiny_fold(), torch.device("cpu"))


def test_a_private_run_is_reproducible_under_its_noise_seed_and_finite(tmp_path):
    a = train(tiny_cfg(*BASE, *GAUSSIAN, "epsilon=2", "noise_seed=4", f"output_dir={tmp_path / 'a'}"))
    b = train(tiny_cfg(*BASE, *GAUSSIAN, "epsilon=2", "noise_seed=4", f"output_dir={tmp_path / 'b'}"))
    assert math.isfinite(a["test_rmse"]) and a["test_rmse"] == b["test_rmse"]


# ------------------------------------------------------------------------------------------- canary audit
def test_canary_audit_stays_below_the_claim_and_has_power(tmp_path):
    """scripts/audit.py on the low-rank PNBM under mechanism=gaussian: the empirical lower bound stays below the claimed
    eps = 1, and the same pipeline without noise (eps = inf, no clipping bound) leaks more."""
    from scripts import audit

    def run(eps: str, out: str) -> dict:
        cfg = tiny_cfg(*LOWRANK, *GAUSSIAN, "mechanism.clip_norm=10", eps, "audit.trials=10", "audit.canaries=20",
                       f"output_dir={tmp_path / out}", config_name="audit")
        return audit.audit(cfg)

    private, leaky = run("epsilon=1", "p"), run("epsilon=inf", "l")
    assert private["epsilon_claimed"] == pytest.approx(1.0, rel=0.01)
    assert private["epsilon_lower_bound"] <= 1.0
    assert leaky["epsilon_lower_bound"] > private["epsilon_lower_bound"]


def test_a_cancelling_gradient_stays_within_c_when_its_user_leaves():
    """The counterexample the harness found in CI (float32 autograd against float32 norms: a removal moved the L1 release
    by 0.0500023 > C = 0.05): the released gradient is now the float64 sum of the very rows whose norms were clipped."""
    from dprec_torch.mechanisms.dpsgd import ClippedLaplaceDPSGD
    from dprec_torch.privacy_harness.registry import builder_for
    from tests.privacy.test_sensitivity_harness import check_case

    case = next(c for c in builder_for(ClippedLaplaceDPSGD)() if c.name.startswith("dpsgd lowrank-pnbm step C=0.05 d=3 U-scale=3 Gr=2"))
    data = Ratings(torch.tensor([0, 0, 3]), torch.tensor([0, 1, 0]), torch.tensor([1.0, 5.0, 1.0]), 4, 2, RatingScale(1, 5),
                   meta={"user_keys": torch.tensor([0, 1, 2, 3]),
                         "item_keys": torch.tensor([3710167889747395225, 3710167339991581120])})
    assert check_case(case, data, 0, lambda strategy: [0])
