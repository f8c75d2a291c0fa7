"""Fit and check the low-rank PNBM's size rule (issue 34) on OTHER people's data, on validation splits only.

The rule (:mod:`dprec_torch.privacy.size_rule`) turns the public sizes of a fold (N users, M items), (eps, delta) and
"a catalogue is attached" into the knobs of the default mechanisms. This script measures it:

* ``make``: the fitting data, each a train/validation pair of tab-separated files (80/20 per user, seeded) read by
  ``data=custom``; the validation side is the only thing scored, no test fold of any dataset is read:
    - ``ml1m-<n>``: n random ML-1M users with all their ratings (used to fit the rule for ML-100K runs: no user in
      common with ML-100K);
    - ``ml100k``: ML-100K's u1.base split 80/20 per user (used, with synthetic data, to fit the rule for ML-1M runs).
  Synthetic data (``data=synthetic preset=ml-1m``, its own seeded hold-out) needs no files.
* ``grid``: runs configurations (overrides) on a set of fitting datasets and writes every validation RMSE to JSON.

    python experiments/studies/pnbm_lowrank_size_rule.py make --out /tmp/size_rule
    python experiments/studies/pnbm_lowrank_size_rule.py grid --sets ml1m-500 ml1m-1000 --mechanism sgld --epsilon 20 \
        --space '{"mechanism.lr": [3, 10]}' --out /tmp/grid.json

* ``sweep``: MEASUREMENT of the frozen rule, the commands as typed (``python train.py mechanism=<m> epsilon=<e>``, the
  references on) over eps in {0.5, 1, 2, 5, 10, 20, 50}: the model beside its own DP-means reference, the first and last
  epoch's test RMSE and the knobs the rule chose (``docs/results/pnbm_lowrank/size_rule_sweep.json``).
* ``report``: ``docs/results/pnbm_lowrank/size_rule.json`` and the tables of docs/pnbm_lowrank.md (``size_rule`` markers)
  from the grid with every knob ``auto`` (``--rule``) against the same grid with the means only (``--means``) and the sweeps.

The measurements in the docs (2 noise seeds each; ``S="ml100k ml1m-500 ml1m-1000 ml1m-2000"``)::

    python experiments/studies/pnbm_lowrank_size_rule.py grid --sets $S --epsilon 2 5 10 20 50 --seeds 2 --out /tmp/s34/rule_sgld.json
    python experiments/studies/pnbm_lowrank_size_rule.py grid --sets $S --epsilon 2 5 10 20 50 --seeds 2 --out /tmp/s34/means_sgld.json \
        --fixed mechanism.sampling_ratio=1.0 mechanism.clip_norm=0.5 --space '{"mechanism.epochs":[1],"mechanism.mean_fraction":[0.99],"mechanism.lr":[0.001]}'
    python experiments/studies/pnbm_lowrank_size_rule.py sweep --mechanisms sgld dpsgd gaussian
    python experiments/studies/pnbm_lowrank_size_rule.py sweep --mechanisms sgld dpsgd gaussian --extra data=ml-1m data.fold=1 --tag "ml-1m fold 1"
    python experiments/studies/pnbm_lowrank_size_rule.py report

The fitting grids (``rule.nu=<nu>`` in ``--space`` sets the step of the rule's formula (1) for that per-entry noise) are
listed with their results in docs/pnbm_lowrank.md, "The size rule".

Every run: one thread (``OMP_NUM_THREADS=1``), explicit noise seeds (published: the figures are measurements, not
releases), no TensorBoard, no references unless asked.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
DATA = Path(os.environ.get("DPREC_DATA", ROOT.parent / "shared" / "data"))


def _split(rows: np.ndarray, rng: np.random.Generator, fraction: float = 0.2) -> np.ndarray:
    is_val = np.zeros(len(rows), dtype=bool)
    order = np.argsort(rows[:, 0], kind="stable")
    users, starts = np.unique(rows[order, 0], return_index=True)
    ends = np.append(starts[1:], len(rows))
    for s, e in zip(starts, ends):
        idx = order[s:e]
        k = int(round(fraction * len(idx)))
        is_val[rng.choice(idx, size=k, replace=False)] = True
    return is_val


def _write(out: Path, rows: np.ndarray, is_val: np.ndarray, catalog: Path, info: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    np.savetxt(out / "train.tsv", rows[~is_val], fmt="%d", delimiter="\t")
    np.savetxt(out / "valid.tsv", rows[is_val], fmt="%d", delimiter="\t")
    info = {**info, "users": int(len(np.unique(rows[:, 0]))), "items_rated": int(len(np.unique(rows[:, 1]))),
            "train": int((~is_val).sum()), "valid": int(is_val.sum()), "catalog": str(catalog)}
    (out / "README.json").write_text(json.dumps(info, indent=1))


def make(out: Path, sizes: list[int], seed: int = 0) -> None:
    lines = (DATA / "ml-1m" / "ratings.dat").read_text().splitlines()
    ml1m = np.array([[int(x) for x in ln.split("::")[:3]] for ln in lines], dtype=np.int64)
    users = np.unique(ml1m[:, 0])
    for n in sizes:
        rng = np.random.default_rng(seed + n)
        chosen = rng.choice(users, size=min(n, len(users)), replace=False)
        rows = ml1m[np.isin(ml1m[:, 0], chosen)]
        _write(out / f"ml1m-{n}", rows, _split(rows, rng), DATA / "ml-1m" / "movies.dat",
               {"source": f"ML-1M, {n} random users (seed {seed + n}), all their ratings, 80/20 per user"})
    rows = np.loadtxt(DATA / "ml-100k" / "u1.base", dtype=np.int64)[:, :3]
    rng = np.random.default_rng(seed)
    _write(out / "ml100k", rows, _split(rows, rng), DATA / "ml-100k" / "u.item",
           {"source": "ML-100K u1.base (u1's TRAIN side only), 80/20 per user; u1.test is never read"})


def data_args(root: Path, name: str) -> list[str]:
    if name.startswith("synthetic"):  # synthetic-<preset>: its own seeded hold-out (synthetic people)
        return ["data=synthetic", f"data.preset={name.split('-', 1)[1]}", "data.fold=1"]
    d = root / name
    info = json.loads((d / "README.json").read_text())
    return ["data=custom", f"data.train_path={d / 'train.tsv'}", f"data.test_path={d / 'valid.tsv'}",
            "data.rating_scale=[1,5]", f"data.catalog_path={info['catalog']}"]


BASE = ["device=cpu", "tensorboard=false"]


def run_one(root: Path, name: str, overrides: list[str], seed: int, out: str, references: bool = False) -> dict:
    import dprec_torch
    from dprec_torch.errors import TrainingDiverged

    t0 = time.perf_counter()
    try:
        run = dprec_torch.train([*BASE, *data_args(root, name), *overrides, f"noise_seed={seed}",
                                 f"compare_baselines={'true' if references else 'false'}", f"output_dir={out}"])
    except TrainingDiverged:
        return {"rmse": float("nan"), "seconds": time.perf_counter() - t0}
    m = run.metrics
    rec = {"rmse": m["test_rmse"], "seconds": time.perf_counter() - t0,
           "epoch_rmse": [h.get("test_rmse") for h in next(iter(m.get("history", {}).values()), [])][:1]
           + [h.get("test_rmse") for h in next(iter(m.get("history", {}).values()), [])][-1:],
           "epsilon": m["privacy"].get("epsilon"), "knobs": m["privacy"].get("size_rule")}
    if references:
        rec["references"] = {k: v.get("rmse") for k, v in m.get("baselines", {}).items()}
    return rec


def n_users_of(root: Path, name: str) -> int:
    if name.startswith("synthetic"):
        from dprec_torch.data.synthetic import PRESETS

        return PRESETS[name.split("-", 1)[1]][0]
    return int(json.loads((root / name / "README.json").read_text())["users"])


def rule_overrides(root: Path, name: str, mechanism: str, eps: float, over: list[str]) -> list[str]:
    """``rule.nu=<nu>``: the step of the rule's (1) for that per-entry noise (size_rule.gaussian_step / laplace_step) at
    the run's N, eps, mean share, clip and epochs; the other overrides pass through."""
    from dprec_torch.privacy import size_rule as R

    nu = [float(o.split("=", 1)[1]) for o in over if o.startswith("rule.nu=")]
    rest = [o for o in over if not o.startswith("rule.")]
    if not nu:
        return rest
    get = {o.split("=", 1)[0]: o.split("=", 1)[1] for o in rest}
    m = float(get.get("mechanism.mean_fraction", R.SHARE_HIGH))
    clip = float(get.get("mechanism.clip_norm", 0.5))
    steps = int(get.get("mechanism.epochs", 20))
    n = n_users_of(root, name)
    lr = (R.gaussian_step(nu[0], n, eps, 1e-6, m, clip, steps) if mechanism != "dpsgd"
          else R.laplace_step(nu[0], n, eps, m, clip, steps))
    return [*rest, f"mechanism.lr={lr:.4g}"]


def grid(root: Path, sets: list[str], mechanism: str, epsilons: list[float], space: dict, fixed: list[str], seeds: int,
         out: Path, references: bool = False) -> None:
    import torch

    torch.set_num_threads(1)
    results = json.loads(out.read_text())["results"] if out.exists() else []
    done = {(r["set"], r["epsilon"], tuple(r["overrides"])) for r in results}
    keys = list(space)
    for name in sets:
        for eps in epsilons:
            for values in itertools.product(*(space[k] for k in keys)):
                over = [f"mechanism={mechanism}", f"epsilon={eps}", *fixed, *(f"{k}={v}" for k, v in zip(keys, values))]
                over = rule_overrides(root, name, mechanism, eps, over)
                if (name, eps, tuple(over)) in done:
                    continue
                recs = [run_one(root, name, over, 100 + s, f"/tmp/size_rule_runs/{os.getpid()}_{len(results)}_{s}", references)
                        for s in range(seeds)]
                row = {"set": name, "epsilon": eps, "overrides": over, "rmse": float(np.mean([r["rmse"] for r in recs])),
                       "runs": recs}
                results.append(row)
                print(f"{name:>14} eps={eps:<5g} {row['rmse']:.4f}  {' '.join(over[2:])}  "
                      f"({sum(r['seconds'] for r in recs):.0f} s)", flush=True)
                out.write_text(json.dumps({"results": results}, indent=1))


def sweep(mechanisms: list[str], epsilons: list[float], extra: list[str], out: Path, tag: str) -> None:
    """The commands as typed (``python train.py mechanism=<m> epsilon=<e> <extra>``) on real data, noise seed 1, the
    references on: the model's test RMSE beside its own DP-means reference and PCC/COS, the rule's knobs, and the
    test RMSE of the first and last epoch. MEASUREMENT only: nothing here chooses a knob."""
    import torch

    import dprec_torch

    torch.set_num_threads(1)
    results = json.loads(out.read_text()) if out.exists() else {}
    rows = results.setdefault(tag, [])
    done = {(r["mechanism"], r["epsilon"]) for r in rows}
    for mech in mechanisms:
        for eps in epsilons:
            if (mech, eps) in done:
                continue
            t0 = time.perf_counter()
            over = [f"mechanism={mech}", f"epsilon={eps}", *extra]
            run = dprec_torch.train([*over, "noise_seed=1", "tensorboard=false", "device=cpu",
                                     f"output_dir=/tmp/size_rule_sweep/{tag}_{mech}_{eps}"])
            m = run.metrics
            hist = next(iter(m.get("history", {}).values()), [])
            rec = {"command": "python train.py " + " ".join(over), "mechanism": mech, "epsilon": eps,
                   "test_rmse": m["test_rmse"], "references": {k: v.get("rmse") for k, v in m.get("baselines", {}).items()},
                   "epoch_first": hist[0].get("test_rmse") if hist else None,
                   "epoch_last": hist[-1].get("test_rmse") if hist else None,
                   "defended_epsilon": m["privacy"].get("epsilon"), "size_rule": m["privacy"].get("size_rule"),
                   "seconds": time.perf_counter() - t0}
            rows.append(rec)
            ref = next((v for k, v in rec["references"].items() if k not in ("PCC", "COS")), None)
            print(f"{tag} {mech:>8} eps={eps:<5g} {rec['test_rmse']:.4f}  DP-means ref {ref}  "
                  f"epochs {rec['epoch_first']}->{rec['epoch_last']}  ({rec['seconds']:.0f} s)", flush=True)
            out.write_text(json.dumps(results, indent=1))


def report(rule: Path, means: Path, sweep_path: Path, out: Path) -> str:
    """The measurements as one JSON (``out``) and the markdown tables of docs/pnbm_lowrank.md ("The rule on one screen").
    ``rule``: grid runs with every knob ``auto`` (the frozen rule); ``means``: the same sets and eps with the means only
    (m = 0.99, one step of 1e-3: U does not move)."""
    from dprec_torch.privacy import size_rule as R

    def table(path: Path) -> dict:
        rows = json.loads(path.read_text())["results"] if path.exists() else []
        return {(r["set"], r["epsilon"]): r for r in rows}

    ru, me = table(rule), table(means)
    sets = sorted({k[0] for k in ru}, key=lambda n: n_users_of(Path("/tmp/size_rule"), n) if not n.startswith("syn") else 1e9)
    eps = sorted({k[1] for k in ru})
    records, lines = [], ["| fitting set (N users) | " + " | ".join(f"eps = {e:g}" for e in eps) + " |",
                          "|---|" + "---|" * len(eps)]
    for name in sets:
        n = n_users_of(Path("/tmp/size_rule"), name)
        cells = []
        for e in eps:
            r, m = ru.get((name, e)), me.get((name, e))
            if r is None:
                cells.append("–")
                continue
            k = R.rule_knobs("sgld", n, 0, e, 1e-6, True)
            kappa = R.noise_level("sgld", n, e, 1e-6)
            gap = None if m is None else r["rmse"] - m["rmse"]
            records.append({"set": name, "n_users": n, "epsilon": e, "kappa": kappa, "knobs": k.__dict__,
                            "rmse_rule": r["rmse"], "rmse_means_only": None if m is None else m["rmse"],
                            "rule_minus_means_only": gap, "runs_rule": [x["rmse"] for x in r["runs"]],
                            "runs_means_only": None if m is None else [x["rmse"] for x in m["runs"]]})
            cells.append(f"{r['rmse']:.4f} ({'' if gap is None else f'{gap:+.4f}'}; κ {kappa:.0f}"
                         f"{', lr ' + format(k.lr, '.3g') + ', m ' + format(k.mean_fraction, '.2f') if k.learns else ', means only'})")
        lines.append(f"| {name} ({n}) | " + " | ".join(cells) + " |")
    sweep_rows = json.loads(sweep_path.read_text()) if sweep_path.exists() else {}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rule": "dprec_torch/privacy/size_rule.py", "validation_grid": records,
                               "constants": {k: getattr(R, k) for k in dir(R) if k.isupper() and not k.startswith("_")},
                               "sweeps": sweep_rows}, indent=1, default=str))
    md = "\n".join(lines)
    for tag, rows in sweep_rows.items():
        md += f"\n\n{tag}: " + "\n\n| command | test RMSE | DP-means reference | PCC | epoch 1 → last | knobs |\n|---|---|---|---|---|---|"
        for r in rows:
            ref = next((v for k, v in r["references"].items() if k not in ("PCC", "COS")), None)
            k = (r.get("size_rule") or {}).get("knobs") or {}
            kn = (f"lr {k['lr']:.3g}, m {k['mean_fraction']:.2f}, T {k['epochs']}" if k.get("learns") else "means only") if k else "–"
            md += (f"\n| `{r['command']}` | {r['test_rmse']:.4f} | {'–' if ref is None else f'{ref:.4f}'} | "
                   f"{r['references'].get('PCC', float('nan')):.4f} | {r['epoch_first']:.4f} → {r['epoch_last']:.4f} | {kn} |")
    return md


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--out", type=Path, default=Path("/tmp/size_rule"))
    m.add_argument("--sizes", type=int, nargs="*", default=[500, 1000, 2000, 6040])
    g = sub.add_parser("grid")
    g.add_argument("--root", type=Path, default=Path("/tmp/size_rule"))
    g.add_argument("--sets", nargs="+", required=True)
    g.add_argument("--mechanism", default="sgld")
    g.add_argument("--epsilon", type=float, nargs="+", default=[20.0])
    g.add_argument("--space", default="{}")
    g.add_argument("--fixed", nargs="*", default=[])
    g.add_argument("--seeds", type=int, default=1)
    g.add_argument("--references", action="store_true")
    g.add_argument("--out", type=Path, required=True)
    w = sub.add_parser("sweep")
    w.add_argument("--mechanisms", nargs="+", default=["dpsgd", "sgld"])
    w.add_argument("--epsilon", type=float, nargs="+", default=[0.5, 1, 2, 5, 10, 20, 50])
    w.add_argument("--extra", nargs="*", default=[])
    w.add_argument("--tag", default="ml-100k u1")
    w.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "pnbm_lowrank" / "size_rule_sweep.json")
    r = sub.add_parser("report")
    r.add_argument("--rule", type=Path, default=Path("/tmp/s34/rule_sgld.json"))
    r.add_argument("--means", type=Path, default=Path("/tmp/s34/means_sgld.json"))
    r.add_argument("--sweep", type=Path, default=ROOT / "docs" / "results" / "pnbm_lowrank" / "size_rule_sweep.json")
    r.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "pnbm_lowrank" / "size_rule.json")
    a = ap.parse_args()
    if a.cmd == "report":
        from dprec_torch.study.markers import splice

        md = report(a.rule, a.means, a.sweep, a.out)
        splice(ROOT / "docs" / "pnbm_lowrank.md", "size_rule", md)
        print(md)
    elif a.cmd == "sweep":
        sweep(a.mechanisms, a.epsilon, a.extra, a.out, a.tag)
    elif a.cmd == "make":
        make(a.out, a.sizes)
    else:
        grid(a.root, a.sets, a.mechanism, a.epsilon, json.loads(a.space), a.fixed, a.seeds, a.out, a.references)


if __name__ == "__main__":
    main()
