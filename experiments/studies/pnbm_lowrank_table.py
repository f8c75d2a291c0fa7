"""The design card's table: the low-rank PNBM from the commands as a user types them, regenerated (never hand-edited).

Each row is a ``python train.py ...`` command exactly as a user types it (the design card's
``python train.py mechanism=sgld epsilon=20`` first), run through :func:`dprec_torch.train` with only what a table
needs added: every fold of the dataset (``data.fold=all``), no TensorBoard, and an output folder under ``--runs``. The
noise is SECRET, as in a user's run (no ``noise_seed``): the figures are what a user gets, up to the run-to-run noise
the fold spread shows. The knobs those commands pick come from the size rule (:mod:`dprec_torch.privacy.size_rule`,
fitted on other people's data, validation splits only: ML-1M user subsamples for ML-100K runs, ML-100K and synthetic
data for ML-1M runs); the last column says where each row's knobs came from. No row reads a test fold to choose
anything. The ``custom`` row runs the ML-1M command on ML-1M's ratings read as a custom file WITHOUT its catalogue.

Columns: the run's test RMSE beside the references the same run reports on the same folds (non-private PCC and COS
item-kNN, and DP item means + user offset at the run's epsilon), the (ε, δ) of one fold model and of all of them
together (they share people), and the issue-34 target.

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

from dprec_torch.evaluation.baselines import DP_MEANS  # noqa: E402
from dprec_torch.io import atomic_write_json  # noqa: E402
from dprec_torch.study.markers import splice  # noqa: E402

log = logging.getLogger("pnbm_lowrank_table")
OUT = ROOT / "docs" / "results" / "pnbm_lowrank"
ALL = ["data.fold=all"]
PCC_5FOLD = "pcc-5fold"  # the target "PCC's 5-fold mean", read from the same run's references


def custom_ml1m() -> list[str]:
    """ML-1M's ratings as a custom file, no catalogue (the ``custom`` row)."""
    data = Path(os.environ.get("DPREC_DATA", ROOT.parent / "shared" / "data")) / "ml-1m"
    return ["data=custom", f"data.path={data / 'ratings.dat'}", "data.rating_scale=[1,5]", "data.fold=all"]


#: (the command as typed, the data it runs on, the overrides the table adds, the issue's target: a number, "dp-means"
#: = the same run's DP-means reference, or PCC_5FOLD)
ROWS: list[tuple[str, str, list[str], Any]] = [
    ("python train.py mechanism=sgld epsilon=20", "ML-100K u1", [], 0.945),
    ("python train.py mechanism=sgld epsilon=20", "ML-100K u1-u5", ALL, PCC_5FOLD),
    ("python train.py mechanism=sgld epsilon=20 data=ml-1m", "ML-1M, 5 folds", ALL, 0.870),
    ("python train.py mechanism=gaussian epsilon=10 data=ml-1m", "ML-1M, 5 folds", ALL, 0.875),
    ("python train.py mechanism=dpsgd epsilon=10 data=ml-1m", "ML-1M, 5 folds", ALL, 0.895),
    ("python train.py mechanism=sgld epsilon=20 data=custom", "custom: ML-1M without a catalogue, 5 folds", [], 0.880),
    ("python train.py", "ML-100K u1", [], "dp-means"),
]
CUSTOM_ROWS = {5}


def overrides(row: int) -> list[str]:
    command, _, extra, _ = ROWS[row]
    typed = shlex.split(command)[2:]
    if row in CUSTOM_ROWS:
        typed = [t for t in typed if t != "data=custom"] + custom_ml1m()
    else:
        typed += extra
    return typed + ["tensorboard=false", "device=cpu"]


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
        "epsilon_per_model": p.get("epsilon_per_model", p.get("epsilon")), "delta_per_model": p.get("delta_per_model", p.get("delta")),
        "size_rule": p.get("size_rule"), "noise": (p.get("randomness") or {}).get("noise_seed"),
        "accountant": p.get("accountant"), "relation": p.get("relation"), "mechanism": p.get("mechanism"),
        "model": run.config.model.get("_target_"), "similarity": getattr(run.model(), "similarity", None),
        "hyperparameters": p.get("hyperparameters"), "seconds": seconds, "run_dir": str(out),
    }


def _fmt(rmse: float, std: float, n: int) -> str:
    return f"{rmse:.4f} ± {std:.4f}" if n > 1 else f"{rmse:.4f}"


def target_value(rec: dict[str, Any]) -> tuple[float, str]:
    """The row's target as a number, and how it reads."""
    target, b = rec["target"], rec.get("baselines", {})
    if target == "dp-means":
        return b[DP_MEANS]["rmse"], "≤ its DP-means reference"
    if target == PCC_5FOLD:
        return b["PCC"]["rmse"], "≤ PCC's 5-fold mean"
    return float(target), f"≤ {float(target):.3f}"


def _verdict(rec: dict[str, Any]) -> str:
    value, text = target_value(rec)
    return f"{text}: {'met' if rec['test_rmse'] <= value else 'missed'}"


def _privacy(rec: dict[str, Any]) -> str:
    """(ε, δ) of one model and, for several fold models, of all of them together, as the run's privacy report states."""
    eps, delta, acc = rec.get("epsilon_per_model", rec["epsilon"]), rec.get("delta_per_model", rec.get("delta")), (rec.get("accountant") or "").lower()
    if eps is None or not math.isfinite(float(eps)):
        return "none defended"
    name = "pure" if not delta else "Opacus PRV" if "prv" in acc else "Opacus RDP" if "rdp" in acc else acc
    one = f"ε = {eps:.4g}" + (f", δ = {delta:g}" if delta else "") + f" ({name})"
    if len(rec["folds"]) > 1 and rec["epsilon"] is not None:
        one += f"; all {len(rec['folds'])}: ε = {float(rec['epsilon']):.4g}"
    return one


def _knobs(rec: dict[str, Any]) -> str:
    """Where the row's knobs came from: the size rule (and where it was fitted), else the run's provenance."""
    rule = rec.get("size_rule")
    if rule:
        k = rule.get("knobs", {})
        return (f"size rule (q {k.get('sampling_ratio')}, {k.get('epochs')} epochs, lr {k.get('lr', 0):.3g}, C "
                f"{k.get('clip_norm')}, mean share {k.get('mean_fraction', 0):.2f}); fitted on {rule.get('fitted_on')}")
    hp = rec.get("hyperparameters") or {}
    return str(hp.get("chosen_on", "–"))


def table(records: dict[str, Any], compact: bool = False) -> str:
    """The table; ``compact`` (README): a one-line preamble and no COS column."""
    if compact:
        lines = ["Test RMSE of the default low-rank PNBM from each command as typed (mean ± std over folds; secret noise, as "
                 "in a user's run), beside the references the same run prints. Knobs from the size rule, fitted on other "
                 "people's data. Generated by `python experiments/studies/pnbm_lowrank_table.py`; the full table and what "
                 "limits it: [docs/pnbm_lowrank.md](docs/pnbm_lowrank.md).", ""]
    else:
        lines = ["Test RMSE of the low-rank PNBM (S = U Uᵀ, `model=pnbm_lowrank`, the default model) from each command as "
                 "typed, mean ± std over folds, with the references the same run reports on the same folds "
                 "(`compare_baselines`: non-private PCC/COS item-kNN, and DP item means + user offset at the run's ε) and "
                 "the (ε, δ) its privacy report defends (user level; one fold model, and all of them together: they share "
                 "people). Generated by `python experiments/studies/pnbm_lowrank_table.py` (do not edit by hand); the "
                 "noise is secret, as in a user's run. The knobs come from the size rule "
                 "(`dprec_torch/privacy/size_rule.py`), fitted on other people's data (last column). The targets are "
                 "issue 34's; what limits them: [docs/pnbm_lowrank.md](docs/pnbm_lowrank.md).", ""]
    cols = ["#", "command", "data", "test RMSE", "PCC", *([] if compact else ["COS"]), "DP means", "ε, δ (accountant)",
            "target", *([] if compact else ["knobs from"])]
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in range(len(ROWS)):
        rec = records.get(str(row))
        if rec is None:
            lines.append(f"| {row + 1} | `{ROWS[row][0]}` | {ROWS[row][1]} | not run yet |" + " |" * (len(cols) - 4))
            continue
        b = rec.get("baselines", {})
        ref = {k: f"{b[k]['rmse']:.4f}" if k in b else "–" for k in ("PCC", "COS", DP_MEANS)}
        cells = [str(row + 1), f"`{rec['command']}`", rec["data"],
                 _fmt(rec["test_rmse"], rec["test_rmse_std"], len(rec["folds"])), ref["PCC"],
                 *([] if compact else [ref["COS"]]), ref[DP_MEANS], _privacy(rec), _verdict(rec),
                 *([] if compact else [_knobs(rec)])]
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
