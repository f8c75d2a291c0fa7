"""Masked user-level batches (``UserBatch.row_mask``, what a low-rank PNBM step runs on off the CPU): the same users,
the same numbers as the compacted batch of the same draw, bit for bit, and nothing of an unsampled user is read."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from dprec_torch.data.ratings import Ratings
from dprec_torch.models.batching import PoissonBatchSampler, full_batch, make_batch
from dprec_torch.models.pnbm_lowrank import flat_rows, take_rows
from dprec_torch.seeding import noise_generator
from dprec_torch.training import run as run_module
from dprec_torch.training.run import setup_training
from dprec_torch.training.trainer import Trainer
from tests.helpers import tiny_cfg, tiny_fold
from tests.models.test_pnbm_lowrank import BASE, DPSGD, GAUSSIAN, SGLD, bound_model, random_ratings

STEPS = 5


def _run(overrides: list[str], masked: bool, monkeypatch, kernel: str) -> tuple[Trainer, list]:
    monkeypatch.setenv("DPREC_LOWRANK_KERNEL", kernel)
    monkeypatch.setattr(run_module, "masked_steps", lambda model, device: masked)
    setup = setup_training(tiny_cfg(*BASE, *overrides, "epsilon=5", "noise_seed=3"), tiny_fold(), torch.device("cpu"))
    assert setup.sampler.masked is masked
    trainer = Trainer(setup.model, setup.optimizer, setup.sampler, 1)
    trace = []
    for _ in range(STEPS):
        sq, n = trainer._step()
        st = setup.optimizer.state["mechanism"]
        trace.append((float(sq), int(n), st["clipped_fraction"], st["max_clipped_norm"], st["grad_norm"]))
    return trainer, trace


@pytest.mark.parametrize("mechanism", [GAUSSIAN, SGLD, DPSGD], ids=["gaussian", "sgld", "dpsgd"])
@pytest.mark.parametrize("kernel", ["torch", "numba"])
def test_a_masked_step_is_the_compacted_step_bit_for_bit(mechanism, kernel, monkeypatch):
    """Five noised steps at q = 0.5 (the same secret draws): U, the target count and the clip statistics of the masked
    batches equal the compacted batches', to the last bit (the torch path and the CPU kernels); the loss to rounding."""
    compact, t_compact = _run(mechanism, False, monkeypatch, kernel)
    masked, t_masked = _run(mechanism, True, monkeypatch, kernel)
    # the logged loss sums the zeros of the unsampled rows too: torch's reduction tree moves its last bits
    assert [t[1:] for t in t_masked] == [t[1:] for t in t_compact]
    assert [t[0] for t in t_masked] == pytest.approx([t[0] for t in t_compact], rel=1e-13)
    assert 0 < t_compact[0][1] < len(tiny_fold().train)  # a real sample: neither empty nor everyone
    assert torch.equal(masked.model.U, compact.model.U)


def test_the_full_batch_of_a_masked_sampler_is_the_full_batch_bit_for_bit(monkeypatch):
    """q = 1: the masked sampler's full batch (grouped, with row offsets) trains to the same U as ``full_batch``."""
    full = [*GAUSSIAN[:3], "mechanism.sampling_ratio=1.0", *GAUSSIAN[4:]]
    plain, t_plain = _run(full, False, monkeypatch, "torch")
    masked, t_masked = _run(full, True, monkeypatch, "torch")
    assert masked.sampler.sample().row_offsets is not None and masked.sampler.sample().row_mask is None
    assert t_masked == t_plain and torch.equal(masked.model.U, plain.model.U)


def _masked_gradient(model, opt, data: Ratings, sampled: torch.Tensor, masked: bool) -> torch.Tensor:
    """U's gradient of one clipped step over the users in ``sampled`` (a masked full batch, or their compacted one)."""
    if masked:
        full = full_batch(data, model.item_means)
        batch = replace(full, row_mask=sampled.index_select(0, full.users), base=full)
    else:
        batch = make_batch(data, model.item_means, None, sampled)
    residuals = (model.batch_predict(batch) - model.training_targets(batch)).detach()
    if batch.row_mask is not None:  # as the Trainer does
        residuals = torch.where(batch.target_mask, residuals, 0.0)
    clipped = opt.clip_residuals(residuals, batch, model)
    model.zero_grad(set_to_none=True)
    model.surrogate_loss(batch, clipped).backward()
    return model.U.grad.detach().clone()


def test_an_unsampled_users_ratings_change_nothing():
    """Rewrite every rating of a user left out of the sample (values at both ends of the scale): the masked step's
    gradient is unchanged, and equals the compacted batch's, bit for bit."""
    from dprec_torch.mechanisms.gaussian import GaussianPNBM
    from dprec_torch.privacy_harness.lowrank_pnbm_cases import _context

    data = random_ratings(4, n_users=7, n_items=8)
    sampled = torch.tensor([True, False, True, True, False, True, True])
    other = data.values.clone()
    other[data.users == 1] = torch.where(other[data.users == 1] > 3, 1.0, 5.0)
    changed = Ratings(data.users, data.items, other, data.n_users, data.n_items, data.scale)
    grads = []
    for d in (data, changed):
        for masked in (True, False):
            model = bound_model(d, init_std=2.0)
            opt = GaussianPNBM(model.parameters(), _context(d, model), float("inf"), clip_norm=0.3, sampling_ratio=1.0,
                               model=model)
            opt.prepared = True
            grads.append(_masked_gradient(model, opt, d, sampled, masked))
    assert all(torch.equal(g, grads[0]) for g in grads[1:])
    assert grads[0].abs().sum() > 0


def test_the_sampler_draws_the_same_users_either_way():
    train = tiny_fold().train
    a = PoissonBatchSampler(train, train.item_means(), 0.3, "user", noise_generator(9))
    b = PoissonBatchSampler(train, train.item_means(), 0.3, "user", noise_generator(9), masked=True)
    for _ in range(3):
        x, y = a.sample(), b.sample()
        assert torch.equal(y.users[y.row_mask], x.users)
        assert y.n_targets == x.n_targets and int(y.target_count()) == x.n_targets
        assert torch.equal(y.items[y.target_mask], x.items) and torch.equal(y.values[y.target_mask], x.values)
        assert y.base is b.sample.__self__._template and y.rows is y.base.rows  # one fixed full batch


def test_take_rows_is_index_select():
    """The flat gather (what :func:`take_rows` runs off the CPU) gives index_select's values, its flat index cached."""
    mat = torch.randn(11, 5, dtype=torch.float64)
    index = torch.tensor([3, 0, 10, 3, 7])
    cache: dict = {}
    for _ in range(2):  # computed, then from the cache
        assert torch.equal(flat_rows(mat, index, cache), mat.index_select(0, index))
    assert len(cache) == 1
    assert torch.equal(take_rows(mat, index, cache), mat.index_select(0, index))
    if torch.cuda.is_available():
        assert torch.equal(take_rows(mat.cuda(), index.cuda()).cpu(), mat.index_select(0, index))


def test_a_lazy_statistic_is_computed_once_when_read_and_checkpointed_as_a_number():
    """Off the CPU the clip's statistics are recorded unevaluated (no launches, no wait for the device)."""
    from dprec_torch.mechanisms.base import LazyStatistic
    from dprec_torch.mechanisms.gaussian import GaussianPNBM
    from dprec_torch.privacy_harness.lowrank_pnbm_cases import _context

    calls = []
    both = LazyStatistic(lambda: calls.append(1) or (0.25, 3.0))
    frac, top = both.part(0), both.part(1)
    assert not calls
    assert float(frac) == 0.25 and float(top) == 3.0 and float(frac) == 0.25 and calls == [1]
    import copy
    import pickle

    assert pickle.loads(pickle.dumps(top)) == 3.0 and copy.deepcopy(frac) == 0.25  # as numbers
    data = random_ratings(1)
    model = bound_model(data)
    opt = GaussianPNBM(model.parameters(), _context(data, model), float("inf"), sampling_ratio=1.0, model=model)
    opt.state["mechanism"]["clipped_fraction"] = LazyStatistic(lambda: torch.tensor(0.5, dtype=torch.float64))
    saved = opt.state_dict()["state"]["mechanism"]["clipped_fraction"]
    assert type(saved) is float and saved == 0.5
    assert isinstance(opt.state["mechanism"]["clipped_fraction"], LazyStatistic)  # the live state is left as it was


def _torch_kernels(monkeypatch, fail: set[str]):
    """Stand-ins for the GPU kernels with the torch path's formulas (so the kernel path's plumbing runs on the CPU
    without Triton), each in ``fail`` raising as a kernel that does not compile would."""
    from dprec_torch.models import lowrank_triton as lt
    from dprec_torch.models.pnbm_lowrank import per_user_gradients

    def users_of(seg):
        return torch.repeat_interleave(torch.arange(seg.numel() - 1), seg.diff())

    def forward_sums(U, items, seg, y, w, row_mask=None):
        users = users_of(seg)
        ui = U.index_select(0, items)
        p_sum = torch.zeros(seg.numel() - 1, U.shape[1], dtype=U.dtype).index_add_(0, users, ui * y[:, None])
        f = (ui * (p_sum * w[:, None]).index_select(0, users)).sum(1) - (U * U).sum(1)[items] * y * w[users]
        return p_sum, f

    def gradient_norms(U, items, seg, y, e, p_sum, inv_sqrt, row_mask=None, l1=False):
        users = users_of(seg)
        rows, norms = per_user_gradients(users, items, y, U, seg.numel() - 1, e, (U.index_select(0, items), p_sum),
                                         norm=1 if l1 else 2)
        q = torch.zeros_like(p_sum).index_add_(0, users, U.index_select(0, items) * e[:, None])
        return q, norms

    def broken(*args, **kwargs):
        raise RuntimeError("PTX compile failed (a stand-in)")

    monkeypatch.setattr(lt, "failed", None)
    monkeypatch.setattr(lt, "runs", lambda u, offsets: offsets is not None and lt.failed is None)
    for name, fn in (("forward_sums", forward_sums), ("gradient_norms", gradient_norms), ("scatter_clipped", broken)):
        monkeypatch.setattr(lt, name, broken if name in fail else fn)
    return lt


@pytest.mark.parametrize("fail", ["forward_sums", "scatter_clipped"])
def test_a_kernel_that_fails_turns_the_kernels_off_and_the_torch_path_takes_over(fail, monkeypatch, caplog):
    """A kernel that raises (one that does not compile for this GPU or Triton) is logged once and the step goes on
    on the torch path: the same U as that path to rounding (from the forward, or from the deferred rows' scatter)."""
    reference, _ = _run(GAUSSIAN, True, monkeypatch, "torch")
    lt = _torch_kernels(monkeypatch, {fail})
    with caplog.at_level("WARNING"):
        fallback, trace = _run(GAUSSIAN, True, monkeypatch, "auto")
    assert lt.failed is not None and "PTX compile failed" in lt.failed
    assert sum("GPU kernels failed" in r.message for r in caplog.records) == 1  # once: then they are off
    assert torch.allclose(fallback.model.U, reference.model.U, rtol=0, atol=1e-13)
