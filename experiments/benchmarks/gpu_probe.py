"""Where a GPU run's time goes, for the speed issue's GPU rows: one full-S training run under ``torch.profiler``.

    python experiments/benchmarks/gpu_probe.py --out /tmp/probe.txt -- data=ml-1m mechanism=gaussian_pnbm mechanism.epochs=3

Writes the operator tables (self CUDA time, self CPU time) and the per-epoch seconds of ``train(cfg)`` run with the
given overrides (``device=cuda`` unless given; no baselines, no TensorBoard) to ``--out``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    import torch
    from hydra import compose, initialize_config_dir
    from torch.profiler import ProfilerActivity, profile

    from dprec_torch.training.run import train

    cuda = torch.cuda.is_available()
    base = ["device=cuda" if cuda else "device=cpu", "compare_baselines=false", "tensorboard=false"]
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with tempfile.TemporaryDirectory() as tmp:
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            cfg = compose(config_name="config", overrides=[*base, *args.overrides, f"output_dir={tmp}"])
        t0 = time.perf_counter()
        with profile(activities=acts) as prof:
            metrics = train(cfg)
        wall = time.perf_counter() - t0
    head = (f"overrides {args.overrides}\nwall {wall:.3f} s; seconds_per_epoch {metrics.get('seconds_per_epoch')}; "
            f"after first {metrics.get('seconds_per_epoch_after_first')}; test_rmse {metrics.get('test_rmse')}\n")
    keys = ["self_cuda_time_total", "self_cpu_time_total"] if cuda else ["self_cpu_time_total"]
    tables = [prof.key_averages().table(sort_by=k, row_limit=45) for k in keys]
    args.out.write_text(head + "\n".join(tables))
    print(head)


if __name__ == "__main__":
    main()
