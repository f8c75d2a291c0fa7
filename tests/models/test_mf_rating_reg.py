"""``mechanism.rating_reg``: the classic SGD-MF per-visited-rating penalty, non-private MF only.

Each batch target (u, i) adds lambda_r (b_u, b_i, p_u, q_i) to the gradient of the rows it touches, before the
division by the expected batch size B; rows no target touches get no decay from it; the default 0 leaves the
step exactly as it was; a model without per-rating rows and every private mechanism refuse the key in one line.
"""

from __future__ import annotations

import pytest
import torch

from dprec_torch.config import check_config
from dprec_torch.errors import ConfigError
from dprec_torch.mechanisms.context import TrainingContext
from dprec_torch.mechanisms.sgd import MapSGD
from dprec_torch.models.batching import full_batch
from dprec_torch.models.mf import MF
from dprec_torch.training.run import setup_training
from tests.helpers import tiny_cfg, tiny_fold

LR, LAM, B = 3.0, 0.7, 40.0


def _model_and_batch():
    train = tiny_fold().train
    model = MF(train.n_users, train.n_items, dim=4, seed=0).attach(train)
    with torch.no_grad():  # a non-trivial point: biases and both factor tables away from zero
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    keep = (train.users % 3 != 0) & (train.items % 4 != 0)  # a batch that leaves some users and items unvisited
    sub = train.select(torch.nonzero(keep).squeeze(1))
    return train, model, full_batch(sub, train.item_means())


def _step(rating_reg: float, weight_decay: float = 0.0) -> tuple[MF, list[torch.Tensor], object]:
    """One MapSGD step as the trainer takes it (clip_residuals, surrogate backward, step); returns the deltas."""
    train, model, batch = _model_and_batch()
    ctx = TrainingContext(1, 1, len(train), train.n_users, train.scale, n_units=len(train), model=model,
                          expected_batch_size=B, gradient_reduction="mean")
    opt = MapSGD(model.parameters(), ctx, lr=LR, weight_decay=weight_decay, beta=1.0, rating_reg=rating_reg)
    before = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad(set_to_none=True)
    residuals = (model.batch_predict(batch) - batch.values).detach()
    model.surrogate_loss(batch, opt.clip_residuals(residuals, batch, model)).backward()
    opt.step()
    return model, [p.detach() - b for p, b in zip(model.parameters(), before)], batch


def test_the_penalty_decays_each_row_once_per_visit_over_the_expected_batch():
    model, with_reg, batch = _step(LAM)
    _, without, _ = _step(0.0)
    start = _model_and_batch()[1]
    users = MF.batch_users(batch)
    n_u = torch.bincount(users, minlength=model.n_users).float()
    n_i = torch.bincount(batch.items, minlength=model.n_items).float()
    visits = {"user_bias.weight": n_u, "item_bias.weight": n_i, "user_factors.weight": n_u, "item_factors.weight": n_i}
    names = [n for n, _ in model.named_parameters()]
    for name, d_reg, d_plain, p0 in zip(names, with_reg, without, start.parameters()):
        extra = d_reg - d_plain  # the data gradient is the same in both runs: what is left is the penalty's step
        if name in visits:
            expected = -LR * LAM * visits[name][:, None] * p0.detach() / B
            torch.testing.assert_close(extra, expected, rtol=1e-4, atol=1e-7)
            unvisited = visits[name] == 0
            assert unvisited.any() and (visits[name] > 1).any()
            assert torch.equal(d_reg[unvisited], torch.zeros_like(d_reg[unvisited]))  # no dense decay (lambda = 0)
        else:  # the global bias g has no per-visit penalty (mu = mu_0 + s g sits on the public midpoint)
            assert torch.equal(extra, torch.zeros_like(extra))


def test_zero_rating_reg_is_the_plain_step_bit_for_bit():
    _, a, _ = _step(0.0, weight_decay=2.0)
    train, model, batch = _model_and_batch()
    ctx = TrainingContext(1, 1, len(train), train.n_users, train.scale, n_units=len(train), model=model,
                          expected_batch_size=B, gradient_reduction="mean")
    opt = MapSGD(model.parameters(), ctx, lr=LR, weight_decay=2.0, beta=1.0)  # no rating_reg argument at all
    before = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad(set_to_none=True)
    residuals = (model.batch_predict(batch) - batch.values).detach()
    model.surrogate_loss(batch, opt.clip_residuals(residuals, batch, model)).backward()
    opt.step()
    for x, p, b0 in zip(a, model.parameters(), before):
        assert torch.equal(x, p.detach() - b0)


def _cfg(tmp_path, *overrides: str):
    return tiny_cfg("data=synthetic", "compare_baselines=false", "tensorboard=false", f"output_dir={tmp_path}",
                    *overrides)


def test_the_runner_passes_rating_reg_to_mapsgd(tmp_path):
    cfg = _cfg(tmp_path, "model=mf", "mechanism=none", "epsilon=inf", "mechanism.rating_reg=0.1")
    s = setup_training(cfg, tiny_fold(), torch.device("cpu"))
    assert isinstance(s.optimizer, MapSGD) and s.optimizer.rating_reg == pytest.approx(0.1)


def test_a_model_without_per_rating_rows_refuses_it_in_one_line(tmp_path):
    cfg = _cfg(tmp_path, "model=pnbm", "mechanism=none", "epsilon=inf", "+mechanism.rating_reg=0.1")
    with pytest.raises(ConfigError, match="mechanism.rating_reg needs .*model=mf"):
        setup_training(cfg, tiny_fold(), torch.device("cpu"))


@pytest.mark.parametrize("mechanism", ["dpsgd_paper", "sgld_paper", "gaussian"])
def test_private_mechanisms_have_no_rating_reg(tmp_path, mechanism):
    """The penalty's gradient reveals which ratings exist and is not linear in the residuals, so the residual
    clip of the private mechanisms would not bound it: they do not take the key."""
    cfg = _cfg(tmp_path, "model=mf", f"mechanism={mechanism}", "epsilon=1", "+mechanism.rating_reg=0.1")
    with pytest.raises(ConfigError, match="rating_reg is not a parameter"):
        check_config(cfg)


@pytest.mark.parametrize("value", ["-0.1", "abc"])
def test_out_of_domain_rating_reg_is_one_line(tmp_path, value):
    cfg = _cfg(tmp_path, "model=mf", "mechanism=none", "epsilon=inf", f"mechanism.rating_reg={value}")
    with pytest.raises(ConfigError, match="rating_reg"):
        check_config(cfg)
