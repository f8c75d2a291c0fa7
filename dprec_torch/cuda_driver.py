"""The CUDA driver's slow first calls, made through ctypes so that the GIL is free while they run, and made while
``train.py`` imports torch.

torch's first CUDA call of a process initialises the driver (``cuInit``, inside ``torch._C._cuda_init`` or
``torch._C._cuda_getDeviceCount``) without releasing the GIL, so a warm-up thread that makes that call stops every
other Python thread for as long as the driver takes (the first CUDA call of a run took 1.0-1.2 s on the H200 image).
A ctypes call into a ``CDLL`` releases the GIL for its duration. :func:`open_device` makes the two slow calls that way:

* ``cuInit(0)``: the driver initialises once a process, so torch's own ``cuInit`` later returns at once;
* ``cuDevicePrimaryCtxRetain``: creates the device's *primary* context, the one the CUDA runtime (and so torch)
  makes current on that device, so torch finds it made. The reference it holds is kept (torch uses the same context
  until the process ends), except where :func:`settle_early` drops it.

Before ``cuInit`` it sets ``CUDA_MODULE_LOADING=LAZY`` where the user has not chosen, as torch's ``CUDAHooks::init``
does before its own ``cuInit`` (the driver reads it there; eager loading would load every kernel of torch at once).
Any failure (no driver library, no device, an old driver) returns False and changes nothing: torch's first CUDA call
then does the work, and reports any error, as before.

:func:`open_early` needs no torch, so ``train.py`` starts it before its imports (``import torch`` alone takes 1.7-2.3 s
on the H200 image): the driver and the context are made meanwhile on another core. The device is read from the
command line (``device=...``) or the primary config's top-level ``device:`` line, before Hydra composes anything, so
once the config is composed :func:`settle_early` releases the context again wherever the run turns out not to use
that device (a ``device`` set some other way), and no CPU run keeps a GPU context.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import re
import sys
import threading
from pathlib import Path
from typing import Any

#: the driver library's name by platform (the runtime links the same one)
DRIVER_LIBRARY = {"linux": "libcuda.so.1", "win32": "nvcuda.dll"}


def _load_driver() -> Any | None:
    """The CUDA driver library (``ctypes.CDLL``: its calls release the GIL), or None where it cannot be loaded."""
    name = DRIVER_LIBRARY.get(sys.platform)
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def open_device(index: int) -> bool:
    """``cuInit(0)``, then retain device ``index``'s primary context (module docstring). True where both succeeded.

    ``index`` is the ordinal among the devices ``CUDA_VISIBLE_DEVICES`` leaves visible, as in ``cuda:<index>``."""
    driver = _load_driver()
    if driver is None:
        return False
    os.environ.setdefault("CUDA_MODULE_LOADING", "LAZY")  # read by cuInit: torch's own default, set first
    context = ctypes.c_void_p()
    try:  # each call returns CUDA_SUCCESS (0) or an error that torch's own first call then reports
        if driver.cuInit(0) != 0 or (device := _device_handle(driver, index)) is None:
            return False
        return driver.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) == 0
    except AttributeError:  # a driver without the symbol: torch's own calls decide
        return False


def _device_handle(driver: Any, index: int) -> ctypes.c_int | None:
    """``cuDeviceGet``: the driver's handle of device ``index``, or None where it has no such device."""
    device = ctypes.c_int()
    return device if driver.cuDeviceGet(ctypes.byref(device), int(index)) == 0 else None


def release_device(index: int) -> bool:
    """Drop the reference :func:`open_device` took on device ``index``'s primary context (the driver destroys the
    context once no one holds it). True where the driver accepted it."""
    driver = _load_driver()
    if driver is None:
        return False
    try:
        device = _device_handle(driver, index)
        release = getattr(driver, "cuDevicePrimaryCtxRelease_v2", None) or driver.cuDevicePrimaryCtxRelease
        return device is not None and release(device) == 0
    except AttributeError:
        return False


#: ``device=<name>`` on a command line (also ``+device=`` / ``++device=``), and a config file's top-level ``device:``
_DEVICE_OVERRIDE = re.compile(r"^\+{0,2}device=(.*)$")
_DEVICE_LINE = re.compile(r"^device:\s*([^\s#]+)", re.MULTILINE)

#: the early opening in flight: ``thread``, and ``index`` once a device's context is held
_EARLY: dict[str, Any] = {}

#: the threads :func:`open_early` and :func:`settle_early` started, joined at exit (:func:`_join_driver_threads`)
_DRIVER_THREADS: list[threading.Thread] = []


@atexit.register
def _join_driver_threads(timeout: float = 60.0) -> None:
    """At exit, wait for a driver call still running on one of this module's threads (a bad command line exits
    within milliseconds): the driver's own exit handlers must not run while another thread is inside ``cuInit``."""
    for thread in _DRIVER_THREADS:
        thread.join(timeout)


def _start(target: Any, name: str) -> threading.Thread:
    thread = threading.Thread(target=target, name=name, daemon=True)
    _DRIVER_THREADS.append(thread)
    thread.start()
    return thread


def cuda_index_named(name: str) -> int | None:
    """The CUDA ordinal a ``device`` setting names: ``cuda:<n>`` -> n; ``cuda`` and ``auto`` -> 0 (``auto`` is CUDA
    exactly where a device opens); anything else (``cpu``, ``mps``, a typo) -> None."""
    name = name.strip().strip("'\"").lower()
    if name in ("auto", "cuda"):
        return 0
    match = re.fullmatch(r"cuda:(\d+)", name)
    return int(match.group(1)) if match else None


def open_early(argv: list[str], config_file: Path) -> threading.Thread | None:
    """Start :func:`open_device` on a daemon thread for the device a single run's command line will use (module
    docstring). Nothing for a command line with a Hydra flag (``-m``, ``--cfg``, ``-cn``, ...: another config, or jobs
    pinned to their own GPUs) or one that sets ``hydra.job.env_set`` (it may change ``CUDA_VISIBLE_DEVICES``)."""
    if any(arg.startswith("-") or "env_set" in arg for arg in argv):
        return None

    def open_named() -> None:
        names = [m.group(1) for m in map(_DEVICE_OVERRIDE.match, argv) if m]
        if not names:
            try:
                found = _DEVICE_LINE.search(config_file.read_text())
            except OSError:
                return
            names = [found.group(1)] if found else []
        index = cuda_index_named(names[-1]) if names else None
        if index is not None and open_device(index):
            _EARLY["index"] = index

    _EARLY.clear()
    _EARLY["thread"] = thread = _start(open_named, "cuda-driver-open")
    return thread


def settle_early(index: int | None) -> threading.Thread | None:
    """Once the run's device is known (``index``: its CUDA ordinal, or None for no GPU): keep the context
    :func:`open_early` holds where it is that device's, else release it, on a daemon thread that first waits for the
    opening to finish. Returns that thread, or None where nothing was opened early."""
    opening = _EARLY.pop("thread", None)
    if opening is None:
        return None

    def settle() -> None:
        opening.join()
        opened = _EARLY.pop("index", None)
        if opened is not None and opened != index:
            release_device(opened)

    return _start(settle, "cuda-driver-settle")
