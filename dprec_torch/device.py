"""Device selection: ``device=auto`` picks CUDA when present, one GPU per job in a local multirun."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from dprec_torch import cuda_driver
from dprec_torch.errors import ConfigError

log = logging.getLogger(__name__)


def resolve_device(name: str = "auto") -> torch.device:
    """Map ``auto|cpu|cuda[:n]`` to a :class:`torch.device`."""
    name = str(name).lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={name} asked for CUDA but none is available; use device=cpu or device=auto")
    try:
        return torch.device(name)
    except RuntimeError as err:
        raise ConfigError(f"unknown device '{name}'; use auto, cpu or cuda") from err


MATMUL_PRECISIONS = ("highest", "high", "medium")


def set_matmul_precision(name: str = "highest") -> str:
    """``torch.set_float32_matmul_precision``: ``highest`` (float32, the default), ``high`` (TF32 where the
    GPU has it), ``medium`` (bf16). Reduced precision is only ever this explicit choice, never silent."""
    name = str(name).lower()
    if name not in MATMUL_PRECISIONS:
        raise ConfigError(f"matmul_precision must be one of {', '.join(MATMUL_PRECISIONS)}, got '{name}' "
                          "(highest = float32; high = TF32; medium = bf16)")
    torch.set_float32_matmul_precision(name)
    return name


def warm_up(device: torch.device) -> threading.Thread | None:
    """Create ``device``'s CUDA context (and cuBLAS handle) on a background thread; None for a CPU device.

    The first CUDA call of a process creates the context and loads kernels (0.5-1.2 s on an H100/H200). Started as soon
    as the device is known, it overlaps with reading the data; torch's lazy-init lock makes the main thread's first CUDA
    call wait for it rather than race it. The driver's initialisation and the context are made first through
    :func:`cuda_driver.open_device`, which frees the GIL while they run (torch's own call holds it). A second thread
    readies Triton where it is installed (:func:`_warm_triton`). Returns the CUDA thread.
    """
    if device.type != "cuda":
        return None
    with _WARMING_LOCK:  # once a device per process: the command-line check may have started it (warm_up_early)
        if str(device) in _WARMING:
            return _WARMING[str(device)]

        def init() -> None:
            cuda_driver.open_device(device.index or 0)  # with the GIL free for the main thread meanwhile
            try:
                a = torch.ones(64, 64, device=device)
                (a @ a).sum().item()  # context, cuBLAS handle and the first kernels: not in the first epoch's time
            except Exception as err:  # noqa: BLE001 - the main thread's own first CUDA call reports it
                log.debug("CUDA warm-up on %s failed: %s", device, err)

        threading.Thread(target=_warm_triton, args=(device,), name="triton-warm-up", daemon=True).start()
        thread = threading.Thread(target=init, name=f"cuda-warm-up-{device}", daemon=True)
        thread.start()
        _WARMING[str(device)] = thread
        return thread


#: the devices :func:`warm_up` has started in this process, by ``str(device)``, and its lock
_WARMING: dict[str, threading.Thread] = {}
_WARMING_LOCK = threading.Lock()


def warm_up_early(device_name: str, argv: list[str]) -> threading.Thread | None:
    """:func:`warm_up` of a single run's ``device`` as soon as its command line is checked, on a background thread
    (``device=auto`` asks the driver for a GPU there too), so the CUDA context is made while Hydra composes the config
    twice more and sets up the run directory, not after. Nothing for a multirun (a job may be pinned to another GPU;
    :func:`claimed_device`) or a command line that sets ``hydra.job.env_set`` (it may change ``CUDA_VISIBLE_DEVICES``
    for the job); the run's own :func:`claimed_device` then starts it. The context ``train.py`` opened before its
    imports (:func:`cuda_driver.open_early`) is kept for this device and released otherwise. Returns the thread, or
    None."""
    single = not any(a in ("-m", "--multirun") or "env_set" in a for a in argv)
    index = cuda_driver.cuda_index_named(str(device_name)) if single else None
    cuda_driver.settle_early(index)
    if index is None:
        return None

    def start() -> None:
        cuda_driver.open_device(index)  # before torch asks the driver anything (it would hold the GIL meanwhile)
        try:
            warm_up(resolve_device(device_name))
        except Exception as err:  # noqa: BLE001 - a bad device name is the run's own error to report
            log.debug("early warm-up of %s skipped: %s", device_name, err)

    thread = threading.Thread(target=start, name="device-warm-up", daemon=True)
    thread.start()
    return thread


def _warm_triton(device: torch.device) -> None:
    """What the set-up's first Triton launch would do first (none of it needs the CUDA context): import Triton, define
    the package's kernels, and hash Triton's own files into its cache key (``triton_key``: 0.4 s on the H200 image,
    computed once a process), and import the module its launcher's first call imports (``triton.experimental.gluon``)."""
    try:
        from dprec_torch import chacha
        from dprec_torch.models import lowrank_triton

        if chacha._triton(device) is None or lowrank_triton._kernels() is None:
            return
        import triton.experimental.gluon  # noqa: F401 - imported by the first launch's argument specialisation
        from triton.runtime.cache import triton_key

        triton_key()  # (functools.lru_cache: the first compile-or-load in this process then reads it)
    except Exception as err:  # noqa: BLE001 - a Triton without these: the first launch does what it must
        log.debug("Triton warm-up failed: %s", err)


@contextlib.contextmanager
def claimed_device(name: str, lock_dir: Path | None, poll_seconds: float = 1.0) -> Iterator[torch.device]:
    """:func:`resolve_device`; with ``device=auto``, several GPUs and a ``lock_dir``, one GPU per job.

    A job of a local multirun (the joblib launcher, one process per job) takes an exclusive lock on
    ``lock_dir/gpu-<i>.lock`` for the first GPU i no other job holds, waits while all are taken, and keeps it until the
    job ends, so ``hydra.launcher.n_jobs`` = the number of GPUs runs one job per GPU. SLURM jobs never lock.
    """
    device = resolve_device(name)
    n_gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    if str(name).lower() != "auto" or n_gpus <= 1 or lock_dir is None:
        warm_up(device)
        yield device
        return
    import fcntl

    lock_dir.mkdir(parents=True, exist_ok=True)
    waited = False
    while True:
        for i in range(n_gpus):
            handle = open(lock_dir / f"gpu-{i}.lock", "a+")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.close()
                continue
            log.info("multirun job pinned to cuda:%d (%d GPUs)", i, n_gpus)
            warm_up(torch.device(f"cuda:{i}"))
            try:
                yield torch.device(f"cuda:{i}")
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
                handle.close()
            return
        if not waited:
            log.info("all %d GPUs hold a job of this sweep; waiting for one", n_gpus)
            waited = True
        time.sleep(poll_seconds)
