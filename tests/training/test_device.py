"""device=auto: CPU without CUDA; in a local multirun, one GPU per job through lock files."""

from __future__ import annotations

import threading

import pytest
import torch

from dprec_torch import device as dev
from dprec_torch.errors import ConfigError


def fake_gpus(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


@pytest.fixture(autouse=True)
def fresh_warm_ups(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no device warmed up in this process (warm_up is once a device)."""
    monkeypatch.setattr(dev, "_WARMING", {})


def test_auto_without_cuda_is_cpu(monkeypatch, tmp_path) -> None:
    fake_gpus(monkeypatch, 0)
    with dev.claimed_device("auto", tmp_path) as d:
        assert d == torch.device("cpu")
    assert not any(tmp_path.iterdir())  # no locks taken


def test_explicit_cuda_without_cuda_is_a_config_error(monkeypatch) -> None:
    fake_gpus(monkeypatch, 0)
    with pytest.raises(ConfigError, match="device=cpu"):
        dev.resolve_device("cuda:1")


def test_jobs_get_distinct_gpus_and_release_them(monkeypatch, tmp_path) -> None:
    fake_gpus(monkeypatch, 3)
    with dev.claimed_device("auto", tmp_path) as a, dev.claimed_device("auto", tmp_path) as b:
        assert {a, b} == {torch.device("cuda:0"), torch.device("cuda:1")}
        with dev.claimed_device("auto", tmp_path) as c:
            assert c == torch.device("cuda:2")
    with dev.claimed_device("auto", tmp_path) as again:  # all released: the first GPU is free again
        assert again == torch.device("cuda:0")


def test_a_job_waits_while_every_gpu_is_taken(monkeypatch, tmp_path) -> None:
    fake_gpus(monkeypatch, 1 + 1)
    got: list[torch.device] = []
    with dev.claimed_device("auto", tmp_path), dev.claimed_device("auto", tmp_path):
        waiter = threading.Thread(target=lambda: got.append(_claim(tmp_path)))
        waiter.start()
        waiter.join(timeout=0.5)
        assert waiter.is_alive() and not got  # both GPUs held: the third job waits
    waiter.join(timeout=10)
    assert got == [torch.device("cuda:0")]


def _claim(lock_dir):
    with dev.claimed_device("auto", lock_dir, poll_seconds=0.05) as d:
        return d


def test_no_locking_outside_a_sweep_or_with_an_explicit_device(monkeypatch, tmp_path) -> None:
    fake_gpus(monkeypatch, 4)
    with dev.claimed_device("auto", None) as a, dev.claimed_device("auto", None) as b:
        assert a == b == torch.device("cuda")
    with dev.claimed_device("cuda:3", tmp_path) as c:
        assert c == torch.device("cuda:3")
    assert not any(tmp_path.iterdir())


def test_warm_up_starts_no_thread_for_the_cpu() -> None:
    assert dev.warm_up(torch.device("cpu")) is None


def test_a_claimed_gpu_is_warmed_up_in_the_background(monkeypatch, tmp_path) -> None:
    """The CUDA context is created while the data is read, on the GPU the job was given."""
    fake_gpus(monkeypatch, 2)
    started: list[torch.device] = []
    monkeypatch.setattr(dev, "warm_up", lambda d: started.append(d))
    with dev.claimed_device("auto", tmp_path) as a, dev.claimed_device("auto", tmp_path) as b:
        assert started == [a, b] == [torch.device("cuda:0"), torch.device("cuda:1")]
    with dev.claimed_device("cpu", tmp_path):
        pass
    assert started[-1] == torch.device("cpu")  # warm_up itself decides that a CPU needs nothing


def test_warm_up_starts_once_a_device(monkeypatch) -> None:
    """The command line's early warm-up and the run's claimed device start one context, not two racing ones."""
    monkeypatch.setattr(dev, "_warm_triton", lambda device: None)
    monkeypatch.setattr(torch, "ones", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no CUDA here")))
    first = dev.warm_up(torch.device("cuda:1"))
    assert first is not None
    assert dev.warm_up(torch.device("cuda:1")) is first
    other = dev.warm_up(torch.device("cuda:0"))
    assert other is not None and other is not first
    first.join(timeout=10)  # its failure is left to the run's own first CUDA call
    assert not first.is_alive()


@pytest.mark.parametrize(("name", "argv", "warmed"), [
    ("auto", ["mechanism=sgld", "epsilon=20"], [torch.device("cuda")]),
    ("cuda:1", ["device=cuda:1"], [torch.device("cuda:1")]),
    ("cpu", ["device=cpu"], None),                                    # nothing to warm
    ("auto", ["-m", "epsilon=1,20"], None),                           # a job may be pinned to another GPU
    ("auto", ["--multirun", "epsilon=1,20"], None),
    ("auto", ["+hydra.job.env_set.CUDA_VISIBLE_DEVICES=1"], None),   # the job may see other GPUs
])
def test_early_warm_up_only_for_a_single_run_on_a_gpu(monkeypatch, name, argv, warmed) -> None:
    fake_gpus(monkeypatch, 2)
    started: list[torch.device] = []
    monkeypatch.setattr(dev, "warm_up", lambda d: started.append(d))
    thread = dev.warm_up_early(name, argv)
    if warmed is None:
        assert thread is None and started == []
        return
    thread.join(timeout=10)
    assert started == warmed


def test_early_warm_up_of_a_bad_device_leaves_the_error_to_the_run(monkeypatch) -> None:
    fake_gpus(monkeypatch, 0)
    started: list[torch.device] = []
    monkeypatch.setattr(dev, "warm_up", lambda d: started.append(d))
    dev.warm_up_early("cuda", []).join(timeout=10)  # no GPU: resolve_device raises inside the thread
    assert started == []
    with pytest.raises(ConfigError, match="device=cpu"):
        dev.resolve_device("cuda")  # ... and the run reports it as ever


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_warm_up_creates_the_context_without_blocking() -> None:
    thread = dev.warm_up(torch.device("cuda:0"))
    assert thread is not None
    thread.join(timeout=60)
    assert not thread.is_alive() and torch.cuda.is_initialized()
