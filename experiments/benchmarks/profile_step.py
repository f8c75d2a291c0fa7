"""Where one full-batch training step's time goes: forward sums, backward, mechanism step, projection.

    python experiments/benchmarks/profile_step.py --data syn1m --mechanism dpsgd --threads 1 --steps 5

Prints, per step, the seconds of each phase (wall clock) for PNBM with the configured
sparse-pair kernels (``--backend numba|torch``); the data are the benchmark's cached folds
(experiments/benchmarks/bench.py prepares them).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import bench  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="syn1m", choices=sorted(bench.DATA))
    ap.add_argument("--mechanism", default="dpsgd", choices=["none", "dpsgd", "sgld"])
    ap.add_argument("--backend", default="auto", choices=["auto", "numba", "torch"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--path", default="separate", choices=["separate", "fused", "alternate"],
                    help="separate: batch_predict, then surrogate_loss().backward(); fused: PNBM.fused_step (forward "
                         "column = the fused pass, backward column = the mechanism's clip_residuals and the check); "
                         "alternate: one then the other, step by step (side by side under the same load)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from dprec_torch.mechanisms.context import TrainingContext, prior_precision_for
    from dprec_torch.models.batching import full_batch
    from dprec_torch.models.pnbm import PNBM

    bench.prepare(args.data)
    train = bench.load(args.data).train
    cls, kwargs = bench.mechanism_kwargs(args.mechanism, "pnbm")
    model = PNBM(train.n_items, formulation="sparse_pair", pair_backend=args.backend).attach(train)
    ctx = TrainingContext(total_steps=args.steps, steps_per_epoch=1, n_ratings=len(train), n_users=train.n_users,
                          scale=train.scale, max_user_ratings=None, entry_bound=model.gradient_entry_bound,
                          prior_precision=prior_precision_for(cls, model, train, len(train)))
    opt = cls(model.parameters(), ctx, **kwargs)
    opt.prepare(model)  # DP item means and the start of S, before the batch (as setup_training)
    batch = full_batch(train, model.item_means)
    print(f"{args.data}: {train.n_users} users x {train.n_items} items, {len(train)} ratings; "
          f"{args.mechanism}, backend {args.backend}, {args.threads} thread(s)")
    print("step  path       forward  backward  mechanism  project  total   (seconds; step 1 also builds the pair layout)")
    for step in range(1, args.steps + 1):
        fused = args.path == "fused" or (args.path == "alternate" and step % 2 == 0)
        t = [time.perf_counter()]
        opt.zero_grad(set_to_none=True)
        if fused:
            out = model.fused_step(batch, batch.values, opt.elementwise_residual_clip())
            assert out is not None, "the fused step does not apply here (backend, mechanism)"
            t.append(time.perf_counter())
            assert torch.equal(opt.clip_residuals(out[1], batch, model), out[2])
        else:
            pred = model.batch_predict(batch)
            t.append(time.perf_counter())
            clipped = opt.clip_residuals((pred - batch.values).detach(), batch, model)
            model.surrogate_loss(batch, clipped).backward()
        t.append(time.perf_counter())
        opt.step()
        t.append(time.perf_counter())
        model.project_()
        t.append(time.perf_counter())
        parts = [b - a for a, b in zip(t, t[1:])]
        print(f"{step:>4}  {'fused' if fused else 'separate':9}  " + "  ".join(f"{p:7.3f}" for p in parts) + f"  {t[-1] - t[0]:6.3f}")


if __name__ == "__main__":
    main()
