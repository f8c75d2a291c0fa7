"""Start-up cost a run does not need: torch's dynamo (and, through it, distributed/FSDP) import.

``torch.optim.Optimizer.add_param_group``, ``zero_grad``, ``state_dict`` and ``load_state_dict``
are wrapped by ``torch._compile._disable_dynamo``, whose first call imports ``torch._dynamo``
(which imports ``torch.distributed.fsdp``, ``torch.distributed.tensor``, sympy, ...): 2-3 s of a
run that never compiles anything (``python -X importtime train.py``: ``torch._dynamo`` is
imported from ``Optimizer.__init__`` -> ``add_param_group``). The wrapper caches the disabled
function on the wrapped one as ``__dynamo_disable``; pre-filling that cache with the function
itself skips the import. Outside ``torch.compile`` the two are the same call: dynamo's
``disable`` only matters while a frame is being compiled, and dprec-torch compiles nothing.
"""

from __future__ import annotations

import logging
import sys

log = logging.getLogger(__name__)


def skip_dynamo_import() -> list[str]:
    """Pre-fill the ``_disable_dynamo`` cache of ``torch.optim.Optimizer``'s methods; returns their names.

    A no-op (empty list) once ``torch._dynamo`` is imported -- then there is nothing to save and
    the real ``disable`` must stay -- or if torch's wrapper changes shape.
    """
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
