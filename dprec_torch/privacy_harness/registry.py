"""Sensitivity registry: a mechanism may print a finite epsilon only if the harness checks its sensitivity.

Every epsilon rests on one sentence, "one unit moves the released pre-noise quantity by at most
Delta". The harness (``tests/test_sensitivity_harness.py``) tests that sentence on small adversarial
datasets (D = C exactly, ties, constant S, users at exactly tau, a single user, extreme ratings) by
MATERIALISING what the mechanism's own code releases:

(a) each unit's clipped contribution has norm <= c (plus float tolerance), and
(b) for neighbouring datasets under the mechanism's relation (one unit added/removed, or one
    rating's value changed) the released pre-noise aggregate moves by at most Delta.

Registering a mechanism (a class: a ``MechanismOptimizer`` subclass or a predictor) -- two forms::

    from dprec_torch.privacy_harness.registry import SensitivityCase, harnessed, register_sensitivity

    def my_cases() -> list[SensitivityCase]:
        return [SensitivityCase(name="noisy_gram user", relation="user", norm=2, sensitivity=1.0,
                                clip_bound=1.0, release=my_pre_noise_release)]

    @harnessed(my_cases)              # on the class
    class NoisyGram: ...

    register_sensitivity(NoisyGram, my_cases)    # or from another module

``release(data, seed, units)`` runs the mechanism's code on ``data`` (a small :class:`Ratings`) WITHOUT its
noise and returns a :class:`Release`: the flattened pre-noise aggregate and, if the mechanism clips
per unit, the per-unit clipped contributions (one row per unit, in the mechanism's own arithmetic --
never recomputed from the bound's formula; only when ``units`` is True), and ``stated``, the
sensitivity the mechanism object itself calibrates its noise to (check (b) uses it, and it must equal
the case's). Any public state (initial parameters, public item means) must depend on ``seed``
only, never on ``data``: the harness calls ``release`` on a dataset and its neighbour with the
same seed; it returns None where the mechanism refuses the dataset (e.g. a ``DataError`` on an empty
one), and the harness then skips that pair. ``relation``: ``user`` (add/remove one user's profile), ``rating``
(add/remove one rating), ``rating_value`` (change one rating's value; who rated what is public) or
``score_entry`` (one entry of a score matrix changes: the case maps each rating to one entry, so a removed
rating or a changed value is one changed entry);
a case claiming ``rating`` is also checked for a changed value when ``also_change`` is set (the
"add/remove/change" relation). ``tau``: the case caps users at tau ratings before releasing.

Enforcement. The harness test enumerates every ``MechanismOptimizer`` subclass and every class of
``dprec_torch.mechanisms`` / ``dprec_torch.predictors`` with a ``privacy_report`` and fails for any
that is neither registered, nor declared non-private (:func:`declare_non_private`; the test fits each
declared predictor and checks its report says epsilon = inf), nor listed in :data:`PENDING`
(known gaps, each named in the docs; registering a class requires removing it from there). So a new
mechanism file fails the fast suite until it registers. :func:`check_claim` is the runtime form (a
finite epsilon from an unregistered class raises a ``ConfigError``): the runner calls it in ``train_fold``
(mechanisms) and ``fit_fold`` (fitted predictors and output mechanisms) before anything is scored.
Built-in registrations live in :mod:`dprec_torch.privacy_harness.sensitivity_cases` (imported on first lookup).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from dprec_torch.errors import ConfigError

log = logging.getLogger(__name__)

RELATIONS = ("user", "rating", "rating_value", "score_entry")

#: Known gaps: classes (``module.Class``) whose privacy_report can print a finite epsilon but that have no harness
#: case yet. :func:`check_claim` lets them through with a warning naming the gap (so their runs keep working);
#: the harness test fails for a class that is registered AND still listed here, so registering removes the entry.
PENDING: dict[str, str] = {}


@dataclass
class Release:
    """What a mechanism releases before its noise: ``total`` (flattened, float64) and the per-unit
    clipped contributions ``units`` ([n_units, len(total)], or None where nothing is clipped per unit)."""

    total: torch.Tensor
    units: torch.Tensor | None = None
    stated: float | None = None  # the sensitivity the mechanism OBJECT calibrates its noise to (checked == the case's)


@dataclass(frozen=True)
class SensitivityCase:
    """One configuration of a mechanism and the sensitivity it claims (see the module docstring)."""

    name: str
    relation: str
    norm: float  # p of both bounds (1, 2 or math.inf)
    sensitivity: float  # Delta: ||total(D) - total(D')||_p for neighbours D, D'
    release: Callable[[Any, int], Release]
    clip_bound: float | None = None  # c: ||unit contribution||_p (None: no per-unit clipping)
    also_change: bool = False  # relation=rating also covers changing a rating's value
    tau: int | None = None  # users capped at tau ratings before the release
    max_items: int = 12  # the harness draws datasets with at most this many items
    sensitivity_for: Callable[[int], float] | None = None  # Delta as a function of the (public) n_items, if it depends

    def claimed(self, n_items: int) -> float:
        """The case's Delta on a dataset of ``n_items`` items."""
        return float(self.sensitivity_for(n_items)) if self.sensitivity_for is not None else float(self.sensitivity)

    def __post_init__(self) -> None:
        if self.relation not in RELATIONS:
            raise ConfigError(f"SensitivityCase.relation must be one of {RELATIONS}, got '{self.relation}'")


Builder = Callable[[], list[SensitivityCase]]
_BUILDERS: dict[type, Builder] = {}
_NON_PRIVATE: dict[type, str] = {}
_LOADED = False

#: The registered classes by qualified name: the runner's :func:`check_claim` reads this set instead of importing
#: every case module (mechanisms, predictors, Opacus: seconds of start-up). tests/test_harness_fast_path.py
#: checks it equals the registrations, so a name here is always a class the harness really checks.
HARNESSED = frozenset({
    "dprec_torch.mechanisms.dpsgd_l1.ClippedLaplaceDPSGD",
    "dprec_torch.mechanisms.dpsgd_mf.DPSGDMF",
    "dprec_torch.mechanisms.exponential_topk.ExponentialTopKRecommender",
    "dprec_torch.mechanisms.gaussian.GaussianDPSGD",
    "dprec_torch.mechanisms.gaussian_pnbm.GaussianPNBM",
    "dprec_torch.mechanisms.output_perturbation.LaplaceOutputPredictor",
    "dprec_torch.mechanisms.sgld.ScaledPosteriorSGLD",
    "dprec_torch.predictors.dpals.DPALS",
    "dprec_torch.predictors.lowrank_dpsgd.LowRankDPSGD",
    "dprec_torch.predictors.mcsherry.McSherryMironov",
    "dprec_torch.predictors.noisy_gram.NoisyGram",
})


def register_sensitivity(cls: type, builder: Builder) -> type:
    """Register ``builder`` (no arguments -> the cases to check) for the mechanism class ``cls``."""
    if not callable(builder):
        raise ConfigError(f"register_sensitivity({cls.__name__}, ...) needs a callable returning SensitivityCase's")
    _BUILDERS[cls] = builder
    return cls


def harnessed(builder: Builder) -> Callable[[type], type]:
    """Class decorator form of :func:`register_sensitivity`."""
    return lambda cls: register_sensitivity(cls, builder)


def declare_non_private(cls: type, reason: str) -> type:
    """Record that ``cls`` never reports a finite epsilon (the harness test checks every class is one or the other)."""
    _NON_PRIVATE[cls] = reason
    return cls


def _load_builtin() -> None:
    global _LOADED
    if not _LOADED:
        _LOADED = True
        import dprec_torch.privacy_harness.sensitivity_cases  # noqa: F401  (registers the built-in mechanisms)
        import dprec_torch.privacy_harness.learned_similarity_cases  # noqa: F401  (noisy_gram, dpals: issue 17)
        import dprec_torch.privacy_harness.lowrank_pnbm_cases  # noqa: F401  (the low-rank PNBM's mechanisms: issue 27)


def builder_for(cls: type) -> Builder | None:
    """The registered builder of ``cls`` (exact class: a subclass must register itself)."""
    _load_builtin()
    return _BUILDERS.get(cls)


def registered(cls: type) -> bool:
    return builder_for(cls) is not None


def registered_classes() -> dict[type, Builder]:
    _load_builtin()
    return dict(_BUILDERS)


def non_private_classes() -> dict[type, str]:
    _load_builtin()
    return dict(_NON_PRIVATE)


def qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def check_claim(obj: Any, report: dict[str, Any]) -> None:
    """Raise if ``obj`` (a mechanism or predictor) reports a finite epsilon without a registered harness.

    Called by the runner before anything is scored or logged (``train_fold`` for mechanisms, ``fit_fold`` for
    fitted predictors). A class listed in :data:`PENDING` passes with a warning naming the known gap.
    """
    eps = report.get("epsilon") if isinstance(report, dict) else None
    if eps is None:
        return
    try:
        finite = math.isfinite(float(eps))
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{type(obj).__name__}.privacy_report() gives epsilon={eps!r}: it must be a number, "
                          "inf or None") from err
    # once the case modules are loaded the live registrations decide; before, the checked list of their names
    fast = not _LOADED and qualified_name(type(obj)) in HARNESSED
    if not finite or fast or registered(type(obj)):
        return
    if qualified_name(type(obj)) in PENDING:
        log.warning("%s reports epsilon=%g without a sensitivity harness yet (known gap: %s)", type(obj).__name__,
                    float(eps), PENDING[qualified_name(type(obj))])
        return
    raise ConfigError(f"{type(obj).__name__} reports a finite epsilon but has no sensitivity harness: register it "
                      "with dprec_torch.privacy_harness.registry.register_sensitivity (see that module)")
