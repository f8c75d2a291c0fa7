"""The low-rank PNBM's size rule: the knobs of the default mechanisms as a function of public numbers only.

Inputs, all public: N (privacy units: users with a training rating), M (items), (eps, delta), the mechanism, and
whether a public catalogue is attached. Nothing here reads a rating, so choosing knobs by it costs no epsilon.

Why these quantities (DP-SGD at full batch, q = 1; Sander et al. 2023, De et al. 2022). A Gaussian step adds
N(0, (sigma C)^2) to the clipped sum, i.e. sigma C / N to each entry of the mean gradient. T full-batch steps at
noise multiplier sigma are mu-GDP with mu_U = sqrt(T) / sigma, so after T steps of size eta the noise on each entry
of U is

    nu = eta sqrt(T) sigma C / N = eta T C / (mu_U N)                                              (1)

while the drift is eta T times the mean clipped gradient. At q = 1 the result's signal-to-noise does not depend on T
(T only serves the optimisation) and subsampling does not help (q sqrt(T) / sigma is largest at q = 1 for a fixed
number of epochs: ``experiments/studies/pnbm_lowrank_size_rule.py``), so the rule takes full batches, fixes T, and
picks the step from the noise U can tolerate:

    eta = min(eta_max, nu_star mu_U N / (C T)),    mu_U = mu sqrt(1 - m),    mu = 1 / sigma_1(eps, delta)   (2)

sigma_1: the noise multiplier of ONE full-batch Gaussian release at (eps, delta) (the mechanisms' own calibration);
m: the means' share of mu^2. nu_star (the per-entry noise U tolerates) and eta_max (the non-private step's cap)
transfer across N because (1) is the whole of N's effect on the noise. So (eps, delta, N) act through one number,
kappa = mu N (the users a step averages over, in units of the noise):

    kappa < KAPPA_LEARN (2,500):  means only -- m = 0.99, one step of 1e-3 (U does not move): the model is the DP item
                                  means + the user's offset (+ the public-feature term, which costs nothing), i.e.
                                  never worse than not learning;
    kappa >= KAPPA_LEARN:         q = 1, T = 20, C = 0.5, m = 0.85 at kappa = 2,500 falling linearly in log kappa to
                                  0.6 at 6,000 (and 0.6 above), eta from (2) with nu_star = 0.1, capped at 120.

Laplace (``dpsgd``, pure eps, per-user L1 clip c): T steps at eps_s = (1 - m) eps / T each put Lap(c / eps_s) on the
sum; the noise on U after T steps, eta sqrt(2 T) c T / ((1 - m) eps N), grows with T: the rule takes few steps and
the same test on kappa = eps N / (sqrt(2 T) L1_SIGNAL) (the Laplace noise after T steps on the Gaussian scale, and an
L1 clip's smaller signal: about 1 / sqrt(n_u d) of an L2 clip's, n_u ~ 100 ratings, d = 8).

Fitted on validation splits only (``FITTED_ON``): ML-1M user subsamples of 500, 1,000 and 2,000 users for ML-100K
runs; ML-100K's u1.base and synthetic data for ML-1M runs (experiments/studies/pnbm_lowrank_size_rule.py,
docs/pnbm_lowrank.md "The size rule"). The default model's other constants were re-chosen the same way
(``... size_rule.py constants``); the one a population chose differently is in ``POPULATION_CONSTANTS``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from dprec_torch.config import SIZE_RULE_KNOBS
from dprec_torch.errors import ConfigError
from dprec_torch.populations import POPULATION_CONSTANTS, POPULATION_FALLBACK, RULE_MECHANISMS, population  # noqa: F401

#: the knobs the rule sets (a value of ``auto`` in the config asks for it; config.py accepts it for these keys)
MECHANISM_KNOBS = SIZE_RULE_KNOBS["mechanism"]
MODEL_KNOBS = SIZE_RULE_KNOBS["model"]

# ---- the fitted constants (experiments/studies/pnbm_lowrank_size_rule.py; docs/pnbm_lowrank.md "The rule")
STEPS_GAUSSIAN = 20          # T at q = 1 (sgld, gaussian)
STEPS_LAPLACE = 3            # T at q = 1 (dpsgd)
CLIP_GAUSSIAN = 0.5          # C (Frobenius)
CLIP_LAPLACE = 0.5           # c (L1)
NU_STAR = 0.1                # per-entry noise on U the rule allows, (1)
ETA_MAX = 120.0              # cap of the step (eps = inf; ML-1M at eps = 20 reaches ~118)
KAPPA_LEARN = 2500.0         # kappa = mu N below which U does not beat its noise: means only
KAPPA_LOW, KAPPA_HIGH = 2500.0, 6000.0   # the means' share falls from SHARE_LOW to SHARE_HIGH between them (log kappa)
SHARE_LOW, SHARE_HIGH = 0.85, 0.6
MEANS_ONLY_SHARE = 0.99      # m when U does not learn
L1_SIGNAL = 28.0             # Laplace: an L1 clip leaves ~1/sqrt(n_u d) of an L2 clip's signal (n_u ~ 100, d = 8)
RANK = 8

FITTED_ON = {
    "ml-100k": "ML-1M user subsamples (500, 1000, 2000 random users), 80/20 validation splits (no user of ML-100K)",
    "ml-1m": "ML-100K u1.base 80/20 validation split and synthetic data (preset ml-1m) (no user of ML-1M)",
}


@dataclass(frozen=True)
class Knobs:
    sampling_ratio: float
    epochs: int
    lr: float
    clip_norm: float
    mean_fraction: float
    rank: int
    learns: bool
    noise_per_entry: float  # nu of (1) at the chosen step


def gaussian_mu(epsilon: float, delta: float, accountant: str = "rdp") -> float:
    """mu = 1 / sigma_1: the GDP-like strength of ONE full-batch Gaussian release at (eps, delta)."""
    if not math.isfinite(epsilon):
        return math.inf
    from dprec_torch.privacy.calibration import calibrate_gaussian

    return 1.0 / calibrate_gaussian(float(epsilon), float(delta), 1.0, 1, accountant).sigma


def gaussian_step(nu: float, n_users: int, epsilon: float, delta: float, mean_fraction: float, clip: float, steps: int,
                  accountant: str = "rdp") -> float:
    """eta with noise nu per entry of U after ``steps`` full-batch steps, (1) solved for eta."""
    mu_u = gaussian_mu(epsilon, delta, accountant) * math.sqrt(1.0 - mean_fraction)
    return nu * mu_u * n_users / (clip * steps)


def laplace_step(nu: float, n_users: int, epsilon: float, mean_fraction: float, clip: float, steps: int) -> float:
    """eta with noise nu (std) per entry of U after ``steps`` full-batch Laplace steps (module docstring)."""
    return nu * (1.0 - mean_fraction) * epsilon * n_users / (clip * math.sqrt(2.0 * steps) * steps)


def mean_share(kappa: float) -> float:
    """m(kappa): SHARE_LOW up to KAPPA_LOW, SHARE_HIGH from KAPPA_HIGH, linear in log kappa between."""
    t = (math.log(max(kappa, KAPPA_LOW)) - math.log(KAPPA_LOW)) / (math.log(KAPPA_HIGH) - math.log(KAPPA_LOW))
    return SHARE_LOW + (SHARE_HIGH - SHARE_LOW) * min(t, 1.0)


def noise_level(mechanism: str, n_users: int, epsilon: float, delta: float, accountant: str = "rdp") -> float:
    """kappa (module docstring): Gaussian mu N (mu = 1 / sigma_1(eps, delta)); Laplace eps N / (sqrt(2 T) L1_SIGNAL)."""
    if not math.isfinite(epsilon):
        return math.inf
    if mechanism == "dpsgd":
        return epsilon * n_users / (math.sqrt(2.0 * STEPS_LAPLACE) * L1_SIGNAL)
    return gaussian_mu(epsilon, delta, accountant) * n_users


def rule_knobs(mechanism: str, n_users: int, n_items: int, epsilon: float, delta: float, catalogue: bool,
               accountant: str = "rdp") -> Knobs:
    """The knobs of ``mechanism`` (sgld | gaussian | dpsgd) on the low-rank PNBM for a fold of ``n_users`` privacy
    units and ``n_items`` items at (``epsilon``, ``delta``) (module docstring). ``n_items`` and ``catalogue`` move no
    knob (the fits found no dependence worth a term: (1) does not depend on M, the public-feature term costs nothing): the record
    states them."""
    if mechanism not in RULE_MECHANISMS:
        raise ValueError(f"the size rule covers mechanism={'|'.join(RULE_MECHANISMS)}, not {mechanism}")
    gaussian = mechanism != "dpsgd"
    steps, clip = (STEPS_GAUSSIAN, CLIP_GAUSSIAN) if gaussian else (STEPS_LAPLACE, CLIP_LAPLACE)
    if not math.isfinite(epsilon):
        return Knobs(1.0, steps, ETA_MAX, clip, SHARE_HIGH, RANK, True, 0.0)
    kappa = noise_level(mechanism, n_users, epsilon, delta, accountant)
    if kappa < KAPPA_LEARN:  # U cannot move above its noise: the budget goes to the means (never worse than not learning)
        return Knobs(1.0, 1, 1e-3, clip, MEANS_ONLY_SHARE, RANK, False, 0.0)
    m = mean_share(kappa)
    eta = (gaussian_step(NU_STAR, n_users, epsilon, delta, m, clip, steps, accountant) if gaussian
           else laplace_step(NU_STAR, n_users, epsilon, m, clip, steps))
    eta = min(eta, ETA_MAX)
    nu = (eta * steps * clip / (gaussian_mu(epsilon, delta, accountant) * math.sqrt(1 - m) * n_users) if gaussian
          else eta * math.sqrt(2.0 * steps) * clip * steps / ((1 - m) * epsilon * n_users))
    return Knobs(1.0, int(steps), float(eta), float(clip), float(m), RANK, True, float(nu))


def record(knobs: Knobs, mechanism: str, n_users: int, n_items: int, epsilon: float, delta: float, catalogue: bool,
           data_population: str | None, resolved: list[str]) -> dict[str, Any]:
    """What ``metrics.json["privacy"]["size_rule"]`` records: the inputs, the resolved knobs, where it was fitted."""
    if data_population in FITTED_ON:
        fitted = FITTED_ON[data_population]
    else:  # custom or synthetic data: both fits hold the same constants; whose people the data holds is unknown
        fitted = (f"{FITTED_ON['ml-100k']}; and {FITTED_ON['ml-1m']} (the same constants): the package cannot tell "
                  "whether this data's people are among them")
    return {"rule": "dprec_torch/privacy/size_rule.py", "mechanism": mechanism,
            "inputs": {"n_users": int(n_users), "n_items": int(n_items), "epsilon": float(epsilon), "delta": float(delta),
                       "catalogue": bool(catalogue)},
            "knobs": asdict(knobs), "resolved_by_rule": resolved, "fitted_on": fitted,
            "shares_people": False if data_population in ("ml-100k", "ml-1m") else "unknown"}


def apply(cfg: Any, train: Any) -> tuple[Any, dict[str, Any] | None]:
    """``cfg`` with every ``auto`` knob of ``mechanism`` / ``model`` replaced by the rule's value for the fold's public
    sizes (``train``: the fold's training ratings), and the record for ``metrics.json`` (None when nothing was ``auto``:
    ``cfg`` is returned as is). A knob given a number (the tuned file, or the command line) keeps it."""
    from omegaconf import OmegaConf, open_dict

    auto_mech = [k for k in MECHANISM_KNOBS if cfg.mechanism.get(k) == "auto"]
    auto_model = [k for k in MODEL_KNOBS if cfg.model.get(k) == "auto"]
    if not auto_mech and not auto_model:
        return cfg, None
    mechanism = str(cfg.mechanism.get("name"))
    resolved = [*(f"mechanism.{k}" for k in auto_mech), *(f"model.{k}" for k in auto_model)]
    if mechanism not in RULE_MECHANISMS or "LowRankPNBM" not in str(cfg.model.get("_target_", "")):
        raise ConfigError(f"{', '.join(resolved)}=auto: the size rule (dprec_torch/privacy/size_rule.py) sets the knobs of "
                          f"mechanism={'|'.join(RULE_MECHANISMS)} on model=pnbm_lowrank only: give a number")
    from dprec_torch.data.item_features import ITEM_FEATURES

    n_users = int((train.user_counts() > 0).sum())
    catalogue = train.meta.get(ITEM_FEATURES) is not None
    epsilon, delta = float(cfg.epsilon), float(cfg.get("delta") or 0.0)
    knobs = rule_knobs(mechanism, n_users, int(train.n_items), epsilon, delta, catalogue,
                       str(cfg.mechanism.get("accountant") or "rdp"))
    out = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    with open_dict(out):
        for k in auto_mech:
            out.mechanism[k] = getattr(knobs, k)
        for k in auto_model:
            out.model[k] = getattr(knobs, k)
    return out, record(knobs, mechanism, n_users, int(train.n_items), epsilon, delta, catalogue, population(cfg), resolved)
