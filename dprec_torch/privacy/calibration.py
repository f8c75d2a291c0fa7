"""Gaussian noise calibration, written once: the epsilon of a Gaussian history under an accountant
(:func:`gaussian_epsilon`) and the noise that meets a target (epsilon, delta) under it (:func:`calibrate_gaussian`).

A *history* is a list of (sigma, q, steps) entries: ``steps`` applications of the Poisson(q)-subsampled Gaussian
mechanism with noise multiplier sigma (noise std / L2 sensitivity); a one-off release is (sigma, 1, 1).
Accountants (``accountant=``):

* ``rdp``: Renyi DP of the subsampled Gaussian mechanism (Mironov et al. 2019), Opacus's ``compute_rdp`` and
  ``get_privacy_spent`` over :data:`~dprec_torch.privacy.opacus_accounting.RDP_ORDERS` -- exactly what Opacus's
  ``RDPAccountant`` returns for the history, the RDP of one step of each (q, sigma) computed once (memoised);
* ``prv``: Opacus's PRV accountant (Gopi et al. 2021) through :class:`~dprec_torch.privacy.opacus_accounting.OpacusAccountant`;
* ``gdp``: Gaussian DP (Dong, Roth & Su, JRSS-B 2022) for unsampled releases (q = 1). A Gaussian mechanism of
  multiplier sigma is mu = 1/sigma -GDP (Thm. 2.7); k of them compose to exactly sqrt(sum mu_k^2)-GDP (Cor. 3.3),
  and mu-GDP is (eps, delta(eps))-DP for every eps with delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)
  (Cor. 2.13: the analytic Gaussian mechanism's curve, Balle & Wang 2018). :func:`gdp_delta` and :func:`gdp_epsilon`
  are that curve; :func:`split_mu` splits one mu^2 between the releases of a plan, so the plan is exactly mu-GDP.

:func:`gaussian_epsilon` first merges consecutive entries with the same (sigma, q), as Opacus's accountants record
them: the figure is the one an :class:`OpacusAccountant` fed the same steps reports. :func:`calibrate_gaussian`
returns a :class:`Noise` (sigma and mu = 1 / sigma; exact is the accountant's own parameter: sigma for
``rdp``/``prv``, mu for ``gdp``), found by

* ``search="bisect"`` (``rdp``/``prv``): bisection for the smallest sigma whose history ``prior + [(sigma, q, steps)]``
  stays at or below the target (the mechanisms that calibrate once for a whole run);
* ``search="opacus"`` (``rdp``/``prv``, no prior): Opacus's own ``get_noise_multiplier`` (``mechanism=gaussian``'s
  calibration since the first release; ``tolerance`` is then Opacus's absolute ``epsilon_tolerance``);
* ``accountant="gdp"`` (q = 1, one release, no prior): the exact inversion of the monotone delta(mu) (brentq).

Every calibration is memoised: sweeps and audits with one configuration calibrate once.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from dprec_torch.errors import ConfigError

# Opacus (~1.4 s: the whole privacy engine, scipy.stats, torch.distributed) and scipy.optimize / scipy.special (~0.5 s
# each) are imported where used: the Laplace mechanisms (``dpsgd``, the default) import this module but never call it.

#: the accountants a calibration can run under (``rdp``/``prv``: Opacus; ``gdp``: analytic Gaussian DP)
CALIBRATION_ACCOUNTANTS = ("rdp", "prv", "gdp")
SEARCHES = ("bisect", "opacus")
#: the default tolerance of each search: relative to the target (bisect), absolute (Opacus's epsilon_tolerance)
DEFAULT_TOLERANCE = {"bisect": 0.005, "opacus": 0.01}

History = Sequence[Sequence[float]]


# --------------------------------------------------------------------------- one Gaussian release, in sigma units
# (McSherry & Mironov's per-release calibration, ``predictors/mcsherry.py``: the classic bound and the analytic
# Gaussian mechanism, Balle & Wang 2018; the same curve as gdp_delta at mu = sensitivity / sigma)
def classic_gaussian_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """Slide "Gaussian Mechanism" Thm: ``sigma = sqrt(2 ln(2/delta)) / eps * Delta_2``."""
    return math.sqrt(2.0 * math.log(2.0 / delta)) * sensitivity / epsilon


def gaussian_delta(sigma: float, sensitivity: float, epsilon: float) -> float:
    """Exact delta(eps) of the Gaussian mechanism (Balle & Wang 2018, Thm. 8)."""
    from scipy.special import log_ndtr

    a = sensitivity / (2.0 * sigma)
    b = epsilon * sigma / sensitivity
    return float(math.exp(log_ndtr(a - b)) - math.exp(epsilon + log_ndtr(-a - b)))


def analytic_gaussian_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """Smallest sigma with ``gaussian_delta(sigma) <= delta`` (bisection on a monotone function)."""
    from scipy.optimize import brentq

    lo, hi = 1e-6 * sensitivity, sensitivity
    while gaussian_delta(hi, sensitivity, epsilon) > delta:
        hi *= 2.0
    sigma = brentq(lambda s: gaussian_delta(s, sensitivity, epsilon) - delta, lo, hi, xtol=1e-12 * sensitivity, rtol=1e-12)
    # brentq lands within tolerance on either side; step up until the guarantee holds
    while gaussian_delta(sigma, sensitivity, epsilon) > delta:
        sigma *= 1.0 + 1e-9
    return float(sigma)


# --------------------------------------------------------------------------- Gaussian DP
def gdp_delta(mu: float, epsilon: float) -> float:
    """delta(eps) of mu-GDP (Dong, Roth & Su Cor. 2.13)."""
    from scipy.special import log_ndtr

    if mu <= 0:
        return 0.0
    return float(math.exp(log_ndtr(-epsilon / mu + mu / 2)) - math.exp(epsilon + log_ndtr(-epsilon / mu - mu / 2)))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest eps with delta(eps) <= delta for mu-GDP (the inverse of ``calibrate_gaussian(..., accountant="gdp")``)."""
    from scipy.optimize import brentq

    if math.isinf(mu):
        return math.inf
    if mu <= 0:
        return 0.0
    hi = 1.0
    while gdp_delta(mu, hi) > delta:
        hi *= 2.0
    return float(brentq(lambda e: gdp_delta(mu, e) - delta, 0.0, hi, xtol=1e-12))


def split_mu(mu: float, plan: dict[str, tuple[float, int]]) -> dict[str, float]:
    """Per-step mu of each release, ``plan[name] = (fraction of mu^2, steps)`` with fractions summing to 1:
    sum_name steps * mu_name^2 = mu^2, so the composition is exactly mu-GDP."""
    total = sum(f for f, _ in plan.values())
    if any(not f > 0 or n < 1 for f, n in plan.values()) or abs(total - 1.0) > 1e-9:
        raise ConfigError(f"release plan fractions must be > 0 and sum to 1, got {plan}")
    return {k: mu * math.sqrt(f / n) for k, (f, n) in plan.items()}


def _gdp_mu(epsilon: float, delta: float) -> float:
    """The largest mu with mu-GDP implying (epsilon, delta)-DP (bisection on the monotone delta(mu)); inf for eps = inf."""
    from scipy.optimize import brentq

    if math.isinf(epsilon):
        return math.inf
    if not epsilon > 0 or not 0 < delta < 1:
        raise ConfigError(f"Gaussian release needs epsilon > 0 and delta in (0, 1), got epsilon={epsilon}, delta={delta}")
    hi = 1.0
    while gdp_delta(hi, epsilon) < delta:
        hi *= 2.0
    mu = brentq(lambda m: gdp_delta(m, epsilon) - delta, 1e-9, hi, xtol=1e-14, rtol=1e-12)
    while gdp_delta(mu, epsilon) > delta:  # brentq may land a hair above: step down until it holds
        mu *= 1.0 - 1e-10
    return float(mu)


# --------------------------------------------------------------------------- Opacus's own figure
#: RDP orders: Opacus's defaults (``RDPAccountant.DEFAULT_ALPHAS``, written out so that importing the accountants does
#: not import Opacus; tests/privacy/test_accountant_cache.py checks they are Opacus's) plus larger ones (small epsilon at small delta)
OPACUS_DEFAULT_ALPHAS: list[float] = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
RDP_ORDERS: list[float] = OPACUS_DEFAULT_ALPHAS + [64, 80, 96, 128, 160, 192, 256, 384, 512, 768, 1024]


def _epsilon_kwargs(mechanism: str) -> dict[str, Any]:
    return {"alphas": RDP_ORDERS} if mechanism == "rdp" else {}


def opacus_epsilon(history: list[tuple[float, float, int]] | tuple, delta: float, mechanism: str) -> float:
    """Opacus's own accountant (``create_accountant``) on ``history``: its epsilon at ``delta`` (0 before any step,
    inf with sigma = 0). Imports Opacus."""
    if not history:
        return 0.0
    if any(sigma <= 0 for sigma, _, _ in history):
        return math.inf
    from opacus.accountants import create_accountant

    acc = create_accountant(mechanism=mechanism)
    acc.history = [(float(s), float(q), int(n)) for s, q, n in history]
    with np.errstate(divide="ignore"):  # PRV at q = 1 takes log(1 - q) = -inf on a branch np.where discards
        return float(acc.get_epsilon(delta=delta, **_epsilon_kwargs(mechanism)))


# --------------------------------------------------------------------------- the on-disk memo
#: bump when a function below changes its answer for the same arguments (old entries are then never read)
MEMO_VERSION = 1
_log = logging.getLogger(__name__)


def _opacus_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("opacus")
    except PackageNotFoundError:  # pragma: no cover - opacus is a dependency
        return "absent"


def memo_dir() -> Path | None:
    """``$DPREC_CACHE/accountant`` (default ``~/.cache/dprec/accountant``); None with ``DPREC_ACCOUNTANT_CACHE=0``."""
    if os.environ.get("DPREC_ACCOUNTANT_CACHE", "1") == "0":
        return None
    return Path(os.environ.get("DPREC_CACHE") or Path.home() / ".cache" / "dprec").expanduser() / "accountant"


def disk_memo(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Memoise ``fn`` (a pure function of public numbers: a calibration, the epsilon of a history) on disk, keyed by
    its name, arguments, :data:`MEMO_VERSION` and the Opacus version, so a run whose figures were computed before
    never imports Opacus. One small JSON file per key, written atomically; floats round-trip exactly (``repr``), bit
    for bit. Unreadable entries are recomputed; a cache that cannot be written is skipped."""

    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        root = memo_dir()
        if root is None:
            return fn(*args)
        key = json.dumps([fn.__name__, MEMO_VERSION, _opacus_version(), args], default=list)
        path = root / f"{hashlib.sha256(key.encode()).hexdigest()}.json"
        try:
            entry = json.loads(path.read_text())
            if entry["key"] == key:
                return _decode(entry["value"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
        value = fn(*args)
        try:
            from dprec_torch.io import atomic_write_json

            root.mkdir(parents=True, exist_ok=True)
            atomic_write_json(path, {"key": key, "value": _encode(value)})
        except OSError as err:  # read-only home, full disk: the figure is still right, only not cached
            _log.debug("accountant cache not written (%s)", err)
        return value

    wrapper.uncached = fn  # type: ignore[attr-defined]
    return wrapper


def _encode(value: Any) -> Any:
    return {"noise": [_f(value.sigma), _f(value.mu)]} if isinstance(value, Noise) else {"float": _f(value)}


def _f(x: float) -> Any:
    return x if math.isfinite(x) else repr(float(x))  # inf / nan as strings: strict JSON


def _decode(value: dict[str, Any]) -> Any:
    return Noise(*(float(x) for x in value["noise"])) if "noise" in value else float(value["float"])


# --------------------------------------------------------------------------- epsilon of a history
def _compact(history: Iterable[Sequence[float]]) -> tuple[tuple[float, float, int], ...]:
    """(sigma, q, steps) entries as floats/ints, consecutive equal (sigma, q) merged (as Opacus records steps)."""
    out: list[tuple[float, float, int]] = []
    for sigma, q, steps in history:
        entry = (float(sigma), float(q), int(steps))
        if out and out[-1][:2] == entry[:2]:
            out[-1] = (entry[0], entry[1], out[-1][2] + entry[2])
        else:
            out.append(entry)
    return tuple(out)


@lru_cache(maxsize=4096)
def _rdp_of_one_step(q: float, sigma: float) -> np.ndarray:
    from opacus.accountants.analysis.rdp import compute_rdp

    return np.asarray(compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=RDP_ORDERS))


@lru_cache(maxsize=4096)
@disk_memo
def _history_epsilon(history: tuple[tuple[float, float, int], ...], delta: float, accountant: str) -> float:
    if not history:
        return 0.0
    if any(sigma <= 0 for sigma, _, _ in history):
        return math.inf
    if accountant == "rdp":  # RDPAccountant's sum over the history of compute_rdp(q, sigma, steps) = steps x one step's
        from opacus.accountants.analysis.rdp import get_privacy_spent

        rdp = sum(steps * _rdp_of_one_step(q, sigma) for sigma, q, steps in history)
        return float(get_privacy_spent(orders=RDP_ORDERS, rdp=rdp, delta=delta)[0])
    if accountant == "gdp":
        if any(q != 1.0 for _, q, _ in history):
            raise ConfigError("the gdp accountant composes unsampled releases only (q = 1)")
        return gdp_epsilon(math.sqrt(sum(steps / (sigma * sigma) for sigma, _, steps in history)), delta)
    return opacus_epsilon(history, delta, accountant)


def gaussian_epsilon(history: Iterable[Sequence[float]], delta: float, accountant: str = "rdp") -> float:
    """The epsilon at ``delta`` of a history of (sigma, q, steps) subsampled-Gaussian entries under ``accountant``
    (module docstring); 0 for an empty history, inf when any sigma is 0. Memoised per history (a mechanism asks for
    the same figure every epoch)."""
    if accountant not in CALIBRATION_ACCOUNTANTS:
        raise ConfigError(f"accountant must be one of {CALIBRATION_ACCOUNTANTS}, got '{accountant}'")
    return _history_epsilon(_compact(history), float(delta), accountant)


# --------------------------------------------------------------------------- calibration
@dataclass(frozen=True)
class Noise:
    """A calibrated noise level: the noise multiplier ``sigma`` (noise std / L2 sensitivity) and ``mu`` = 1 / sigma,
    its Gaussian-DP parameter as one unsampled release (module docstring: which is exact)."""

    sigma: float
    mu: float


def calibrate_gaussian(target_epsilon: float, delta: float, q: float = 1.0, steps: int = 1, accountant: str = "rdp",
                       prior: History | None = None, tolerance: float | None = None, search: str = "bisect") -> Noise:
    """The noise of ``steps`` Poisson(``q``) Gaussian steps such that the history ``prior + [(sigma, q, steps)]``
    meets (``target_epsilon``, ``delta``) under ``accountant`` (module docstring: ``search``, ``tolerance``).
    ``tolerance`` (None: :data:`DEFAULT_TOLERANCE`): ``bisect`` stops once the epsilon is within ``tolerance`` x
    the target below it; ``opacus`` within ``tolerance`` (absolute). ``gdp`` is exact (the largest mu that holds)."""
    if accountant not in CALIBRATION_ACCOUNTANTS:
        raise ConfigError(f"accountant must be one of {CALIBRATION_ACCOUNTANTS}, got '{accountant}'")
    if search not in SEARCHES:
        raise ConfigError(f"calibration search must be one of {SEARCHES}, got '{search}'")
    prior_t = tuple(tuple(h) for h in (prior or []))
    tol = DEFAULT_TOLERANCE[search] if tolerance is None else float(tolerance)
    return _calibrate(float(target_epsilon), float(delta), float(q), int(steps), accountant, prior_t, tol, search)


@lru_cache(maxsize=512)
@disk_memo
def _calibrate(target_epsilon: float, delta: float, q: float, steps: int, accountant: str, prior_t: tuple,
               tolerance: float, search: str) -> Noise:
    if accountant == "gdp":
        if q != 1.0 or steps != 1 or prior_t:
            raise ConfigError("the gdp calibration is for one unsampled release (q = 1, steps = 1, no prior); "
                              "split its mu between releases with split_mu")
        mu = _gdp_mu(target_epsilon, delta)
        return Noise(0.0 if math.isinf(mu) else 1.0 / mu, mu)
    if search == "opacus":
        if prior_t:
            raise ConfigError("search=opacus (Opacus's get_noise_multiplier) calibrates one history entry: no prior")
        sigma = _opacus_search(target_epsilon, delta, q, steps, accountant, tolerance)
    else:
        sigma = _bisect(target_epsilon, delta, q, steps, accountant, [tuple(h) for h in prior_t], tolerance)
    return Noise(sigma, 1.0 / sigma)


def _opacus_search(target_epsilon: float, delta: float, q: float, steps: int, accountant: str, tolerance: float) -> float:
    from opacus.accountants.utils import get_noise_multiplier

    try:
        return float(get_noise_multiplier(target_epsilon=target_epsilon, target_delta=delta, sample_rate=q, steps=steps,
                                          accountant=accountant, epsilon_tolerance=tolerance, **_epsilon_kwargs(accountant)))
    except ValueError as err:  # "The privacy budget is too low."
        raise ConfigError(f"no noise multiplier reaches epsilon={target_epsilon} at delta={delta}, "
                          f"q={q}, {steps} steps ({err})") from err


def _bisect(target_epsilon: float, delta: float, q: float, steps: int, accountant: str, prior: list,
            tolerance: float) -> float:
    """Smallest sigma (within ``tolerance`` of eps) with eps(prior + [(sigma, q, steps)]) <= target."""

    def eps(sigma: float) -> float:
        return gaussian_epsilon(prior + [(sigma, q, steps)], delta, accountant)

    lo, hi = 0.05, 1.0
    while eps(hi) > target_epsilon:
        lo, hi = hi, hi * 2
        if hi > 1e5:
            raise ConfigError(f"no noise multiplier reaches epsilon={target_epsilon} at delta={delta} "
                              f"(the one-off releases alone spend {gaussian_epsilon(prior, delta, accountant):.4g})")
    while hi - lo > 1e-4 * hi:
        mid = (lo + hi) / 2
        if eps(mid) > target_epsilon:
            lo = mid
        else:
            hi = mid
        if target_epsilon - eps(hi) < tolerance * target_epsilon:
            break
    return hi
