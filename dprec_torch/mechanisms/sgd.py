"""Non-private MAP training by SGD on Eq. (3)/(4), with the beta trick of Alg. 1: the update of ``mechanism=none``
(:class:`~dprec_torch.mechanisms.none.NoMechanism`) and the base of the Laplace mechanisms (``dpsgd``, ``dpsgd_paper``,
``dpsgd_mf``), which add clipping and noise to it."""

from __future__ import annotations

from typing import Any, Iterable

import torch

from dprec_torch.errors import ConfigError
from dprec_torch.mechanisms.base import MechanismOptimizer
from dprec_torch.mechanisms.context import TrainingContext


class MapSGD(MechanismOptimizer):
    """S <- S - eta_t (beta G + lambda S)  (Eq. (4); Alg. 1 line 7 without noise), eta_t = lr x lr_decay^epoch.

    With ``gradient_reduction = "mean"`` (MF), G has been divided by the expected batch size B and lambda by #units
    before this update (:mod:`dprec_torch.mechanisms.base`). ``beta`` also rescales the initialisation once (Alg. 1
    line 1): S^(1) <- beta S^(1). ``lr_decay`` multiplies the step once per epoch (epoch = (t - 1) // steps_per_epoch,
    0-based; 1 = the constant step of Alg. 1).
    ``rating_reg`` (lambda_r, default 0 = off) adds the classic SGD-MF per-visited-rating penalty (Koren et al. 2009
    Eq. (5); Berlioz et al.'s lambda): each batch target (u, i) contributes lambda_r (b_u, b_i, p_u, q_i) to the gradient
    of the rows it touches (the model's ``visit_penalty``, MF), before the division by B. Non-private only: the
    penalty's gradient reveals which ratings exist and is not linear in the residuals, so no residual-scaling clip
    bounds it.
    ``per_rating_step`` (default False): ``lr`` is the step of each sampled rating, not of the batch mean: the applied
    step is lr x B, i.e. lr (sum_batch e_ui d r_hat_ui/d theta + q lambda theta) -- sequential SGD-MF's per-rating step
    gamma (Koren et al. 2009; Berlioz et al. 2015) for a whole batch at once, so one ``lr`` means the same on ML-100K
    and ML-1M (docs/mf.md). A batch takes its visits to a row at once, so each row's step is capped at the Newton step
    of its bias over them: the row's gradient is divided by max(1, lr k_row), k_row = the model's ``batch_visits`` (MF:
    the targets that read the row; s^2 |batch| for the global bias g). It needs a model that counts its visits (MF).
    Neighbouring relation: none (non-private).
    """

    private = False  # non-private: sampled from the public seed (reproducible)

    name = "none"

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        context: TrainingContext,
        lr: float = 0.4,
        weight_decay: float = 0.005,
        beta: float = 10.0,
        lr_decay: float = 1.0,
        rating_reg: float = 0.0,
        per_rating_step: bool = False,
        seed: int = 0,
    ) -> None:
        params = list(params)
        super().__init__(params, dict(lr=float(lr), weight_decay=float(weight_decay), beta=float(beta)), seed=seed)
        self.context = context
        self.lr_decay = float(lr_decay)
        self.rating_reg = float(rating_reg)
        self.per_rating_step = bool(per_rating_step)
        self._visits: dict[int, torch.Tensor] = {}  # this step's k per parameter (id), from clip_residuals
        if self.per_rating_step:
            self._check_visit_counts(None if context is None else context.model)
        if self.rating_reg:
            self._check_visit_penalty(None if context is None else context.model)
        with torch.no_grad():
            for p in params:
                p.mul_(float(beta))  # Alg. 1 line 1

    def current_lr(self, lr: float) -> float:
        """lr x lr_decay^epoch (x B with ``per_rating_step``); the epoch comes from the saved step counter ``t``,
        so a resume continues the schedule."""
        if self.per_rating_step:
            lr = lr * self.grad_divisor  # the template divided G by B: lr x B x (G / B) = lr x G
        if self.lr_decay == 1.0:
            return lr
        per_epoch = max(1, int(self.context.steps_per_epoch)) if self.context is not None else 1
        return lr * self.lr_decay ** ((self.t - 1) // per_epoch)

    @staticmethod
    def _check_visit_penalty(model: Any) -> None:
        if model is not None and model.visit_penalty is None:  # BaseModel's default: no penalty
            raise ConfigError(f"mechanism.rating_reg needs a model with per-rating parameters (model=mf), "
                              f"got {type(model).__name__}; set mechanism.rating_reg=0")

    @staticmethod
    def _check_visit_counts(model: Any) -> None:
        if model is not None and model.batch_visits is None:  # BaseModel's default: no counts
            raise ConfigError(f"mechanism.per_rating_step needs a model that counts its batch visits (model=mf), "
                              f"got {type(model).__name__}; set mechanism.per_rating_step=false")

    def clip_residuals(self, residuals: torch.Tensor, batch: Any = None, model: Any = None) -> torch.Tensor:
        """No clipping; with ``rating_reg`` > 0, accumulate lambda_r x the model's per-visit penalty gradient first
        (the trainer's surrogate backward then adds the data gradient to the same ``p.grad``); with
        ``per_rating_step``, read the batch's visits per row for the cap in :meth:`apply_update`."""
        if self.per_rating_step:
            self._check_visit_counts(model)
            self._visits = {id(p): k for p, k in model.batch_visits(batch)}
        if self.rating_reg:
            self._check_visit_penalty(model)
            with torch.enable_grad():
                (self.rating_reg * model.visit_penalty(batch)).backward()
        return residuals

    def apply_update(self) -> None:
        """Alg. 1 line 7: p <- p - eta_t (beta G + lambda p); with ``per_rating_step``, row r's bracket is divided by
        max(1, (eta_t / B) k_r) (the per-rating step eta_t / B times the row's batch visits k_r)."""
        for group in self.param_groups:
            lr = self.current_lr(group["lr"])
            for p in group["params"]:
                if p.grad is not None:  # in place on the gradient buffer: no M x M temporaries
                    g = p.grad
                    if group["beta"] != 1.0:
                        g.mul_(group["beta"])
                    if group["weight_decay"]:  # decay_divisor = 1 for PNBM (the paper's lambda)
                        g.add_(p, alpha=group["weight_decay"] / self.decay_divisor)
                    k = self._visits.get(id(p)) if self.per_rating_step else None
                    if k is not None:
                        g.div_(torch.clamp(k * (lr / self.grad_divisor), min=1.0))
                    p.add_(g, alpha=-lr)
