"""Speed rows of the low-rank PNBM (``model=pnbm_lowrank``; issue 27, item 5): set-up (the mechanism's accountant
calibration and the DP item means included) and the mechanism steps, timed apart, through the runner's own
``setup_training`` and the Trainer's step (no per-epoch evaluation or checkpoint in the timed loop).

Rows (``--rows``):

* ``ml1m-400``: ML-1M fold 1, mechanism=gaussian at epsilon=10 with the former ``lowrank_dpsgd``'s ML-1M settings
  (q = 0.3, C = 0.5, lr = 5, d = 8), 402 steps (134 epochs of round(1/q) = 3 steps; the target row of the issue is
  400 steps);
* ``syn20m``: synthetic data of ML-20M's size (138,493 users x 26,744 items, 20M ratings), 10 steps at q = 0.01
  (seconds a step; meant for a GPU).

As ``train.py`` does, the device's warm-up thread (``dprec_torch.device.warm_up``: the CUDA context, Triton's import)
starts before the data is read (``load_s``, reported apart from the set-up).

Writes one JSON line per row to stdout and, with ``--out``, appends it to that file (JSON lines: a rerun adds
lines, and ``publish.py`` reads the last line of a row). Each row names its ``machine`` (``bench.py``'s line, the GPU
included on ``--device cuda``) and the 1-minute load average after it.

    OMP_NUM_THREADS=2 python experiments/benchmarks/bench_pnbm_lowrank.py --rows ml1m-400 --device cpu --repeat 5 \
        --out docs/results/benchmarks/lowrank-cpu.json
    python experiments/benchmarks/bench_pnbm_lowrank.py --rows ml1m-400 syn20m --device cuda
    python experiments/benchmarks/bench_pnbm_lowrank.py --rows ml1m-400 --device cuda --profile /tmp/lowrank-prof.txt

``--repeat N``: each row N times, each run in a fresh process; the line is the run with the median time a step, with
every run's figures under ``runs`` (this shared VM's speed drifts by a third from hour to hour: one run is one
sample). ``--profile FILE``: after the timed steps, 20 more under ``torch.profiler`` (CPU, and CUDA on a GPU), their operator
table (self time) written to FILE: where a step's time goes; and the set-up's cProfile (top 30 by cumulative time)
after it (that run's set-up is slowed by the profiler).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GAUSSIAN = ["model=pnbm_lowrank", "mechanism=gaussian", "epsilon=10", "mechanism.lr=5", "mechanism.clip_norm=0.5",
            "mechanism.sampling_ratio=0.3", "mechanism.mean_fraction=0.5", "mechanism.accountant=rdp",
            "mechanism.mean_popularity_alpha=0.5", "mechanism.mean_popularity_share=0.1",
            "mechanism.count_weight=0.5", "compare_baselines=false", "tensorboard=false", "noise_seed=0"]
ROWS = {
    "ml1m-400": (["data=ml-1m", "mechanism.epochs=134"], None),
    "syn20m": (["data=synthetic", "data.preset=ml-20m", "mechanism.sampling_ratio=0.01", "mechanism.epochs=1"], 10),
}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def profile_steps(trainer, device: torch.device, path: Path, steps: int = 20) -> None:
    """``steps`` more steps under torch.profiler; the operator table sorted by self time to ``path``."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            trainer._step()
        sync(device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    tables = [prof.key_averages().table(sort_by=k, row_limit=40) for k in dict.fromkeys([key, "self_cpu_time_total"])]
    path.write_text(f"{steps} steps on {device}\n" + "\n".join(tables))


def run_row(name: str, device: str, profile_path: Path | None = None) -> dict:
    from hydra import compose, initialize_config_dir

    from dprec_torch.training.run import instantiate_node, setup_training, validate
    from dprec_torch.training.trainer import Trainer

    extra, max_steps = ROWS[name]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*GAUSSIAN, *extra, f"device={device}"])
    validate(cfg)
    dev = torch.device(device)
    from dprec_torch.device import warm_up

    warm_up(dev)  # as train.py does when it resolves the device: CUDA and Triton warm while the data loads
    t0 = time.perf_counter()
    fold = instantiate_node(cfg.data).folds[0].to(dev)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    if profile_path is None:
        setup = setup_training(cfg, fold, dev)
    else:  # where the set-up's time goes (cProfile slows it: this run's figures are not the plain run's)
        import cProfile
        import io
        import pstats

        prof = cProfile.Profile()
        setup = prof.runcall(setup_training, cfg, fold, dev)
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(30)
        setup_profile = text.getvalue()
    sync(dev)
    setup_s = time.perf_counter() - t0
    trainer = Trainer(setup.model, setup.optimizer, setup.sampler, setup.epochs)
    steps = setup.optimizer.context.total_steps if max_steps is None else max_steps
    trainer._step()  # warm-up (first-call allocations), not timed
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(steps):
        trainer._step()
    sync(dev)
    steps_s = time.perf_counter() - t0
    rmse = float(torch.sqrt(((setup.model.predict(fold.test.users, fold.test.items) - fold.test.values) ** 2).mean()))
    if profile_path is not None:  # after the row's figures: they are the plain run's
        profile_steps(trainer, dev, profile_path)
        with profile_path.open("a") as f:
            f.write(f"\nset-up under cProfile ({setup_s:.3f} s with the profiler), top 30 by cumulative time\n"
                    + setup_profile)
    from bench import code_version, machine  # experiments/benchmarks/ is the script's folder

    return {"row": name, "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu",
            "device_type": dev.type, "machine": machine(gpu=dev.type == "cuda"), "load_avg": round(os.getloadavg()[0], 2),
            "threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "load_s": round(load_s, 3), "setup_s_incl_calibration": round(setup_s, 3), "steps": steps,
            "steps_s": round(steps_s, 3), "s_per_step": round(steps_s / steps, 5),
            "setup_plus_steps_s": round(setup_s + steps_s, 3), "test_rmse_after": round(rmse, 4),
            "epsilon": setup.optimizer.privacy_report()["epsilon"],
            "masked_batches": bool(getattr(setup.sampler, "masked", False)), "code": code_version(),
            "lowrank_kernel": os.environ.get("DPREC_LOWRANK_KERNEL", "auto"),
            # steps replayed from a CUDA graph (training.step_graph; 0: every step eager), and why not, if it failed
            "graph_replays": getattr(trainer._graph, "replays", 0), "graph_failed": getattr(trainer._graph, "failed", None)}


def repeated_row(name: str, device: str, repeat: int) -> dict:
    """``repeat`` runs of a row, each in a fresh process (as a user's run: its own imports, caches loaded from disk);
    the run with the median time a step, with every run's (s a step, s with set-up) under ``runs``."""
    runs = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, __file__, "--rows", name, "--device", device], check=True,
                             capture_output=True, text=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    median = sorted(runs, key=lambda r: r["s_per_step"])[(len(runs) - 1) // 2]
    return {**median, "repeat": repeat, "runs": [[r["s_per_step"], r["setup_plus_steps_s"]] for r in runs]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", nargs="+", default=["ml1m-400"], choices=list(ROWS))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--repeat", type=int, default=1, help="runs of each row, each in a fresh process: the median's line")
    ap.add_argument("--profile", type=Path, default=None, help="write 20 profiled steps' operator table here")
    a = ap.parse_args()
    for name in a.rows:
        row = repeated_row(name, a.device, a.repeat) if a.repeat > 1 else run_row(name, a.device, a.profile)
        print(json.dumps(row), flush=True)
        if a.out is not None:
            with a.out.open("a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
