"""Where a GPU run's time goes, for the speed issue's GPU rows: one full-S training run under ``torch.profiler``.

    python experiments/benchmarks/gpu_probe.py --out /tmp/probe.txt -- data=ml-1m mechanism=gaussian_pnbm mechanism.epochs=3

Writes the operator tables (self CUDA time, self CPU time) and the per-epoch seconds of ``train(cfg)`` run with the
given overrides (``device=cuda`` unless given; no baselines, no TensorBoard) to ``--out``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from gpu_bench import run_case  # experiments/benchmarks/: the GPU table's own run of one config

    cuda = torch.cuda.is_available()
    base = ["device=cuda" if cuda else "device=cpu", "compare_baselines=false", "tensorboard=false"]
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        row = run_case([*base, *args.overrides])
    head = (f"overrides {args.overrides}\nwall {row['train_wall']:.3f} s; seconds_per_epoch {row['seconds_per_epoch']}; "
            f"after first {row['seconds_per_epoch_after_first']}; test_rmse {row['test_rmse']}\n")
    keys = ["self_cuda_time_total", "self_cpu_time_total"] if cuda else ["self_cpu_time_total"]
    tables = [prof.key_averages().table(sort_by=k, row_limit=45) for k in keys]
    args.out.write_text(head + "\n".join(tables))
    print(head)


if __name__ == "__main__":
    main()
