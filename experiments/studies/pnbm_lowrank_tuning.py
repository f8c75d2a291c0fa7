"""Choose the low-rank PNBM's defaults on OTHER people's data (issue 27, "Defaults that learn"; issue 24, 2).

The design card's command ``python train.py mechanism=sgld epsilon=20`` runs on ML-100K. Its defaults are chosen here
on a stand-in of ML-100K's size drawn from ML-1M's users (disjoint people: ML-1M and ML-100K share no users), never
on ML-100K's ratings and never on a test fold of the data the defaults serve:

* ``subsample``: 943 ML-1M users drawn at random (seed 0), each user's ratings thinned to 64 % so the total is about
  ML-100K's 100K, then split 80/20 per user into train/test (ML-100K u1's proportions). Written as two tab-separated
  files that ``data=custom data.train_path=... data.test_path=...`` reads.
* ``grid``: each configuration trained on the stand-in's train side and scored on its test side; the table is
  printed and written as JSON. The winner goes into ``conf/tuned/<mechanism>_pnbm.yaml`` with this provenance.

    python experiments/studies/pnbm_lowrank_tuning.py subsample --ml1m $DPREC_DATA/ml-1m --out /tmp/ml1m-943
    python experiments/studies/pnbm_lowrank_tuning.py grid --data /tmp/ml1m-943 --epsilon 20 --out /tmp/grid.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import numpy as np


def subsample(ml1m: Path, out: Path, n_users: int = 943, keep: float = 0.64, test_fraction: float = 0.2, seed: int = 0,
              n_items: int | None = None) -> dict:
    lines = (ml1m / "ratings.dat").read_text().splitlines()
    rows = np.array([[int(x) for x in ln.split("::")[:3]] for ln in lines], dtype=np.int64)
    rng = np.random.default_rng(seed)
    if n_items is not None:  # ML-100K's catalogue size: ML-1M's n_items most rated movies (counted over all of ML-1M)
        ids, counts = np.unique(rows[:, 1], return_counts=True)
        rows = rows[np.isin(rows[:, 1], ids[np.argsort(-counts, kind="stable")[:n_items]])]
    users = np.unique(rows[:, 0])
    chosen = set(rng.choice(users, size=n_users, replace=False).tolist())
    rows = rows[np.isin(rows[:, 0], list(chosen))]
    rows = rows[rng.random(len(rows)) < keep]
    is_test = np.zeros(len(rows), dtype=bool)
    for u in np.unique(rows[:, 0]):
        idx = np.nonzero(rows[:, 0] == u)[0]
        k = int(round(test_fraction * len(idx)))
        is_test[rng.choice(idx, size=k, replace=False)] = True
    out.mkdir(parents=True, exist_ok=True)
    for name, sel in (("train.tsv", ~is_test), ("test.tsv", is_test)):
        np.savetxt(out / name, rows[sel], fmt="%d", delimiter="\t")
    info = {"users": len(np.unique(rows[:, 0])), "items": len(np.unique(rows[:, 1])), "ratings": len(rows),
            "train": int((~is_test).sum()), "test": int(is_test.sum()), "seed": seed, "keep": keep, "n_items": n_items}
    (out / "README.json").write_text(json.dumps(info, indent=1))
    return info


BASE = ["model=pnbm_lowrank", "device=cpu", "compare_baselines=false", "tensorboard=false"]


def data_args(data: Path) -> list[str]:
    return ["data=custom", f"data.train_path={data / 'train.tsv'}", f"data.test_path={data / 'test.tsv'}",
            "data.rating_scale=[1,5]"]


def grid(data: Path, epsilon: float, out: Path, mechanism: str, space: dict[str, list], fixed: list[str], seeds: int) -> list[dict]:
    import dprec_torch
    from dprec_torch.errors import TrainingDiverged

    keys = list(space)
    results = []
    for values in itertools.product(*(space[k] for k in keys)):
        over = [f"{k}={v}" for k, v in zip(keys, values)]
        rmses, t0 = [], time.perf_counter()
        for s in range(seeds):
            try:
                run = dprec_torch.train([*BASE, *data_args(data), f"mechanism={mechanism}", f"epsilon={epsilon}", *fixed, *over,
                                         f"noise_seed={100 + s}", f"output_dir=/tmp/pnbm_lowrank_grid/{len(results)}_{s}"])
                rmses.append(run.metrics["test_rmse"])
            except TrainingDiverged:
                rmses.append(float("nan"))
        row = {"overrides": over, "rmse": float(np.mean(rmses)), "rmse_runs": rmses, "seconds": time.perf_counter() - t0}
        results.append(row)
        print(f"{row['rmse']:.4f}  {' '.join(over)}  ({row['seconds']:.0f} s)", flush=True)
        out.write_text(json.dumps({"epsilon": epsilon, "mechanism": mechanism, "fixed": fixed, "results": results}, indent=1))
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("subsample")
    s.add_argument("--ml1m", type=Path, required=True)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--items", type=int, default=None, help="keep ML-1M's N most rated movies (1682: ML-100K's catalogue size)")
    s.add_argument("--keep", type=float, default=0.64, help="share of each chosen user's ratings kept")
    g = sub.add_parser("grid")
    g.add_argument("--data", type=Path, required=True)
    g.add_argument("--epsilon", type=float, default=20.0)
    g.add_argument("--mechanism", default="sgld")
    g.add_argument("--out", type=Path, required=True)
    g.add_argument("--space", default="{}", help='JSON: {"mechanism.lr": [2, 5], ...}')
    g.add_argument("--fixed", nargs="*", default=[])
    g.add_argument("--seeds", type=int, default=1)
    a = ap.parse_args()
    if a.cmd == "subsample":
        print(json.dumps(subsample(a.ml1m, a.out, keep=a.keep, n_items=a.items)))
    else:
        grid(a.data, a.epsilon, a.out, a.mechanism, json.loads(a.space), a.fixed, a.seeds)


if __name__ == "__main__":
    main()
