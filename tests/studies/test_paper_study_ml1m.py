"""experiments/studies/paper_study.py on a second dataset: the ML-1M commands, and its claims answered
beside ML-100K's from the same generated bullets."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ps():
    spec = importlib.util.spec_from_file_location("paper_study", ROOT / "experiments" / "studies" / "paper_study.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ml1m_runs_fig1_and_fig2_on_ml1m_and_keeps_ml100k_commands(ps):
    runs = ps.runs_of("ml-1m", None)
    assert list(runs) == ["python scripts/study.py study=fig1 dataset=ml-1m", "python scripts/study.py study=fig2 dataset=ml-1m"]
    assert all("dataset=ml-1m" in args for args in runs.values())
    repo = ps.runs_of("ml-1m", ["fig2repo"])
    (args,) = repo.values()
    assert "search=repo" in args and f"report={ps.studies_of('ml-1m')['fig2repo']}" in args
    assert list(ps.runs_of("ml-100k", None)) == list(ps.RUNS)  # ML-100K: the four documented commands, unchanged


def _study(rmse: dict, base=(0.94, 0.95)) -> dict:
    return {"rmse": {k: (v, 0.01, "None") for k, v in rmse.items()}, "base": {"PCC": base[0], "COS": base[1]},
            "selected": {"selected": {}, "study": {}}, "md": ""}


def test_claims_of_two_datasets_land_in_one_verdict_table(ps):
    s1a = _study({("dpsgd_paper-pnbm", e): 0.93 for e in (0.1, 0.5, 1.0)} | {("dpsgd_paper-mf", e): 1.1 for e in (0.1, 0.5, 1.0)})
    s1b = _study({("dpsgd_paper-pnbm", e): 1.2 for e in (0.1, 0.5, 1.0)} | {("dpsgd_paper-mf", e): 1.1 for e in (0.1, 0.5, 1.0)})
    table = ps.verdict_table({"ml-100k": ps.claims(s1a, None), "ml-1m": ps.claims(s1b, None)})
    assert table[0] == "| claim | ML-100K | ML-1M |"
    row = next(r for r in table if "PNBM beats MF at small ε" in r)
    assert row.endswith("| **holds** | **refuted** |")
    assert not any("Fig. 2 claims" in r for r in table)  # a "not run" bullet carries no verdict: no row


def test_the_two_fig3_claims_keep_their_own_rows(ps):
    """ML-100K answers Fig. 3 twice (paper grid, `search=repo`): one row each, neither hides the other."""
    dpsgd = {("dpsgd_paper-pnbm", x): (0.95, 0.01, "None") for x in (0.5, 1.0)}
    paper, repo = ({("sgld_paper-pnbm", x * 200): (v, 0.01, "None") for x in (0.5, 1.0)} for v in (0.97, 0.94))
    bullets = [ps.fig3_claim(dpsgd, paper, "from the Fig. 3 study (thinner paper grid)", ""),
               ps.fig3_claim(dpsgd, repo, "DPPS-PNBM from the `search=repo` Fig. 2 study (not the paper's grid)", "")]
    table = ps.verdict_table({"ml-100k": bullets, "ml-1m": bullets[:1]})
    rows = [r for r in table if r.startswith("| Fig. 3")]
    assert len(rows) == 2
    assert rows[0].endswith("| **refuted** | **refuted** |") and rows[1].endswith("| **holds** | not run |")


def test_an_unrun_dataset_leaves_the_page_block_unchanged(ps, tmp_path):
    """Without ML-1M results the generated block is the ML-100K block alone (no empty ML-1M section)."""
    assert ps.study_tables("ml-1m", {k: None for k in ps.FIG_KEYS}) == []
