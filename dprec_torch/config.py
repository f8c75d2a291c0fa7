"""Hydra glue (:func:`instantiate_node`, :func:`accepted`) and the config's schema check, run once before any data is
read (:func:`check_config`, called by ``training.run.validate`` and :mod:`dprec_torch.cli`):

* every key of the ``data``, ``model`` and ``mechanism`` nodes is a declared parameter of the node's ``_target_``, a key
  the runner reads itself (:data:`NODE_RUNNER_KEYS`) or a Hydra key, so ``mechanism.lerning_rate=0.1`` is an error;
* every required parameter of a target is present, and every number lies in its domain (:mod:`dprec_torch.config_domains`);
* a mechanism node is checked against the class that trains the model (:func:`form_node`, :mod:`dprec_torch.forms`).

Each problem raises :class:`~dprec_torch.errors.ConfigError` with one line naming the key, the value and the valid
range. The relation rules are in :mod:`dprec_torch.privacy.relations`.
"""

from __future__ import annotations

import copy
import difflib
import inspect
from pathlib import Path
from typing import Any, Iterator

from hydra.errors import InstantiationException
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from dprec_torch import forms, populations  # noqa: F401 (populations registers ${size_rule:...}, which the model yaml reads)
from dprec_torch.config_domains import TOP_DOMAINS, Domain, boolean, domain_of
from dprec_torch.errors import ConfigError, DprecError

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"

#: Keys the runner reads itself, per node: ``name`` for labels, ``epochs`` / ``sampling_ratio`` / ``unit`` for the batch
#: schedule, ``max_user_ratings`` for the tau cap of user-level mechanisms, ``chosen_on`` (on whose ratings the file's
#: numbers were chosen) for the report's provenance. Passed on to a target that declares them, dropped for one that does not.
NODE_RUNNER_KEYS: dict[str, tuple[str, ...]] = {
    "data": ("name",),
    "model": ("name", "chosen_on"),
    "mechanism": ("name", "epochs", "sampling_ratio", "unit", "max_user_ratings", "chosen_on", "select", "select_rounds",
                  "select_grid", "select_score_share", "select_validation"),
}
RUNNER_KEYS: tuple[str, ...] = tuple(dict.fromkeys(k for keys in NODE_RUNNER_KEYS.values() for k in keys))
#: the knobs that may be ``auto``: the low-rank PNBM's size rule sets them at set-up (:mod:`dprec_torch.privacy.size_rule`)
SIZE_RULE_KNOBS: dict[str, tuple[str, ...]] = {
    "mechanism": ("sampling_ratio", "epochs", "lr", "clip_norm", "mean_fraction"),
    "model": ("rank",),
}

#: Keys that no longer exist -> the one line naming what replaced them (an old override fails with it).
RETIRED_KEYS = {"perturb_residuals": "DPSGD-MF is its own mechanism now: mechanism=dpsgd_mf "
                                     "(mechanism=dpsgd_paper model=mf builds it)"}

#: Usual names of our keys, for the "did you mean" hint of a misspelt key.
ALIASES = {"learning_rate": "lr", "n_epochs": "epochs", "num_epochs": "epochs", "eps": "epsilon",
           "lambda": "weight_decay", "l2": "weight_decay", "gamma": "sampling_ratio", "sample_rate": "sampling_ratio"}

#: Parameters the runner passes at instantiation (never in yaml).
SUPPLIED_BY_RUNNER = frozenset({"params", "context", "n_items", "n_users", "device", "model"})
HYDRA_KEYS = frozenset({"_target_", "_partial_", "_convert_", "_recursive_", "_args_"})


# the last composition of conf/ in this process, as Hydra returned it: (config name, overrides, config)
_COMPOSED: tuple[str, tuple[str, ...], DictConfig] | None = None


def remember_composed(config_name: str, overrides: list[str], cfg: DictConfig) -> None:
    """Keep a copy of ``cfg``, the composition of ``conf/<config_name>.yaml`` with ``overrides`` (the command line's
    check composes what the run's provenance composes again when the command line sets no hyperparameter value)."""
    global _COMPOSED
    _COMPOSED = (config_name, tuple(overrides), copy.deepcopy(cfg))


def recall_composed(config_name: str, overrides: list[str]) -> DictConfig | None:
    """A copy of the remembered composition of exactly (``config_name``, ``overrides``), or None."""
    hit = _COMPOSED
    if hit is None or hit[0] != config_name or hit[1] != tuple(overrides):
        return None
    return copy.deepcopy(hit[2])


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
    not declare it. A :class:`DprecError` raised by the target is re-raised as is, not wrapped by Hydra (one CLI line)."""
    data = OmegaConf.to_container(node, resolve=True)
    declared = declared_parameters(data["_target_"])
    data = {k: v for k, v in data.items() if k not in RUNNER_KEYS or k in declared}
    try:
        return instantiate(data, **kwargs)
    except InstantiationException as err:
        if isinstance(err.__cause__, DprecError):
            raise err.__cause__ from None
        raise


def _retarget(node: DictConfig, target: str, drop: list[str]) -> DictConfig:
    """A copy of ``node`` naming ``target``, without the keys ``drop``."""
    out = copy.deepcopy(node)
    with open_dict(out):
        for key in drop:
            del out[key]
        out._target_ = target
    return out


def resolve_model_node(node: DictConfig, similarity: str | None = None) -> DictConfig:
    """The model ``node`` as its class reads it: for a PNBM node, a copy whose ``_target_`` is the class its
    ``similarity`` (or the one given) picks (``model=pnbm model.similarity=lowrank``; :data:`dprec_torch.forms.SIMILARITY_FORMS`),
    without ``similarity`` and the keys only the other form reads; any other node as it is. ``node`` itself is never
    changed (the run's config, and so its provenance, keeps what was composed)."""
    if node.get("_target_") != forms.SIMILARITY_FORMS["full"] or "similarity" not in node:
        return node
    similarity = similarity or node.similarity
    if similarity not in forms.SIMILARITY_FORMS:
        raise ConfigError(f"model.similarity must be one of {tuple(forms.SIMILARITY_FORMS)}, got '{similarity}'")
    target = forms.SIMILARITY_FORMS[similarity]
    other = set().union(*(declared_parameters(p) for p in forms.SIMILARITY_FORMS.values())) - set(declared_parameters(target))
    return _retarget(node, target, [k for k in node if k in other or k == "similarity"])


def typed_keys(kind: str) -> set[str]:
    """The ``<kind>.<key>`` overrides typed on ``train.py``'s command line (none outside a Hydra run)."""
    from hydra.core.hydra_config import HydraConfig

    keys = (o.split("=", 1)[0].lstrip("+~") for o in (HydraConfig.get().overrides.task if HydraConfig.initialized() else ()))
    return {k[len(kind) + 1:] for k in keys if k.startswith(kind + ".")}


def form_node(node: DictConfig, model: Any, typed: set[str] = frozenset()) -> DictConfig:
    """The mechanism ``node`` as the class that trains ``model`` (a model node, instance or class) reads it:
    ``_target_`` = that class (:func:`dprec_torch.forms.form_path`), without the keys only the key's own class reads;
    such a key in ``typed`` (typed on the command line) is refused."""
    target = node.get("_target_")
    form = target and forms.form_path(target, forms.model_target(model) if isinstance(model, DictConfig) else model)
    if form == target:
        return node
    declared, own = declared_parameters(form), declared_parameters(target)
    drop = [k for k in node if k in own and k not in declared and k not in NODE_RUNNER_KEYS["mechanism"]]
    for key in sorted(set(drop) & set(typed))[:1]:
        raise ConfigError(f"mechanism.{key} is not read by {form.rsplit('.', 1)[-1]}, the class that trains this model "
                          f"under mechanism={node.get('name', '?')}: remove it")
    out = _retarget(node, form, drop)
    if "delta" in declared and "delta" not in out:  # the typed top-level delta, never the form's default
        with open_dict(out):
            out.delta = "${delta}"
    return out


def _fail_value(path: str, value: Any, dom: Domain) -> ConfigError:
    return ConfigError(f"{path}={'null' if value is None else value} is invalid: it must be {dom}")


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
        if extra := [k for k in data if k not in runner and k not in HYDRA_KEYS]:
            raise ConfigError(f"{path}.{extra[0]} is not a key of {kind}={data.get('name', '?')} (it has no parameters)")
        return
    declared = declared_parameters(target)
    label = target.rsplit(".", 1)[-1] + (f" ({kind}={node.get('name', '?')})" if "name" in node else "")
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
    for name, param in declared.items():
        if param.default is inspect.Parameter.empty and name not in data and name not in SUPPLIED_BY_RUNNER:
            raise ConfigError(f"{path}.{name} is required by {label} but missing: set +{path}.{name}=<value>")
    if kind == "mechanism" and data.get("_partial_") and "epochs" not in data:
        raise ConfigError(f"{path}.epochs is required by the training loop but missing: set +{path}.epochs=<value>")
    for key, value in _leaves({k: v for k, v in data.items() if k not in HYDRA_KEYS}):
        if isinstance(value, dict):  # a nested _target_ node (data.dataset of a validation split)
            check_node(kind, node[key], f"{path}.{key}")
            continue
        dom = domain_of(target, key) or _bool_domain(declared.get(key))
        if value == "auto" and key in SIZE_RULE_KNOBS.get(kind, ()):  # resolved at set-up by dprec_torch/privacy/size_rule.py
            continue
        if dom is not None and not dom.accepts(value):
            raise _fail_value(f"{path}.{key}", value, dom)


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
    model = resolve_model_node(cfg.model)
    check_node("data", cfg.data)
    for similarity in forms.SIMILARITY_FORMS if model is not cfg.model else (None,):  # a PNBM node: each form's keys
        check_node("model", resolve_model_node(cfg.model, similarity))
    check_node("mechanism", form_node(cfg.mechanism, model, typed_keys("mechanism")))
