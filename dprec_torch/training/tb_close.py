"""A fold's TensorBoard writer finished and closed off the training thread (closing blocks no step).

Closing a ``SummaryWriter`` and the second writer ``add_hparams`` opens took 1.8 s over a 7-job batched sweep on the
H200 machine, in a job's critical path. :func:`close_in_background` hands the writer to one non-daemon thread (the
interpreter joins it before it exits: no event is lost) that writes the last summaries and closes it while the run goes
on; at most one close is in flight. A caller that reads the logs in the same process calls :func:`wait_closed` first.
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
    """Run ``last(writer)`` (the final summaries), then ``writer.close()``, in a background thread. ``writer`` must not
    be used by the caller afterwards. A failure is logged (the run's results stand), never raised."""
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
        log.warning("TensorBoard log %s: finishing it failed (%s); its last events may be missing", writer.log_dir, err)


def wait_closed() -> None:
    """Return once every writer handed to :func:`close_in_background` is closed."""
    while _closing:
        _closing.pop(0).join()
