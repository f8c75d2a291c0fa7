"""Where a run's hyperparameters came from, and whether that source shares people with the training data (issue 24, 2).

A choice of hyperparameters by validation RMSE reads the validation ratings: on the people a model is trained on it
is not post-processing, and the printed epsilon does not count it. On other people's data it costs those people
nothing: the choice is a fixed input for the trained people, and the epsilon is end to end.

Presets (``conf/experiment/private_{rating,user}.yaml``, written by ``experiments/studies/private_frontier.py``)
carry a ``preset`` block: one configuration per (dataset it was chosen on, validated epsilon), from
``docs/results/private_frontier/selection.json``. Each tuned ``model.KEY`` of the preset reads ``${preset:KEY}``,
which :func:`preset_choice` resolves (issue 25, 3):

* the source: the first of ``preset.sources`` that shares no people with ``cfg.data`` (ML-100K, 1997-98, and ML-1M,
  users who joined in 2000, are different users; synthetic data has no people); for data whose people are unknown
  (``data=custom``) the first source, and the report says it is unknown;
* the epsilon: the largest validated epsilon at or below the typed one; below the smallest, the smallest.

A ``model.KEY=...`` on the command line replaces the interpolation, so the user's own value wins and the report
names it. :func:`hyperparameter_provenance` is the ``hyperparameters`` entry of a run's privacy report.
"""

from __future__ import annotations

import logging
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dprec_torch.errors import ConfigError

log = logging.getLogger(__name__)

#: the people behind each data config: its validation split holds the same people
POPULATIONS = {"ml-100k": "ml-100k", "ml-100k-val": "ml-100k", "ml-1m": "ml-1m", "ml-1m-val": "ml-1m",
               "synthetic": "synthetic", "synthetic-val": "synthetic"}
#: how a population is named in a statement
DESCRIPTIONS = {"ml-100k": "ML-100K's users (rated 1997-98)", "ml-1m": "ML-1M's users (joined MovieLens in 2000)"}

_LOGGED: set[tuple[Any, ...]] = set()


def population(cfg: DictConfig) -> str | None:
    """The people ``cfg.data`` holds: ``ml-100k``, ``ml-1m``, ``synthetic``, or None (custom data: not known)."""
    data = cfg.data
    inner = data.get("dataset")
    name = str((inner if isinstance(inner, DictConfig) else data).get("name", ""))
    return POPULATIONS.get(name)


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
        return f"data={cfg.data.get('name', '?')}, whose people are not known to the package"
    if people == "synthetic":
        return "synthetic data (generated, no people)"
    return DESCRIPTIONS.get(people, people)


def tuned_source(mechanism: str, model: str) -> str | None:
    """The dataset named by a ``# chosen_on: <dataset>`` line of ``conf/tuned/<mechanism>_<model>.yaml`` (None: none)."""
    from dprec_torch.config import CONF_DIR

    path = CONF_DIR / "tuned" / f"{mechanism}_{model}.yaml"
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        if line.startswith("# chosen_on:"):
            return line.split(":", 1)[1].split()[0]
    return None


def defaults_provenance(cfg: DictConfig, people: str | None) -> dict[str, Any]:
    """Provenance of a run without a preset: the model's defaults and the tuned mechanism file, whose ``chosen_on``
    line (where there is one) says on whose ratings its numbers were chosen."""
    model, mech = cfg.model.get("name", "?"), cfg.mechanism.get("name", "?")
    source = tuned_source(mech, model)
    files = f"conf/model/{model}.yaml, conf/tuned/{mech}_{model}.yaml"
    if source is None:
        return {"source": f"package defaults ({files}) and any command-line values", "chosen_on": "not recorded",
                "shares_people": "unknown",
                "statement": f"package defaults (chosen on not recorded; {files}) and any command-line values: "
                             "if any of them was chosen by looking at results on these people's ratings, that choice is not "
                             "counted in epsilon"}
    shared = shares_people(source, people)
    text = (f"package defaults ({files}), the tuned numbers chosen on {DESCRIPTIONS.get(source, source)}; the training "
            f"data is {_people_text(people, cfg)}: ")
    text += ("the same people: that choice read their ratings and is NOT counted in epsilon" if shared is True else
             "no user in common, so the choice is a fixed input for them (end to end)" if shared is False else
             f"whether they include any of {DESCRIPTIONS.get(source, source)} is unknown")
    return {"source": f"package defaults ({files})", "chosen_on": source, "shares_people": shared, "statement": text}


def hyperparameter_provenance(cfg: DictConfig) -> dict[str, Any]:
    """Where ``cfg.model``'s hyperparameters came from, for the ``hyperparameters`` entry of the privacy report."""
    people = population(cfg)
    if cfg.get("preset") is None:
        return defaults_provenance(cfg, people)
    choice = preset_choice(cfg)
    source, shared = choice["chosen_on"], choice["shares_people"]
    model = OmegaConf.to_container(cfg.model, resolve=True)
    # the preset's item_features: auto stands for the validated true (on wherever a catalogue is attached)
    own = sorted(k for k, v in choice["config"].items()
                 if k in model and model[k] != v and not (k == "item_features" and v is True and model[k] == "auto"))
    name = cfg.preset.name
    typed, eps = choice["typed_epsilon"], float(choice["epsilon"])
    rule = ("" if typed == eps else f" (the nearest validated epsilon at or below the typed {typed:g})" if eps <= typed
            else f" (the typed {typed:g} is below every validated epsilon: the smallest)")
    text = (f"preset {name}: the configuration validated at epsilon = {eps:g}{rule}, chosen on {DESCRIPTIONS.get(source, source)} "
            f"by the lowest mean validation RMSE over their {choice['folds']} validation folds ({cfg.preset.selection}, "
            f"grid sha256 {str(cfg.preset.grid_sha256)[:12]}); the training data is {_people_text(people, cfg)}: ")
    if shared is True:
        text += ("the same people: the selection read their validation ratings and is NOT counted in epsilon "
                 "(not post-processing)")
    elif shared is False:
        text += "no user in common, so the choice is a fixed input for them and the epsilon includes it (end to end)"
    else:
        text += (f"whether they include any of {DESCRIPTIONS.get(source, source)} is unknown; if they do, the selection is "
                 "not counted in epsilon for those people")
    if own:
        text += f"; the user's own values replace the preset's for model.{', model.'.join(own)} (not validated here)"
    return {"source": f"preset {name} (conf/experiment/{name}.yaml)", "chosen_on": source, "validated_epsilon": eps,
            "typed_epsilon": typed, "selection": str(cfg.preset.selection), "grid_sha256": str(cfg.preset.grid_sha256),
            "shares_people": shared, "user_values": own, "statement": text}
