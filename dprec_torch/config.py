"""The config's shape in one place: which keys a node may carry and which values each number may take.

Hydra composes ``conf/`` as it is (``_target_`` nodes, no dataclasses); this module checks the result once,
before any data is read (:func:`check_config`, called by ``training.run.validate``):

* every key of the ``data``, ``model`` and ``mechanism`` nodes is a declared parameter of the node's
  ``_target_``, a key the runner reads itself (:data:`NODE_RUNNER_KEYS`) or a Hydra key (``_partial_``...),
  so ``mechanism.lerning_rate=0.1`` is an error, not a silently ignored argument;
* every required parameter of a target is present;
* every number lies in its domain (:data:`DOMAINS`: key -> type and range, per target where the same
  name means something else).

Each problem raises :class:`~dprec_torch.errors.ConfigError` with one line naming the key, the value
and the valid range. :func:`check_command_line` does the same for the command line itself (an unknown
``mechanism=foo``, a misspelt ``mechanism.lerning_rate=0.1`` that Hydra rejects) before ``@hydra.main``
runs, so the CLI prints one line and exits 2 instead of Hydra's multi-line report.

The Hydra glue of the runner (:func:`instantiate_node`, :func:`accepted`) lives here as well.
"""

from __future__ import annotations

import difflib
import inspect
import logging
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from hydra.errors import InstantiationException
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dprec_torch import populations  # noqa: F401 (registers ${size_rule:...}, which the model yaml reads)
from dprec_torch.errors import ConfigError, DprecError

log = logging.getLogger(__name__)

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"

# --------------------------------------------------------------------------------------------- keys
#: Keys the runner reads itself, per node: ``cfg.model.name`` for labels, ``cfg.mechanism.epochs`` /
#: ``sampling_ratio`` / ``unit`` for the batch schedule, ``max_user_ratings`` for the tau cap of
#: user-level mechanisms, ``chosen_on`` (on whose ratings the file's numbers were chosen) for the report's provenance
#: (:mod:`dprec_torch.privacy.provenance`). They are passed on to a target that declares them
#: (``load_movielens(name=...)``) and dropped for one that does not.
NODE_RUNNER_KEYS: dict[str, tuple[str, ...]] = {
    "data": ("name",),
    "model": ("name", "chosen_on"),
    "mechanism": ("name", "epochs", "sampling_ratio", "unit", "max_user_ratings", "chosen_on"),
}
RUNNER_KEYS: tuple[str, ...] = tuple(dict.fromkeys(k for keys in NODE_RUNNER_KEYS.values() for k in keys))


#: Keys that no longer exist -> the one line naming what replaced them (an old override fails with it).
RETIRED_KEYS = {"perturb_residuals": "DPSGD-MF is its own mechanism now: mechanism=dpsgd_mf "
                                     "(mechanism=dpsgd_paper model=mf builds it)"}

#: Classes moved since runs recorded them (issue 26, 2: ``mechanism=X`` -> ``mechanisms/X.py``). A run dir's
#: ``config_resolved.json`` is read through :func:`upgrade_recorded`, so ``evaluate.py run=`` and ``load_run`` keep
#: working on runs made before.
RENAMED_TARGETS = {
    "dprec_torch.mechanisms.dpsgd_l1.ClippedLaplaceDPSGD": "dprec_torch.mechanisms.dpsgd.ClippedLaplaceDPSGD",
    "dprec_torch.mechanisms.dpsgd.DPSGDLaplace": "dprec_torch.mechanisms.dpsgd_paper.DPSGDLaplace",
    "dprec_torch.mechanisms.sgd.MapSGD": "dprec_torch.mechanisms.none.NoMechanism",  # the class of mechanism=none
    "dprec_torch.mechanisms.gaussian_pnbm.GaussianPNBM": "dprec_torch.mechanisms.gaussian.GaussianPNBM",
}
BUILTIN_TARGET = "dprec_torch.mechanisms.builtin.BuiltIn"


def upgrade_recorded(cfg: DictConfig) -> DictConfig:
    """A recorded run config (``config_resolved.json``) with today's class names, in place: a moved ``_target_``
    (:data:`RENAMED_TARGETS`), and ``mechanism=builtin``, which named no class before it had one."""
    mech = cfg.get("mechanism")
    if isinstance(mech, DictConfig):
        target = mech.get("_target_")
        if target in RENAMED_TARGETS:
            mech._target_ = RENAMED_TARGETS[target]
        elif not target and mech.get("name") == "builtin":
            mech._target_ = BUILTIN_TARGET
    return cfg


#: Usual names of our keys, for the "did you mean" hint of a misspelt key.
ALIASES = {"learning_rate": "lr", "n_epochs": "epochs", "num_epochs": "epochs", "eps": "epsilon",
           "lambda": "weight_decay", "l2": "weight_decay", "gamma": "sampling_ratio", "sample_rate": "sampling_ratio"}

#: Parameters the runner passes at instantiation (never in yaml).
SUPPLIED_BY_RUNNER = frozenset({"params", "context", "n_items", "n_users", "device", "model"})
HYDRA_KEYS = frozenset({"_target_", "_partial_", "_convert_", "_recursive_", "_args_"})


def declared_parameters(target: str) -> dict[str, inspect.Parameter]:
    """The named parameters of a ``_target_`` (a class's ``__init__`` or a function)."""
    try:
        obj = get_object(target)
    except Exception as err:  # noqa: BLE001 - report a bad _target_ as a config error
        raise ConfigError(f"cannot import _target_ '{target}': {err}") from err
    params = inspect.signature(obj).parameters.values()
    return {p.name: p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def accepted(cls: type, **kwargs: Any) -> dict[str, Any]:
    """The subset of ``kwargs`` that ``cls.__init__`` names."""
    params = inspect.signature(cls.__init__).parameters
    return {k: v for k, v in kwargs.items() if k in params}


def instantiate_node(node: DictConfig, **kwargs: Any) -> Any:
    """``instantiate`` a config node; a runner-only key (:data:`RUNNER_KEYS`) is dropped only where the target does
    not declare it, so no real argument is ever lost to the filtering.

    A :class:`DprecError` raised by the target is re-raised as is, not wrapped by Hydra,
    so the CLI prints its one line.
    """
    data = OmegaConf.to_container(node, resolve=True)
    declared = declared_parameters(data["_target_"])
    data = {k: v for k, v in data.items() if k not in RUNNER_KEYS or k in declared}
    try:
        return instantiate(data, **kwargs)
    except InstantiationException as err:
        cause = err.__cause__
        if isinstance(cause, DprecError):
            raise cause from None
        raise


# ------------------------------------------------------------------------------------------ domains
@dataclass(frozen=True)
class Domain:
    """A number's type and valid range; ``null``/``also`` name the non-numeric values allowed."""

    kind: type  # int, float or bool
    lo: float = -math.inf
    hi: float = math.inf
    lo_open: bool = False
    hi_open: bool = False
    null: bool = False
    also: tuple[str, ...] = ()
    note: str = ""

    def __str__(self) -> str:
        if self.kind is bool:
            extras = [*(["null"] if self.null else []), *self.also]
            return "true or false" + "".join(f" or {e}" for e in extras) + (f" ({self.note})" if self.note else "")
        if self.kind is int:
            if math.isinf(self.hi):
                text = f"an integer >= {self.lo:g}"
            else:
                text = f"an integer in [{self.lo:g}, {self.hi:g}]"
        else:
            text = f"a number in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"
        extras = [*(["null"] if self.null else []), *self.also]
        text += "".join(f" or {e}" for e in extras)
        return text + (f" ({self.note})" if self.note else "")

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.null
        if isinstance(value, str) and value in self.also:
            return True
        if isinstance(value, bool) or self.kind is bool:  # a bool is no number; "maybe" is no bool
            return isinstance(value, bool) and self.kind is bool
        if self.kind is int:
            if not isinstance(value, int):
                return False
            x = float(value)
        else:
            try:
                x = float(value)  # "inf" or "1e-3" from yaml are strings
            except (TypeError, ValueError):
                return False
        if math.isnan(x):
            return False
        above = x > self.lo if self.lo_open else x >= self.lo
        below = x < self.hi if self.hi_open else x <= self.hi
        return above and below

    def invalid_example(self) -> Any:
        """A value outside the domain of the same type where one exists, else a non-number."""
        if self.kind is bool:
            return "maybe"
        if self.kind is int:
            return int(self.lo) - 1 if math.isfinite(self.lo) else "abc"
        if math.isfinite(self.hi):
            return self.hi + 0.5
        if math.isfinite(self.lo):
            return self.lo - 0.5 if not self.lo_open else self.lo
        return "abc"


def integer(lo: int, hi: float = math.inf, null: bool = False, also: tuple[str, ...] = (), note: str = "") -> Domain:
    return Domain(int, lo, hi, null=null, also=also, note=note)


def number(interval: str, null: bool = False, note: str = "") -> Domain:
    """``number("(0, 1]")``: a real in the written interval (``inf`` allowed as a bound)."""
    lo_s, hi_s = (s.strip() for s in interval.strip()[1:-1].split(","))
    return Domain(float, float(lo_s), float(hi_s), interval.strip()[0] == "(", interval.strip()[-1] == ")", null=null, note=note)


def boolean(null: bool = False, note: str = "") -> Domain:
    """``true`` or ``false`` only: ``maybe`` or ``1`` is an error, not truthy."""
    return Domain(bool, null=null, note=note)


ANY_REAL = number("(-inf, inf)")

#: Top-level keys of config.yaml / evaluate.yaml / audit.yaml.
TOP_DOMAINS: dict[str, Domain] = {
    "epsilon": number("(0, inf]", note="inf = non-private"),
    "delta": number("[0, 1)"),
    "seed": integer(0),
    "noise_seed": integer(0, null=True, note="null = secret noise from the OS entropy source"),
    "baseline_k": integer(1, null=True, note="null = 900 on ML-100K, 1300 on ML-1M"),
    "eval.topn": integer(1),
    "eval.relevance_threshold": ANY_REAL,
    "audit.trials": integer(1),
    "audit.canaries": integer(2),
    "audit.history": integer(0),
    "audit.guess_fraction": number("(0, 0.5]"),
    "audit.alpha": number("(0, 1)"),
    "audit.probe_ratings": integer(1),
    "resume": boolean(),
    "keep_checkpoint": boolean(note="false = a private run's secret checkpoint is deleted once its release is written"),
    "checkpoint_every": integer(1, also=("auto", "end"), note="auto = every epoch with resume=true, else every 60 s"),
    "compare_baselines": boolean(),
    "tensorboard": boolean(),
}

#: Key -> domain, shared by every target that takes the key (its meaning is the same everywhere).
DOMAINS: dict[str, Domain] = {
    # privacy and seeds
    "epsilon": number("(0, inf]", note="inf = non-private"),
    "delta": number("[0, 1)"),
    "seed": integer(0, null=True, note="a mechanism's noise seed: null = secret (OS entropy)"),
    "support_seed": integer(0),
    "item_features": Domain(bool, also=("auto",), note="auto = on when the dataset has a public catalogue attached"),
    # data
    "fold": integer(1, also=("all",)),
    "n_folds": integer(1),
    "test_fraction": number("(0, 1)"),
    "fraction": number("(0, 1)"),
    "min_user_ratings": integer(0),
    "max_user_ratings": integer(1, null=True),
    "n_users": integer(1, null=True),
    "n_items": integer(1, null=True),
    "n_ratings": integer(1, null=True),
    "rank": integer(1),
    # models and predictors
    "dim": integer(1),
    "init_std": number("[0, inf)"),
    "mu_scale": number("[0, inf)"),
    "floor_c": number("(0, inf)"),
    "n_neighbors": integer(1),
    "init_scale": number("[0, inf)"),
    "predict_batch_users": integer(1),
    "pair_budget": integer(1),
    "block_budget": integer(1),
    "dense_max_items": integer(0),
    "sparse_k": integer(1),
    "support_shrinkage": number("[0, inf)"),
    "k": integer(1),
    "min_support": integer(0),
    "shrinkage": number("[0, inf)"),
    "batch_size": integer(1),
    "T": integer(1),
    "phi_m": integer(0),
    "delta_r": number("(0, inf)", null=True, note="null = the data's scale span"),
    "threshold": number("(-inf, inf)", null=True),
    "p": number("[0, 1]"),
    "p_star": number("[0, 1]", null=True),
    "lam": number("[0, inf)"),
    "neighbor_groups": integer(0, null=True),
    "like_fraction": number("[0, 1]"),
    "clamp_b": number("(0, inf)"),
    "beta_m": number("[0, inf)"),
    "beta_p": number("[0, inf)"),
    "variance_floor": number("[0, inf)"),
    "knn_shrinkage": number("[0, inf)"),
    "mean_prior_std": number("(0, inf)"),
    "mean_popularity_alpha": number("[0, inf)", note="0 = one plain item-statistics release"),
    "feature_reg": number("(0, inf)", note="ridge of each user's weights on the public item features"),
    "mean_popularity_share": number("(0, 1)"),
    "reg": number("[0, inf)"),
    "eig_threshold": number("[0, inf)"),
    "prior_power": number("[0, inf)"),
    "block": integer(1),
    "iterations": integer(1),
    "power_iters": integer(0),
    "max_ratings_per_user": integer(1, null=True, note="null = every rating (only without noise)"),
    "clip_factor": number("(0, inf)"),
    "clamp_r": number("(0, inf)"),
    "item_reg": number("(0, inf)"),
    "noise_reg": number("[0, inf)"),
    "init_fraction": number("[0, 1)"),
    "count_weight": number("(0, inf)", null=True, note="null = the relation's default count weight"),
    "steps": integer(1),
    "clip": number("(0, inf)"),
    "momentum": number("[0, 1)"),
    "budget.gsum": number("(0, 1]"),
    "budget.gcnt": number("(0, 1]"),
    "budget.msum": number("(0, 1]"),
    "budget.mcnt": number("(0, 1]"),
    "budget.cov": number("(0, 1]"),
    "w": number("[0, inf)", null=True, note="null = max(s_k, 0)"),
    # mechanisms
    "lr": number("(0, inf)"),
    "weight_decay": number("[0, inf)"),
    "beta": number("(0, inf)"),
    "sampling_ratio": number("(0, 1]"),
    "epochs": integer(1),
    "clip_norm": number("(0, inf)"),
    "noise_multiplier": number("[0, inf)", null=True, note="null = from epsilon"),
    "mean_fraction": number("(0, 1)"),
    "mean_global_fraction": number("(0, 1)"),
    "mean_shrinkage": number("[0, inf)"),
    "init_value": ANY_REAL,
    "chunk_pairs": integer(1),
    "decay": number("[0, inf)"),
    "lr_decay": number("(0, 1]", note="per-epoch factor on lr (mechanism=none)"),
    "rating_reg": number("[0, inf)", note="per-visited-rating L2 (mechanism=none, model=mf)"),
    "temperature": number("(0, 1]"),
    "prior_kappa": number("(0, inf)", null=True, note="null = weight_decay as given"),
    "prior_mean": ANY_REAL,
    "e_max": number("(0, inf)", null=True),
    "sensitivity": number("(0, inf)", null=True, note="null = the model's score range"),
    "n1": integer(1),
    "n2": integer(1),
    "n_iter": integer(1),
    "dt": number("(0, inf)", null=True, note="null = 1/U_s"),
    "max_exact_items": integer(0),
}

_GAUSSIAN_DELTA = number("(0, 1)", note="the Gaussian mechanism needs delta > 0")
#: Where one target gives a shared key another range.
TARGET_DOMAINS: dict[str, dict[str, Domain]] = {
    "dprec_torch.predictors.knn.ItemKNN": {"k": integer(1, null=True, note="null = 900 on ML-100K, 1300 on ML-1M")},
    "dprec_torch.predictors.mcsherry.McSherryMironov": {"delta": _GAUSSIAN_DELTA},
    "dprec_torch.mechanisms.gaussian.GaussianDPSGD": {"delta": _GAUSSIAN_DELTA},
    "dprec_torch.mechanisms.gaussian.GaussianPNBM": {"delta": _GAUSSIAN_DELTA},
    "dprec_torch.mechanisms.sgld.ScaledPosteriorSGLD": {"max_user_ratings": integer(
        1, null=True, note="tau bounds B in the posterior-sampling form; null = no cap, for the clipped chain (bounded by C)")},
    "dprec_torch.predictors.dpals.DPALS": {"reg": number("(0, inf)"), "init_scale": number("(0, inf)"), "delta": _GAUSSIAN_DELTA},
    "dprec_torch.predictors.noisy_gram.NoisyGram": {"delta": _GAUSSIAN_DELTA,
                                                    "support": integer(2, null=True, note="null = all items")},
}


def domain_of(target: str | None, key: str) -> Domain | None:
    """The domain of ``key`` (a dotted path inside the node) for ``target``; None if it has none."""
    return TARGET_DOMAINS.get(target or "", {}).get(key) or DOMAINS.get(key)


# ------------------------------------------------------------------------------------------- checks
def _fail_value(path: str, value: Any, dom: Domain) -> ConfigError:
    shown = "null" if value is None else value
    return ConfigError(f"{path}={shown} is invalid: it must be {dom}")


def _target_label(kind: str, node: DictConfig, target: str) -> str:
    return f"{target.rsplit('.', 1)[-1]} ({kind}={node.get('name', '?')})" if "name" in node else target.rsplit(".", 1)[-1]


def _leaves(node: dict, prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in node.items():
        if isinstance(value, dict) and "_target_" not in value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _bool_domain(param: inspect.Parameter | None) -> Domain | None:
    """:func:`boolean` for a parameter annotated ``bool`` (or ``bool | None``), else None."""
    annotation = None if param is None else param.annotation
    if annotation in (bool, "bool"):
        return boolean()
    if annotation in ("bool | None", "None | bool", "Optional[bool]"):
        return boolean(null=True)
    return None


def check_node(kind: str, node: DictConfig, path: str | None = None) -> None:
    """Unknown keys, missing required keys and out-of-domain numbers of one ``_target_`` node."""
    path = path or kind
    for key in node:
        if OmegaConf.is_missing(node, key):
            raise ConfigError(f"{path}.{key} is required but missing (???): set {path}.{key}=<value>")
    try:
        data = OmegaConf.to_container(node, resolve=True)
    except OmegaConfBaseException as err:
        raise ConfigError(f"{path}: {str(err).splitlines()[0]}") from None
    runner = NODE_RUNNER_KEYS.get(kind, ())
    target = data.get("_target_")
    if not target:
        extra = [k for k in data if k not in runner and k not in HYDRA_KEYS]
        if extra:
            raise ConfigError(f"{path}.{extra[0]} is not a key of {kind}={data.get('name', '?')} (it has no parameters)")
        return
    declared = declared_parameters(target)
    label = _target_label(kind, node, target)
    for key in data:
        if key in HYDRA_KEYS or key in declared or key in runner:
            continue
        if key in RETIRED_KEYS:
            raise ConfigError(f"{path}.{key} is no longer a key: {RETIRED_KEYS[key]}")
        known = sorted(set(declared) - SUPPLIED_BY_RUNNER | set(runner))
        names = {**{a: k for a, k in ALIASES.items() if k in known}, **{k: k for k in known}}
        close = difflib.get_close_matches(key, list(names), n=1)
        hint = f"did you mean {path}.{names[close[0]]}? " if close else ""
        raise ConfigError(f"{path}.{key} is not a parameter of {label}: {hint}valid keys: {', '.join(known)}")
    partial = bool(data.get("_partial_"))
    for name, param in declared.items():
        if param.default is inspect.Parameter.empty and name not in data and name not in SUPPLIED_BY_RUNNER:
            raise ConfigError(f"{path}.{name} is required by {label} but missing: set +{path}.{name}=<value>")
    if kind == "mechanism" and partial and "epochs" not in data:
        raise ConfigError(f"{path}.epochs is required by the training loop but missing: set +{path}.epochs=<value>")
    for key, value in _leaves({k: v for k, v in data.items() if k not in HYDRA_KEYS}):
        if isinstance(value, dict):  # a nested _target_ node (data.dataset of a validation split)
            check_node(kind, node[key], f"{path}.{key}")
            continue
        dom = domain_of(target, key) or _bool_domain(declared.get(key))
        if value == "auto" and _size_rule_knob(kind, key):  # resolved at set-up by dprec_torch/privacy/size_rule.py
            continue
        if dom is not None and not dom.accepts(value):
            raise _fail_value(f"{path}.{key}", value, dom)


#: the knobs that may be ``auto``: the low-rank PNBM's size rule sets them at set-up (:mod:`dprec_torch.privacy.size_rule`)
SIZE_RULE_KNOBS: dict[str, tuple[str, ...]] = {
    "mechanism": ("sampling_ratio", "epochs", "lr", "clip_norm", "mean_fraction"),
    "model": ("rank",),
}




def _size_rule_knob(kind: str, key: str) -> bool:
    """Whether ``kind.key`` may be ``auto`` (:data:`SIZE_RULE_KNOBS`)."""
    return key in SIZE_RULE_KNOBS.get(kind, ())


def check_config(cfg: DictConfig) -> None:
    """Validate a composed train/evaluate/audit config once, before any data is read (see module doc)."""
    for key, dom in TOP_DOMAINS.items():
        if OmegaConf.select(cfg, key, default="__absent__", throw_on_missing=False) == "__absent__":
            if key == "epsilon":
                raise ConfigError("epsilon is required but missing: set epsilon=<value> (inf = non-private)")
            continue
        try:
            value = OmegaConf.select(cfg, key, throw_on_missing=True)
        except OmegaConfBaseException as err:
            raise ConfigError(f"{key}: {str(err).splitlines()[0]}") from None
        if not dom.accepts(value):
            raise _fail_value(key, value, dom)
    for kind in ("data", "model", "mechanism"):
        if kind not in cfg or not isinstance(cfg[kind], DictConfig):
            raise ConfigError(f"the config has no {kind} node: choose {kind}=<name> (see conf/{kind}/)")
        check_node(kind, cfg[kind])
    check_relation_preprocessing(cfg)


# ----------------------------------------------------------------- relation vs per-user preprocessing
#: The relation of targets whose class attribute does not state the one their epsilon defends (None: none defended).
#: laplace_output is absent: its Delta f is the output range (cosine_implicit) or a substitution bound (slope_one),
#: which per-user preprocessing cannot exceed (tests/test_issue24_harness.py).
TARGET_RELATIONS: dict[str, str | None] = {
    "dprec_torch.mechanisms.dpsgd_paper.DPSGDLaplace": None,  # Alg. 1 as printed: the paper's figure only
    "dprec_torch.mechanisms.dpsgd_mf.DPSGDMF": "rating_value",  # one rating's value changes; who rated what is public
    "dprec_torch.mechanisms.exponential_topk.ExponentialTopK": "score_entry",
    "dprec_torch.predictors.mcsherry.McSherryMironov": "rating",
}
#: Relations whose neighbours differ in one rating added, removed (or changed): a per-user step (a min-count
#: filter, a tau cap) turns that one rating into many, so their sensitivity does not survive it (issue 24, 3).
RATING_LEVEL = frozenset({"rating"})


def form_target(node: DictConfig, model: DictConfig | None = None) -> str | None:
    """The qualified class that trains ``model`` under the mechanism ``node``: its ``_target_``, or the form that class's
    ``form_for`` names for the model's class (``mechanism=dpsgd_paper model=mf``: DPSGD-MF; see
    :mod:`dprec_torch.mechanisms.base`). Without a model, or for a node whose class has no forms: the ``_target_``."""
    target = node.get("_target_") if isinstance(node, DictConfig) else None
    model_target = model.get("_target_") if isinstance(model, DictConfig) else None
    if not target or not model_target:
        return target
    forms = getattr(get_object(target), "form_for", None)  # config.py sits below the mechanisms: no isinstance here
    if forms is None:
        return target
    form = forms(get_object(model_target))
    return f"{form.__module__}.{form.__qualname__}"


def node_relation(node: DictConfig, model: DictConfig | None = None) -> str | None:
    """The neighbouring relation a node's ``_target_`` (with ``model``: the form that trains it, :func:`form_target`)
    is configured to defend (None: it states none).

    :data:`TARGET_RELATIONS`; else the node's ``relation`` where the target takes one (absent: its default);
    else the class's ``relation`` (a :class:`~dprec_torch.interfaces.TrainingMechanism` attribute); else, where
    that is None, the node's ``unit`` (Gaussian DP-SGD defends add/remove one unit). The configured value always
    wins over the class default."""
    target = form_target(node, model)
    if not target:
        return None
    if target in TARGET_RELATIONS:
        return TARGET_RELATIONS[target]
    declared = declared_parameters(target)
    if "relation" in declared:
        return str(node.get("relation", declared["relation"].default))
    fixed = getattr(get_object(target), "relation", None)  # config.py sits below interfaces: no isinstance here
    if fixed is None and "unit" in declared:
        return str(node.get("unit", declared["unit"].default))
    return fixed if isinstance(fixed, str) else None


def claimed_relations(cfg: DictConfig) -> list[tuple[str, str, DictConfig]]:
    """``(kind, relation, node)`` of every model/mechanism node that states a finite epsilon under a relation."""
    out = []
    for kind in ("mechanism", "model"):
        node = cfg.get(kind)
        model = cfg.get("model") if kind == "mechanism" else None
        rel = node_relation(node, model)
        if rel is None or "epsilon" not in declared_parameters(form_target(node, model)):
            continue  # e.g. mechanism=none, model=pnbm: nothing claimed here
        eps = node.get("epsilon", cfg.get("epsilon"))
        if eps is not None and math.isfinite(float(eps)):
            out.append((kind, rel, node))
    return out


def per_user_steps(cfg: DictConfig) -> list[tuple[str, str]]:
    """``(key=value, fix)`` of every per-user preprocessing step the run applies before its mechanism."""
    steps = []
    nodes = [("data", cfg.data)]
    inner = cfg.data.get("dataset")
    if isinstance(inner, DictConfig):  # data=<name>-val: the loader node inside the validation wrapper
        nodes.append(("data.dataset", inner))
    for path, node in nodes:
        low = node.get("min_user_ratings")
        if low is not None and int(low) > 1:  # 0 and 1 keep every present user
            steps.append((f"{path}.min_user_ratings={low}", f"{path}.min_user_ratings=0"))
        if node.get("max_user_ratings") is not None:
            steps.append((f"{path}.max_user_ratings={node.max_user_ratings}", f"{path}.max_user_ratings=null"))
    mech = cfg.mechanism
    if mech.get("_partial_") and mech.get("max_user_ratings") is not None:  # the runner's cap (training mechanisms)
        steps.append((f"mechanism.max_user_ratings={mech.max_user_ratings}", "mechanism.max_user_ratings=null"))
    return steps


def _user_level_fix(kind: str, node: DictConfig) -> str:
    declared = declared_parameters(node._target_)
    key = "relation" if "relation" in declared else "unit" if "unit" in declared else None
    return f"{kind}.{key}=user" if key else "a user-level mechanism"


def check_relation_preprocessing(cfg: DictConfig) -> None:
    """No rating-level epsilon after a per-user step: removing one rating of a user at the min-count threshold
    removes all of them, and under a tau cap it lets another rating in (issue 24, 3). Non-private runs and
    user-level relations are unaffected (the cap keeps each user's profile a function of that user alone)."""
    steps = per_user_steps(cfg)
    if not steps:
        return
    for kind, rel, node in claimed_relations(cfg):
        if rel in RATING_LEVEL:
            step, fix = steps[0]
            raise ConfigError(f"{kind}={node.get('name', node._target_)} defends relation={rel} (one rating), but {step} "
                              f"acts per user, so one rating can move many and the epsilon does not hold: set {fix} "
                              f"or {_user_level_fix(kind, node)}")


def check_privacy_units(cfg: DictConfig, n_ratings: int, n_users: int) -> None:
    """delta < 1 / (number of privacy units): ratings at rating level, users at user level. A larger delta
    allows a mechanism that publishes one unit's data outright, so its epsilon defends nothing: refused.

    delta > 1 / (10 N) is allowed but warned about (one line naming the fix; issue 33, 6): delta is the probability
    that the epsilon bound fails outright, and a mechanism that publishes each of the N units' data whole with
    probability delta is (0, delta)-DP, so at delta near 1/N it expects to leak about one unit's data in full.
    Dwork & Roth (2014, Sec. 2.3) ask for delta below the inverse of any polynomial in N; 1/(10 N) is the
    conventional ceiling in practice. Warned, not refused: between 1/(10 N) and 1/N no unit is expected to leak
    whole (at most 1/10 of one in expectation), the printed (epsilon, delta) is still what the accountant proves,
    and refusing would break commands (e.g. rating-level runs on ML-1M at the default delta=1e-6) that state their
    delta openly."""
    for kind, rel, node in claimed_relations(cfg):
        if "delta" not in declared_parameters(form_target(node, cfg.get("model") if kind == "mechanism" else None)):
            continue  # a pure-epsilon mechanism: delta is not part of its claim
        delta = float(node.get("delta", cfg.get("delta", 0.0)) or 0.0)
        units, what = (n_users, "users") if rel == "user" else (n_ratings, "ratings")
        if delta > 0 and delta * max(units, 1) >= 1:
            raise ConfigError(f"{kind}.delta={delta:g} is not below 1/{units} (relation={rel}: {units} {what} to "
                              f"protect), so epsilon defends nothing: set delta below {1 / max(units, 1):.2g}")
        if delta > 0 and delta * 10 * max(units, 1) > 1:
            log.warning("%s.delta=%g is above 1/(10 N) = %.2g (relation=%s: N = %d %s): delta is the chance that the "
                        "guarantee fails outright, and near 1/N one of the %d %s can leak whole; set delta=%.1g or "
                        "lower (the usual ceiling 1/(10 N))", kind, delta, 1 / (10 * max(units, 1)), rel, units, what,
                        units, what, _round_down(1 / (10 * max(units, 1))))


def _round_down(x: float) -> float:
    """``x`` rounded down to one significant digit (a delta to type)."""
    exp = math.floor(math.log10(x))
    return max(1, math.floor(x / 10**exp * (1 + 1e-9))) * 10**exp


# ------------------------------------------------------------------------ dataset-dependent defaults
#: k of the non-private PCC/COS baselines per dataset (Wang & Tang Sec. 5.1); any other dataset: 900.
PAPER_KNN_K = {"ml-100k": 900, "ml-1m": 1300}


def dataset_name(cfg: DictConfig) -> str:
    """The MovieLens name behind ``cfg.data`` (through a validation wrapper), else its ``name``."""
    data = cfg.data
    inner = data.get("dataset")
    return str((inner if isinstance(inner, DictConfig) else data).get("name", ""))


def paper_knn_k(name: str) -> int:
    """900 on ML-100K, 1300 on ML-1M (the paper's PCC/COS k), 900 elsewhere."""
    return PAPER_KNN_K.get(name, PAPER_KNN_K["ml-100k"])


def fill_dataset_defaults(cfg: DictConfig) -> None:
    """``baseline_k: null`` and ``model.k: null`` of PCC/COS become the paper's k for the dataset, in place,
    so ``config_resolved.json`` records the k that was used."""
    k = paper_knn_k(dataset_name(cfg))
    if "baseline_k" in cfg and cfg.baseline_k is None:
        cfg.baseline_k = k
    if cfg.model.get("_target_") == "dprec_torch.predictors.knn.ItemKNN" and cfg.model.get("k", 0) is None:
        cfg.model.k = k


def check_study(cfg: DictConfig) -> None:
    """Every (method, epsilon) of a ``scripts/study.py`` config, composed as its stage-2 ``train.py`` run and checked
    with :func:`check_config`, so a bad study fails in one line before any multirun is launched."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    def compose_all() -> None:
        for m in cfg.study.methods:
            for eps in cfg.study.epsilons:
                overrides = [f"model={m.model}", f"mechanism={m.mechanism}", f"data={cfg.dataset}", f"epsilon={eps}",
                             f"seed={cfg.seed}", f"noise_seed={cfg.seed}", *[f"data.{o}" for o in cfg.data_overrides], *cfg.stage2_overrides,
                             *cfg.overrides]
                try:
                    run_cfg = compose(config_name="config", overrides=overrides)
                except HydraException as err:
                    raise ConfigError(f"study method {m.mechanism}/{m.model}: {_one_line(err)}") from None
                check_config(run_cfg)

    if GlobalHydra.instance().is_initialized():  # inside @hydra.main: compose from its search path
        compose_all()
        return
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        compose_all()


# ----------------------------------------------------------------------------------- command line
def _one_line(err: Exception) -> str:
    """Hydra's multi-line composition errors, condensed."""
    from hydra.errors import MissingConfigException

    if isinstance(err, MissingConfigException) and err.missing_cfg_file and "/" in err.missing_cfg_file:
        group, option = err.missing_cfg_file.rsplit("/", 1)
        options = ", ".join(err.options or sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")))
        return f"{group}={option} is unknown: there is no conf/{group}/{option}.yaml; choose one of {options}"
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return "; ".join(ln for ln in lines if not ln.startswith(("full_key", "object_type")))


def check_command_line(config_name: str, argv: list[str]) -> None:
    """Compose ``conf/<config_name>.yaml`` with the command-line overrides (the first value of each sweep)
    and :func:`check_config` it; raises :class:`ConfigError` with one line. Command lines with Hydra
    flags other than ``-m`` (``--cfg``, ``--help``, ...) are left to Hydra."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    if any(a.startswith("-") and a not in ("-m", "--multirun") for a in argv):
        return
    args = [a for a in argv if not a.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(args)
    except HydraException as err:
        raise ConfigError(_one_line(err)) from None
    overrides = []
    for o in parsed:
        key = o.get_key_element().lstrip("+~")
        if key.startswith("hydra") and key != "hydra.searchpath":  # searchpath: where +grid=/+selected= files live
            continue
        if o.is_sweep_override():
            first = next(iter(o.sweep_string_iterator()), None)
            overrides.append(f"{o.get_key_element()}={first}")
        else:
            overrides.append(o.input_line)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        try:
            cfg = compose(config_name=config_name, overrides=overrides)
        except HydraException as err:
            retry = _misspelt_key_retry(config_name, overrides, err)
            raise (retry or ConfigError(_one_line(err))) from None
    if "data" in cfg:
        check_config(cfg)


def _misspelt_key_retry(config_name: str, overrides: list[str], err: Exception) -> ConfigError | None:
    """``mechanism.lerning_rate=0.1`` (a key not in the yaml): compose it with ``+`` and let the schema name it."""
    from hydra import compose
    from hydra.errors import HydraException

    text = str(err)
    if "Could not override" not in text:
        return None
    key = text.split("'")[1]
    plussed = [f"+{o}" if o.split("=", 1)[0] == key else o for o in overrides]
    try:
        check_config(compose(config_name=config_name, overrides=plussed))
    except ConfigError as named:
        return named
    except HydraException:
        return None
    return ConfigError(f"{key} is not in the composed config: add it with +{key}=<value>")


def exit_on_bad_command_line(config_name: str) -> None:
    """For ``if __name__ == "__main__"`` of the CLI scripts: one line on stderr and exit 2 on a bad command line."""
    try:
        check_command_line(config_name, sys.argv[1:])
    except ConfigError as err:
        report_error(err)
        sys.exit(2)


def report_error(err: BaseException) -> None:
    """The CLI's one error line, on stderr (Hydra's own log handlers write to stdout and the job log)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("error: %(message)s"))
    cli = logging.getLogger("dprec_torch.cli")
    cli.handlers, cli.propagate = [handler], False
    cli.error("%s", err)
