"""A fold's TensorBoard writer finished and closed off the training thread (start-up time: closing blocks no step).

Closing a ``SummaryWriter`` flushes its event file and joins its writer thread, and ``add_hparams`` opens and
closes a second writer for the ``hparams`` run: 1.8 s over a 7-job batched sweep on the H200 machine, in a
job's critical path. :func:`close_in_background` hands the writer to one thread that writes the last summaries
and closes it while the run (or the sweep's next job) goes on. The thread is not a daemon: the interpreter
joins it before it exits, so no event is lost. A caller that reads the logs in the same process
(``dprec_torch.train``, the batched launcher at the end of a launch) calls :func:`wait_closed` first; the next
:func:`close_in_background` waits for the previous close, so at most one is in flight.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

log = logging.getLogger(__name__)

_closing: list[threading.Thread] = []


def close_in_background(writer: SummaryWriter, last: Callable[[SummaryWriter], None] | None = None) -> None:
    """Run ``last(writer)`` (the final summaries), then ``writer.close()``, in a background thread.

    ``writer`` must not be used by the caller afterwards. A failure is logged (the run's results stand), never raised.
    """
    wait_closed()
    thread = threading.Thread(target=_finish, args=(writer, last), name="tensorboard-close", daemon=False)
    thread.start()
    _closing.append(thread)


def _finish(writer: SummaryWriter, last: Callable[[SummaryWriter], None] | None) -> None:
    try:
        try:
            if last is not None:
                last(writer)
        finally:
            writer.close()
    except Exception as err:  # noqa: BLE001 - logged: a TensorBoard failure must not fail a finished run
        log.warning("TensorBoard log %s: finishing it failed (%s); its last events may be missing",
                    writer.log_dir, err)


def wait_closed() -> None:
    """Return once every writer handed to :func:`close_in_background` is closed."""
    while _closing:
        _closing.pop(0).join()
