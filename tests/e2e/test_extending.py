"""docs/extending.md's walkthrough runs as written: its toy mechanism trains, reports and passes the harness.

The fenced blocks introduced by ``File `<path>```` are written to a temporary directory (the module on ``sys.path``,
the yaml under a Hydra search path), the guide's own ``python train.py ...`` overrides are composed with that search
path, and the real runner (``dprec_torch.training.run.train``) trains one epoch on ``data=synthetic``. So a guide
that drifts from the code (a renamed import, a changed template, a new required key) fails here.
"""

from __future__ import annotations

import importlib
import math
import re
import shlex
import sys
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from dprec_torch.privacy_harness import registry
from tests.helpers import tiny_cfg
from tests.privacy.test_sensitivity_harness import HARNESS, check_case, edge_datasets

pytestmark = pytest.mark.e2e  # whole runs: -m e2e selects them, -m 'not e2e' leaves them out

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
FILE_BLOCK = re.compile(r"^File `(?P<path>[^`]+)`[^\n]*\n+```[a-z]*\n(?P<body>.*?)^```", re.M | re.S)
COMMAND = re.compile(r"^```bash\n(?P<line>[^\n]*python train\.py [^\n]*)\n```", re.M)


def guide_files() -> dict[str, str]:
    """path -> text of the walkthrough's files (blocks naming the same file are appended in order)."""
    files: dict[str, str] = {}
    for m in FILE_BLOCK.finditer(GUIDE.read_text()):
        files[m["path"]] = files.get(m["path"], "") + ("\n\n" if m["path"] in files else "") + m["body"]
    return files


def guide_overrides(root: Path) -> list[str]:
    """The overrides of the guide's ``python train.py`` command, its ``$PWD`` being ``root``."""
    found = COMMAND.findall(GUIDE.read_text())
    assert len(found) == 1, "docs/extending.md: expected one ```bash block with the walkthrough's train.py command"
    args = shlex.split(found[0])
    return [a.replace("$PWD", str(root)) for a in args[args.index("train.py") + 1:]]


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The walkthrough's files under ``tmp_path``, its module imported (which registers its harness case); the
    registry and ``sys.modules`` are restored afterwards."""
    files = guide_files()
    assert set(files) == {"toy_gaussian.py", "my_conf/mechanism/toy_gaussian.yaml"}, sorted(files)
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    registry.registered_classes()  # the built-in registrations first, so restoring the copy below keeps them
    monkeypatch.setattr(registry, "_BUILDERS", dict(registry._BUILDERS))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "toy_gaussian", raising=False)
    module = importlib.import_module("toy_gaussian")
    yield tmp_path, module
    sys.modules.pop("toy_gaussian", None)


def test_the_guides_toy_mechanism_trains_through_the_runner_and_reports_its_epsilon(toy):
    from opacus.accountants import RDPAccountant

    from dprec_torch.training.run import train

    root, module = toy
    cls = module.ToyGaussianSGD
    assert registry.registered(cls)  # importing the class registered its harness case
    overrides = guide_overrides(root)
    assert "mechanism=toy_gaussian" in overrides and "data=synthetic" in overrides
    cfg = tiny_cfg(*overrides, f"output_dir={root / 'run'}", "device=cpu", "tensorboard=false",
                   "compare_baselines=false", "noise_seed=0")
    assert cfg.mechanism._target_ == "toy_gaussian.ToyGaussianSGD" and int(cfg.mechanism.epochs) == 1
    metrics = train(cfg)  # validates, trains one epoch, refuses an unregistered finite epsilon (check_claim)
    report = metrics["privacy"]
    assert report["mechanism"].startswith("toy_gaussian") and report["relation"] == "rating"
    assert metrics["epochs"] == 1 and math.isfinite(metrics["test_rmse"])
    eps, delta, steps = float(cfg.epsilon), float(report["delta"]), int(report["steps"])
    assert steps == round(1 / float(cfg.mechanism.sampling_ratio)) * int(cfg.mechanism.epochs)
    assert 0.9 * eps <= report["epsilon"] <= eps  # sigma calibrated to the typed epsilon
    # the same history, accounted independently by Opacus
    accountant = RDPAccountant()
    accountant.history = [(report["noise"]["noise_multiplier"], float(cfg.mechanism.sampling_ratio), steps)]
    assert report["epsilon"] == pytest.approx(accountant.get_epsilon(delta), rel=2e-2)


def test_the_guides_toy_mechanism_passes_the_sensitivity_harness(toy):
    _, module = toy
    cases = registry.builder_for(module.ToyGaussianSGD)()
    assert cases
    for case in cases:
        @HARNESS
        @given(data=st.data(), seed=st.integers(0, 5))
        def run(data, seed):
            assume(check_case(case, data.draw(edge_datasets(case.max_items, case.tau)), seed, data.draw))

        run()


def test_the_harness_fails_the_toy_mechanism_without_its_clip(toy, monkeypatch):
    """The check is real: the same case on a ToyGaussianSGD that no longer clips fails it."""
    _, module = toy
    monkeypatch.setattr(module.ToyGaussianSGD, "clip_residuals", lambda self, residuals, batch=None, model=None: residuals)
    case = registry.builder_for(module.ToyGaussianSGD)()[0]

    @HARNESS
    @given(data=st.data(), seed=st.integers(0, 5))
    def run(data, seed):
        assume(check_case(case, data.draw(edge_datasets(case.max_items, case.tau)), seed, data.draw))

    with pytest.raises(AssertionError, match="toy_gaussian"):
        run()
