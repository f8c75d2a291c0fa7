"""The GPU table of issue 18, measured in one go and written as one JSON file (``experiments/benchmarks/gpu_check.sh``).

Stages, in order of importance, each under what is left of ``--budget`` seconds (a stage that
cannot fit is recorded as skipped, never guessed), the JSON rewritten after every stage:

* ``mechanisms``: ML-1M, every PNBM mechanism of ``conf/mechanism`` (output mechanisms excluded),
  plus the paper-faithful DPSGD with ``model.formulation=sparse_pair``: s/epoch, test RMSE, GPU
  peak memory (``torch.cuda.max_memory_allocated``), wall; one fresh process per case;
* ``parity``: ``mechanism=none`` (no noise, 2 epochs) on the GPU and on the CPU, same config: |delta RMSE|;
* ``startup``: ``python train.py data=ml-1m device=cuda`` to the first epoch and end to end
  (``experiments/benchmarks/bench_startup.py``);
* ``sweep``: the 7-epsilon ML-1M sweep, one process per job vs the basic vs the batched launcher
  (``experiments/benchmarks/bench_sweep.py``), same numbers checked;
* ``profile``: cProfile of one batched 7-epsilon sweep (where the per-job time goes);
* ``ml20m``: one ML-20M-size synthetic DPSGD-PNBM epoch: s/epoch and GPU peak;
* ``lowrank20m``: the low-rank PNBM (the default model) with the clipped SGLD chain at ML-20M size:
  s a step (full batch: one step an epoch) and GPU peak;
* ``netflix``: the Netflix-size synthetic DPPS-PNBM run (480,189 x 17,770, 100 M ratings,
  ``mechanism=sgld_paper model=pnbm``, 20 epochs): training seconds, process wall, GPU peak; a run
  cut by the budget keeps the last lines it logged;
* ``gemm``: the product behind ``models.batching.dense_gemm_wins`` -- ML-1M's full history block
  times S as cuSPARSE ``csrmm`` and as a dense GEMM, float32 and float64, ms a call.

    python experiments/benchmarks/gpu_bench.py --out docs/results/benchmarks/gpu-check.json
    python experiments/benchmarks/gpu_bench.py --dry-run --out /tmp/gpu-dry.json     # CPU, tiny data: tests the plumbing
    python experiments/benchmarks/gpu_bench.py case -- data=ml-1m device=cuda mechanism=none   # one row, printed as JSON
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

PARITY_TOL = 1e-4  # |RMSE_gpu - RMSE_cpu| for the noise-free run: float32 sums in another order, nothing more
CASE_TIMEOUT = 150
SWEEP_EPS = "epsilon=0.1,0.5,1,2,5,10,20"
# expected seconds of each stage on one H100/H200 (from the timings), to skip what cannot fit
ESTIMATE = {"mechanisms": 80, "lowrank20m": 40, "startup": 20, "sweep": 70, "netflix": 120, "ml20m": 45,
            "parity": 35, "profile": 25, "gemm": 15}
NETFLIX_TIMEOUT = 240  # the target is 120 s of training; past twice that the row says so


def log(msg: str) -> None:
    print(f"[gpu_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ one case, in this process
def run_case(overrides: list[str]) -> dict[str, Any]:
    """``train(cfg)`` for one composed config; the metrics the GPU table needs, GPU peak memory included."""
    import torch
    from hydra import compose, initialize_config_dir

    from dprec_torch.startup import skip_dynamo_import
    from dprec_torch.training.run import train

    skip_dynamo_import()
    cuda = torch.cuda.is_available()
    with tempfile.TemporaryDirectory(prefix="dprec-gpu-case-") as tmp:
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            cfg = compose(config_name="config", overrides=[*overrides, f"output_dir={tmp}"])
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        metrics = train(cfg)
        wall = time.perf_counter() - t0
    row = {"overrides": overrides, "mechanism": metrics.get("mechanism"), "model": metrics.get("model"),
           "data": metrics.get("data"), "epochs": metrics.get("epochs"), "seconds_per_epoch": metrics.get("seconds_per_epoch"),
           "seconds_per_epoch_after_first": metrics.get("seconds_per_epoch_after_first"),
           "test_rmse": metrics.get("test_rmse"), "epsilon": metrics.get("privacy", {}).get("epsilon"), "train_wall": wall}
    if cuda:
        row["gpu_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        row["gpu_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    return row


def case_subprocess(overrides: list[str], timeout: float) -> dict[str, Any]:
    """One case in a fresh process (clean GPU peak, cold caches as a user's run has them)."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, str(Path(__file__)), "case", "--", *overrides], cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:  # what it logged so far is the evidence (epochs reached, their seconds)
        tail = err.stderr.decode(errors="replace") if isinstance(err.stderr, bytes) else (err.stderr or "")
        return {"overrides": overrides, "error": f"timed out after {timeout:.0f} s",
                "log_tail": [line for line in tail.strip().splitlines() if line.strip()][-8:]}
    if proc.returncode != 0:
        tail = [line for line in proc.stderr.strip().splitlines() if line.strip()][-3:]
        return {"overrides": overrides, "error": " | ".join(tail)[-500:]}
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    row["process_wall"] = time.perf_counter() - t0
    return row


def gemm_costs(data: list[str], repeat: int = 5) -> dict[str, Any]:
    """ms per call of (history block) x S^T as CSR x dense and as dense GEMM, on this run's device and data."""
    import torch
    from hydra import compose, initialize_config_dir

    from dprec_torch.config import instantiate_node
    from dprec_torch.models.batching import full_batch

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*data])
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train = instantiate_node(cfg.data).folds[0].to(dev).train
    batch = full_batch(train, train.item_means())
    out: dict[str, Any] = {"device": str(dev), "rows": int(batch.x.shape[0]), "items": int(batch.x.shape[1]),
                           "density": float(batch.x.values().numel() / (batch.x.shape[0] * batch.x.shape[1]))}
    for dtype in (torch.float32, torch.float64):
        S = torch.rand(train.n_items, train.n_items, device=dev, dtype=dtype)
        x = batch.x.to(dtype)
        dense = x.to_dense()

        def timed(fn) -> float:
            fn()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(repeat):
                fn()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            return (time.perf_counter() - t0) / repeat * 1e3

        name = str(dtype).replace("torch.", "")
        out[f"csrmm_ms_{name}"] = timed(lambda: torch.sparse.mm(x, S.T))
        out[f"gemm_ms_{name}"] = timed(lambda: dense @ S.T)
    return out


def profile_batched(overrides: list[str], out_dir: Path, top: int = 45) -> dict[str, Any]:
    """cProfile of one ``hydra/launcher=batched`` sweep (where a group's per-job time goes); the .prof file
    lands beside the JSON, the top functions by cumulative time go into it."""
    import pstats

    prof = out_dir / "batched-sweep.prof"
    with tempfile.TemporaryDirectory(prefix="dprec-prof-") as tmp:
        cmd = [sys.executable, "-m", "cProfile", "-o", str(prof), "train.py", "-m", "hydra/launcher=batched", *overrides,
               f"hydra.sweep.dir={tmp}/sweep"]
        env = {**os.environ, "DPREC_CACHE": f"{tmp}/cache"}
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"error": proc.stderr[-800:]}
    stats = pstats.Stats(str(prof))
    rows = sorted(((v[3], v[2], v[1], f"{k[0].split('/')[-1]}:{k[1]}({k[2]})") for k, v in stats.stats.items()), reverse=True)
    return {"command": " ".join(cmd[3:-1]), "wall_seconds": wall,
            "top_cumulative": [{"cum_s": round(c, 3), "tot_s": round(t, 3), "calls": n, "fn": f} for c, t, n, f in rows[:top]]}


# ------------------------------------------------------------------ what to run
def pnbm_mechanisms() -> list[str]:
    """``conf/mechanism`` entries that train an nn.Module (PNBM): the training mechanisms (``MechanismOptimizer``s)."""
    import importlib

    from dprec_torch.mechanisms.base import MechanismOptimizer

    from omegaconf import OmegaConf

    names = []
    for path in sorted((ROOT / "conf" / "mechanism").glob("*.yaml")):
        target = OmegaConf.load(path).get("_target_")
        if not target:
            continue
        module, _, cls = target.rpartition(".")
        try:  # training mechanisms only: output mechanisms wrap fitted predictors, builtin is a predictor's own
            if not issubclass(getattr(importlib.import_module(module), cls), MechanismOptimizer):
                continue
        except Exception:  # noqa: BLE001 - an unimportable mechanism still gets its (failing) row
            pass
        names.append(path.stem)
    # MF-only mechanisms are not PNBM rows; `gaussian` with model=pnbm is the same class as gaussian_pnbm
    names = [n for n in names if not n.endswith("_mf")]
    return [n for n in names if not (n == "gaussian" and "gaussian_pnbm" in names)]


def paper_dpsgd(mechs: list[str]) -> str:
    return "dpsgd_paper" if "dpsgd_paper" in mechs else "dpsgd"


def plan(dry: bool) -> dict[str, Any]:
    """The overrides of every stage: the real GPU table, or the same plumbing on tiny CPU data."""
    if dry:
        data, dev, big = ["data=synthetic"], "device=cpu", ["data=synthetic"]
        epochs = ["mechanism.epochs=1", "mechanism.sampling_ratio=0.5"]
    else:
        data, dev, big = ["data=ml-1m"], "device=cuda", ["data=synthetic", "data.preset=ml-20m"]
        epochs = []
    mechs = pnbm_mechanisms()
    # the dry run checks the plumbing with two mechanisms; on the GPU every one gets its row
    todo = ["none", paper_dpsgd(mechs)] if dry else mechs
    quick = ["compare_baselines=false", "tensorboard=false"]
    cases = []
    for m in todo:
        cap = [] if dry else ["mechanism.epochs=3"]  # epochs 2-3 give the steady-state s/epoch (1 pays warm-up)
        cases.append([*data, dev, "model=pnbm", f"mechanism={m}", *quick, *epochs, *cap])
    cases.append([*data, dev, "model=pnbm", f"mechanism={paper_dpsgd(mechs)}", "model.formulation=sparse_pair", *quick, *epochs])
    return {
        "mechanisms": cases,
        "startup": [*data, dev],
        # the sweep (default mechanism, 7 epsilons x 3 seeds); one process per job on 7 of the 21 jobs only
        "sweep": {"sweep": ["epsilon=1,5", "seed=0,1"] if dry else [SWEEP_EPS, "seed=0,1,2"],
                  "fixed": [*data, dev, *epochs], "separate_sample": 2 if dry else 3},
        "profile": [*data, dev, *epochs, "epsilon=1,5" if dry else SWEEP_EPS],
        "ml20m": [*big, dev, "model=pnbm", f"mechanism={paper_dpsgd(mechs)}", "mechanism.epochs=2", *quick, *epochs],
        "lowrank20m": [*big, dev, "model=pnbm_lowrank", "mechanism=sgld", "mechanism.sampling_ratio=1.0",
                       "mechanism.epochs=3" if not dry else "mechanism.epochs=1", *quick],
        "netflix": ([*big[:1], "data.preset=netflix"] if not dry else big) + [
            dev, "model=pnbm", "mechanism=sgld_paper", "mechanism.epochs=20" if not dry else "mechanism.epochs=1", *quick],
        "parity": [[*data, d, "model=pnbm", "mechanism=none", "mechanism.epochs=2", *quick, *epochs] for d in (dev, "device=cpu")],
        "gemm": data,
    }


def environment() -> dict[str, Any]:
    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "host": platform.node(), "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(device=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), tf32_matmul=torch.backends.cuda.matmul.allow_tf32)
    else:
        env["device"] = "cpu (no CUDA device)"
    return env


def main_all(args: argparse.Namespace) -> dict[str, Any]:
    t_start = time.perf_counter()
    out: dict[str, Any] = {"dry_run": args.dry_run, "env": environment(), "parity_tolerance": PARITY_TOL, "skipped": {}}
    steps = plan(args.dry_run)

    def save() -> None:
        out["total_seconds"] = time.perf_counter() - t_start
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2, default=str) + "\n")

    def left() -> float:
        return args.budget - (time.perf_counter() - t_start)

    def fits(stage: str) -> bool:
        need = 1 if args.dry_run else ESTIMATE[stage]
        if stage not in args.stages:
            out["skipped"][stage] = "not asked for (--stages)"
        elif left() < need:
            out["skipped"][stage] = f"out of budget: {left():.0f} s left, stage needs ~{need} s"
        else:
            log(f"stage {stage} ({left():.0f} s left)")
            return True
        save()
        return False

    save()
    if fits("mechanisms"):
        out["mechanisms"] = []
        for case in steps["mechanisms"]:
            if left() < 20:
                out["skipped"]["mechanisms"] = f"out of budget after {len(out['mechanisms'])} cases"
                break
            row = case_subprocess(case, min(CASE_TIMEOUT, left()))
            log(json.dumps({k: row.get(k) for k in ("mechanism", "seconds_per_epoch", "test_rmse", "gpu_peak_gib", "error")}))
            out["mechanisms"].append(row)
            save()
    if fits("lowrank20m"):
        out["lowrank20m"] = case_subprocess(steps["lowrank20m"], min(180, left()))
        save()
    if fits("startup"):
        import bench_startup

        try:
            out["startup"] = bench_startup.measure(ROOT, steps["startup"], repeat=1)
        except SystemExit as err:  # a failing stage is a result, not a crash of the whole check
            out["startup"] = {"error": str(err)[-800:]}
        save()
    if fits("sweep"):
        import bench_sweep

        s = steps["sweep"]
        try:
            out["sweep"] = bench_sweep.measure(s["sweep"], s["fixed"], separate_sample=s["separate_sample"])
        except SystemExit as err:  # a failing mode is a result, not a crash of the whole check
            out["sweep"] = {"error": str(err)[-800:]}
        save()
    if fits("netflix"):
        out["netflix"] = case_subprocess(steps["netflix"], min(NETFLIX_TIMEOUT, left()))
        save()
    if fits("ml20m"):
        out["ml20m"] = case_subprocess(steps["ml20m"], min(120, left()))
        save()
    if fits("parity"):
        gpu, cpu = (case_subprocess(c, min(CASE_TIMEOUT, left())) for c in steps["parity"])
        out["parity"] = {"gpu": gpu, "cpu": cpu}
        if "test_rmse" in gpu and "test_rmse" in cpu:
            out["parity"]["abs_diff"] = abs(gpu["test_rmse"] - cpu["test_rmse"])
        save()
    if fits("profile"):
        out["profile"] = profile_batched(steps["profile"], args.out.parent)
        save()
    if fits("gemm"):
        try:
            out["gemm"] = gemm_costs(steps["gemm"], repeat=1 if args.dry_run else 5)
        except Exception as err:  # noqa: BLE001 - a failing stage is a result, not a crash of the whole check
            out["gemm"] = {"error": repr(err)[-500:]}
        log(json.dumps(out["gemm"]))
        save()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", nargs="?", default="all", choices=("all", "case"))
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "benchmarks" / "gpu-check.json")
    ap.add_argument("--dry-run", action="store_true", help="device=cpu, tiny synthetic data: checks the plumbing only")
    ap.add_argument("--budget", type=float, default=360.0, help="seconds for all stages together")
    ap.add_argument("--stages", nargs="+", default=list(ESTIMATE), choices=list(ESTIMATE))
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    if args.what == "case":  # its log lines (epochs and their seconds) go to stderr: a cut run keeps them
        import logging

        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
        print(json.dumps(run_case(args.overrides), default=str))
        return
    main_all(args)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
