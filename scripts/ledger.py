"""Sum the privacy spent by every run of a sweep on the same data: ``python scripts/ledger.py multirun/2026-11-25/22-00-00``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout (its package and hydra_plugins), as from its root
from dprec_torch.privacy.ledger import format_ledger, ledger_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("sweep_dir", help="a folder holding run folders with metrics.json (searched recursively)")
    parser.add_argument("--json", help="also write the ledger as JSON to this path")
    args = parser.parse_args(argv)
    report = ledger_report(args.sweep_dir)
    if not report["entries"]:
        print(f"no metrics.json with a privacy record under {args.sweep_dir}", file=sys.stderr)
        return 2
    print(format_ledger(report))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
