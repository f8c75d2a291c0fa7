"""What every trained model shares: a neutral default for each optional capability (LensKit style).

A model (:class:`~dprec_torch.interfaces.TrainableModel`: ``attach``, ``restore``, ``batch_predict``, ...) subclasses
:class:`BaseModel` and overrides what it has; the runner, the Trainer and the mechanisms read these members directly.
Tensors a model registers (``item_means``, ``S``, the factor tables) get no class default: an ``nn.Module`` serves them
from ``_buffers``/``_parameters``, which a class attribute of the same name would shadow.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from dprec_torch.errors import ConfigError
from dprec_torch.interfaces import MeanFallback


def check_settings(*checks: tuple) -> None:
    """The first invalid ``model.<name>`` as one :class:`ConfigError`: (name, value, allowed) must be one of ``allowed``,
    (name, value) must be > 0."""
    for name, value, *allowed in checks:
        if allowed and value not in allowed[0]:
            raise ConfigError(f"model.{name} must be one of {allowed[0]}, got '{value}'")
        if not allowed and value <= 0:
            raise ConfigError(f"model.{name} must be > 0, got {value}")


class BaseModel(nn.Module):
    """An ``nn.Module`` trained under a mechanism; the defaults say "has no such capability"."""

    #: what ``lr`` is a step on: ``sum`` (the paper's summed G) or ``mean`` (the clipped, noised sum / expected batch size)
    gradient_reduction = "sum"
    #: a step reads the batch's history blocks ``x``/``ind``; False: the rating-level sampler skips building them
    reads_history = True
    #: predictions for u read u's own training ratings R_u (PNBM's Eq. (2)): joint DP only
    reads_own_ratings = False
    #: centres on, and releases, item means r_bar: an ``item_means`` buffer a mechanism may replace by a DP release
    centres_on_item_means = False
    #: ``mechanism=dpsgd_paper`` perturbs each rating's error (Berlioz et al. 2015: DPSGD-MF), not the gradient
    dpsgd_perturb_residuals = False
    #: a user-level step may run on a masked full batch (:attr:`~dprec_torch.models.batching.UserBatch.row_mask`): each
    #: row's prediction reads that row's ratings only, and a row whose residuals are all 0 has a gradient of exactly 0
    masked_batches = False
    #: training predictions are clipped to the rating scale (then |e_ui| <= phi)
    clip_training_predictions = False
    #: the fallback of ids without training ratings where the config chooses it (MF: ``mean`` | ``model``)
    fallback: str | None = None
    #: the :class:`MeanFallback` unknown users/items get (None: none)
    fallback_: MeanFallback | None = None
    #: a released part no mechanism covers (top-k PNBM: its data-chosen support)
    privacy_caveat: str | None = None
    #: optional methods, None where the model has none (a mechanism that needs one refuses the model): per-example
    #: L2 gradient norms without the gradients (Gaussian DP-SGD), the classic SGD-MF per-visit penalty lambda_r
    #: (``mechanism.rating_reg``) and how many batch targets read each parameter row (``mechanism.per_rating_step``)
    per_example_grad_norms: Callable[[Any, torch.Tensor, str], torch.Tensor] | None = None
    visit_penalty: Callable[[Any], torch.Tensor] | None = None
    batch_visits: Callable[[Any], list[tuple[torch.Tensor, torch.Tensor]]] | None = None

    def project_(self) -> None:
        """Re-impose the constraint set after a step (PNBM: S symmetric, zero diagonal); none by default."""

    def training_targets(self, batch: Any) -> torch.Tensor:
        """What the training prediction is compared with: the ratings (low-rank PNBM: its clamped residual target)."""
        return batch.values

    def fused_step(self, batch: Any, target: torch.Tensor, bound: float
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """Forward, residuals, element-wise clamp to ``bound`` and backward in one pass (fills ``.grad``; returns pred,
        residuals, clamped residuals, the separate path's numbers); None: not fused here (the default)."""
        return None

    def sgld_prior_precision(self, train: Any, batch_ratings: float) -> list[torch.Tensor | None]:
        """SGLD's prior correction H (Wang & Tang Eq. (11)); none by default."""
        return []
