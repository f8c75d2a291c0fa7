"""Sensitivity registry: a mechanism may print a finite epsilon only if the harness checks its sensitivity.

Every epsilon rests on one sentence, "one unit moves the released pre-noise quantity by at most Delta". The harness
(``tests/privacy/test_sensitivity_harness.py``) tests that sentence on small adversarial datasets (D = C exactly, ties,
constant S, users at exactly tau, a single user, extreme ratings) by MATERIALISING what the mechanism's own code releases:

(a) each unit's clipped contribution has norm <= c (plus float tolerance), and
(b) for neighbouring datasets under the mechanism's relation (one unit added/removed, or one rating's value changed)
    the released pre-noise aggregate moves by at most Delta.

Registering a mechanism class (a ``MechanismOptimizer`` subclass or a predictor) runs one way: a built-in case module
(``privacy_harness/<family>_cases.py``) imports the case types from :mod:`.case`, never this module, and exports a
table that this module imports and collects (:data:`CASE_MODULES`)::

    from dprec_torch.privacy_harness.case import SensitivityCase

    def my_cases() -> list[SensitivityCase]:
        return [SensitivityCase(name="noisy_gram user", relation="user", norm=2, sensitivity=1.0,
                                clip_bound=1.0, release=my_pre_noise_release)]

    SENSITIVITY_CASES = {"dprec_torch.predictors.noisy_gram.NoisyGram": my_cases}   # qualified name -> builder
    NON_PRIVATE = {"dprec_torch.predictors.knn.ItemKNN": "epsilon = inf"}           # optional

The builders import the classes they check inside their bodies, so the tables are read without importing any
mechanism or predictor. Code outside the package registers at run time with ``register_sensitivity(cls, builder)``
(or the ``@harnessed(builder)`` class decorator) and ``declare_non_private(cls, reason)``.

``release(data, seed, units)`` runs the mechanism's code on ``data`` (a small :class:`Ratings`) WITHOUT its noise and
returns a :class:`Release`: the flattened pre-noise aggregate and, if the mechanism clips per unit, the per-unit
clipped contributions (one row per unit, in the mechanism's own arithmetic -- never recomputed from the bound's
formula; only when ``units`` is True), and ``stated``, the sensitivity the mechanism object itself calibrates its
noise to (check (b) uses it, and it must equal the case's). Any public state (initial parameters, public item means)
must depend on ``seed`` only, never on ``data``: the harness calls ``release`` on a dataset and its neighbour with the
same seed; it returns None where the mechanism refuses the dataset (e.g. a ``DataError`` on an empty one), and the
harness then skips that pair. ``relation``: ``user`` (add/remove one user's profile), ``rating`` (add/remove one
rating), ``rating_value`` (change one rating's value; who rated what is public) or ``score_entry`` (one entry of a
score matrix changes: the case maps each rating to one entry, so a removed rating or a changed value is one changed
entry); a case claiming ``rating`` is also checked for a changed value when ``also_change`` is set (the
"add/remove/change" relation). ``tau``: the case caps users at tau ratings before releasing.

Enforcement. The harness test enumerates every ``MechanismOptimizer`` subclass and every class of
``dprec_torch.mechanisms`` / ``dprec_torch.predictors`` with a ``privacy_report`` and fails for any that is neither
registered, nor declared non-private (:func:`declare_non_private`; the test fits each declared predictor and checks its
report says epsilon = inf), nor listed in :data:`PENDING` (known gaps, each named in the docs; registering a class
requires removing it from there). So a new mechanism file fails the fast suite until it registers. :func:`check_claim`
is the runtime form (a finite epsilon from an unregistered class raises a ``ConfigError``): the runner calls it in
``train_fold`` (mechanisms) and ``fit_fold`` (fitted predictors and output mechanisms) before anything is scored.
"""

from __future__ import annotations

import importlib
import logging
import math
from typing import Any, Callable

from dprec_torch.errors import ConfigError
from dprec_torch.privacy_harness import learned_similarity_cases, lowrank_pnbm_cases, sensitivity_cases
from dprec_torch.privacy_harness.case import RELATIONS, Builder, Release, SensitivityCase

__all__ = ["RELATIONS", "Builder", "Release", "SensitivityCase", "PENDING", "HARNESSED", "register_sensitivity", "harnessed",
           "declare_non_private", "builder_for", "registered", "registered_classes", "non_private_classes", "check_claim"]

log = logging.getLogger(__name__)

#: Known gaps: classes (``module.Class``) whose privacy_report can print a finite epsilon but that have no harness
#: case yet. :func:`check_claim` lets them through with a warning naming the gap (so their runs keep working);
#: the harness test fails for a class that is registered AND still listed here, so registering removes the entry.
PENDING: dict[str, str] = {}

#: The built-in case modules, in registration order: each exports ``SENSITIVITY_CASES`` (qualified class name ->
#: builder) and may export ``NON_PRIVATE`` (qualified class name -> reason). A class harnessed by several modules
#: (the low-rank PNBM's cases are added to the full form's) gets their cases concatenated in this order.
CASE_MODULES = (sensitivity_cases, learned_similarity_cases, lowrank_pnbm_cases)

#: The harnessed classes by qualified name: the case tables' own keys (no class imported; it cannot drift from them). The
#: runner's :func:`check_claim` reads it before the registrations resolve (importing every mechanism, predictor and Opacus
#: takes seconds of start-up).
HARNESSED = frozenset(name for module in CASE_MODULES for name in module.SENSITIVITY_CASES)

_BUILDERS: dict[type, Builder] = {}
_NON_PRIVATE: dict[type, str] = {}
_LOADED = False


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


def class_named(name: str) -> type:
    """The class a case module's table names (``module.Class``); imports its module."""
    module, _, qualname = name.rpartition(".")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _concatenated(builders: list[Builder]) -> Builder:
    return builders[0] if len(builders) == 1 else (lambda: [case for build in builders for case in build()])


def _load_builtin() -> None:
    """Resolve the case modules' tables into the registrations (once). A class registered by
    :func:`register_sensitivity` / :func:`declare_non_private` before this keeps that registration."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    collected: dict[str, list[Builder]] = {}
    for module in CASE_MODULES:
        for name, builder in module.SENSITIVITY_CASES.items():
            collected.setdefault(name, []).append(builder)
        for name, reason in getattr(module, "NON_PRIVATE", {}).items():
            _NON_PRIVATE.setdefault(class_named(name), reason)
    for name, builders in collected.items():
        _BUILDERS.setdefault(class_named(name), _concatenated(builders))


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
    """Raise if ``obj`` (a mechanism or predictor) reports a finite epsilon without a registered harness (module
    docstring); a class listed in :data:`PENDING` passes with a warning naming the known gap."""
    eps = report.get("epsilon") if isinstance(report, dict) else None
    if eps is None:
        return
    try:
        finite = math.isfinite(float(eps))
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{type(obj).__name__}.privacy_report() gives epsilon={eps!r}: it must be a number, "
                          "inf or None") from err
    name = qualified_name(type(obj))
    # once the case modules are loaded the live registrations decide; before, the checked list of their names
    if not finite or (not _LOADED and name in HARNESSED) or registered(type(obj)):
        return
    if name in PENDING:
        log.warning("%s reports epsilon=%g without a sensitivity harness yet (known gap: %s)", type(obj).__name__,
                    float(eps), PENDING[name])
        return
    raise ConfigError(f"{type(obj).__name__} reports a finite epsilon but has no sensitivity harness: register it "
                      "with dprec_torch.privacy_harness.registry.register_sensitivity (see that module)")
