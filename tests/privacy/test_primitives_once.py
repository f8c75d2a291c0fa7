"""Each privacy primitive is written once.

Parses every module of ``dprec_torch`` with :mod:`ast` (no import) and counts where each primitive is DEFINED (a
``def``/``class`` at any depth, or a module-level assignment); re-exports (imports) do not count.
``predictors/lowrank_dpsgd.py`` (the former low-rank predictor, deleted with its duplicates) is left out.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "dprec_torch"
IGNORED: set[str] = set()

#: primitive -> the one module (relative to dprec_torch/) that defines it
ONCE = {
    # find the noise for a target (eps, delta) under an accountant (rdp, prv, gdp)
    "calibrate_gaussian": "privacy/calibration.py",
    # the epsilon of a Gaussian history under an accountant
    "gaussian_epsilon": "privacy/calibration.py",
    # Gaussian DP's privacy curve and the split of one mu between releases
    "gdp_delta": "privacy/calibration.py",
    "gdp_epsilon": "privacy/calibration.py",
    "split_mu": "privacy/calibration.py",
    # one Gaussian release in sigma units (McSherry-Mironov's calibration: classic bound, analytic Gaussian)
    "classic_gaussian_sigma": "privacy/calibration.py",
    "analytic_gaussian_sigma": "privacy/calibration.py",
    "gaussian_delta": "privacy/calibration.py",
    # exact Poisson amplification of a pure-DP step
    "amplified_epsilon": "privacy/accountants.py",
    # the release of DP item means, its spec and its record
    "release_item_means": "privacy/item_means.py",
    "ItemMeansSpec": "privacy/item_means.py",
    "ItemMeansRelease": "privacy/item_means.py",
    "install_item_means": "privacy/item_means.py",
    # the per-user seeded cap and its per-rating key
    "rating_keys": "data/preprocess.py",
    "per_user_sample": "data/preprocess.py",
}

#: the names the merged duplicates had: none of them may come back
GONE = ("calibrate_sigma", "history_epsilon", "total_mu", "rdp_epsilon", "noise_multiplier_for", "dp_item_means",
        "DPItemMeans", "per_user_sample_of", "MeanOptions", "dp_global_mean")

#: third-party routines a calibration or an epsilon is computed with: imported by the calibration module only
ONLY_IN_CALIBRATION = ("compute_rdp", "get_privacy_spent", "get_noise_multiplier")


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel not in IGNORED:
            yield rel, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _definitions() -> dict[str, list[str]]:
    where: dict[str, list[str]] = defaultdict(list)
    for rel, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                where[node.name].append(rel)
        for node in tree.body:  # module-level assignments (an alias `name = other` is a second definition)
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            for t in targets:
                if isinstance(t, ast.Name):
                    where[t.id].append(rel)
    return where


DEFINED = _definitions()


@pytest.mark.parametrize("name", sorted(ONCE))
def test_each_primitive_is_defined_exactly_once(name):
    assert DEFINED.get(name) == [ONCE[name]], f"{name} is defined in {DEFINED.get(name)}, expected only {ONCE[name]}"


@pytest.mark.parametrize("name", GONE)
def test_the_merged_duplicates_are_gone(name):
    assert not DEFINED.get(name), f"{name} is defined again in {DEFINED[name]}"


def test_opacus_calibration_routines_are_called_from_the_calibration_module_only():
    users = defaultdict(list)
    for rel, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if alias.name in ONLY_IN_CALIBRATION:
                        users[alias.name].append(rel)
    assert all(mods == ["privacy/calibration.py"] for mods in users.values()), dict(users)
    assert set(users) == set(ONLY_IN_CALIBRATION)


def test_the_primitives_are_the_ones_the_callers_import():
    """The re-exported names resolve to the single definitions (no wrapper in between)."""
    from dprec_torch.privacy import analysis, calibration
    from dprec_torch.privacy.accountants import amplified_epsilon

    assert analysis.amplified_epsilon is amplified_epsilon
    assert calibration.calibrate_gaussian(2.0, 1e-6, accountant="gdp").mu == calibration._gdp_mu(2.0, 1e-6)
