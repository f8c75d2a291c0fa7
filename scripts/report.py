"""Build RMSE-vs-epsilon tables and figures from a sweep: ``python scripts/report.py multirun/<date>/<time>``.

A study's report (what ``scripts/study.py`` writes at its end) can be rebuilt with
``python scripts/report.py <out>/stage2 --out docs/results/<name> --ledger-dir <out> --selected <out>/selected.yaml``.
It ends with what the sweep's jobs cost together: jobs on the same dataset share people, so their epsilons compose
(:func:`dprec_torch.privacy.ledger.composition_lines`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout (its package and hydra_plugins), as from its root
from dprec_torch.errors import DprecError
from dprec_torch.privacy.ledger import composition_lines, ledger_report
from dprec_torch.study.report import build_report


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("sweep_dir")
    ap.add_argument("--out", default=None, help="output folder (default: the sweep dir)")
    ap.add_argument("--ledger-dir", default=None, help="where the privacy ledger looks for runs (a study's whole folder)")
    ap.add_argument("--selected", default=None, help="a study's selected.yaml: adds the stage-1 choice table")
    args = ap.parse_args()
    try:
        path = build_report(args.sweep_dir, args.out, ledger_dir=args.ledger_dir, selected=args.selected)
    except DprecError as err:
        logging.error("%s", err)
        sys.exit(2)
    print(path.read_text())
    # the jobs of a sweep (and the folds of a fold=all job) share people: their epsilons compose (issue 33, 3)
    print("\n".join(["Privacy over the whole sweep:", *composition_lines(ledger_report(args.ledger_dir or args.sweep_dir))]))


if __name__ == "__main__":
    main()
