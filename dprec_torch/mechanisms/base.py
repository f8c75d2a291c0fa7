"""The Opacus-style optimizer template shared by every training mechanism.

``step()`` is a short fixed sequence -- ``add_noise()``, ``scale_grad()``, ``apply_update()``, then ``account()`` --
and a mechanism overrides only the pieces that differ. Per-example clipping happens one stage earlier, on the
residuals, through ``clip_residuals()`` (Alg. 1 line 5), because for PNBM and MF every example's gradient is
``e_ui * d r_hat_ui / d theta``.

Optimizer state (step counter, noise generator state, last noise scale) lives in ``self.state`` so it round-trips
through ``state_dict()`` into checkpoints; so does the mechanism's accountant, which lives in ONE attribute,
``self.accountant`` (None for a mechanism without one): this base class saves and restores it.

Two set-up steps, one job each. The constructor CALIBRATES (noise scales, budget split, accountant; no data,
no noise drawn). :meth:`prepare` then touches the model once, after it is attached to its training data and
before any batch is built: the releases that come first (PNBM's DP item means, into the model and its
fallback, kept as ``mean_release``) and the parameters' start (PNBM's S = s0 (1 - I)). A resumed run skips
``prepare``: its checkpoint restores the model, and ``load_state_dict`` the release record and the accountant.

One key, one class per model family: where a key trains a model family by another class (e.g. ``mechanism=gaussian``
PNBM by :class:`~dprec_torch.mechanisms.gaussian.GaussianPNBM`), the table :data:`dprec_torch.forms.FORMS` says so.
No class builds another.

Gradient reduction (``TrainingContext.gradient_reduction``, declared by the model). Under ``sum`` (PNBM) ``lr`` applies
to the summed, clipped, noised gradient G, as in the paper. Under ``mean`` (MF) ``scale_grad()`` divides G -- signal
AND noise -- by the expected batch size B = q x #units (Opacus's ``scale_grad``) and the dense decay becomes
lambda / #units, so each step is lr x an unbiased estimate of the gradient of the mean objective
(1/n)(sum_x l_x + lambda |theta|^2 / 2): the same ``lr`` and ``weight_decay`` mean the same thing at any sampling ratio
and any dataset size. Both divisors are public counts, so privacy is unaffected (post-processing of the noised sum).
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Iterable

import torch
from torch.optim import Optimizer

from dprec_torch.errors import ConfigError
from dprec_torch.mechanisms.context import TrainingContext
from dprec_torch.privacy.accountants import Accountant
from dprec_torch.privacy.pnbm_clipping import clip_factors
from dprec_torch.seeding import SecretGenerator, noise_generator, secret


class MechanismOptimizer(Optimizer):
    """Base class. ``relation`` is the neighbouring relation the mechanism protects (never the sampling unit:
    that is ``mechanism.unit``; see :class:`~dprec_torch.interfaces.TrainingMechanism`)."""

    name = "none"
    relation: str | None = None
    #: draws calibrated noise: its Poisson sampling is then part of the privacy proof (amplification), so the runner
    #: draws the sampler from the secret noise source too (``noise_seed``); only non-private SGD sets False
    private = True
    uses_prior_precision = False  # reads TrainingContext.prior_precision (SGLD's H)
    #: the mechanism's accountant (set in ``__init__``); saved and restored by ``state_dict`` below
    accountant: Accountant | None = None
    #: the run's facts (set by every mechanism's ``__init__``); None = a bare optimizer with summed gradients
    context: TrainingContext | None = None
    #: whether :meth:`prepare` releases DP item means (decided by ``__init__``); the release it made, else None
    #: (saved and restored with the state, so a resumed run reports it and never releases again)
    releases_item_means = False
    mean_release: Any = None
    #: set by :meth:`prepare` (and by :meth:`load_state_dict`: a restored mechanism is prepared)
    prepared = False
    #: :meth:`report`'s cache: the step count it was computed at, and the report
    _report_key: tuple[int, bool] | None = None
    _report: dict[str, Any] | None = None

    @classmethod
    def model_lacks(cls, model: type) -> str | None:
        """The capability this class calls that the model class leaves at BaseModel's None (checked before any data
        is read); None when it has what the class needs."""
        return None

    def __init__(self, params: Iterable[torch.Tensor], defaults: dict[str, Any], seed: int | None = None) -> None:
        super().__init__(params, defaults)
        device = self.param_groups[0]["params"][0].device
        # the noise proof's randomness: secret (OS entropy) unless an explicit noise seed is given (seeding.py)
        self.generator = noise_generator(seed, device)
        self.state["mechanism"] = {"t": 0, "noise_scale": 0.0, "grad_norm": 0.0, "residual_bound": float("inf")}

    # ------------------------------------------------------------------ set-up
    def prepare(self, model: Any) -> None:
        """The data-dependent set-up (module docstring), run once by whoever trains with it after ``model`` is attached to
        its training data, before any batch is built (a batch centres the history by the item means installed here).
        Draws from ``self.generator``. Nothing by default; an override calls ``super().prepare(model)`` first."""
        if self.prepared:
            raise RuntimeError(f"{type(self).__name__}.prepare() ran already (or the state was restored): "
                               "a second call would release the item means again")
        self.prepared = True

    # ----------------------------------------------------------------- template
    @property
    def t(self) -> int:
        """1-based index of the step about to be taken (Alg. 1/2's t)."""
        return int(self.state["mechanism"]["t"]) + 1

    def clip_residuals(self, residuals: torch.Tensor, batch: Any = None, model: Any = None) -> torch.Tensor:
        """Per-example clipping, expressed on the residuals e_ui (identity by default): clamping e_ui (Alg. 1) or scaling
        it by min(1, c / ||per-example gradient||) (Gaussian DP-SGD; ``batch`` and ``model`` give the norms)."""
        return residuals

    def elementwise_residual_clip(self) -> float | None:
        """b when this step's :meth:`clip_residuals` is the pure clamp min(max(e, -b), b) (inf: the identity), so the
        Trainer may let a model clamp inside its fused step; None (the default) when it is anything else."""
        return None

    def clip_by_norm(self, residuals: torch.Tensor, norms: torch.Tensor, rows: torch.Tensor | None = None,
                     counted: torch.Tensor | None = None) -> torch.Tensor:
        """Per-example clipping as residual scaling: e_ui min(1, c / ||g||), c = ``self.clip_norm``. ``norms``: per target,
        or per user with ``rows`` mapping each target to its user's norm (:meth:`unit_clip_factors`)."""
        return scale_residuals(residuals, self.unit_clip_factors(norms, counted), rows)

    def unit_clip_factors(self, norms: torch.Tensor, counted: torch.Tensor | None = None) -> torch.Tensor:
        """min(1, c / ||g||) per unit in float64 (:func:`clip_factors`). Records the clipped fraction and the largest
        clipped norm over the units in ``counted`` (a masked batch's sampled rows; None: all): numbers on the CPU,
        computed when first read off it (:class:`LazyStatistic`; a diagnostic, not worth a dozen launches a step)."""
        norms = norms.double()
        factor = clip_factors(norms, self.clip_norm)
        st = self.state["mechanism"]
        if not norms.numel():
            st["clipped_fraction"] = st["max_clipped_norm"] = 0.0
        elif norms.device.type == "cpu":
            st["clipped_fraction"], st["max_clipped_norm"] = _clip_statistics(norms, factor, counted, self.clip_norm)
        else:
            both = LazyStatistic(lambda: _clip_statistics(norms, factor, counted, self.clip_norm))
            st["clipped_fraction"], st["max_clipped_norm"] = both.part(0), both.part(1)
        st["residual_bound"] = float("inf")
        return factor

    def grads(self) -> list[torch.Tensor]:
        """Every parameter's gradient that exists (``p.grad`` is not None), group by group."""
        return [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]

    def add_noise(self) -> None:
        """Perturb ``p.grad`` in place; no noise by default."""

    def add_gaussian_noise_(self, std: float) -> None:
        """G += N(0, std^2) on every parameter entry (a missing gradient counts as zero), from the secret generator
        (:func:`add_gaussian_noise_`: ChaCha20 under a 256-bit key, on every device)."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                if std > 0:
                    add_gaussian_noise_(p.grad, std, self.generator)

    @property
    def grad_divisor(self) -> float:
        """B = E|batch| when the model declares ``gradient_reduction = "mean"``, else 1 (see the module doc)."""
        return 1.0 if self.context is None else self.context.grad_divisor

    @property
    def decay_divisor(self) -> float:
        """#units when the model declares ``gradient_reduction = "mean"``, else 1: the dense decay is lambda / #units."""
        return 1.0 if self.context is None else self.context.decay_divisor

    def scale_grad(self) -> None:
        """G <- G / B (Opacus's ``scale_grad``; B = 1 under summed semantics, which is left untouched)."""
        b = self.grad_divisor
        if b != 1.0:
            for g in self.grads():
                g.div_(b)

    def account(self) -> None:
        """Record the step just taken in ``self.accountant`` (no-op by default; Opacus's step hook)."""

    def apply_update(self) -> None:
        """Plain gradient descent with L2 penalty: p <- p - lr (grad + (weight_decay / decay_divisor) p)."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:  # in place: no M x M temporaries
                    wd, lr = group.get("weight_decay", 0.0), group["lr"]
                    if wd:
                        p.grad.add_(p, alpha=wd / self.decay_divisor)
                    p.add_(p.grad, alpha=-lr)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        norms = [torch.linalg.vector_norm(g).double() for g in self.grads()]  # a logged diagnostic: float32 accumulation suffices
        self.state["mechanism"]["grad_norm"] = _statistic(torch.linalg.vector_norm(torch.stack(norms or [torch.zeros((), dtype=torch.float64)])))
        self.add_noise()
        self.scale_grad()
        self.apply_update()
        self.host_step()
        return loss

    def host_step(self) -> None:
        """A step's bookkeeping on the host, after its device work: the step count and the accountant's record. A step
        replayed from a CUDA graph (:mod:`dprec_torch.training.step_graph`) runs no Python but this."""
        self.state["mechanism"]["t"] += 1
        self.account()

    def graph_constants(self) -> tuple | None:
        """The host numbers a step's kernels are launched with (step size, noise scale, clip bound, ...), where they are
        the same every step: a step captured in a CUDA graph is replayed only while they are unchanged. None (the
        default): the mechanism's step is not replayed from a graph (its host work is more than :meth:`host_step`, or
        its numbers change from step to step)."""
        return None

    # ----------------------------------------------------------------- reporting
    def step_size(self) -> float:
        return float(self.param_groups[0]["lr"])

    def epsilon_spent(self) -> float:
        """Epsilon spent so far, as this mechanism's analysis states it (inf when non-private)."""
        return float("inf")

    def privacy_report(self) -> dict[str, Any]:
        return {"mechanism": self.name, "relation": None, "epsilon": float("inf"), "analysis": "non-private training"}

    def report(self) -> dict[str, Any]:
        """:meth:`privacy_report` computed once per step count (an epoch's log line and the run's last report share one
        accountant answer), returned as a copy so a caller's additions stay its own."""
        key = (int(self.state["mechanism"]["t"]), self.prepared)
        if self._report_key != key:
            self._report_key, self._report = key, self.privacy_report()
        return copy.deepcopy(self._report)

    # ------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """torch's optimizer state (incl. ``self.state["mechanism"]``: t, ...) + noise RNG + accountant + the
        record of what :meth:`prepare` released (``mean_release``)."""
        sd = super().state_dict()
        mech = sd["state"].get("mechanism")
        if mech is not None:  # the device scalars of _statistic as numbers (a checkpoint reads on any device)
            sd["state"]["mechanism"] = {k: float(v) if isinstance(v, LazyStatistic) or (isinstance(v, torch.Tensor)
                                                                                       and v.dim() == 0) else v
                                        for k, v in mech.items()}
        sd["generator_state"] = self.generator.get_state()
        if self.accountant is not None:
            sd["accountant"] = self.accountant.state_dict()
        if self.mean_release is not None:
            sd["mean_release"] = self.mean_release
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; the mechanism is then prepared (the model's r_bar, fallback and S come from the
        model's own state: nothing is released again)."""
        state_dict = dict(state_dict)
        gen, acc, release = (state_dict.pop(key, None) for key in ("generator_state", "accountant", "mean_release"))
        super().load_state_dict(state_dict)
        if gen is not None:
            self.generator.set_state(gen)
        if acc is not None and self.accountant is not None:
            self.accountant.load_state_dict(acc)
        if release is not None:
            self.mean_release = release
        self.prepared = True


def scale_residuals(residuals: torch.Tensor, factor: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """e_ui factor in float64, rounded once to e's dtype; ``factor`` per target, or per unit with ``rows`` mapping each
    target to its unit."""
    if rows is not None:
        factor = factor.index_select(0, rows)
    return (residuals.double() * factor).to(residuals.dtype)


def _clip_statistics(norms: torch.Tensor, factor: torch.Tensor, counted: torch.Tensor | None, bound: float
                     ) -> tuple[float, float]:
    """(the fraction of the counted units whose norm exceeds ``bound``, the largest norm after the clip)."""
    over, after = norms > bound, norms * factor
    if counted is not None:
        over, after = over & counted, torch.where(counted, after, 0.0)
    n = norms.numel() if counted is None else counted.sum().clamp_min(1)
    return float(over.sum().double() / n), float(after.max())


class LazyStatistic:
    """A logged diagnostic computed when first read (``float(...)``), from tensors the step no longer changes: off the
    CPU a step records it without launching its kernels or waiting for the device. :meth:`part` reads one item of a
    tuple-valued statistic (computed once for all its parts)."""

    def __init__(self, compute: Callable[[], Any], parent: "LazyStatistic | None" = None) -> None:
        self._formula, self._parent = compute, parent
        self._compute: Callable[[], Any] | None = compute
        self._value: Any = None

    def value(self) -> Any:
        if self._compute is not None:
            self._value, self._compute = self._compute(), None
        return self._value

    def part(self, index: int) -> "LazyStatistic":
        return LazyStatistic(lambda: self.value()[index], parent=self)

    def reset(self) -> None:
        """Forget the value read: the next read computes it again from the same tensors (which a replayed CUDA graph
        has rewritten with its step's numbers)."""
        self._compute, self._value = self._formula, None
        if self._parent is not None:
            self._parent.reset()

    def __float__(self) -> float:
        return float(self.value())

    def __reduce__(self) -> tuple:  # pickled or deep-copied as its number (the closure is not picklable)
        return float, (float(self),)

    def __repr__(self) -> str:
        return f"LazyStatistic({float(self)!r})"


def _statistic(value: torch.Tensor) -> float | torch.Tensor:
    """A logged per-step diagnostic: a float on the CPU; off it the device scalar itself, read when it is logged
    (a float() every step would make the host wait for the device each step)."""
    return float(value) if value.device.type == "cpu" else value.detach()


def check_choices(*checks: tuple[str, Any, tuple[str, ...]]) -> None:
    """ConfigError for the first ``(key, value, allowed)`` whose value is not one of ``allowed`` (``mechanism.key``)."""
    for key, value, allowed in checks:
        if value not in allowed:
            raise ConfigError(f"mechanism.{key} must be one of {allowed}, got '{value}'")


def laplace_noise(shape: torch.Size, scale: float, generator: SecretGenerator, device: torch.device) -> torch.Tensor:
    """Lap(0, b) with *scale* b (variance 2 b^2), by inverse CDF on ChaCha20 words (:mod:`dprec_torch.chacha`), as a
    float32 tensor on ``device``."""
    return add_laplace_noise_(torch.zeros(shape, dtype=torch.float32, device=device), scale, generator)


def add_laplace_noise_(target: torch.Tensor, scale: float, generator: SecretGenerator) -> torch.Tensor:
    """target += Lap(0, b) entrywise, in place, from the secret generator (one 256-bit key per draw; on the CPU the
    inverse CDF is fused with the keystream in a parallel kernel, no M^2 temporaries)."""
    return secret(generator).add_laplace_(target, scale)


def add_gaussian_noise_(target: torch.Tensor, std: float, generator: SecretGenerator) -> torch.Tensor:
    """target += N(0, std^2) entrywise, in place: ChaCha20 + Box-Muller, from the secret generator, on any device."""
    return secret(generator).add_gaussian_(target, std)
