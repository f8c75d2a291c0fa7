"""``mechanism=none``: non-private MAP training by SGD on Eq. (3)/(4), with the beta trick of Alg. 1."""

from __future__ import annotations

from typing import Iterable

import torch

from dprec_torch.mechanisms.base import MechanismOptimizer
from dprec_torch.mechanisms.context import TrainingContext


class MapSGD(MechanismOptimizer):
    """S <- S - eta_t (beta G + lambda S)  (Eq. (4); Alg. 1 line 7 without noise), eta_t = lr x lr_decay^epoch.

    With a model that declares ``gradient_reduction = "mean"`` (MF), G has been divided by the expected
    batch size B and lambda by #units before this update (see :mod:`dprec_torch.mechanisms.base`).

    ``beta`` also rescales the initialisation once (Alg. 1 line 1): S^(1) <- beta S^(1).
    ``lr_decay`` multiplies the step once per epoch (epoch = (t - 1) // steps_per_epoch, 0-based; 1 = the constant
    step of Alg. 1): a large step early, a small one late, below the noise floor of a constant mini-batch step.
    Neighbouring relation: none (non-private).
    """

    name = "none"

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        context: TrainingContext,
        lr: float = 0.4,
        weight_decay: float = 0.005,
        beta: float = 10.0,
        lr_decay: float = 1.0,
        seed: int = 0,
    ) -> None:
        params = list(params)
        super().__init__(params, dict(lr=float(lr), weight_decay=float(weight_decay), beta=float(beta)), seed=seed)
        self.context = context
        self.lr_decay = float(lr_decay)
        with torch.no_grad():
            for p in params:
                p.mul_(float(beta))  # Alg. 1 line 1

    def current_lr(self, lr: float) -> float:
        """lr x lr_decay^epoch; the epoch comes from the saved step counter ``t``, so a resume continues the schedule."""
        if self.lr_decay == 1.0:
            return lr
        per_epoch = max(1, int(self.context.steps_per_epoch)) if self.context is not None else 1
        return lr * self.lr_decay ** ((self.t - 1) // per_epoch)

    def apply_update(self) -> None:
        """Alg. 1 line 7: p <- p - eta_t (beta G + lambda p)."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:  # in place on the gradient buffer: no M x M temporaries
                    g = p.grad
                    if group["beta"] != 1.0:
                        g.mul_(group["beta"])
                    if group["weight_decay"]:  # decay_divisor = 1 for PNBM (the paper's lambda)
                        g.add_(p, alpha=group["weight_decay"] / self.decay_divisor)
                    p.add_(g, alpha=-self.current_lr(group["lr"]))
