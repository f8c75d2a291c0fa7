"""The runner's claim check reads ``registry.HARNESSED`` (no import of the case modules); that set must be exactly
the classes the sensitivity harness checks, or a finite epsilon could pass unchecked (or a checked one be slowed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dprec_torch.privacy_harness import registry

ROOT = Path(__file__).resolve().parents[1]


def test_harnessed_names_are_the_registrations():
    names = {registry.qualified_name(cls) for cls in registry.registered_classes()}
    assert registry.HARNESSED == names, {"listed but not registered": registry.HARNESSED - names,
                                         "registered but not listed": names - registry.HARNESSED}


def test_claim_check_of_a_registered_class_imports_no_case_module():
    code = ("import sys; from dprec_torch.privacy_harness.registry import check_claim\n"
            "from dprec_torch.mechanisms.dpsgd_l1 import ClippedLaplaceDPSGD as C\n"
            "check_claim(C.__new__(C), {'epsilon': 1.0})\n"
            "print(sorted(m for m in sys.modules if m.endswith('_cases')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
