"""Steps replayed from a CUDA graph (``training.step_graph``): every replay feeds each secret draw a fresh key from its
generator, runs the mechanism's bookkeeping, and trains to the numbers of eager steps; a step that cannot be captured
leaves no trace and runs eagerly.

On a GPU (``-m gpu``) graphed and eager training are compared step by step. Without one the key feed, the decision and
the capture's failure path are tested on the CPU.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest
import torch

from dprec_torch import key_feed
from dprec_torch.key_feed import GraphUnsupported, KeyFeed
from dprec_torch.mechanisms.base import LazyStatistic
from dprec_torch.seeding import SecretGenerator
from dprec_torch.training import run as run_module
from dprec_torch.training import step_graph
from dprec_torch.training.run import setup_training
from dprec_torch.training.trainer import Trainer
from tests.helpers import tiny_cfg, tiny_fold
from tests.models.test_pnbm_lowrank import BASE, DPSGD, GAUSSIAN, SGLD

KEY = bytes(range(32))


def _words(key: np.ndarray, tag: int = 7) -> np.ndarray:
    return np.concatenate([np.asarray(key, np.uint32), np.array([tag], np.uint32)]).view(np.int32)


def test_the_feed_gives_each_replay_the_keys_an_eager_step_draws():
    """Captured draws pair with their key buffers; each replay's keys are the generators' next draws, in order, and
    land in the buffers the captured kernels read."""
    a, b = SecretGenerator(KEY), SecretGenerator(KEY[::-1])
    twin_a, twin_b = SecretGenerator(KEY), SecretGenerator(KEY[::-1])
    feed = KeyFeed(torch.device("cpu"), words=64)
    with feed:
        ka, kb = a.next_key(), b.next_key()
        slot_b = feed.slot(kb, lambda k: _words(k, 2))  # (slots in another order than the draws)
        slot_a = feed.slot(ka, _words)
    feed.check()
    assert key_feed.observing() is None
    feed.upload(feed.captured_keys())
    assert np.array_equal(slot_a.view(torch.int32).numpy(), _words(twin_a.next_key()))
    assert np.array_equal(slot_b.view(torch.int32).numpy(), _words(twin_b.next_key(), 2))
    for _ in range(3):  # replays: fresh keys, the generators advanced as eager steps advance them
        feed.upload(feed.next_keys())
        assert np.array_equal(slot_a.view(torch.int32).numpy(), _words(twin_a.next_key()))
        assert np.array_equal(slot_b.view(torch.int32).numpy(), _words(twin_b.next_key(), 2))
    assert (a.counter, b.counter) == (twin_a.counter, twin_b.counter) == (4, 4)


def test_a_draw_the_feed_cannot_refresh_refuses_the_capture():
    """A draw with no key buffer (its kernel would replay a stale key), a buffer of no draw, or one draw read twice."""
    gen = SecretGenerator(KEY)
    with KeyFeed(torch.device("cpu")) as feed:
        gen.next_key()
    with pytest.raises(GraphUnsupported, match="stale key"):
        feed.check()
    earlier = SecretGenerator(KEY[::-1]).next_key()  # drawn before the capture
    with KeyFeed(torch.device("cpu")) as feed, pytest.raises(GraphUnsupported, match="not one draw"):
        feed.slot(earlier, _words)
    with KeyFeed(torch.device("cpu")) as feed:
        key = gen.next_key()
        feed.slot(key, _words)
        with pytest.raises(GraphUnsupported):
            feed.slot(key, _words)
    with KeyFeed(torch.device("cpu")) as feed, pytest.raises(GraphUnsupported, match="already"):
        with KeyFeed(torch.device("cpu")):
            pass


def test_only_the_capturing_thread_is_observed():
    """Another thread's draws (a checkpoint writer, a warm-up) are not the captured step's."""
    other = SecretGenerator(KEY)
    with KeyFeed(torch.device("cpu")) as feed:
        thread = threading.Thread(target=other.next_key)
        thread.start()
        thread.join()
    assert feed.draws == [] and other.counter == 1


def test_a_reset_lazy_statistic_reads_its_tensors_again():
    value = torch.tensor([1.0, 2.0])
    both = LazyStatistic(lambda: (float(value[0]), float(value[1])))
    first, second = both.part(0), both.part(1)
    assert (float(first), float(second)) == (1.0, 2.0)
    value.mul_(10)  # (a replay rewrote the tensors)
    assert float(first) == 1.0
    first.reset()
    second.reset()
    assert (float(first), float(second)) == (10.0, 20.0)


def _setup(mechanism: list[str], device: str, monkeypatch, *extra: str):
    monkeypatch.setattr(run_module, "masked_steps", lambda model, dev: True)
    overrides = [o if o != "device=cpu" else f"device={device}" for o in BASE]
    return setup_training(tiny_cfg(*overrides, *mechanism, "epsilon=5", "noise_seed=3", *extra),
                          tiny_fold().to(device), torch.device(device))


@pytest.mark.parametrize("mechanism,graphed", [(GAUSSIAN, True), (DPSGD, True), (SGLD, False)],
                         ids=["gaussian", "dpsgd", "sgld"])
def test_which_steps_are_replayed(mechanism, graphed, monkeypatch):
    """A CUDA device, masked batches below q = 1, and a mechanism that declares its host numbers (the clipped SGLD
    chain does not yet: its graphed steps have not run on a GPU); ``DPREC_STEP_GRAPH=0`` turns graphs off; never on
    the CPU."""
    s = _setup(mechanism, "cpu", monkeypatch)
    cuda = torch.device("cuda")
    assert step_graph.graphed_steps(s.optimizer, s.sampler, cuda) is graphed
    assert not step_graph.graphed_steps(s.optimizer, s.sampler, torch.device("cpu"))
    monkeypatch.setenv("DPREC_STEP_GRAPH", "0")
    assert not step_graph.graphed_steps(s.optimizer, s.sampler, cuda)


def test_a_failed_capture_leaves_no_trace_and_the_run_goes_on_eagerly(monkeypatch):
    """A capture that raises in the step's noise (after its Poisson draw, its clip, its statistics): the mechanism's
    state and both generators are restored, then the step runs eagerly, and so does the rest: U, the step count, the
    accountant and the generators equal a run that never tried (bit for bit, on the CPU)."""
    def trained(fail: bool):
        s = _setup(GAUSSIAN, "cpu", monkeypatch)
        trainer = Trainer(s.model, s.optimizer, s.sampler, 1)
        if fail:  # a capture as torch.cuda.graph runs it, on the CPU: the step's Python, then a capture error
            capturing = {"on": False}

            @contextlib.contextmanager
            def graph(*args, **kwargs):
                capturing["on"] = True
                try:
                    yield
                finally:
                    capturing["on"] = False

            def noise(original=s.optimizer.add_noise):
                if capturing["on"]:
                    raise RuntimeError("operation not permitted when stream is capturing")
                original()

            monkeypatch.setattr(torch.cuda, "graph", graph)
            monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: None)
            monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
            monkeypatch.setattr(s.optimizer, "add_noise", noise)
            trainer._graph = step_graph.StepGraph(trainer._eager_step, s.optimizer, s.sampler,
                                                  list(s.model.parameters()), torch.device("cpu"))
        losses = [float(trainer._step()[0]) for _ in range(5)]
        if fail:
            assert trainer._graph.failed and "capturing" in trainer._graph.failed and trainer._graph.graph is None
        o = s.optimizer
        return (s.model.U.detach().clone(), losses, o.state["mechanism"]["t"], o.accountant.state_dict(),
                o.generator.counter, s.sampler.generator.counter, o.epsilon_spent())

    reference, tried = trained(False), trained(True)
    assert torch.equal(reference[0], tried[0])
    assert reference[1:] == tried[1:]


GPU_STEPS = 9


def _trace(mechanism: list[str], graphs: str, monkeypatch) -> tuple:
    monkeypatch.setenv("DPREC_STEP_GRAPH", graphs)
    s = _setup(mechanism, "cuda", monkeypatch)
    trainer = Trainer(s.model, s.optimizer, s.sampler, 1)
    trace = []
    for _ in range(GPU_STEPS):
        sq, n = trainer._step()
        st = s.optimizer.state["mechanism"]
        trace.append((float(sq), int(n), float(st["clipped_fraction"]), float(st["grad_norm"])))
    o = s.optimizer
    return (trainer, s.model.U.detach().cpu(), trace, o.state["mechanism"]["t"], o.accountant.state_dict(),
            o.generator.counter, s.sampler.generator.counter, o.epsilon_spent())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mechanism", [GAUSSIAN, DPSGD], ids=["gaussian", "dpsgd"])
def test_graphed_steps_train_as_eager_steps_on_cuda(mechanism, monkeypatch):
    """Nine noised steps at q = 0.5: replayed from a graph (the first two eager, the third captured) they give eager
    steps' U, losses, target counts, clip statistics, step count, accountant, generator counters and epsilon (to the
    float64 rounding of the GPU's atomic sums); fresh keys every replay, or U would differ."""
    graphed, *got = _trace(mechanism, "1", monkeypatch)
    _, *want = _trace(mechanism, "0", monkeypatch)
    sg = graphed._graph
    assert sg is not None and sg.failed is None and sg.replays == GPU_STEPS - step_graph.WARMUP_STEPS, sg.failed
    u_got, trace_got, *rest_got = got
    u_want, trace_want, *rest_want = want
    assert float((u_got - u_want).abs().max() / u_want.abs().max()) < 1e-12
    assert rest_got == rest_want
    for g, w in zip(trace_got, trace_want):
        assert g[1] == w[1] and g[0] == pytest.approx(w[0], rel=1e-12) and g[2] == w[2]
        assert g[3] == pytest.approx(w[3], rel=1e-9)  # (a diagnostic summed in float32)
    assert len({t[0] for t in trace_got}) == GPU_STEPS  # every step its own sample and noise


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_graphed_run_fits_and_reports_as_an_eager_one(monkeypatch):
    """Trainer.fit over three epochs (evaluation, checkpoint-free): the same test RMSE and epsilon either way."""
    results = {}
    for graphs in ("1", "0"):
        monkeypatch.setenv("DPREC_STEP_GRAPH", graphs)
        s = _setup(GAUSSIAN, "cuda", monkeypatch, "mechanism.epochs=3")
        trainer = Trainer(s.model, s.optimizer, s.sampler, s.epochs)
        result = trainer.fit(s.fold)
        results[graphs] = ([row.get("test_rmse") for row in result.history], s.optimizer.epsilon_spent(),
                           trainer._graph is not None and trainer._graph.replays)
    (rmse_g, eps_g, replays), (rmse_e, eps_e, _) = results["1"], results["0"]
    assert replays and eps_g == eps_e
    assert rmse_g == pytest.approx(rmse_e, rel=1e-9)
