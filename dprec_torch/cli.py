"""The command line of ``train.py``, ``evaluate.py`` and ``scripts/``, checked before ``@hydra.main`` runs (an unknown
``mechanism=foo``, a misspelt ``mechanism.lerning_rate=0.1``): one error line and exit 2, not Hydra's multi-line report."""

from __future__ import annotations

import contextlib
import logging
import sys

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig

from dprec_torch.config import CONF_DIR, check_config, remember_composed
from dprec_torch.errors import ConfigError
from dprec_torch.privacy.relations import check_relation_preprocessing


def check_study(cfg: DictConfig) -> None:
    """Every (method, epsilon) of a ``scripts/study.py`` config, composed as its stage-2 ``train.py`` run and checked
    with :func:`check_config` and the relation rule, so a bad study fails in one line before any multirun is launched."""
    inside = GlobalHydra.instance().is_initialized()  # inside @hydra.main: compose from its search path
    with contextlib.nullcontext() if inside else initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
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
                check_relation_preprocessing(run_cfg)


def _one_line(err: Exception) -> str:
    """Hydra's multi-line composition errors, condensed."""
    if isinstance(err, MissingConfigException) and err.missing_cfg_file and "/" in err.missing_cfg_file:
        group, option = err.missing_cfg_file.rsplit("/", 1)
        options = ", ".join(err.options or sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")))
        return f"{group}={option} is unknown: there is no conf/{group}/{option}.yaml; choose one of {options}"
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return "; ".join(ln for ln in lines if not ln.startswith(("full_key", "object_type")))


def check_command_line(config_name: str, argv: list[str]) -> DictConfig | None:
    """Compose ``conf/<config_name>.yaml`` with the command-line overrides (the first value of each sweep)
    and check it (:func:`check_config`, then :func:`check_relation_preprocessing`); raises :class:`ConfigError` with
    one line, else returns the composed config. Command lines with Hydra flags other than ``-m`` (``--cfg``,
    ``--help``, ...) are left to Hydra (None)."""
    if any(a.startswith("-") and a not in ("-m", "--multirun") for a in argv):
        return None
    args = [a for a in argv if not a.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(args)
    except HydraException as err:
        raise ConfigError(_one_line(err)) from None
    overrides = []
    for o in parsed:
        key = o.get_key_element().lstrip("+~")
        if not key.startswith("hydra") or key == "hydra.searchpath":  # searchpath: where +grid=/+selected= files live
            sweep = o.is_sweep_override()  # a sweep: its first value
            overrides.append(f"{o.get_key_element()}={next(iter(o.sweep_string_iterator()), None)}" if sweep else o.input_line)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        try:
            cfg = compose(config_name=config_name, overrides=overrides)
        except HydraException as err:
            retry = _misspelt_key_retry(config_name, overrides, err)
            raise (retry or ConfigError(_one_line(err))) from None
    remember_composed(config_name, overrides, cfg)  # the run's provenance may compose the same again
    if "data" in cfg:
        check_config(cfg)
        check_relation_preprocessing(cfg)
    return cfg


def _misspelt_key_retry(config_name: str, overrides: list[str], err: Exception) -> ConfigError | None:
    """``mechanism.lerning_rate=0.1`` (a key not in the yaml): compose it with ``+`` and let the schema name it."""
    text = str(err)
    if "Could not override" not in text:
        return None
    key = text.split("'")[1]
    plussed = [f"+{o}" if o.split("=", 1)[0] == key else o for o in overrides]
    try:
        cfg = compose(config_name=config_name, overrides=plussed)
        check_config(cfg)
        check_relation_preprocessing(cfg)
    except ConfigError as named:
        return named
    except HydraException:
        return None
    return ConfigError(f"{key} is not in the composed config: add it with +{key}=<value>")


def exit_on_bad_command_line(config_name: str) -> DictConfig | None:
    """For ``if __name__ == "__main__"`` of the CLI scripts: one line on stderr and exit 2 on a bad command line;
    else the composed config (:func:`check_command_line`)."""
    try:
        return check_command_line(config_name, sys.argv[1:])
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
