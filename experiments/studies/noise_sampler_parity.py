"""Issue 28, 1: the ChaCha20 CPU sampler leaves the published numbers the same in distribution.

    DPREC_DATA=../shared/data python experiments/studies/noise_sampler_parity.py [--seeds 1-8] [--runs-dir DIR]

The paper's DPSGD-PNBM (``model=pnbm mechanism=dpsgd_paper epsilon=1``, every other key at its default) on ML-100K
u1, once per noise seed with the old sampler (``DPREC_NOISE_SAMPLER=torch``: torch's mt19937, the numbers published
before issue 28) and once with the new one (``chacha20``). The draws differ seed by seed; the test RMSEs must come
from the same distribution: per-seed RMSEs, means, sds, Welch's t-test and the two-sample KS test go to
``docs/results/noise_sampler_parity.json``. A run whose ``metrics.json`` exists is read, not re-run.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dprec_torch.mechanisms import noise  # noqa: E402
from dprec_torch.study.runs import run_configs  # noqa: E402
OVERRIDES = ["model=pnbm", "mechanism=dpsgd_paper", "data=ml-100k", "epsilon=1", "compare_baselines=false", "device=cpu"]
SAMPLERS = ("torch", "chacha20")


def seeds_of(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def run_sampler(name: str, seeds: list[int], runs_dir: Path) -> list[float]:
    """Test RMSE per seed with ``DPREC_NOISE_SAMPLER=name`` (read at every draw, so set for these runs only)."""
    before = os.environ.get(noise.ENV)
    os.environ[noise.ENV] = name
    try:
        done = run_configs(runs_dir / name, [(f"seed{s}", [*OVERRIDES, f"noise_seed={s}"]) for s in seeds])
    finally:
        if before is None:
            os.environ.pop(noise.ENV, None)
        else:
            os.environ[noise.ENV] = before
    for s in seeds:
        assert done[f"seed{s}"]["privacy"]["randomness"]["noise_sampler"] == name, (name, s)
    return [float(done[f"seed{s}"]["test_rmse"]) for s in seeds]


def summary(rmse: dict[str, list[float]], seeds: list[int]) -> dict:
    a, b = np.array(rmse["torch"]), np.array(rmse["chacha20"])
    return {
        "command": "python train.py " + " ".join(OVERRIDES) + " noise_seed=<s>",
        "data": "ML-100K u1 (test RMSE)",
        "seeds": seeds,
        "test_rmse": {name: dict(zip(map(str, seeds), v)) for name, v in rmse.items()},
        "mean": {"torch": float(a.mean()), "chacha20": float(b.mean())},
        "sd": {"torch": float(a.std(ddof=1)), "chacha20": float(b.std(ddof=1))},
        "difference_of_means": float(b.mean() - a.mean()),
        "welch_t_test_p": float(stats.ttest_ind(a, b, equal_var=False).pvalue),
        "ks_2samp_p": float(stats.ks_2samp(a, b).pvalue),
        "samplers": {"torch": "DPREC_NOISE_SAMPLER=torch: torch's mt19937, inverse CDF (the numbers published before "
                              "issue 28)",
                     "chacha20": "default: ChaCha20 keystream under a key drawn from the noise generator "
                                 "(dprec_torch/mechanisms/noise.py)"},
    }


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="1-8", help="noise seeds, lo-hi")
    ap.add_argument("--runs-dir", default=str(ROOT / "outputs" / "studies" / "noise_sampler_parity"))
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "noise_sampler_parity.json"))
    args = ap.parse_args()
    t0 = time.perf_counter()
    seeds = seeds_of(args.seeds)
    rmse = {name: run_sampler(name, seeds, Path(args.runs_dir)) for name in SAMPLERS}
    result = summary(rmse, seeds)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("mean", "sd", "welch_t_test_p", "ks_2samp_p")}, indent=2))
    logging.info("total %.0fs", time.perf_counter() - t0)


if __name__ == "__main__":
    main()
