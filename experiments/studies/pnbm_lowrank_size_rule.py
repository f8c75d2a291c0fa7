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
* ``constants``: a coordinate-wise check of the default run's constants the rule does not set (the model's rank,
  init_std, clamp_r, beta_p, feature_reg; the item means' mean_prior_std, mean_popularity_*, count_weight) per data
  population, on the other people's validation splits (``CONSTANT_SIDES``), with a second pass for any the first flags
  (``CONFIRM``): ``docs/results/pnbm_lowrank/size_rule_constants.json`` (``python ... constants``; needs ``make``).
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


#: the default run's remaining constants (not set by the rule), each with the values the ``constants`` check tries
#: around it (the package's current value among them); which mechanisms' files carry each mechanism key
CONSTANTS: dict[str, list[float]] = {
    "model.rank": [4, 8, 16], "model.init_std": [0.01, 0.03, 0.1], "model.clamp_r": [0.5, 1.0, 2.0],
    "model.beta_p": [2.0, 5.0, 10.0], "model.feature_reg": [3.0, 10.0, 30.0],
    "mechanism.mean_prior_std": [0.25, 0.5, 1.0], "mechanism.mean_popularity_alpha": [0.0, 0.5, 1.0],
    "mechanism.mean_popularity_share": [0.1, 0.2, 0.4], "mechanism.count_weight": [0.1, 0.3, 1.0],
}
#: (mechanism, eps, the constants checked there): sgld at eps = 20 (U learns on both fitting sets: kappa ~ 3,000) checks
#: every one; gaussian at eps = 10 (means only on both: kappa ~ 1,700) the ones that act without U; dpsgd at eps = 10 the
#: two its file carries
CONSTANT_SETTINGS: list[tuple[str, float, list[str]]] = [
    ("sgld", 20.0, list(CONSTANTS)),
    ("gaussian", 10.0, ["model.beta_p", "model.feature_reg", "mechanism.mean_prior_std", "mechanism.mean_popularity_alpha",
                        "mechanism.mean_popularity_share", "mechanism.count_weight"]),
    ("dpsgd", 10.0, ["mechanism.mean_prior_std", "mechanism.count_weight"]),
]
#: the data population a default run serves -> the fitting sets the constants are checked on (no user in common)
CONSTANT_SIDES = {"ml-100k": ["ml1m-1000"], "ml-1m": ["ml100k"]}
#: second pass, for a constant the first pass found better elsewhere on either side (added after the first pass:
#: clamp_r = 2 beat 1 by 0.0030 on ML-100K-val, tolerance 0.0026, and by 0.0019 on ML-1M users, at the grid's edge):
#: the grid extended past the edge, sgld at eps = 20 and 50 (U learns at both on both sides), CONFIRM_SEEDS noise
#: seeds; its verdict replaces the first pass's for that constant
CONFIRM: dict[str, list[float]] = {"model.clamp_r": [1.0, 2.0, 4.0]}
CONFIRM_EPS, CONFIRM_SEEDS = (20.0, 50.0), 6


def _package_value(mechanism: str, key: str):
    from hydra import compose, initialize_config_dir

    from dprec_torch.config import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        # data=custom as the fitting sets are read (people unknown): the value those runs got
        cfg = compose(config_name="config", overrides=[f"mechanism={mechanism}", "model=pnbm_lowrank", "data=custom"])
    node, _, k = key.partition(".")
    return cfg[node][k]


def constants(root: Path, seeds: int, cache: Path, out: Path) -> dict:
    """Coordinate-wise check of the default run's remaining constants (``CONSTANTS``) on OTHER people's validation
    splits (``CONSTANT_SIDES``): each constant over its values with the others at the package's, the rule's knobs
    ``auto``, ``seeds`` noise seeds. Noise: s = the pooled per-run std between the seeds of one configuration; a
    value is better than the package's only if its mean beats it by more than ``tol = max(0.001, 2 s)`` (s is the
    std of the difference of two ``seeds``-seed means for 2 seeds) in every setting that checks it, on that side."""
    import torch

    torch.set_num_threads(1)
    runs = json.loads(cache.read_text()) if cache.exists() else {}
    package = {m: {k: _package_value(m, k) for k in keys} for m, _, keys in CONSTANT_SETTINGS}  # before any run
    sides: dict = {}
    for side, sets in CONSTANT_SIDES.items():
        settings = []
        for mech, eps, keys in CONSTANT_SETTINGS:
            current = package[mech]
            configs = [("package", [])] + [(f"{k}={v:g}", [f"{k}={v:g}"]) for k in keys for v in CONSTANTS[k]
                                             if float(v) != float(current[k])]
            table = {}
            for name in sets:
                for label, over in configs:
                    tag = f"{name}|{mech}|{eps:g}|{label}"
                    if tag not in runs:
                        o = [f"mechanism={mech}", f"epsilon={eps}", *over]
                        runs[tag] = [run_one(root, name, o, 100 + s, f"/tmp/size_rule_runs/c_{os.getpid()}_{s}")["rmse"]
                                     for s in range(seeds)]
                        print(f"{side:>8} {name:>10} {mech:>8} eps={eps:<4g} {np.mean(runs[tag]):.4f} {label}", flush=True)
                        cache.write_text(json.dumps(runs, indent=1))
                    table.setdefault(label, []).append(runs[tag])
            rmse = {lab: float(np.mean([np.mean(r) for r in rs])) for lab, rs in table.items()}
            pairs = [r for rs in table.values() for r in rs if len(r) > 1]
            s = float(np.sqrt(np.mean([np.var(r, ddof=1) for r in pairs]))) if pairs else 0.0
            tol = max(0.001, 2.0 * s)
            checked = {}
            for k in keys:
                vals = {float(current[k]): rmse["package"], **{float(v): rmse[f"{k}={v:g}"] for v in CONSTANTS[k]
                                                                 if float(v) != float(current[k])}}
                best = min(vals, key=vals.get)
                checked[k] = {"package": float(current[k]), "rmse": {f"{v:g}": r for v, r in sorted(vals.items())},
                              "best": best, "package_minus_best": vals[float(current[k])] - vals[best],
                              "package_within_noise": vals[float(current[k])] - vals[best] <= tol}
            settings.append({"mechanism": mech, "epsilon": eps, "sets": sets, "seeds": seeds, "run_std": s,
                             "tolerance": tol, "constants": checked})
        confirmation = {}
        for k, values in CONFIRM.items():
            cur = float(package["sgld"][k])
            per_eps = []
            for eps in CONFIRM_EPS:
                res = {}
                for v in values:
                    over = [] if float(v) == cur else [f"{k}={v:g}"]
                    seeds_rmse = []
                    for name in sets:
                        for sd in range(CONFIRM_SEEDS):
                            tag = f"confirm|{name}|sgld|{eps:g}|{k}={v:g}|{sd}"
                            if tag not in runs:
                                o = ["mechanism=sgld", f"epsilon={eps}", *over]
                                runs[tag] = run_one(root, name, o, 100 + sd, f"/tmp/size_rule_runs/c_{os.getpid()}_{sd}")["rmse"]
                                print(f"{side:>8} {name:>10} confirm eps={eps:<4g} {k}={v:g} seed {sd}: {runs[tag]:.4f}", flush=True)
                                cache.write_text(json.dumps(runs, indent=1))
                            seeds_rmse.append(runs[tag])
                    res[f"{v:g}"] = seeds_rmse
                means = {lab: float(np.mean(r)) for lab, r in res.items()}
                sd_run = float(np.sqrt(np.mean([np.var(r, ddof=1) for r in res.values()])))
                tol = max(0.001, 2.0 * sd_run * np.sqrt(2.0 / len(next(iter(res.values())))))
                best = min(means, key=means.get)
                per_eps.append({"epsilon": eps, "rmse": means, "runs": res, "run_std": sd_run, "tolerance": tol,
                                "best": float(best), "package_minus_best": means[f"{cur:g}"] - means[best]})
            # the values that beat the package's by more than the noise at every eps; of those within the noise of the
            # best of them (mean over eps), the one nearest the package's value (the smallest change)
            better = [float(v) for v in values if float(v) != cur and all(
                e["rmse"][f"{cur:g}"] - e["rmse"][f"{v:g}"] > e["tolerance"] for e in per_eps)]
            mean = {v: float(np.mean([e["rmse"][f"{v:g}"] for e in per_eps])) for v in better}
            tol = max(e["tolerance"] for e in per_eps)
            near = sorted((v for v in better if mean[v] - min(mean.values()) <= tol), key=lambda v: abs(np.log(v / cur)))
            confirmation[k] = {"package": cur, "values": values, "epsilons": list(CONFIRM_EPS), "seeds": CONFIRM_SEEDS,
                               "per_epsilon": per_eps, "better_at_every_eps": better,
                               "chosen": near[0] if near else cur, "keep": not near}
        verdict = {}
        for k in CONSTANTS:
            found = [st["constants"][k] for st in settings if k in st["constants"]]
            keep = all(f["package_within_noise"] for f in found)
            bests = {f["best"] for f in found}
            verdict[k] = {"package": found[0]["package"], "keep": keep,
                          "chosen": found[0]["package"] if keep or len(bests) > 1 else bests.pop(),
                          "why": ("the package's value is best or within the noise of the best in every setting" if keep
                                  else "the settings disagree on a better value: kept" if len(bests) > 1
                                  else "another value beats it by more than the noise in every setting that checks it")}
        for k, c in confirmation.items():
            verdict[k] = {"package": c["package"], "keep": c["keep"], "chosen": c["chosen"], "first_pass": verdict[k],
                          "why": ("second pass (CONFIRM): " + ("no other value beats the package's by more than the noise at every eps"
                                  if c["keep"] else f"{c['chosen']:g} beats it by more than the noise at every eps"))}
        sides[side] = {"fitting_sets": sets, "settings": settings, "confirmation": confirmation, "verdict": verdict}
    doc = {"procedure": constants.__doc__.strip(), "command": "python experiments/studies/pnbm_lowrank_size_rule.py constants",
           "validation_only": "each fitting set's validation side (80/20 per user of ML-1M users / of ML-100K u1.base); "
                              "no test fold read", "values_tried": CONSTANTS,
           "settings": [{"mechanism": m, "epsilon": e, "constants": k} for m, e, k in CONSTANT_SETTINGS],
           "confirm": {"values": CONFIRM, "epsilons": list(CONFIRM_EPS), "seeds": CONFIRM_SEEDS,
                       "rule": "tolerance = max(0.001, 2 s sqrt(2 / seeds)) (s: per-run std between seeds); a value replaces "
                               "the package's only if it beats it by more than the tolerance at every eps; of several, "
                               "the one nearest the package's value among those within the tolerance of the best"},
           "sides": sides}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    return doc


def report(rule: Path, means: Path, sweep_path: Path, out: Path) -> str:
    """The measurements as one JSON (``out``) and the markdown tables of docs/pnbm_lowrank.md ("The rule on one screen").
    ``rule``: grid runs with every knob ``auto`` (the frozen rule); ``means``: the same sets and eps with the means only
    (m = 0.99, one step of 1e-3: U does not move)."""
    from dprec_torch.privacy import size_rule as R

    def table(path: Path) -> dict:
        rows = json.loads(path.read_text())["results"] if path.exists() else []
        return {(r["set"], r["epsilon"]): r for r in rows}

    if rule.exists():
        ru, me = table(rule), table(means)

        def n_of(name: str) -> int:
            return n_users_of(Path("/tmp/size_rule"), name)
    else:  # the grid runs are not on this machine: the committed record's grid (the sweeps below are what a rerun changes)
        grid = json.loads(out.read_text())["validation_grid"]
        ru = {(g["set"], g["epsilon"]): {"rmse": g["rmse_rule"], "runs": [{"rmse": x} for x in g["runs_rule"]]} for g in grid}
        me = {(g["set"], g["epsilon"]): {"rmse": g["rmse_means_only"], "runs": [{"rmse": x} for x in g["runs_means_only"]]}
              for g in grid if g["rmse_means_only"] is not None}
        n_of = {g["set"]: g["n_users"] for g in grid}.__getitem__
    sets = sorted({k[0] for k in ru}, key=lambda n: n_of(n) if not n.startswith("syn") else 1e9)
    eps = sorted({k[1] for k in ru})
    records, lines = [], ["| fitting set (N users) | " + " | ".join(f"eps = {e:g}" for e in eps) + " |",
                          "|---|" + "---|" * len(eps)]
    for name in sets:
        n = n_of(name)
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
    sweep_rows = {tag: sweep_rows[tag] for tag in sorted(sweep_rows)}  # ML-100K first, whatever order the sweeps ran in
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


def five_fold_summary(path: Path, noise: float = 0.003) -> str:
    """The 5-fold sweep (``sweep --extra data.fold=all``) as a table: each mechanism's mean test RMSE beside its own
    DP-means reference per eps, and per dataset whether it is below the reference at every eps and falls with eps
    (a rise of at most ``noise``, the run-to-run spread, is within noise)."""
    data = json.loads(path.read_text())
    lines = ["| data | mechanism | " + " | ".join(f"ε = {e:g}" for e in sorted({r['epsilon'] for rows in data.values()
                                                                             for r in rows})) + " | below its DP-means "
             "reference at every ε | monotone in ε (within 0.003) |"]
    lines.append("|---" * (len(lines[0].split("|")) - 2) + "|")
    for tag, rows in data.items():
        for mech in dict.fromkeys(r["mechanism"] for r in rows):
            rs = sorted((r for r in rows if r["mechanism"] == mech), key=lambda r: r["epsilon"])
            ref = [next(v for k, v in r["references"].items() if k not in ("PCC", "COS")) for r in rs]
            below = all(r["test_rmse"] <= x for r, x in zip(rs, ref))
            mono = all(b["test_rmse"] <= a["test_rmse"] + noise for a, b in zip(rs, rs[1:]))
            cells = [f"{r['test_rmse']:.4f} ({x:.4f})" for r, x in zip(rs, ref)]
            lines.append(f"| {tag} | {mech} | " + " | ".join(cells) + f" | {'yes' if below else 'no'} | {'yes' if mono else 'no'} |")
    return "\n".join(lines)


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
    c = sub.add_parser("constants")
    c.add_argument("--root", type=Path, default=Path("/tmp/size_rule"))
    c.add_argument("--seeds", type=int, default=2)
    c.add_argument("--cache", type=Path, default=Path("/tmp/s34/constants_runs.json"))
    c.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "pnbm_lowrank" / "size_rule_constants.json")
    r = sub.add_parser("report")
    r.add_argument("--rule", type=Path, default=Path("/tmp/s34/rule_sgld.json"))
    r.add_argument("--means", type=Path, default=Path("/tmp/s34/means_sgld.json"))
    r.add_argument("--sweep", type=Path, default=ROOT / "docs" / "results" / "pnbm_lowrank" / "size_rule_sweep.json")
    r.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "pnbm_lowrank" / "size_rule.json")
    f = sub.add_parser("five-fold", help="splice the 5-fold sweep's table into docs/pnbm_lowrank.md")
    f.add_argument("--sweep", type=Path, default=ROOT / "docs" / "results" / "pnbm_lowrank" / "size_rule_sweep_5fold.json")
    a = ap.parse_args()
    if a.cmd == "five-fold":
        from dprec_torch.study.markers import splice

        splice(ROOT / "docs" / "pnbm_lowrank.md", "size_rule_5fold", five_fold_summary(a.sweep))
    elif a.cmd == "report":
        from dprec_torch.study.markers import splice

        md = report(a.rule, a.means, a.sweep, a.out)
        splice(ROOT / "docs" / "pnbm_lowrank.md", "size_rule", md)
        print(md)
    elif a.cmd == "sweep":
        sweep(a.mechanisms, a.epsilon, a.extra, a.out, a.tag)
    elif a.cmd == "constants":
        a.cache.parent.mkdir(parents=True, exist_ok=True)
        doc = constants(a.root, a.seeds, a.cache, a.out)
        for side, v in doc["sides"].items():
            for k, d in v["verdict"].items():
                print(f"{side:>8} {k:<34} package {d['package']:g} -> {d['chosen']:g} ({d['why']})")
    elif a.cmd == "make":
        make(a.out, a.sizes)
    else:
        grid(a.root, a.sets, a.mechanism, a.epsilon, json.loads(a.space), a.fixed, a.seeds, a.out, a.references)


if __name__ == "__main__":
    main()
