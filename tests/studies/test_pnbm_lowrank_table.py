"""The low-rank PNBM table is generated (``experiments/studies/pnbm_lowrank_table.py``): the README, docs/pnbm_lowrank.md and
docs/private_frontier.md hold exactly what the script writes from ``docs/results/pnbm_lowrank/table.json``, the design
card's command is its first row, and every row's figures are that file's."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("pnbm_lowrank_table", ROOT / "experiments" / "studies" / "pnbm_lowrank_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _block(path: Path) -> str:
    text = path.read_text()
    start, end = "<!-- pnbm_lowrank:start -->", "<!-- pnbm_lowrank:end -->"
    return text[text.index(start) + len(start):text.index(end)].strip()


def test_the_published_tables_are_the_scripts_output_of_table_json():
    mod = _script()
    records = json.loads((ROOT / "docs" / "results" / "pnbm_lowrank" / "table.json").read_text())
    assert set(records) == {str(i) for i in range(len(mod.ROWS))}, "a row of the table was never run"
    assert _block(ROOT / "README.md") == mod.table(records, compact=True).strip()
    full = mod.table(records).strip().replace("(docs/pnbm_lowrank.md)", "(pnbm_lowrank.md)")
    for doc in ("pnbm_lowrank.md", "private_frontier.md"):
        assert _block(ROOT / "docs" / doc) == full, doc


def test_the_design_cards_command_is_the_first_row_and_defends_a_numeric_delta():
    mod = _script()
    assert mod.ROWS[0][0] == "python train.py mechanism=sgld epsilon=20"
    rec = json.loads((ROOT / "docs" / "results" / "pnbm_lowrank" / "table.json").read_text())["0"]
    assert rec["command"] == mod.ROWS[0][0] and rec["overrides"] == mod.overrides(0)
    assert rec["model"].endswith("LowRankPNBM") and 0 < rec["delta"] < 1 and rec["epsilon"] <= 20


def test_the_five_fold_sweep_table_is_its_scripts_output():
    """docs/pnbm_lowrank.md's 5-fold ε-sweep block is ``size_rule.py five-fold`` of the committed JSON, and every row
    there is below its own DP-means reference and falls with ε ("never worse than not learning")."""
    import importlib.util

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("size_rule_study", root / "experiments/studies/pnbm_lowrank_size_rule.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    body = mod.five_fold_summary(root / "docs/results/pnbm_lowrank/size_rule_sweep_5fold.json")
    assert f"<!-- size_rule_5fold:start -->\n{body}\n<!-- size_rule_5fold:end -->" in (root / "docs/pnbm_lowrank.md").read_text()
    rows = [r for r in body.splitlines()[2:]]
    assert len(rows) == 6 and all(r.endswith("| yes | yes |") for r in rows)


def test_the_pure_epsilon_means_block_is_its_scripts_output_and_backs_the_docs_claim():
    """docs/pnbm_lowrank.md's pure-ε item-means block is ``pure_eps_item_means.py report`` of the committed JSON, and
    the claim beside it holds there: at ε = 10 the feature prior helps, yet every pure-ε release (even the optimistic
    one) misses 0.895, the Gaussian one not."""
    spec = importlib.util.spec_from_file_location("pure_eps", ROOT / "experiments/studies/pure_eps_item_means.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    path = ROOT / "docs/results/pnbm_lowrank/pure_eps_item_means.json"
    body = mod.summary(path)
    assert f"<!-- pure_eps_means:start -->\n{body}\n<!-- pure_eps_means:end -->" in (ROOT / "docs/pnbm_lowrank.md").read_text()
    cell = json.loads(path.read_text())["results"]["10"]
    mean = {k: sum(v) / len(v) for k, v in cell.items()}
    assert mean["laplace"] > mean["laplace_feature_prior"] > mod.TARGET > mean["gaussian"]
    assert mean["laplace_oracle"] > mod.TARGET
    assert len(cell["exact"]) == 5 and len(cell["laplace"]) == 5 * mod.REPEATS


def test_the_feature_prior_choice_holds_on_the_validation_splits_it_was_made_on():
    """conf/tuned/dpsgd_pnbm_lowrank.yaml's ``mean_feature_prior: true`` says: better at every epsilon checked on both
    datasets' validation splits (each choosing for the other). The committed check must say so."""
    doc = json.loads((ROOT / "docs/results/pnbm_lowrank/feature_prior_check.json").read_text())
    assert set(doc["results"]) == {"ml-100k", "ml-1m"}
    for cells in doc["results"].values():
        assert set(cells) == {"1", "5", "10", "50"}
        for cell in cells.values():
            assert sum(cell["feature_prior"]) < sum(cell["constant_prior"])
    assert "mean_feature_prior: true" in (ROOT / "conf/tuned/dpsgd_pnbm_lowrank.yaml").read_text()


def test_the_size_rule_blocks_sweep_rows_are_the_sweep_json():
    """docs/pnbm_lowrank.md's per-command sweep rows (the ``size_rule`` block, ``size_rule.py report``) show
    ``size_rule_sweep.json``'s figures: a redrawn sweep must be reported again."""
    doc = (ROOT / "docs/pnbm_lowrank.md").read_text()
    block = doc[doc.index("<!-- size_rule:start -->"):doc.index("<!-- size_rule:end -->")]
    sweeps = json.loads((ROOT / "docs/results/pnbm_lowrank/size_rule_sweep.json").read_text())
    assert sweeps and all(rows for rows in sweeps.values())
    for rows in sweeps.values():
        for r in rows:
            assert f"| `{r['command']}` | {r['test_rmse']:.4f} |" in block, r["command"]
