"""The people a data config holds, and the default model's constants that a population chose differently.

:func:`population` is the size rule's population input (``dprec_torch/privacy/size_rule.py``) and the provenance's.
:func:`population_constant` serves ``${size_rule:KEY}`` in ``conf/model/pnbm_lowrank.yaml``; the resolver is registered
when this module is imported (``dprec_torch.config`` imports it, so every composed config can resolve it).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

#: the mechanisms whose knobs the size rule sets (on the low-rank PNBM)
RULE_MECHANISMS = ("sgld", "gaussian", "dpsgd")

#: constants of the default model that the rule does not compute from N, M and eps but that a data population chose
#: differently: the value per population a run trains on, each chosen on OTHER people's validation splits
#: (``python experiments/studies/pnbm_lowrank_size_rule.py constants``: ML-1M users for ML-100K runs, ML-100K u1.base
#: for ML-1M runs; docs/results/pnbm_lowrank/size_rule_constants.json). ``conf/model/pnbm_lowrank.yaml`` reads them as
#: ``${size_rule:KEY}`` (:func:`population_constant`). clamp_r: on 1,000 ML-1M users 2 beat 1 by 0.003 at eps = 20 and
#: 50 (6 seeds, noise 0.001); on ML-100K-val 2 and 1 tie at eps = 50 (ML-1M's runs have kappa above it), so 1 stays.
POPULATION_CONSTANTS: dict[str, dict[str, float]] = {"clamp_r": {"ml-100k": 2.0, "ml-1m": 1.0}}
#: the value for other data (custom: people unknown; synthetic) and for mechanisms the rule does not cover: the earlier one
POPULATION_FALLBACK: dict[str, float] = {"clamp_r": 1.0}

#: the people behind each data config (its validation split holds the same people): the rule's population input
POPULATIONS = {"ml-100k": "ml-100k", "ml-100k-val": "ml-100k", "ml-1m": "ml-1m", "ml-1m-val": "ml-1m",
               "synthetic": "synthetic", "synthetic-val": "synthetic"}


def population(cfg: Any) -> str | None:
    """The people ``cfg.data`` holds: ``ml-100k``, ``ml-1m``, ``synthetic``, or None (custom data: not known)."""
    inner = cfg.data.get("dataset")  # a validation split's data node wraps the dataset it splits
    return POPULATIONS.get(str((inner if isinstance(inner, DictConfig) else cfg.data).get("name", "")))


def population_constant(key: str, cfg: Any) -> float:
    """``${size_rule:KEY}``: :data:`POPULATION_CONSTANTS` ``[key]`` for the population ``cfg.data`` holds when
    ``cfg.mechanism`` is one the rule covers, else :data:`POPULATION_FALLBACK` ``[key]``."""
    if key not in POPULATION_CONSTANTS:
        raise KeyError(f"${{size_rule:{key}}}: the size rule has no per-population constant '{key}' "
                       f"(it has {', '.join(POPULATION_CONSTANTS)})")
    mechanism = cfg.get("mechanism")
    name = str(mechanism.get("name")) if mechanism is not None else None
    people = population(cfg) if cfg.get("data") is not None else None
    table = POPULATION_CONSTANTS[key]
    return float(table[people]) if name in RULE_MECHANISMS and people in table else float(POPULATION_FALLBACK[key])


def _resolve(key: str, *, _root_: DictConfig) -> Any:
    """``${size_rule:KEY}``: :func:`population_constant`."""
    return population_constant(key, _root_)


OmegaConf.register_new_resolver("size_rule", _resolve, replace=True)
