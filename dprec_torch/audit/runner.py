"""Train the configured model + mechanism many times with random canary subsets; bound epsilon from below.

Per trial t (seed + t): each of the m canaries is included with probability 1/2, the model is trained on real data +
included canaries exactly as ``train.py`` trains it (same mechanism config, ``Trainer``, batch sampler), and every
canary is scored on the released model (:func:`dprec_torch.audit.canaries.score_canaries`). Guesses (top-k "in",
bottom-k "out") over all trials give the Clopper-Pearson lower bound of :mod:`dprec_torch.audit.bounds`.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from dprec_torch.audit.bounds import epsilon_lower_bound, guesses
from dprec_torch.audit.canaries import CanarySet, canary_history, make_canaries, score_canaries
from dprec_torch.privacy.relations import form_target
from dprec_torch.data.ratings import Fold, Ratings
from dprec_torch.errors import ConfigError
from dprec_torch.mechanisms.base import MechanismOptimizer
from dprec_torch.seeding import make_generator, seed_everything
from dprec_torch.training.trainer import Trainer

log = logging.getLogger(__name__)


@dataclass
class AuditResult:
    mechanism: str
    epsilon_claimed: float | None
    epsilon_lower_bound: float
    alpha: float
    trials: int
    canaries: int
    canary_kind: str
    guesses: int
    correct: int
    accuracy: float
    relation: str | None
    seconds: float
    privacy: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def canary_kind(cfg: DictConfig) -> str:
    """``audit.canary`` or, for ``auto``, the mechanism's defended relation (user or rating canaries)."""
    kind = str(cfg.audit.canary)
    if kind != "auto":
        return kind
    cls = get_class(form_target(cfg.mechanism, cfg.model))  # the class that trains this model (mechanisms/base.py)
    declared = cls.relation if isinstance(cls, type) and issubclass(cls, MechanismOptimizer) else None
    rel = cfg.mechanism.get("relation") or declared
    return "user" if rel == "user" else "rating"


def history_for(cfg: DictConfig, kind: str) -> int:
    """History items per user canary: ``audit.history``, or the edge size of ``floor`` / ``tau`` canaries."""
    init = cfg.mechanism.get("init")
    init_value = cfg.mechanism.get("init_value") if init == "constant" else None
    return canary_history(kind, int(cfg.audit.history), cfg.model.get("floor_c"), init_value,
                          cfg.mechanism.get("max_user_ratings"))


def claimed_epsilon(report: dict[str, Any]) -> float | None:
    """The epsilon the mechanism states: the defended one, else the paper's claim, else the nominal one."""
    for key in ("epsilon", "epsilon_claimed_by_paper", "epsilon_nominal"):
        v = report.get(key)
        if v is not None:
            return float(v)
    return None


def train_once(cfg: DictConfig, train: Ratings, probe: Ratings, seed: int) -> tuple[torch.nn.Module, dict[str, Any]]:
    """One training run exactly as ``train.py`` builds it (``setup_training``: the tau cap of user-level mechanisms,
    model, sampler, mechanism), without files; returns the model and its privacy report."""
    from dprec_torch.training.run import setup_training

    c = cfg.copy()
    OmegaConf.set_struct(c, False)
    c.seed = int(seed)
    c.noise_seed = int(seed)  # the audit's trials are reproducible; its adversary never reads the seed
    seed_everything(int(seed))
    s = setup_training(c, Fold(1, train, probe), torch.device("cpu"))
    Trainer(s.model, s.optimizer, s.sampler, s.epochs).fit(s.fold)
    return s.model, s.optimizer.privacy_report()


def run_audit(cfg: DictConfig, base: Ratings, probe: Ratings) -> AuditResult:
    """The whole audit on real data ``base`` (``probe``: a few ratings the per-epoch evaluation reads)."""
    a = cfg.audit
    trials, m, alpha = int(a.trials), int(a.canaries), float(a.alpha)
    if trials < 1:
        raise ConfigError(f"audit.trials must be >= 1, got {trials}")
    if not 0 < alpha < 1:
        raise ConfigError(f"audit.alpha must be in (0, 1), got {alpha}")
    kind = canary_kind(cfg)
    canaries: CanarySet = make_canaries(base, m, kind, history_for(cfg, kind), int(cfg.seed))
    probe = Ratings(probe.users, probe.items, probe.values, canaries.base.n_users, canaries.base.n_items, probe.scale)
    gen = make_generator(int(cfg.seed) + 7919)
    scores, included, report = [], [], {}
    t0 = time.perf_counter()
    for t in range(trials):  # independent training runs
        inc = torch.rand(m, generator=gen) < 0.5
        model, report = train_once(cfg, canaries.dataset(inc), probe, int(cfg.seed) + 1000 * (t + 1))
        scores.append(score_canaries(model, canaries))
        included.append(inc)
    s, inc = torch.stack(scores), torch.stack(included)
    k = max(1, int(round(float(a.guess_fraction) * m)))
    correct, made = guesses(s, inc, k)
    eps_lb = epsilon_lower_bound(correct, made, alpha)
    rel = report.get("relation")
    return AuditResult(mechanism=str(cfg.mechanism.get("name", cfg.mechanism._target_)),
                       epsilon_claimed=claimed_epsilon(report), epsilon_lower_bound=eps_lb, alpha=alpha, trials=trials,
                       canaries=m, canary_kind=kind, guesses=made, correct=correct,
                       accuracy=correct / made if made else math.nan,
                       relation=rel.split()[0] if isinstance(rel, str) else rel,
                       seconds=time.perf_counter() - t0,
                       privacy={k2: v for k2, v in report.items() if isinstance(v, (int, float, str, type(None)))})
