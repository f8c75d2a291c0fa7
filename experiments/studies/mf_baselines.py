"""The MF baselines (issue 14, part 2) on ML-100K and ML-1M; writes docs/mf.md's results blocks.

    DPREC_DATA=../shared/data OMP_NUM_THREADS=1 python experiments/studies/mf_baselines.py \
        [--runs-dir outputs/studies/mf_baselines] [--folds-100k 1 2 3 4 5] [--folds-1m 1 2 3 4 5] [--only none ...]

Every run is ``train(cfg)`` on the real Hydra config: ``data=<d> data.fold=<k> model=mf mechanism=<m>
epsilon=<e>`` plus the row's extra overrides (none for the tuned defaults of ``conf/tuned/<m>_mf.yaml``);
a run whose ``metrics.json`` already exists is read, not re-run, so the script resumes. Each table cell is
the mean test RMSE over the folds run, +- the std over folds. The tables are spliced into docs/mf.md
between the ``mf-baselines-*`` markers (never hand-edited). Non-increasing in epsilon is checked within
2 std of the fold spread (the larger of the two neighbours' stds).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import time
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from dprec_torch.study.markers import splice
from dprec_torch.training.run import train

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "mf.md"
DATASETS = ("ml-100k", "ml-1m")
FIG1_EPS = ("0.1", "0.5", "1", "2", "5", "10", "20", "50")  # conf/study/fig1.yaml
FIG2_EPS = ("2", "10", "20", "100", "200")  # conf/study/fig2.yaml
GAUSSIAN_USER = ("mechanism.unit=user", "mechanism.sampling_ratio=0.2", "mechanism.clip_norm=1", "mechanism.lr=1",
                 "mechanism.weight_decay=10", "mechanism.epochs=10")  # conf/tuned/gaussian_mf.yaml's comment
# (block, label, mechanism, epsilons, extra overrides (all datasets), extra overrides per dataset)
ROWS = [
    # non-private: the plain command, no overrides (conf/tuned/none_mf.yaml: one per-rating setting for both datasets)
    ("none", "MF, non-private (the plain command: conf/tuned/none_mf.yaml)", "none", ("inf",), (), {}),
    ("dpsgd_mf", "DPSGD-MF (Berlioz; ε per rating value)", "dpsgd_paper", FIG1_EPS, (), {}),
    ("dpps_mf", "DPPS-MF (sgld_paper, ρ = 1; user level)", "sgld_paper", FIG2_EPS, (), {}),
    ("gaussian", "Gaussian DP-SGD, unit=rating", "gaussian", ("1", "10"), ("mechanism.unit=rating",), {}),
    ("gaussian", "Gaussian DP-SGD, unit=user (q = 0.2, c = 1, lr = 1, λ = 10, 10 epochs)", "gaussian", ("1", "10"), GAUSSIAN_USER, {}),
]


def run_one(runs_dir: Path, data: str, fold: int, mech: str, eps: str, extra: tuple[str, ...]) -> dict:
    overrides = [f"data={data}", f"data.fold={fold}", "model=mf", f"mechanism={mech}", f"epsilon={eps}",
                 "compare_baselines=false", "tensorboard=false", *extra]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    # the cache key holds the composed model and mechanism: a changed default (a yaml edit) is a new run, never a stale read
    nodes = json.dumps([OmegaConf.to_container(cfg[k], resolve=True) for k in ("model", "mechanism")], sort_keys=True)
    tag = "_".join([data, f"fold{fold}", mech, f"eps{eps}", *[e.split(".")[-1].replace("=", "-") for e in extra]])
    tag = (tag if len(tag) < 120 else tag[:80]) + "_" + hashlib.sha1(f"{tag} {nodes}".encode()).hexdigest()[:8]
    run_dir = runs_dir / tag
    if not (run_dir / "metrics.json").exists():
        cfg.output_dir = str(run_dir)
        t0 = time.perf_counter()
        train(cfg)
        logging.info("%s done in %.0fs", tag, time.perf_counter() - t0)
    return json.loads((run_dir / "metrics.json").read_text())


def fmt(vals: list[float]) -> str:
    if not vals:
        return "-"
    return f"{np.mean(vals):.4f}" + (f" ± {np.std(vals):.4f}" if len(vals) > 1 else "")


def monotone(cells: list[list[float]]) -> str:
    """'yes' when the mean RMSE never rises by more than 2 std (fold spread) from one epsilon to the next."""
    means = [float(np.mean(c)) for c in cells]
    stds = [float(np.std(c)) if len(c) > 1 else 0.0 for c in cells]
    bad = [i for i in range(1, len(means)) if means[i] > means[i - 1] + 2 * max(stds[i], stds[i - 1])]
    return "yes" if not bad else "NO (rises at eps index " + ", ".join(map(str, bad)) + ")"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs-dir", type=Path, default=ROOT / "outputs" / "studies" / "mf_baselines")
    ap.add_argument("--folds-100k", type=int, nargs="*", default=[1, 2, 3, 4, 5])
    ap.add_argument("--folds-1m", type=int, nargs="*", default=[1, 2, 3, 4, 5])
    ap.add_argument("--only", nargs="*", default=None, help="blocks to run (none dpsgd_mf dpps_mf gaussian)")
    ap.add_argument("--no-splice", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    folds = {"ml-100k": args.folds_100k, "ml-1m": args.folds_1m}
    tables: dict[str, list[str]] = {}
    for block, label, mech, epsilons, extra_all, extra_data in ROWS:
        if args.only and block not in args.only:
            continue
        lines = tables.setdefault(block, [])
        for data in DATASETS:
            if not folds[data]:
                continue
            cells, seconds = [], []
            for eps in epsilons:
                extra = (*extra_all, *extra_data.get(data, ()))
                ms = [run_one(args.runs_dir, data, k, mech, eps, extra) for k in folds[data]]
                cells.append([m["test_rmse"] for m in ms])
                seconds.append(np.mean([f["fit_seconds"] for m in ms for f in m["folds"]]))
            eps_cells = " | ".join(fmt(c) for c in cells)
            folds_s = ",".join(map(str, folds[data]))
            mono = monotone(cells) if len(cells) > 1 else "-"
            note = " (" + " ".join(extra_data[data]) + ")" if extra_data.get(data) else ""
            per_fold = ", ".join(f"{v:.4f}" for v in cells[-1])  # the largest epsilon's folds, in fold order
            lines.append(f"| {label}{note} | {data} | {folds_s} | {eps_cells} | {mono} | {per_fold} | {max(seconds):.0f} |")
        header = {"none": "ε = ∞", "dpsgd_mf": " | ".join(f"ε = {e}" for e in FIG1_EPS),
                  "dpps_mf": " | ".join(f"ε = {e}" for e in FIG2_EPS), "gaussian": "ε = 1 | ε = 10"}[block]
        ncol = len(header.split("|"))
        tables[block] = [f"| method | data | folds | {header} | non-increasing in ε | per fold (largest ε) | fit s (max) |",
                         "|---|---|---|" + "---|" * ncol + "---|---|---|"] + [ln for ln in lines if not ln.startswith("| method")
                                                                         and not ln.startswith("|---")]
    for block, lines in tables.items():
        body = "\n".join(lines)
        print(f"\n[{block}]\n{body}")
        if not args.no_splice:
            splice(DOC, f"mf-baselines-{block}", body)


if __name__ == "__main__":
    main()
