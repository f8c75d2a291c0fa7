"""Where a run's hyperparameters came from, and whether that source shares people with the training data.

A choice of hyperparameters by validation RMSE reads the validation ratings: on the people a model is trained on it
is not post-processing, and the printed epsilon does not count it; on other people's data it costs the trained people
nothing (a fixed input for them: the epsilon is end to end).

Presets (``conf/experiment/private_{rating,user}.yaml``, written by ``experiments/studies/private_frontier.py`` from
``docs/results/private_frontier/selection.json``) carry a ``preset`` block: one configuration per (dataset it was
chosen on, validated epsilon). Each tuned ``model.KEY`` reads ``${preset:KEY}``, which :func:`preset_choice` resolves:

* the source: the first of ``preset.sources`` that shares no people with ``cfg.data`` (ML-100K, 1997-98, and ML-1M,
  users who joined in 2000, are different users; synthetic data has no people); for data whose people are unknown
  (``data=custom``) the first source, and the report says it is unknown;
* the epsilon: the largest validated epsilon at or below the typed one; below the smallest, the smallest.

A ``model.KEY=...`` on the command line replaces the interpolation: the user's value wins and the report names it.
:func:`hyperparameter_provenance` is the ``hyperparameters`` entry of a run's privacy report.

Without a preset, every ``conf/model``, ``conf/mechanism`` and ``conf/tuned`` file carries a ``chosen_on`` value (a
population, a list of them, ``data-independent`` or ``not recorded``): on whose ratings its numbers were chosen; a
tuned file's value replaces its mechanism file's, and the runner drops the key before a class is built
(``NODE_RUNNER_KEYS``). A model or mechanism value the user set (:func:`user_values`: the Hydra command line, or for
``train(cfg)`` from Python a difference from the package's composition of the same choices) is reported as "chosen by
the user: not counted": the package cannot tell whether it was chosen on these people's ratings. For custom data the
package cannot tell whose people it holds, so it never claims a choice was made on other people.

A ``chosen_on`` value may also map the population a run trains on to the one its numbers were chosen on:
``{ml-100k: ml-1m, ml-1m: ml-100k, note: {ml-1m: "..."}}`` says they were chosen (or re-checked) on ML-1M's users for
ML-100K runs and on ML-100K's for ML-1M runs, so neither shares people. Data without an entry (custom, synthetic)
gets every source the mapping names. ``note`` (optional, per population) is appended to the statement (what the
choice found, e.g. the earlier values again).
"""

from __future__ import annotations

import logging
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dprec_torch.config import CONF_DIR, recall_composed
from dprec_torch.errors import ConfigError
from dprec_torch.populations import POPULATIONS, population  # noqa: F401 (the people a data config holds)

log = logging.getLogger(__name__)

#: how a population is named in a statement
DESCRIPTIONS = {"ml-100k": "ML-100K's users (rated 1997-98)", "ml-1m": "ML-1M's users (joined MovieLens in 2000)"}

_LOGGED: set[tuple[Any, ...]] = set()


def shares_people(source: str, people: str | None) -> bool | str:
    """Whether hyperparameters chosen on ``source`` read any of ``people``: True, False or "unknown"."""
    if people is None:
        return "unknown"
    if people == "synthetic":
        return False
    return source == people


def pick_epsilon(validated: list[float], typed: float) -> float:
    """The largest validated epsilon at or below ``typed``; below the smallest, the smallest."""
    if not validated:
        raise ConfigError("preset: no validated epsilon (regenerate it: python experiments/studies/private_frontier.py --stage report)")
    below = [e for e in validated if e <= typed]
    return max(below) if below else min(validated)


def preset_choice(cfg: DictConfig) -> dict[str, Any]:
    """The entry of ``cfg.preset.choices`` for the typed epsilon and the data (see module doc), plus
    ``shares_people``; logged once per (preset, entry, data)."""
    preset = cfg.get("preset")
    if preset is None:
        raise ConfigError("${preset:...} needs a 'preset' block: use +experiment=private_rating or +experiment=private_user")
    spec = OmegaConf.to_container(preset, resolve=True)
    people = population(cfg)
    sources = list(spec["sources"])
    source = next((s for s in sources if shares_people(s, people) is False), sources[0])
    typed = float(cfg.epsilon)
    mine = [c for c in spec["choices"] if c["chosen_on"] == source]
    eps = pick_epsilon(sorted(float(c["epsilon"]) for c in mine), typed)
    choice = next(c for c in mine if float(c["epsilon"]) == eps)
    key = (spec["name"], source, eps, people)
    if key not in _LOGGED:
        _LOGGED.add(key)
        log.info("preset %s: epsilon=%g -> the configuration validated at epsilon=%g, chosen on %s (%s)", spec["name"], typed, eps,
                 source, spec["selection"])
    return {**choice, "typed_epsilon": typed, "shares_people": shares_people(source, people), "data_population": people}


def _preset_value(key: str, *, _root_: DictConfig) -> Any:
    """``${preset:KEY}``: KEY of the chosen configuration."""
    config = preset_choice(_root_)["config"]
    if key not in config:
        raise ConfigError(f"${{preset:{key}}}: the preset's chosen configuration has no '{key}' (regenerate the preset)")
    return config[key]


OmegaConf.register_new_resolver("preset", _preset_value, replace=True)


def _people_text(people: str | None, cfg: DictConfig) -> str:
    if people is None:
        files = [str(cfg.data.get(k)) for k in ("path", "train_path", "test_path") if cfg.data.get(k)]
        where = f" ({', '.join(files)})" if files else ""
        return f"data={cfg.data.get('name', '?')}{where}, whose people are unknown to the package"
    if people == "synthetic":
        return "synthetic data (generated, no people)"
    return _desc(people)


#: ``chosen_on`` values that name no people: the file's numbers read no ratings / nobody recorded which ones they read
DATA_INDEPENDENT, NOT_RECORDED = "data-independent", "not recorded"

#: keys of the model and mechanism nodes that are no hyperparameter chosen by results: what the run is (``name``, the
#: class), what it protects and how strongly (typed anyway: ``epsilon``, ``delta``, the neighbouring ``relation`` /
#: ``unit``), seeds, the accountant that proves the figure, compute-only settings (other kernels or chunk sizes)
NOT_TUNED = frozenset({"_target_", "_partial_", "_convert_", "_recursive_", "_args_", "name", "chosen_on", "epsilon",
                       "delta", "seed", "accountant", "relation", "unit", "formulation", "pair_budget", "pair_backend",
                       "dense_max_items", "block_budget"})

#: the key of a per-population ``chosen_on`` mapping that holds notes, not a population
CHOSEN_NOTE = "note"
_EVERY = object()


def _as_list(value: Any) -> list[Any]:
    return list(value) if OmegaConf.is_list(value) or isinstance(value, (list, tuple)) else [value]


def _is_dict(value: Any) -> bool:
    return OmegaConf.is_dict(value) or isinstance(value, dict)


def chosen_on(node: DictConfig | None, people: Any = _EVERY) -> list[str]:
    """The ``chosen_on`` value of a model or mechanism node as a list (module doc): population names (``ml-100k``,
    ``ml-1m``), :data:`DATA_INDEPENDENT`, or :data:`NOT_RECORDED` (also for a node without the key). A per-population
    mapping gives the entry for ``people`` (the population the run trains on); for people without an entry of their
    own, or when ``people`` is not given, every source the mapping names."""
    value = node.get("chosen_on") if isinstance(node, DictConfig) else None
    if value is None:
        return [NOT_RECORDED]
    values = _as_list(value)
    if _is_dict(value):
        spec = {k: v for k, v in value.items() if k != CHOSEN_NOTE}
        if people is not _EVERY and people in spec:
            values = _as_list(spec[people])
        else:
            values = list(dict.fromkeys(v for entry in spec.values() for v in _as_list(entry)))
    return [str(v) for v in values] or [NOT_RECORDED]


def chosen_note(node: DictConfig | None, people: str | None) -> str | None:
    """The note of a per-population ``chosen_on`` mapping for ``people`` (module doc), None without one."""
    value = node.get("chosen_on") if isinstance(node, DictConfig) else None
    notes = value.get(CHOSEN_NOTE) if _is_dict(value) else None
    return str(notes[people]) if _is_dict(notes) and people in notes else None


def _desc(source: str) -> str:
    return DESCRIPTIONS.get(source, source)


def _sources_text(sources: list[str]) -> str:
    return " and ".join(_desc(s) for s in sources)


# ------------------------------------------------------------------------------------ the user's own values
def _hydra_task() -> tuple[list[str], dict[str, Any]] | None:
    """The command line's overrides and group choices of the running Hydra job (None outside one)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized():
            return None
        hc = HydraConfig.get()
        return [str(o) for o in hc.overrides.task], dict(hc.runtime.choices)
    except Exception:  # noqa: BLE001 - no usable Hydra state: the composition fallback decides
        return None


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _tuned_key(key: str) -> str | None:
    """``mechanism.lr`` / ``model.rank`` for a hyperparameter key (a dotted config path), None for anything else."""
    node, _, rest = key.partition(".")
    return None if node not in ("mechanism", "model") or not rest or rest.split(".", 1)[0] in NOT_TUNED else key


def _compose(overrides: list[str]) -> DictConfig | None:
    """``conf/config.yaml`` composed with ``overrides`` (in a running Hydra app its own search path, else ``conf/``);
    None where it cannot be composed."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    hit = recall_composed("config", overrides)  # the command line's check composed exactly these (train.py)
    if hit is not None:
        return hit
    try:
        if GlobalHydra.instance().is_initialized():
            return compose(config_name="config", overrides=overrides)
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name="config", overrides=overrides)
    except Exception as err:  # noqa: BLE001 - provenance must not fail a finished run
        log.debug("provenance: cannot compose the package's values (%s)", err)
        return None


def _reference(cfg: DictConfig) -> DictConfig | None:
    """The config the package gives for this run's choices without any value of the user's: the running Hydra job's
    command line minus its ``mechanism.*`` / ``model.*`` values, or (``train(cfg)`` from Python) the same data,
    mechanism, model and preset composed afresh; with the dataset-dependent defaults filled in as the runner does."""
    from dprec_torch.data.defaults import fill_dataset_defaults

    task = _hydra_task()
    mech, model = cfg.mechanism.get("name"), cfg.model.get("name")
    if task is not None and task[1].get("mechanism") == mech and task[1].get("model") == model:
        # drop the user's VALUES (mechanism.lr=3), keep the CHOICES (mechanism=none): the package's values for them
        overrides = [o for o in task[0] if not _override_key(o).startswith(("mechanism.", "model."))]
    else:  # train(cfg) on a config composed by compose(overrides=...): the choices are readable from the config itself
        overrides = [f"mechanism={mech}", f"model={model}"]
        if cfg.get("preset") is not None:
            overrides.append(f"+experiment={cfg.preset.name}")
    ref = _compose(overrides)
    if ref is None:
        return None
    ref.data = cfg.data  # model.k: null of PCC/COS -> the dataset's k, as validate() did to cfg
    fill_dataset_defaults(ref)
    return ref


def _leaves(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_leaves(v, f"{prefix}.{k}"))
        return out or {prefix: {}}
    return {prefix: value}


def user_values(cfg: DictConfig) -> dict[str, Any]:
    """The model and mechanism hyperparameters the user set (``mechanism.lr`` -> its value), not the package: every
    ``mechanism.*`` / ``model.*`` value that differs from the package's for the same choices (:func:`_reference`), and,
    in a Hydra run, every one the command line names (even at the package's value). Keys in :data:`NOT_TUNED` are not
    hyperparameters and never count."""
    keys: set[str] = set()
    task = _hydra_task()
    if task is not None and task[1].get("mechanism") == cfg.mechanism.get("name") \
            and task[1].get("model") == cfg.model.get("name"):
        keys |= {k for k in (_tuned_key(_override_key(o)) for o in task[0]) if k}
    ref = _reference(cfg)
    if ref is not None:
        from dprec_torch.data.defaults import fill_dataset_defaults

        cfg = cfg.copy()
        fill_dataset_defaults(cfg)  # as validate() does: a PCC/COS model.k of null is the dataset's k
        for node in ("mechanism", "model"):
            mine = _leaves(OmegaConf.to_container(cfg[node], resolve=False), node)
            base = _leaves(OmegaConf.to_container(ref[node], resolve=False), node)
            keys |= {k for k in set(mine) | set(base) if _tuned_key(k) and mine.get(k, "<absent>") != base.get(k, "<absent>")}
    out = {}
    for key in sorted(keys):
        try:
            out[key] = OmegaConf.select(cfg, key, default=_ABSENT)
        except Exception:  # noqa: BLE001 - an unresolvable value is still the user's
            out[key] = "?"
    return out


_ABSENT = "(removed)"


def _shown(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={'null' if v is None else v}" for k, v in values.items())


USER_CHOICE = ("chosen by the user: not counted in epsilon (the package cannot tell whether that choice looked at "
               "results on these people's ratings; if it did, it is not post-processing)")


def defaults_provenance(cfg: DictConfig, people: str | None) -> dict[str, Any]:
    """Provenance of a run without a preset (module doc): the ``chosen_on`` values of its model and mechanism nodes, and
    the values the user set (:func:`user_values`), which the package cannot vouch for."""
    model, mech = cfg.model.get("name", "?"), cfg.mechanism.get("name", "?")
    tuned = (CONF_DIR / "tuned" / f"{mech}_{model}.yaml").exists()
    files = ", ".join([f"conf/model/{model}.yaml", f"conf/mechanism/{mech}.yaml"]
                      + ([f"conf/tuned/{mech}_{model}.yaml"] if tuned else []))
    listed = chosen_on(cfg.model, people) + chosen_on(cfg.mechanism, people)
    notes = list(dict.fromkeys(n for n in (chosen_note(cfg.model, people), chosen_note(cfg.mechanism, people)) if n))
    populations = list(dict.fromkeys(s for s in listed if s not in (DATA_INDEPENDENT, NOT_RECORDED)))
    unrecorded = NOT_RECORDED in listed
    sources = populations + ([NOT_RECORDED] if unrecorded else [])
    source = sources[0] if len(sources) == 1 else sources or [DATA_INDEPENDENT]
    verdicts = [shares_people(p, people) for p in populations]
    shared: bool | str = (True if True in verdicts else
                          "unknown" if people is None or (unrecorded and people != "synthetic") else False)
    mine = user_values(cfg)
    data_text = _people_text(people, cfg)
    if not populations and unrecorded:
        text = (f"package defaults (chosen on not recorded; {files}): the training data is {data_text}"
                + "; if any of them was chosen by looking at results on these people's ratings, that choice is not "
                "counted in epsilon")
    elif not populations:
        text = f"package defaults ({files}), set without reading any ratings: a fixed input (end to end)"
    else:
        text = (f"package defaults ({files}), chosen on {_sources_text(populations)}"
                + (" (and some with no record of the data they were chosen on)" if unrecorded else "")
                + f"; the training data is {data_text}: ")
        if shared is True:
            text += "the same people: that choice read their ratings and is NOT counted in epsilon"
        elif people is None:
            text += (f"it cannot tell whose people a custom file holds, so it cannot claim the choice was made on "
                     f"other people: if the file holds any of {_sources_text(populations)}, as a file cut from MovieLens "
                     "may, the choice read their ratings and is NOT counted in epsilon for them")
        elif shared == "unknown":
            text += ("no user in common with those, but the values with no record may have been chosen on these "
                     "people's ratings: if so, that choice is not counted in epsilon")
        else:
            text += "no user in common, so the choice is a fixed input for them (end to end)"
        if notes:
            text += "; " + "; ".join(notes)
    if mine:
        if shared is False and people != "synthetic":
            shared = "unknown"
        text = f"{_shown(mine)} {USER_CHOICE}; the other values: {text.replace('(end to end)', '(end to end for those values only)')}"
    return {"source": f"package defaults ({files})" + (" and the user's values" if mine else ""), "chosen_on": source,
            "shares_people": shared, "user_values": sorted(mine), "statement": text}


def hyperparameter_provenance(cfg: DictConfig) -> dict[str, Any]:
    """Where ``cfg.model``'s hyperparameters came from, for the ``hyperparameters`` entry of the privacy report."""
    people = population(cfg)
    if cfg.get("preset") is None:
        return defaults_provenance(cfg, people)
    choice = preset_choice(cfg)
    source, shared = choice["chosen_on"], choice["shares_people"]
    model = OmegaConf.to_container(cfg.model, resolve=True)
    # the preset's item_features: auto stands for the validated true (on wherever a catalogue is attached)
    own = {k for k, v in choice["config"].items()
           if k in model and model[k] != v and not (k == "item_features" and v is True and model[k] == "auto")}
    # and any other model or mechanism value the user set (a fixed key of the preset, a mechanism number); a value equal
    # to the validated choice's stays the preset's
    mine = user_values(cfg)
    own |= {k.partition(".")[2] if k.startswith("model.") else k for k, v in mine.items()
            if not (k.startswith("model.") and k.partition(".")[2] in choice["config"]
                    and choice["config"][k.partition(".")[2]] == model.get(k.partition(".")[2]))}
    own_keys = sorted(own)
    shown = {k: OmegaConf.select(cfg, k, default=_ABSENT) for k in (k if k.startswith("mechanism.") else f"model.{k}" for k in own_keys)}
    name = cfg.preset.name
    typed, eps = choice["typed_epsilon"], float(choice["epsilon"])
    rule = ("" if typed == eps else f" (the nearest validated epsilon at or below the typed {typed:g})" if eps <= typed
            else f" (the typed {typed:g} is below every validated epsilon: the smallest)")
    text = (f"preset {name}: the configuration validated at epsilon = {eps:g}{rule}, chosen on {_desc(source)} "
            f"by the lowest mean validation RMSE over their {choice['folds']} validation folds ({cfg.preset.selection}, "
            f"grid sha256 {str(cfg.preset.grid_sha256)[:12]}); the training data is {_people_text(people, cfg)}: ")
    if shared is True:
        text += ("the same people: the selection read their validation ratings and is NOT counted in epsilon "
                 "(not post-processing)")
    elif shared is False:
        text += "no user in common, so the choice is a fixed input for them and the epsilon includes it (end to end)"
    elif people is None:
        text += (f"it cannot tell whose people a custom file holds, so it cannot claim the selection was made on "
                 f"other people: if the file holds any of {_desc(source)}, as a file cut from MovieLens "
                 "may, the selection read their validation ratings and is NOT counted in epsilon for them")
    else:
        text += (f"whether they include any of {_desc(source)} is unknown; if they do, the selection is not counted in "
                 "epsilon for those people")
    if own_keys:
        if shared is False and people != "synthetic":
            shared = "unknown"
        text = text.replace("(end to end)", "(end to end for the preset's values only)")
        text += f"; {_shown(shown)} replace the preset's values (not validated here): {USER_CHOICE}"
    return {"source": f"preset {name} (conf/experiment/{name}.yaml)", "chosen_on": source, "validated_epsilon": eps,
            "typed_epsilon": typed, "selection": str(cfg.preset.selection), "grid_sha256": str(cfg.preset.grid_sha256),
            "shares_people": shared, "user_values": own_keys, "statement": text}
