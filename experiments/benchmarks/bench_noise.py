"""Seconds for one M x M float32 noise draw added in place on the CPU: torch's serial (insecure) sampler vs ChaCha20.

    python experiments/benchmarks/bench_noise.py [--m 3706] [--runs 5] [--threads 1,2] [--json OUT]

Laplace (``add_laplace_noise_``, the DPSGD noise) and Gaussian (``add_gaussian_noise_``, SGLD/Gaussian DP-SGD) at
M = 3706 (ML-1M: S has 13.7 M entries), each the minimum of ``--runs`` draws after one warm-up draw (numba's compile
and cache load excluded), with ``torch.set_num_threads(n)`` (the ChaCha kernels follow it with
``numba.set_num_threads``). ``torch``: torch's mt19937 draws, for scale only (the package never draws private noise
from it); ``chacha20``: what every private draw uses.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dprec_torch import chacha as noise  # noqa: E402


def best_of(fn, runs: int) -> float:
    fn()  # warm-up: compile / cache load, first touch of the buffers
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, default=3706)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    target = torch.zeros(args.m, args.m)
    gen = torch.Generator().manual_seed(0)
    key = noise.as_key(bytes(32))
    cases = {
        ("laplace", "torch"): lambda: target.add_(torch.empty_like(target).exponential_(generator=gen)
                                                  - torch.empty_like(target).exponential_(generator=gen)),
        ("laplace", "chacha20"): lambda: noise.add_laplace_(target, 1.0, key),
        ("gaussian", "torch"): lambda: target.add_(torch.randn(target.shape, generator=gen, dtype=target.dtype) * 1.0),
        ("gaussian", "chacha20"): lambda: noise.add_gaussian_(target, 1.0, key),
    }
    before = torch.get_num_threads()
    rows = []
    try:
        for n in (int(x) for x in args.threads.split(",")):
            torch.set_num_threads(n)
            for (kind, sampler), fn in cases.items():
                s = best_of(fn, args.runs)
                rows.append({"noise": kind, "sampler": sampler, "threads": n, "seconds": s})
                print(f"{kind:9s} {sampler:9s} threads={n}  {s:.4f} s  (M = {args.m}, min of {args.runs})", flush=True)
    finally:
        torch.set_num_threads(before)
    if args.json:
        Path(args.json).write_text(json.dumps({"m": args.m, "runs": args.runs, "dtype": "float32", "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
