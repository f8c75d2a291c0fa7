"""The runner's claim check reads ``registry.HARNESSED``: the case modules' own registration keys, read without
importing a mechanism, a predictor or Opacus (the case modules import those inside their builders). That set must be
exactly the classes the sensitivity harness checks, or a finite epsilon could pass unchecked (or a checked one be
slowed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dprec_torch.privacy_harness import registry

ROOT = Path(__file__).resolve().parents[2]


def test_harnessed_names_are_the_registrations():
    names = {registry.qualified_name(cls) for cls in registry.registered_classes()}
    assert registry.HARNESSED == names, {"listed but not registered": registry.HARNESSED - names,
                                         "registered but not listed": names - registry.HARNESSED}


def test_claim_check_of_a_registered_class_imports_no_mechanism_predictor_or_opacus():
    """A class with a harnessed name passes on the names alone: no class is resolved (nothing heavy imported)."""
    code = ("import sys; from dprec_torch.privacy_harness.registry import check_claim\n"
            "C = type('ClippedLaplaceDPSGD', (), {'__module__': 'dprec_torch.mechanisms.dpsgd'})\n"
            "check_claim(C(), {'epsilon': 1.0})\n"
            "print(sorted(m for m in sys.modules if m.startswith(('dprec_torch.mechanisms', 'dprec_torch.predictors', "
            "'opacus'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_case_modules_do_not_import_the_registry():
    """Registration runs one way: the registry collects the case modules' tables; no case module imports it."""
    from tests.test_import_graph import module_import_edges

    into_registry = sorted(a for a, b in module_import_edges(ROOT) if b == registry.__name__)
    assert into_registry == ["dprec_torch.training.run"], into_registry  # the runner's check_claim only
    assert {m.__name__ for m in registry.CASE_MODULES} <= {b for a, b in module_import_edges(ROOT) if a == registry.__name__}
