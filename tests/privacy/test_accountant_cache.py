"""The accountant's answers are memoised on disk (dprec_torch/privacy/calibration.py: disk_memo): a figure computed
before is Opacus's figure bit for bit, and a run whose figures are all cached never imports Opacus (start-up)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dprec_torch.privacy import calibration
from dprec_torch.privacy.calibration import OPACUS_DEFAULT_ALPHAS, opacus_epsilon
from dprec_torch.privacy.opacus_accounting import OpacusAccountant

ROOT = Path(__file__).resolve().parents[2]
HISTORIES = [[(1.1, 0.3, 67)], [(3.0, 1.0, 1), (0.9, 0.05, 400)], [(8.0, 1.0, 20), (2.5, 0.01, 1000), (2.5, 0.01, 5)]]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DPREC_CACHE", str(tmp_path))
    monkeypatch.delenv("DPREC_ACCOUNTANT_CACHE", raising=False)
    calibration._history_epsilon.cache_clear()
    calibration._calibrate.cache_clear()
    yield tmp_path / "accountant"
    calibration._history_epsilon.cache_clear()
    calibration._calibrate.cache_clear()


def test_the_written_out_orders_are_opacus_defaults() -> None:
    from opacus.accountants import RDPAccountant

    assert OPACUS_DEFAULT_ALPHAS == list(RDPAccountant.DEFAULT_ALPHAS)


def _opacus_stepped(history, delta: float, mechanism: str) -> float:
    """Opacus's own accountant fed step by step, as Opacus's optimizer hook would feed it."""
    from opacus.accountants import create_accountant

    from dprec_torch.privacy.calibration import _epsilon_kwargs

    acc = create_accountant(mechanism=mechanism)
    for sigma, q, steps in history:
        for _ in range(steps):
            acc.step(noise_multiplier=sigma, sample_rate=q)
    return float(acc.get_epsilon(delta=delta, **_epsilon_kwargs(mechanism)))


@pytest.mark.parametrize("mechanism", ["rdp", "prv"])
def test_a_cached_epsilon_is_opacus_own_figure_bit_for_bit(cache, mechanism) -> None:
    for history in HISTORIES:
        # Opacus's accountant on the history ours records (consecutive equal (sigma, q) merged, as Opacus's RDP
        # accountant merges them when stepped); fed step by step, PRV's numerical composition moves in the 9th digit
        direct = opacus_epsilon(calibration._compact(history), 1e-6, mechanism)
        stepped = _opacus_stepped(history, 1e-6, mechanism)
        assert direct == stepped if mechanism == "rdp" else direct == pytest.approx(stepped, rel=1e-8)
        acc = OpacusAccountant(mechanism)
        for sigma, q, steps in history:
            acc.step(sigma, q, steps)
        assert acc.get_epsilon(1e-6) == direct  # computed (and written)
        calibration._history_epsilon.cache_clear()
        assert acc.get_epsilon(1e-6) == direct  # read back from disk
    assert len(list(cache.glob("*.json"))) == len(HISTORIES)


def test_a_cached_calibration_is_the_computed_one(cache) -> None:
    fresh = calibration.calibrate_gaussian(2.0, 1e-6, 0.3, 67)
    calibration._calibrate.cache_clear()
    calibration._history_epsilon.cache_clear()
    assert calibration.calibrate_gaussian(2.0, 1e-6, 0.3, 67) == fresh
    assert calibration._calibrate.uncached(2.0, 1e-6, 0.3, 67, "rdp", (), calibration.DEFAULT_TOLERANCE["bisect"],
                                           "bisect") == fresh


def test_a_damaged_entry_is_recomputed_and_an_unwritable_cache_is_skipped(cache, monkeypatch) -> None:
    value = calibration.gaussian_epsilon(HISTORIES[0], 1e-6)
    for f in cache.glob("*.json"):
        f.write_text("{not json")
    calibration._history_epsilon.cache_clear()
    assert calibration.gaussian_epsilon(HISTORIES[0], 1e-6) == value
    entry = json.loads(next(cache.glob("*.json")).read_text())
    assert entry["value"]["float"] == value
    monkeypatch.setenv("DPREC_ACCOUNTANT_CACHE", "0")
    calibration._history_epsilon.cache_clear()
    assert calibration.gaussian_epsilon(HISTORIES[1], 1e-6) == opacus_epsilon(HISTORIES[1], 1e-6, "rdp")


def test_a_rerun_whose_figures_are_cached_imports_no_opacus(tmp_path) -> None:
    """The design card's mechanism twice with one cache: the second process never imports Opacus."""
    code = ("import sys, dprec_torch; dprec_torch.train(['data=synthetic', 'data.preset=tiny', 'mechanism=sgld', "
            "'epsilon=20', 'mechanism.epochs=2', 'compare_baselines=false', 'tensorboard=false', 'device=cpu', "
            f"'output_dir={tmp_path / 'run'}']); print('OPACUS', 'opacus' in sys.modules)")
    env = {**os.environ, "DPREC_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    first = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-2000:]
    second = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "OPACUS False" in second.stdout, second.stdout
