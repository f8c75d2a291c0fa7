"""Start-up and exit cost a run does not need: torch's dynamo (and, through it, distributed/FSDP) import, the cyclic
GC, and the interpreter's teardown.

``torch.optim.Optimizer.add_param_group``, ``zero_grad``, ``state_dict`` and ``load_state_dict`` are wrapped by
``torch._compile._disable_dynamo``, whose first call imports ``torch._dynamo`` (and ``torch.distributed.fsdp``, sympy,
...): 2-3 s of a run that never compiles anything. The wrapper caches the disabled function on the wrapped one as
``__dynamo_disable``; pre-filling that cache with the function itself skips the import. Outside ``torch.compile`` the
two are the same call: dynamo's ``disable`` only matters while a frame is being compiled, and dprec-torch compiles nothing.

Loading torch, numba and Hydra allocates a few hundred thousand long-lived objects, and each full collection traverses
them all again (~0.3 s of CPU to the first epoch of ``python train.py data=ml-100k``). ``train.py`` calls
:func:`pause_gc` before its imports and :func:`resume_gc` after them (``gc.freeze``). Nothing else changes: a collection
only frees unreachable cycles, and module-level objects live until the process exits anyway.

At exit, CPython tears down every module and frees their objects one by one: 0.25-0.3 s after ``train.py``'s
final table on ML-100K (about 9 % of the run), and 0.7 s for a bare ``import torch, numba, hydra, scipy.linalg``.
Nothing needs that work: the process is ending. :func:`fast_exit` does what an exit must do -- waits for the
threads that are still running, runs the ``atexit`` handlers (logging's flush and close among them), flushes the
standard streams -- and then ends the process with ``os._exit``.

TensorBoard's file layer imports boto3 and fsspec, where they are installed, only to offer ``s3://`` and fsspec log
directories (0.1-0.2 s of a run on a machine with boto3); a run logs to its local Hydra output directory.
:func:`summary_writer_class` imports the writer without them.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import logging
import os
import sys
import threading
import types
from typing import Any

log = logging.getLogger(__name__)


def skip_dynamo_import() -> list[str]:
    """Pre-fill the ``_disable_dynamo`` cache of ``torch.optim.Optimizer``'s methods; returns their names. A no-op
    (empty list) once ``torch._dynamo`` is imported (the real ``disable`` must stay) or if torch's wrapper changes shape."""
    if "torch._dynamo" in sys.modules:
        return []
    from torch.optim import Optimizer

    done = []
    for name, attr in vars(Optimizer).items():
        code = getattr(attr, "__code__", None)
        fn = getattr(attr, "__wrapped__", None)
        if code is None or fn is None or code.co_name != "inner" or not code.co_filename.endswith("_compile.py"):
            continue
        if getattr(fn, "__dynamo_disable", None) is None:
            fn.__dynamo_disable = fn
            done.append(name)
    return done


def pause_gc() -> None:
    """Turn the cyclic garbage collector off while the modules load (module docstring); :func:`resume_gc` ends it."""
    gc.disable()


def resume_gc() -> None:
    """Freeze what is allocated so far (the imported modules; ``gc.freeze``) and turn the collector back on."""
    gc.freeze()
    gc.enable()


def fast_exit(code: int = 0) -> None:
    """End the process without the interpreter's module teardown (module docstring). Non-daemon threads are joined
    first (as the interpreter's own shutdown does), then the ``atexit`` handlers run (logging's flush and close, temp
    files, torch's and numba's handlers), then stdout and stderr are flushed. For a CLI's last line only: a function
    registered with ``atexit`` after this call, or code that expected to run after it, would not run.

    The threads end as at the interpreter's own exit: ``threading._shutdown`` first runs the hooks registered with
    ``threading._register_atexit``, which tell executors' worker and management threads to stop (concurrent.futures;
    joblib's loky, behind ``hydra/launcher=joblib``), and then joins the non-daemon threads. Joining them without
    those hooks waits forever for an idle executor."""
    shutdown_threads = getattr(threading, "_shutdown", None)  # CPython's; elsewhere, join them
    if shutdown_threads is not None:
        shutdown_threads()
    else:
        current = threading.current_thread()
        for thread in threading.enumerate():
            if thread is not current and not thread.daemon:
                thread.join()
    run_handlers = getattr(atexit, "_run_exitfuncs", None)  # CPython's; elsewhere, logging's own shutdown
    if run_handlers is not None:
        run_handlers()
    else:
        logging.shutdown()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: nothing left to flush
            pass
    os._exit(code)


#: what TensorBoard's file layer imports for remote log directories (``tensorboard.compat.tensorflow_stub.io.gfile``)
REMOTE_FILE_SYSTEMS = ("botocore", "boto3", "fsspec")


def summary_writer_class() -> type:
    """``torch.utils.tensorboard.SummaryWriter``, imported while :data:`REMOTE_FILE_SYSTEMS` that nothing has imported
    yet read as absent (``sys.modules[name] = None``; restored right after). TensorBoard then writes local directories
    only, for the rest of the process: a program that also logs to ``s3://`` imports ``torch.utils.tensorboard``
    itself first, which this leaves as it is."""
    if "torch.utils.tensorboard" in sys.modules:
        return sys.modules["torch.utils.tensorboard"].SummaryWriter
    hidden = [name for name in REMOTE_FILE_SYSTEMS if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment] - the import system's own "not importable" mark
    try:
        from torch.utils.tensorboard import SummaryWriter
    finally:
        for name in hidden:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
    return SummaryWriter


class DeferredModule:
    """Stands for ``import name`` until an attribute is read, then imports the module and reads every attribute from
    it (so a test's ``monkeypatch`` of the module is seen). Not a module and not in ``sys.modules``: scans of
    ``sys.modules`` (``inspect.getmodule`` reads ``__file__`` of every entry, which would run a ``LazyLoader``
    module's body) never import it."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: types.ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:  # only for what the instance lacks: the module's attributes
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)

    def __repr__(self) -> str:
        return f"<deferred import of {self._name!r}>"


def lazy_import(name: str) -> types.ModuleType | DeferredModule:
    """``import name``, deferred to the first attribute read (:class:`DeferredModule`), or the module where it is
    imported already: the numba kernel modules of the models load numba (about 0.2 s) only in a process that runs a
    CPU kernel, not in a GPU run."""
    module = sys.modules.get(name)
    return module if module is not None else DeferredModule(name)
