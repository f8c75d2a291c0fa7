"""Private hyperparameter selection, counted in epsilon: Liu & Talwar (STOC 2019), random stopping (Theorem 3.4).

``mechanism.select=private`` on a pure-epsilon mechanism at user level (``mechanism=dpsgd``). With the typed epsilon
eps, a round's share eps_r = eps / 3, a score share s (``select_score_share``) and gamma = 1 / ``select_rounds``,
round j = 1, 2, ... of a fold:

1. draws a candidate c_j: one value per key of the PUBLIC grid ``select_grid``, each uniformly (secret randomness);
2. trains c_j on the fold's training side less a per-user keyed validation part V (``select_validation`` of each
   user's ratings, :func:`~dprec_torch.data.validation.validation_fold`) at epsilon (1 - s) eps_r;
3. scores it: v_j = -sum_u min(mean_{i in V_u} (r_hat_ui - r_ui)^2, B) + Lap(B / (s eps_r)), B = the squared rating
   span: adding or removing one user moves the sum by at most B (:func:`clipped_error_sum`);
4. stops with probability gamma (the number of rounds is geometric, mean ``select_rounds``).

The fold releases the round with the highest v_j: its model and candidate. Each round reads a user's training and
validation ratings once each, so it is (1 - s) eps_r + s eps_r = eps_r-DP at user level (basic composition), and by
Liu & Talwar's Theorem 3.4 the selection over geometrically many rounds is 3 eps_r = eps-DP: the typed epsilon is the
defended one, the choice included. The rounds' test split is never read; the released model is trained on the training
side less V.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from dprec_torch.config_domains import domain_of
from dprec_torch.data.ratings import Fold
from dprec_torch.data.validation import validation_fold
from dprec_torch.errors import ConfigError
from dprec_torch.seeding import SecretGenerator, key_scope, noise_generator

log = logging.getLogger(__name__)

SELECT_CHOICES = ("none", "private")
#: the keys of a mechanism node that configure the selection (read by the runner, never by the mechanism class)
SELECT_KEYS = ("select", "select_rounds", "select_grid", "select_score_share", "select_validation")
ROUND_SHARE = 3.0  # Liu & Talwar, Theorem 3.4: geometric random stopping over eps_r-DP rounds is 3 eps_r-DP
SELECTION_STREAM = "private-selection"
#: ``select_grid: null``: the knobs the pure-epsilon rows are most sensitive to, around the size rule's values
DEFAULT_GRID = {"mean_fraction": ["auto", 0.6, 0.9], "clip_norm": ["auto", 0.25, 1.0]}


def selects_privately(cfg: DictConfig) -> bool:
    return cfg.mechanism.get("select", "none") == "private"


def check_selection(cfg: DictConfig, mechanism: type) -> None:
    """One readable :class:`ConfigError` for a selection the proof above does not cover (before any data is read);
    ``mechanism`` is the class of the mechanism key."""
    from dprec_torch.mechanisms.dpsgd import ClippedLaplaceDPSGD

    node = cfg.mechanism
    choice = node.get("select", "none")
    if choice not in SELECT_CHOICES:
        raise ConfigError(f"mechanism.select={choice} is invalid: it must be one of {', '.join(SELECT_CHOICES)}")
    if choice == "none":
        return
    eps = float(cfg.epsilon)
    if not (math.isfinite(eps) and eps > 0):
        raise ConfigError("mechanism.select=private needs a finite epsilon > 0 (the selection is counted in it)")
    if cfg.get("resume"):
        raise ConfigError("mechanism.select=private cannot resume a killed run (its rounds keep no checkpoint): set resume=false")
    pure, relation = issubclass(mechanism, ClippedLaplaceDPSGD), str(node.get("relation", mechanism.relation))
    if not pure or relation != "user":
        raise ConfigError(f"mechanism.select=private is implemented for pure-epsilon mechanisms at user level (Liu & "
                          f"Talwar's 3 eps bound), not mechanism={node.get('name', '?')} ({relation} level): use mechanism=dpsgd")
    grid = selection_grid(node)
    if not grid or any(not isinstance(v, list) or len(v) == 0 for v in grid.values()):
        raise ConfigError("mechanism.select_grid must map mechanism keys to non-empty lists of values, e.g. {mean_fraction: [auto, 0.9]}")
    unknown = sorted((set(grid) - set(node)) | (set(grid) & set(SELECT_KEYS)))
    if unknown:
        raise ConfigError(f"mechanism.select_grid names {unknown[0]}, which is not a key of mechanism={node.get('name', '?')}")
    for key, values in grid.items():  # each candidate value in its key's range, as a typed value would be
        dom = domain_of(node.get("_target_"), key)
        bad = [v for v in values if v != "auto" and dom is not None and not dom.accepts(v)]
        if bad:
            raise ConfigError(f"mechanism.select_grid.{key} holds {bad[0]}, which is invalid: it must be {dom}")


def selection_grid(node: DictConfig) -> dict[str, Any]:
    """``select_grid`` as plain lists (null: :data:`DEFAULT_GRID`)."""
    grid = node.get("select_grid")
    return DEFAULT_GRID if grid is None else OmegaConf.to_container(grid, resolve=True) if OmegaConf.is_config(grid) else grid


def clipped_error_sum(pred: torch.Tensor, truth: torch.Tensor, users: torch.Tensor, n_users: int, bound: float) -> float:
    """sum_u min(mean_{i in V_u} (pred_ui - r_ui)^2, B): each user adds a term in [0, B] (L1 sensitivity B)."""
    err = (pred.double() - truth.double()) ** 2
    sums = torch.zeros(n_users, dtype=torch.float64, device=err.device).index_add_(0, users, err)
    counts = torch.bincount(users, minlength=n_users).double()
    present = counts > 0
    return float((sums[present] / counts[present]).clamp(max=bound).sum())


def _candidate(grid: dict[str, list[Any]], gen: SecretGenerator) -> dict[str, Any]:
    return {k: v[min(int(float(gen.rand(1, dtype=torch.float64)) * len(v)), len(v) - 1)] for k, v in sorted(grid.items())}


def round_config(cfg: DictConfig, candidate: dict[str, Any], epsilon: float) -> DictConfig:
    """The config one round trains: the candidate's values, ``epsilon`` the round's training share, no selection."""
    sub = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    with open_dict(sub):
        sub.epsilon = float(epsilon)
        for key, value in candidate.items():
            sub.mechanism[key] = value
        for key in SELECT_KEYS:
            sub.mechanism.pop(key, None)
    return sub


def select_fold(cfg: DictConfig, fold: Fold, device: torch.device, train_round: Any) -> dict[str, Any]:
    """Run the selection on ``fold`` (module docstring). ``train_round(cfg, fold)`` trains one candidate on ``fold``
    (whose test side is the validation part) and returns ``(record, model)``; the chosen round's record comes back with
    its privacy report covering the whole selection."""
    node = cfg.mechanism
    eps = float(cfg.epsilon)
    eps_round = eps / ROUND_SHARE
    share = float(node.select_score_share)
    eps_train, eps_score = (1.0 - share) * eps_round, share * eps_round
    gamma = 1.0 / float(node.select_rounds)
    grid = {k: list(v) for k, v in selection_grid(node).items()}
    val = validation_fold(fold, float(node.select_validation), int(cfg.seed))
    bound = float(fold.train.scale.span) ** 2
    gen = noise_generator(cfg.get("noise_seed"), "cpu", SELECTION_STREAM)
    best: tuple[float, dict[str, Any], Any, dict[str, Any]] | None = None
    rounds: list[dict[str, Any]] = []
    while True:
        j = len(rounds) + 1
        candidate = _candidate(grid, gen)
        with key_scope(selection_round=j):
            record, model = train_round(round_config(cfg, candidate, eps_train), val)
        test = val.test
        raw = clipped_error_sum(model.predict(test.users, test.items), test.values, test.users, test.n_users, bound)
        score = float(gen.add_laplace_(torch.tensor([-raw], dtype=torch.float64), bound / eps_score))
        rounds.append({"round": j, "candidate": candidate, "noisy_score": score})
        log.info("private selection, fold %s round %d: %s -> noisy score %.4g", fold.index, j, candidate, score)
        if best is None or score > best[0]:
            best = (score, candidate, model, record)
        if float(gen.rand(1, dtype=torch.float64)) < gamma:
            break
    _, candidate, model, record = best
    report = dict(record["privacy"])
    selection = {"method": "Liu & Talwar 2019, Theorem 3.4 (geometric random stopping)", "rounds": len(rounds),
                 "expected_rounds": float(node.select_rounds), "stop_probability": gamma, "grid": grid,
                 "chosen": candidate, "epsilon_per_round": eps_round, "epsilon_train_per_round": eps_train,
                 "epsilon_score_per_round": eps_score, "score": "-sum_u min(validation MSE_u, B) + Lap(B / eps_score)",
                 "score_bound_B": bound, "validation_fraction": float(node.select_validation),
                 "noisy_scores": [r["noisy_score"] for r in rounds], "candidates": [r["candidate"] for r in rounds]}
    report.update(epsilon=eps, delta=0.0, selection=selection, epsilon_before_selection=report.get("epsilon"),
                  analysis=(f"Private selection over {len(rounds)} rounds (geometric, mean {float(node.select_rounds):g}): each "
                            f"round trains a candidate at eps = {eps_train:.4g} and releases a Laplace-noised clipped validation "
                            f"score at eps = {eps_score:.4g} (user level, B = {bound:g}), {eps_round:.4g} a round; by Liu & Talwar's "
                            f"Theorem 3.4 the chosen model, its candidate and the choice are {eps:.4g}-DP (3 x {eps_round:.4g}). "
                            f"Chosen: {candidate}. The round's own mechanism: {report.get('analysis', '')}"))
    record = {**record, "privacy": report, "selection": selection}
    return {"record": record, "model": model, "fold": val}

