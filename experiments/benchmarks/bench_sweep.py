"""Wall time of one sweep three ways: one process per job, Hydra's basic launcher, ``hydra/launcher=batched``.

    python experiments/benchmarks/bench_sweep.py --out docs/results/benchmarks/sweep-cpu-ml100k.json \\
        -- data=ml-100k device=cpu model=pnbm mechanism=none
    python experiments/benchmarks/bench_sweep.py --sweep epsilon=0.1,0.5,1,2,5,10,20 -- data=ml-1m device=cuda mechanism=dpsgd

* ``separate``: ``python train.py <job overrides>`` once per job, one after another (what a
  joblib sweep with ``n_jobs=1`` or a shell loop costs: imports, reading, baselines per job);
* ``basic``: ``python train.py -m ...`` (Hydra's default launcher: one process, nothing shared);
* ``batched``: ``python train.py -m ... hydra/launcher=batched``.

Each mode gets a fresh ``$DPREC_CACHE`` (each fits the PCC/COS baselines once at least). The
per-job ``metrics.json`` of the three modes must agree (``same_numbers``: test RMSE/MAE and the
per-epoch history, exactly); a mismatch is a bug, reported, never hidden. The noise is pinned
(``noise_seed=0`` unless the command sets one): with a secret noise seed two runs of one job differ by design.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_startup import python_path  # experiments/benchmarks/ is on sys.path: run as a script or from gpu_bench

ROOT = Path(__file__).resolve().parents[2]
MODES = ("separate", "basic", "batched")


def expand(sweep: list[str]) -> list[list[str]]:
    """``["epsilon=1,5", "seed=0,1"]`` -> the jobs' override lists, in Hydra's order (last key fastest)."""
    keys, values = zip(*(s.split("=", 1) for s in sweep)) if sweep else ((), ())
    return [[f"{k}={v}" for k, v in zip(keys, combo)] for combo in itertools.product(*(v.split(",") for v in values))]


def job_numbers(run_dir: Path) -> dict:
    m = json.loads((run_dir / "metrics.json").read_text())
    return {"test_rmse": m.get("test_rmse"), "test_mae": m.get("test_mae"), "history": m.get("history"),
            "seconds_per_epoch": m.get("seconds_per_epoch"), "train_seconds": m.get("train_seconds")}


def sample_indices(n_jobs: int, n_sample: int | None) -> list[int]:
    """``n_sample`` evenly spaced job indices (all of them when None or >= n_jobs)."""
    if n_sample is None or n_sample >= n_jobs:
        return list(range(n_jobs))
    return sorted({round(k * (n_jobs - 1) / max(n_sample - 1, 1)) for k in range(n_sample)})


def run_mode(mode: str, sweep: list[str], fixed: list[str], work: Path, separate_sample: int | None = None) -> dict:
    env = {**os.environ, "DPREC_CACHE": str(work / f"cache-{mode}"), "PYTHONPATH": python_path(ROOT)}
    jobs = expand(sweep)
    t0 = time.perf_counter()
    index = list(range(len(jobs)))
    if mode == "separate":
        dirs = []
        index = sample_indices(len(jobs), separate_sample)
        for k in index:
            job = jobs[k]
            d = work / mode / str(k)
            proc = subprocess.run([sys.executable, "train.py", *fixed, *job, f"hydra.run.dir={d}"], cwd=ROOT,
                                  capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                raise SystemExit(f"job {job} failed:\n{proc.stderr[-2000:]}")
            dirs.append(d)
    else:
        launcher = ["hydra/launcher=batched"] if mode == "batched" else []
        proc = subprocess.run([sys.executable, "train.py", "-m", *launcher, *fixed, *sweep, f"hydra.sweep.dir={work / mode}"],
                              cwd=ROOT, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"{mode} sweep failed:\n{proc.stderr[-2000:]}")
        dirs = [work / mode / str(k) for k in range(len(jobs))]
    wall = time.perf_counter() - t0
    return {"wall_seconds": round(wall, 3), "index": index, "seconds_per_job": wall / len(index),
            "jobs": [job_numbers(d) for d in dirs]}


def same_numbers(a: dict, b: dict) -> bool:
    """The jobs both modes ran (a sampled ``separate`` ran a subset) have the same numbers."""
    strip = lambda j: {k: v for k, v in j.items() if k not in ("seconds_per_epoch", "train_seconds")}  # noqa: E731
    common = sorted(set(a["index"]) & set(b["index"]))
    pick = lambda r: {i: strip(j) for i, j in zip(r["index"], r["jobs"])}  # noqa: E731
    return bool(common) and all(pick(a)[i] == pick(b)[i] for i in common)


def measure(sweep: list[str], fixed: list[str], modes: tuple[str, ...] = MODES, separate_sample: int | None = None) -> dict:
    """Each mode's wall time for the sweep. With ``separate_sample`` N, one process per job runs on N evenly
    spaced jobs only (it is the slow mode), and its wall for the whole sweep is N's per-job time x the job
    count: the speed-ups are then throughput ratios (jobs per second), and say so (``separate_jobs_run``)."""
    if not any(o.split("=", 1)[0].lstrip("+") == "noise_seed" for o in [*fixed, *sweep]):
        # noise_seed=null draws each run's noise from a secret seed: two runs of one job then differ by design,
        # so the modes can only be compared with the noise pinned (it costs the same time either way)
        fixed = [*fixed, "noise_seed=0"]
    with tempfile.TemporaryDirectory(prefix="dprec-sweep-") as tmp:
        results = {m: run_mode(m, sweep, fixed, Path(tmp), separate_sample) for m in modes}
    ref = results[modes[0]]
    n_jobs = len(expand(sweep))
    out = {"sweep": sweep, "fixed": fixed, "n_jobs": n_jobs, "load_avg": os.getloadavg()[0],
           "separate_jobs_run": len(results["separate"]["index"]) if "separate" in results else None,
           "modes": {m: {"wall_seconds": r["wall_seconds"], "seconds_per_job": r["seconds_per_job"],
                         "test_rmse": [j["test_rmse"] for j in r["jobs"]],
                         # training proper (the mechanism's steps) summed over the jobs; the rest of the wall is overhead
                         "train_seconds": sum(j["train_seconds"] or 0.0 for j in r["jobs"])}
                     for m, r in results.items()},
           "same_numbers": all(same_numbers(ref, r) for r in results.values())}
    for m in modes:
        out["modes"][m]["speedup_vs_separate"] = (round(results["separate"]["seconds_per_job"] / results[m]["seconds_per_job"], 2)
                                                  if "separate" in results else None)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", nargs="+", default=["epsilon=0.1,0.5,1,2,5,10,20"])
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--separate-sample", type=int, default=None,
                    help="run one process per job on this many evenly spaced jobs only (throughput ratio)")
    ap.add_argument("fixed", nargs="*", default=["data=ml-100k", "device=cpu", "model=pnbm", "mechanism=none"])
    args = ap.parse_args()
    result = measure(args.sweep, args.fixed, tuple(args.modes), args.separate_sample)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    if not result["same_numbers"]:
        raise SystemExit("the modes disagree on the per-job numbers (see above)")


if __name__ == "__main__":
    main()
