"""The ε-sweep figure of the default low-rank PNBM, one panel per dataset, with the three references each run prints.

Reads ``docs/results/pnbm_lowrank/size_rule_sweep.json`` (written by ``experiments/studies/pnbm_lowrank_size_rule.py
sweep``: the commands as typed, ``python train.py mechanism=<m> epsilon=<e>``, ε in {0.5, 1, 2, 5, 10, 20, 50}) and
draws each default mechanism's test RMSE against ε beside the same runs' non-private PCC and COS item-kNN and the DP
item means + user offset at the same ε (the model must never lose to that reference). Writes
``docs/results/pnbm_lowrank/eps_sweep.png``::

    python experiments/studies/pnbm_lowrank_eps_figure.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "docs" / "results" / "pnbm_lowrank" / "size_rule_sweep.json"
OUT = ROOT / "docs" / "results" / "pnbm_lowrank" / "eps_sweep.png"
DP_MEANS = "DP means + offset"


def draw(sweep: dict[str, list[dict]], out: Path) -> None:
    panels = list(sweep)
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
    for ax, name in zip(axes[0], panels):
        runs = sweep[name]
        for mech, marker in (("sgld", "o"), ("gaussian", "s"), ("dpsgd", "^")):
            rows = sorted((r for r in runs if r["mechanism"] == mech), key=lambda r: r["epsilon"])
            if rows:
                ax.plot([r["epsilon"] for r in rows], [r["test_rmse"] for r in rows], marker=marker, label=f"PNBM low-rank ({mech})")
                if mech == "sgld":  # the Gaussian mechanisms' DP-means reference (dpsgd's is Laplace: drawn dotted)
                    ax.plot([r["epsilon"] for r in rows], [r["references"][DP_MEANS] for r in rows], "k--",
                            label="DP item means + user offset (Gaussian)")
                if mech == "dpsgd":
                    ax.plot([r["epsilon"] for r in rows], [r["references"][DP_MEANS] for r in rows], "k:",
                            label="DP item means + user offset (Laplace)")
        ref = runs[0]["references"]
        ax.axhline(ref["PCC"], color="tab:red", lw=1, label="PCC (non-private)")
        ax.axhline(ref["COS"], color="tab:purple", lw=1, label="COS (non-private)")
        ax.set_xscale("log")
        ax.set_xlabel("ε (user level)")
        ax.set_ylabel("test RMSE")
        ax.set_title(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    if not SWEEP.exists():
        sys.exit(f"{SWEEP} is missing: run experiments/studies/pnbm_lowrank_size_rule.py sweep first")
    draw(json.loads(SWEEP.read_text()), OUT)
    print(OUT)


if __name__ == "__main__":
    main()
