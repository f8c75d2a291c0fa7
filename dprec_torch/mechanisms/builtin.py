"""``mechanism=builtin`` (``conf/mechanism/builtin.yaml``): the predictor is its own privacy mechanism.

The fitted predictors with a mechanism inside (``model=pncf``, ``mcsherry``, ``d2p``, ``dpals``, ``noisy_gram``: their
yamls pick this key) read ``epsilon``, ``delta`` and their noise seed themselves and state their own privacy report.
:class:`BuiltIn` holds nothing and wraps nothing: the runner fits the predictor and releases it as it is (a
:class:`~dprec_torch.interfaces.LeavesPredictorAsFitted`). A trained model (PNBM, MF) cannot use it: its mechanism is
an optimizer (``mechanism=none|dpsgd|sgld|gaussian|dpsgd_paper``).
"""

from __future__ import annotations

from dprec_torch.interfaces import LeavesPredictorAsFitted


class BuiltIn(LeavesPredictorAsFitted):
    """``mechanism=builtin``: the fitted predictor's own mechanism (see the module docstring); no parameters."""

    name = "builtin"

    def __init__(self) -> None:
        """Nothing to configure: ``epsilon``, ``delta`` and the noise seed are the predictor's own keys."""
