"""Issue 27's table: the low-rank PNBM from the design card's own commands, regenerated (never hand-edited).

Each row is a ``python train.py ...`` command exactly as a user types it (the design card's
``python train.py mechanism=sgld epsilon=20`` first), run through :func:`dprec_torch.train` with only what a table
needs added: every fold of the dataset (``data.fold=all`` on ML-1M), an explicit noise seed (reproducible; the ε then
holds only while that seed stays secret, and it is published here), no TensorBoard, and an output folder under
``--runs``. The defaults those commands pick (``conf/tuned/<mechanism>_pnbm_lowrank.yaml``) were chosen on other
people's data (their ``# chosen_on:`` line; ``experiments/studies/pnbm_lowrank_tuning.py``); no row reads a test fold to
choose anything. The ``custom`` rows run the same commands on ML-1M's ratings read as a custom file with another
split seed (``data.seed=1``) and the catalogue attached (``data.catalog_path``), so they must agree with the ML-1M rows
within the fold-to-fold spread.

Writes ``docs/results/pnbm_lowrank/table.json`` (every fold's figures, the privacy reports' ε, δ and accountant) and
``table.md``, and splices the table into README.md, docs/private_frontier.md and docs/pnbm_lowrank.md (``pnbm_lowrank``
markers)::

    nice -n 10 python experiments/studies/pnbm_lowrank_table.py                # every row not in table.json yet
    nice -n 10 python experiments/studies/pnbm_lowrank_table.py --rerun 0 1    # rerun rows 0 and 1
    python experiments/studies/pnbm_lowrank_table.py --report                  # rewrite the tables from table.json
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dprec_torch.io import atomic_write_json  # noqa: E402
from dprec_torch.study.markers import splice  # noqa: E402

log = logging.getLogger("pnbm_lowrank_table")
OUT = ROOT / "docs" / "results" / "pnbm_lowrank"
NOISE_SEED = 1
ML1M = ["data=ml-1m", "data.fold=all"]


def custom_ml1m() -> list[str]:
    """ML-1M's ratings as a custom file, another split seed, the catalogue attached (the ``custom`` rows)."""
    data = Path(os.environ.get("DPREC_DATA", ROOT.parent / "shared" / "data")) / "ml-1m"
    return ["data=custom", f"data.path={data / 'ratings.dat'}", f"data.catalog_path={data / 'movies.dat'}",
            "data.rating_scale=[1,5]", "data.seed=1", "data.fold=all"]


#: (the command as typed, the data it runs on, the overrides the table adds, the issue's target)
ROWS: list[tuple[str, str, list[str], float]] = [
    ("python train.py mechanism=sgld epsilon=20", "ML-100K u1", [], 0.945),
    ("python train.py mechanism=sgld epsilon=20 data=ml-1m", "ML-1M, 5 folds", ML1M, 0.870),
    ("python train.py mechanism=gaussian epsilon=10 data=ml-1m", "ML-1M, 5 folds", ML1M, 0.875),
    ("python train.py mechanism=dpsgd epsilon=10 data=ml-1m", "ML-1M, 5 folds", ML1M, 0.900),
    ("python train.py mechanism=gaussian epsilon=10 data=ml-1m model.item_features=true", "ML-1M, 5 folds", ML1M, 0.865),
]
#: the same ML-1M commands on data=custom (another split of ML-1M): target = within 0.005 of the ml-1m row
CUSTOM_OF = {5: 1, 6: 2, 7: 3, 8: 4}
ROWS += [(ROWS[i][0].replace("data=ml-1m", "data=custom"), "custom: ML-1M, split seed 1, 5 folds", [], math.nan)
         for i in CUSTOM_OF.values()]


def overrides(row: int) -> list[str]:
    command, _, extra, _ = ROWS[row]
    typed = shlex.split(command)[2:]
    if row in CUSTOM_OF:
        typed = [t for t in typed if t != "data=custom"] + custom_ml1m()
    else:
        typed += extra
    return typed + [f"noise_seed={NOISE_SEED}", "tensorboard=false", "device=cpu"]


def run_row(row: int, runs: Path) -> dict[str, Any]:
    import dprec_torch

    out = runs / f"row{row}"
    t0 = time.perf_counter()
    run = dprec_torch.train([*overrides(row), f"output_dir={out}"])
    seconds = time.perf_counter() - t0
    m = run.metrics
    p = m["privacy"]
    folds = [f["test_rmse"] for f in m["folds"]]
    return {
        "command": ROWS[row][0], "data": ROWS[row][1], "overrides": overrides(row), "target": ROWS[row][3],
        "test_rmse": float(np.mean(folds)), "test_rmse_std": float(np.std(folds)), "folds": folds,
        "baselines": m.get("baselines", {}), "epsilon": p.get("epsilon"), "delta": p.get("delta"),
        "accountant": p.get("accountant"), "relation": p.get("relation"), "mechanism": p.get("mechanism"),
        "model": run.config.model.get("_target_"), "similarity": getattr(run.model(), "similarity", None),
        "hyperparameters": p.get("hyperparameters"), "seconds": seconds, "run_dir": str(out),
    }


def _fmt(rmse: float, std: float, n: int) -> str:
    return f"{rmse:.4f} ± {std:.4f}" if n > 1 else f"{rmse:.4f}"


def _verdict(row: int, rec: dict[str, Any], records: dict[str, Any]) -> str:
    if row in CUSTOM_OF:
        ref = records.get(str(CUSTOM_OF[row]))
        if ref is None:
            return "–"
        gap = rec["test_rmse"] - ref["test_rmse"]
        return f"within 0.005 of row {CUSTOM_OF[row] + 1}: {'met' if abs(gap) <= 0.005 else 'missed'} ({gap:+.4f})"
    return f"≤ {rec['target']:.3f}: {'met' if rec['test_rmse'] <= rec['target'] else 'missed'}"


def _privacy(rec: dict[str, Any]) -> str:
    """(ε, δ) and the accountant's short name, as the run's privacy report states them."""
    eps, delta, acc = rec["epsilon"], rec.get("delta"), (rec.get("accountant") or "").lower()
    if eps is None or not math.isfinite(float(eps)):
        return "none defended"
    if not delta:
        return f"ε = {eps:.4g} (pure, basic composition)"
    name = "Opacus PRV" if "prv" in acc else "Opacus RDP" if "rdp" in acc else acc
    return f"ε = {eps:.4g}, δ = {delta:g} ({name})"


def table(records: dict[str, Any], compact: bool = False) -> str:
    """The table; ``compact`` (README): a one-line preamble and no COS column."""
    if compact:
        lines = ["Test RMSE of the default low-rank PNBM from each command as typed (mean ± std over folds; noise seed "
                 f"{NOISE_SEED}, published, so reproducible). Defaults chosen on a 943-user stand-in from ML-1M's users: end "
                 "to end for ML-100K only. Generated by `python experiments/studies/pnbm_lowrank_table.py`; limits and the "
                 "full table: [docs/pnbm_lowrank.md](docs/pnbm_lowrank.md).", ""]
    else:
        lines = ["Test RMSE of the low-rank PNBM (S = U Uᵀ, `model=pnbm_lowrank`, the default model) from each command as "
                 "typed, mean ± std over folds, with the non-private PCC/COS item-kNN references the same run reports "
                 "(`compare_baselines`) and the (ε, δ) its privacy report defends (user level). Generated by "
                 "`python experiments/studies/pnbm_lowrank_table.py` (do not edit by hand); the runs use the explicit "
                 f"noise seed {NOISE_SEED} (reproducible: their ε holds only while it stays secret, and it is published "
                 "here). The defaults (`conf/tuned/<mechanism>_pnbm_lowrank.yaml`) were chosen on a 943-user stand-in "
                 "drawn from ML-1M's users: end to end for the ML-100K row (no user in common), NOT for the ML-1M and "
                 "custom rows (the same people; each run's `privacy.hyperparameters` says so). The targets are issue "
                 "27's; what limits them: [docs/pnbm_lowrank.md](docs/pnbm_lowrank.md).", ""]
    cols = ["#", "command", "data", "test RMSE", "PCC", *([] if compact else ["COS"]), "ε, δ (accountant)", "issue-27 target"]
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in range(len(ROWS)):
        rec = records.get(str(row))
        if rec is None:
            lines.append(f"| {row + 1} | `{ROWS[row][0]}` | {ROWS[row][1]} | not run yet |" + " |" * (len(cols) - 4))
            continue
        b = rec.get("baselines", {})
        ref = {k: f"{b[k]['rmse']:.4f}" if k in b else "–" for k in ("PCC", "COS")}
        cells = [str(row + 1), f"`{rec['command']}`", rec["data"],
                 _fmt(rec["test_rmse"], rec["test_rmse_std"], len(rec["folds"])), ref["PCC"],
                 *([] if compact else [ref["COS"]]), _privacy(rec), _verdict(row, rec, records)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(records: dict[str, Any]) -> str:
    body = table(records)
    (OUT / "table.md").write_text(body + "\n")
    splice(ROOT / "README.md", "pnbm_lowrank", table(records, compact=True))
    for doc in ("private_frontier.md", "pnbm_lowrank.md"):
        splice(ROOT / "docs" / doc, "pnbm_lowrank", body.replace("(docs/pnbm_lowrank.md)", "(pnbm_lowrank.md)"))
    return body


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rerun", nargs="*", type=int, default=[], help="rows (0-based) to run again")
    ap.add_argument("--rows", nargs="*", type=int, default=None, help="run only these rows (0-based)")
    ap.add_argument("--report", action="store_true", help="only rewrite the tables from table.json")
    ap.add_argument("--runs", type=Path, default=ROOT / "outputs" / "pnbm_lowrank_table")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", force=True)
    os.environ.setdefault("DPREC_DATA", str(ROOT.parent / "shared" / "data"))
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "table.json"
    records: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    if not args.report:
        for row in (args.rows if args.rows is not None else range(len(ROWS))):
            if str(row) in records and row not in args.rerun and records[str(row)]["overrides"] == overrides(row):
                continue
            rec = run_row(row, args.runs)
            log.info("row %d: %s -> %.4f (%.0f s)", row + 1, ROWS[row][0], rec["test_rmse"], rec["seconds"])
            # re-read before writing: another process may have added rows meanwhile (runs of disjoint rows in parallel)
            records = {**(json.loads(path.read_text()) if path.exists() else {}), str(row): rec}
            atomic_write_json(path, records)
    print(report(records))


if __name__ == "__main__":
    main()
