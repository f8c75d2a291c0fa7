"""The README's front door works: every command line of its first code block runs as written.

The install line is run with ``--dry-run`` inserted after each ``pip install`` (it resolves the same
requirements without touching the environment the suite runs in); the training line is run as
written, with only its output redirected to a temporary Hydra run dir, and must report the ε its
comment promises.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # whole runs: -m e2e selects them, -m 'not e2e' leaves them out

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def first_code_block() -> list[str]:
    """The command lines of README's first fenced code block (comments stripped)."""
    match = re.search(r"```(?:bash|sh)?\n(.*?)```", README.read_text(), flags=re.S)
    assert match, "README.md has no code block"
    lines = [line.split("  #")[0].strip() for line in match.group(1).splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def test_readme_stays_a_front_door():
    assert README.stat().st_size <= 12 * 1024, "README.md is over 12 KB: move detail to docs/ and link it"
    lines = first_code_block()
    assert any(line.startswith("pip install") for line in lines), "the first block must install"
    assert any(line.startswith("python train.py") for line in lines), "the first block must train"
    for target in re.findall(r"\]\(((?:docs|results)/[^)#]+)", README.read_text()):
        assert (ROOT / target).exists(), f"README links to a missing file: {target}"


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    env.setdefault("DPREC_DATA", str(ROOT.parent / "shared" / "data"))
    return env


@pytest.mark.parametrize("line", [line for line in first_code_block() if line.startswith("pip install")])
def test_readme_install_line_resolves(line):
    for part in line.split("&&"):
        args = shlex.split(part)
        assert args[:2] == ["pip", "install"], part
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", *args[2:]]
        done = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{part!r} failed:\n{done.stderr[-2000:]}"


@pytest.mark.parametrize("line", [line for line in first_code_block() if line.startswith("python train.py")])
def test_readme_train_line_runs_and_reports_the_typed_epsilon(line, tmp_path):
    args = shlex.split(line)[2:]
    cmd = [sys.executable, "train.py", *args, f"hydra.run.dir={tmp_path}"]
    done = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    typed = [a.split("=", 1)[1] for a in args if a.startswith("epsilon=")]
    priv = metrics["privacy"]
    if typed and priv["epsilon"] is None:  # nothing defended (SGLD's chain): it must say so, never print one
        assert priv.get("epsilon_if_exact_sample") == pytest.approx(float(typed[0])) and "not established" in priv["delta_note"]
    elif typed:  # pure mechanisms report the typed ε; Gaussian ones their accountant's figure, at most it (calibration 0.5 %)
        assert priv.get("epsilon_nominal", priv["epsilon"]) == pytest.approx(float(typed[0]))
        assert float(typed[0]) * 0.99 <= priv["epsilon"] <= float(typed[0]) * (1 + 1e-9), "the reported ε is the typed ε"
    assert metrics["test_rmse"] < 1.15, "worse than the global mean (1.15 on u1)"


def test_the_class_table_is_what_the_runner_builds():
    """Each cell of the mechanism x model class table (docs/extending.md, linked from the README) is regenerated:
    compose, check, set up, one step."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mechanism_table", ROOT / "scripts" / "mechanism_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    body = mod.table()
    page = (ROOT / "docs" / "extending.md").read_text()
    assert f"<!-- mechanism-classes:start -->\n{body}\n<!-- mechanism-classes:end -->" in page
    assert "`ClippedSGLD`" in body.splitlines()[5]  # the design card: sgld on the default model, one class
