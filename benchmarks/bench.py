"""Speed and memory of fit/predict (PCC, COS) and of PNBM training epochs.

Each case runs in its own subprocess so that peak RSS is per case. Prints a
markdown table and writes ``benchmarks/results/<host-tag>.json``.

    python benchmarks/bench.py                       # all cases, device=auto
    python benchmarks/bench.py --cases pcc-ml100k pnbm-dpsgd-ml100k --device cpu
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

CASES = {
    "pcc-ml100k": ("pcc", "ml-100k"),
    "cos-ml100k": ("cos", "ml-100k"),
    "pcc-syn1m": ("pcc", "synthetic-ml-1m"),
    "pnbm-dpsgd-ml100k": ("pnbm-dpsgd", "ml-100k"),
    "pnbm-dpsgd-syn1m": ("pnbm-dpsgd", "synthetic-ml-1m"),
}


def load(data: str):
    if data == "ml-100k":
        from dprec_torch.data.movielens import load_movielens

        return load_movielens("ml-100k", fold=1).folds[0]
    from dprec_torch.data.synthetic import load_synthetic

    return load_synthetic(preset="ml-1m", fold=1).folds[0]


def run_case(name: str, device: str, epochs: int) -> dict:
    """Runs one case in this process and returns its figures."""
    from dprec_torch.device import resolve_device
    from dprec_torch.evaluation.metrics import rmse

    kind, data = CASES[name]
    dev = resolve_device(device)
    fold = load(data).to(dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    out: dict = {"case": name, "device": str(dev), "n_ratings": len(fold.train), "n_items": fold.train.n_items}
    if kind in ("pcc", "cos"):
        from dprec_torch.predictors.knn import ItemKNN

        t0 = time.perf_counter()
        model = ItemKNN("pearson" if kind == "pcc" else "cosine", k=900).fit(fold.train)
        pred = model.predict(fold.test.users, fold.test.items)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        out["fit_predict_seconds"] = time.perf_counter() - t0
        out["test_rmse"] = rmse(pred, fold.test.values)
    else:
        from dprec_torch.mechanisms.context import TrainingContext
        from dprec_torch.mechanisms.dpsgd import DPSGDLaplace
        from dprec_torch.models.batching import PoissonBatchSampler
        from dprec_torch.models.pnbm import PNBM
        from dprec_torch.seeding import make_generator

        model = PNBM(fold.train.n_items).to(dev).attach(fold.train)
        sampler = PoissonBatchSampler(fold.train, model.item_means, 1.0, "rating", make_generator(0, dev))
        ctx = TrainingContext(epochs, 1, len(fold.train), fold.train.n_users, fold.train.scale,
                              entry_bound=model.gradient_entry_bound)
        opt = DPSGDLaplace(model.parameters(), ctx, epsilon=1.0)
        times = []
        for _ in range(epochs):
            t0 = time.perf_counter()
            batch = sampler.sample()
            opt.zero_grad()
            pred = model.batch_predict(batch)
            model.surrogate_loss(batch, opt.clip_residuals(pred - batch.values)).backward()
            opt.step()
            model.project_()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        out["seconds_per_epoch"] = min(times)
        out["seconds_per_epoch_mean"] = sum(times) / len(times)
        t0 = time.perf_counter()
        out["test_rmse"] = rmse(model.predict(fold.test.users, fold.test.items), fold.test.values)
        out["predict_seconds"] = time.perf_counter() - t0
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if dev.type == "cuda":
        out["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    ap.add_argument("--device", default="auto")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_case(args.one, args.device, args.epochs)))
        return
    rows = []
    for case in args.cases:
        proc = subprocess.run([sys.executable, __file__, "--one", case, "--device", args.device, "--epochs", str(args.epochs)],
                              capture_output=True, text=True, env=os.environ)
        if proc.returncode != 0:
            print(f"{case}: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
            continue
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
    if torch.cuda.is_available():
        machine += f", {torch.cuda.get_device_name(0)}"
    print(f"machine: {machine}\n")
    print("| case | device | ratings | seconds | peak RSS MB | peak GPU MB | test RMSE |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        secs = r.get("fit_predict_seconds", r.get("seconds_per_epoch"))
        unit = "fit+predict" if "fit_predict_seconds" in r else "per epoch"
        print(f"| {r['case']} | {r['device']} | {r['n_ratings']:,} | {secs:.3f} ({unit}) | {r['peak_rss_mb']:.0f} | "
              f"{r.get('peak_gpu_mb', float('nan')):.0f} | {r['test_rmse']:.4f} |")
    out = Path(args.out) if args.out else Path(__file__).parent / "results" / f"bench-{rows[0]['device'] if rows else 'none'}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
