"""One validator for every key and number of the composed config (dprec_torch/config.py).

The cases are derived from the yaml files themselves: every numeric key of every conf/data, conf/model,
conf/mechanism and conf/tuned file must have a declared domain, and an out-of-domain value of it must give
a ConfigError naming the key, the value and the range. A new yaml key is covered without editing this file.
"""

from __future__ import annotations

import functools
import math
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from dprec_torch.cli import check_command_line
from dprec_torch.config import check_config
from dprec_torch.config_domains import Domain, domain_of, number
from dprec_torch.errors import ConfigError
from dprec_torch.privacy.relations import form_target
from dprec_torch.training.run import validate
from tests.helpers import CONF_DIR, tiny_cfg

ROOT = Path(__file__).resolve().parents[2]
CONF = Path(CONF_DIR)
INTERPOLATED_NUMBERS = ("${epsilon}", "${delta}", "${seed}")


def _names(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def _node(group: str, name: str) -> dict:
    """The raw (unresolved) yaml node of conf/<group>/<name>.yaml: ``model:`` of a global-package file."""
    raw = OmegaConf.to_container(OmegaConf.load(CONF / group / f"{name}.yaml"), resolve=False)
    raw.pop("defaults", None)
    if group == "model" and isinstance(raw.get("model"), dict):
        return raw["model"]
    return raw


def _tuned_pair(name: str) -> tuple[str, str] | None:
    """conf/tuned/<mechanism>_<model>.yaml -> (mechanism, model)."""
    for mech in sorted(_names("mechanism"), key=len, reverse=True):
        if name.startswith(mech + "_") and name[len(mech) + 1:] in _names("model"):
            return mech, name[len(mech) + 1:]
    return None


def _sources() -> list[tuple[str, str, list[str], dict]]:
    """(file label, config node, overrides that load the file, raw node) for every file of the groups."""
    out = []
    for group in ("data", "model", "mechanism"):
        for name in _names(group):
            # a mechanism file on its own: model=pnbm_topk has no conf/tuned file
            extra = ["model=pnbm_topk"] if group == "mechanism" else []
            out.append((f"{group}/{name}", group, [f"{group}={name}", *extra], _node(group, name)))
    for name in _names("tuned"):
        pair = _tuned_pair(name)
        if pair is not None:
            out.append((f"tuned/{name}", "mechanism", [f"mechanism={pair[0]}", f"model={pair[1]}"], _node("tuned", name)))
    return out


def _is_numeric(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) or value in INTERPOLATED_NUMBERS


def _numeric_keys() -> list[tuple[str, str, tuple[str, ...], str]]:
    """(file, node, overrides, dotted key) for every numeric (or nullable-numeric) leaf of every file."""
    cases = []
    for label, node, overrides, raw in _sources():
        def walk(d: dict, prefix: str = "") -> None:
            for key, value in d.items():
                if key.startswith("_"):
                    continue
                if isinstance(value, dict):
                    walk(value, f"{prefix}{key}.")
                elif _is_numeric(value) or value is None:
                    cases.append((label, node, tuple(overrides), f"{prefix}{key}"))
        walk(raw)
    return cases


@functools.lru_cache(maxsize=None)
def _composed(overrides: tuple[str, ...]) -> DictConfig:
    return tiny_cfg(*overrides)


def _target_of(cfg: DictConfig, node: str, key: str) -> tuple[str | None, str]:
    """The _target_ owning ``node.key`` (a nested data.dataset node has its own) and the key inside it."""
    parts = key.split(".")
    sub = cfg[node]
    for i, part in enumerate(parts[:-1]):
        child = sub.get(part)
        if isinstance(child, DictConfig) and "_target_" in child:
            sub, parts = child, parts[i + 1:]
            return sub.get("_target_"), ".".join(parts)
    if node == "mechanism":  # the class that trains the model reads the node (dprec_torch/forms.py)
        return form_target(sub, cfg.model), key
    return sub.get("_target_"), key


NUMERIC = _numeric_keys()
IDS = [f"{label}:{key}" for label, _, _, key in NUMERIC]


def test_the_yaml_files_have_numeric_keys() -> None:
    assert len(NUMERIC) > 100  # the walk found the files


@pytest.mark.parametrize("label, node, overrides, key", NUMERIC, ids=IDS)
def test_every_numeric_key_is_validated(label: str, node: str, overrides: tuple[str, ...], key: str) -> None:
    cfg = _composed(overrides)
    target, inner = _target_of(cfg, node, key)
    dom = domain_of(target, inner)
    value = OmegaConf.select(cfg, f"{node}.{key}")
    if dom is None:
        assert value is None or not _is_numeric(value), f"{label}: {node}.{key} has no domain in dprec_torch/config_domains.py"
        pytest.skip(f"{node}.{key} is a non-numeric null")  # e.g. data.path: null
    assert dom.accepts(value), f"{label}: the shipped {node}.{key}={value} is outside its own domain {dom}"
    check_config(cfg)  # the shipped file is valid as a whole
    for bad in {dom.invalid_example(), "abc"}:
        broken = cfg.copy()
        OmegaConf.update(broken, f"{node}.{key}", bad, merge=False)
        with pytest.raises(ConfigError) as err:
            check_config(broken)
        msg = str(err.value)
        assert f"{node}.{key}={bad}" in msg and str(dom) in msg and "\n" not in msg


@pytest.mark.parametrize("label, node, overrides", [(s[0], s[1], tuple(s[2])) for s in _sources()], ids=[s[0] for s in _sources()])
def test_a_misspelt_key_is_an_error_in_every_node(label: str, node: str, overrides: tuple[str, ...]) -> None:
    cfg = _composed(overrides).copy()
    OmegaConf.set_struct(cfg, False)
    cfg[node]["lerning_rate"] = 0.1
    with pytest.raises(ConfigError, match=rf"{node}\.lerning_rate is not a"):
        check_config(cfg)


@pytest.mark.parametrize("key, bad, expect", [
    ("epsilon", "abc", "epsilon=abc is invalid: it must be a number in (0, inf]"),
    ("epsilon", 0, "epsilon=0 is invalid"),
    ("delta", 1.0, "delta=1.0 is invalid: it must be a number in [0, 1)"),
    ("mechanism.sampling_ratio", 1.5, "mechanism.sampling_ratio=1.5 is invalid: it must be a number in (0, 1]"),
    ("mechanism.epochs", 0, "mechanism.epochs=0 is invalid: it must be an integer >= 1"),
    ("mechanism.epochs", 2.5, "mechanism.epochs=2.5 is invalid: it must be an integer >= 1"),
    ("mechanism.epochs", True, "mechanism.epochs=True is invalid"),
    ("mechanism.lr", -0.1, "mechanism.lr=-0.1 is invalid: it must be a number in (0, inf)"),
    ("eval.topn", 0, "eval.topn=0 is invalid"),
])
def test_the_issue_examples(key: str, bad: object, expect: str) -> None:
    cfg = _composed(()).copy()
    OmegaConf.update(cfg, key, bad, merge=False)
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert expect in str(err.value)


def test_missing_required_key_and_runner_keys() -> None:
    cfg = _composed(()).copy()
    OmegaConf.set_struct(cfg, False)
    del cfg.mechanism["epsilon"]
    with pytest.raises(ConfigError, match=r"mechanism\.epsilon is required by .* but missing"):
        check_config(cfg)
    cfg = _composed(()).copy()
    OmegaConf.set_struct(cfg, False)
    del cfg.mechanism["epochs"]
    with pytest.raises(ConfigError, match=r"mechanism\.epochs is required by the training loop"):
        check_config(cfg)
    cfg = _composed(()).copy()
    cfg.mechanism.epochs = "???"
    with pytest.raises(ConfigError, match=r"mechanism\.epochs is required but missing"):
        check_config(cfg)


def test_model_k_and_baseline_k_follow_the_dataset() -> None:
    """Wang & Tang Sec. 5.1: PCC/COS with k = 900 on ML-100K and k = 1300 on ML-1M, unless set."""
    for data, k in [("ml-100k", 900), ("ml-1m", 1300), ("ml-1m-val", 1300), ("ml-100k-val", 900), ("synthetic", 900)]:
        cfg = _composed((f"data={data}", "model=pcc")).copy()
        validate(cfg)
        assert (cfg.baseline_k, cfg.model.k) == (k, k), data
    cfg = _composed(("data=ml-1m", "model=cos", "model.k=50", "baseline_k=20")).copy()
    validate(cfg)
    assert (cfg.baseline_k, cfg.model.k) == (20, 50)


def test_domain_text_and_membership() -> None:
    dom = number("(0, 1]")
    assert str(dom) == "a number in (0, 1]"
    assert dom.accepts(1) and dom.accepts(0.5) and dom.accepts("1e-3")
    assert not dom.accepts(0) and not dom.accepts(math.nan) and not dom.accepts(None) and not dom.accepts(True)
    assert Domain(int, 1, also=("all",)).accepts("all") and not Domain(int, 1).accepts(1.0)


def test_command_line_errors_are_one_line() -> None:
    """Errors Hydra itself raises while composing (an unknown option, a key not in the yaml) become one line."""
    with pytest.raises(ConfigError, match=r"mechanism=foo is unknown: there is no conf/mechanism/foo.yaml; choose one of .*dpsgd"):
        check_command_line("config", ["mechanism=foo"])
    with pytest.raises(ConfigError, match=r"mechanism\.lerning_rate is not a parameter of .*did you mean"):
        check_command_line("config", ["mechanism.lerning_rate=0.1"])
    with pytest.raises(ConfigError, match=r"mechanism\.epochs=0 is invalid"):
        check_command_line("config", ["-m", "epsilon=1,2", "mechanism.epochs=0"])
    assert check_command_line("config", ["-m", "epsilon=1,2", "model=pcc"]).epsilon == 1  # a valid sweep: its first job
    assert check_command_line("config", ["device=cpu", "epsilon=20"]).device == "cpu"  # train.py warms this device up early
    assert check_command_line("config", ["--cfg", "job"]) is None  # Hydra's own flags are left to Hydra


@pytest.mark.parametrize("args, key", [
    (["epsilon=abc"], "epsilon=abc"),
    (["mechanism.lerning_rate=0.1"], "mechanism.lerning_rate"),
    (["mechanism=foo"], "mechanism=foo"),
    (["matmul_precision=tf32"], "matmul_precision"),  # reduced precision only by its documented name
])
def test_train_py_exits_2_with_one_line(args: list[str], key: str, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "train.py", *args, f"output_dir={tmp_path}"], cwd=ROOT,
                          capture_output=True, text=True)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and key in lines[0], proc.stderr[-2000:]


@pytest.mark.parametrize("pair", [["mechanism=sgld", "model=pcc"], ["mechanism=laplace_output", "model=pnbm_lowrank"],
                                  ["mechanism=gaussian", "model=pnbm_topk"]])
def test_a_bad_mechanism_model_pair_is_one_line_before_any_data_is_read(tmp_path, monkeypatch, pair):
    """No data exists where the run would look: the refusal is the pair's, so it came before any read."""
    import dprec_torch

    monkeypatch.setenv("DPREC_DATA", str(tmp_path / "no-data"))
    monkeypatch.setenv("DPREC_CACHE", str(tmp_path / "no-cache"))
    with pytest.raises(ConfigError, match="mechanism=") as err:
        dprec_torch.train([*pair, "device=cpu", f"output_dir={tmp_path / 'run'}"])
    assert "\n" not in str(err.value)
