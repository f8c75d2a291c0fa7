"""Park & Acharya (2011) Sec. 4.5: exponential-mechanism top-k, exact sampler vs the birth-death chain.

Regenerates Fig. 4a (accuracy = % overlap with the non-private top k vs epsilon) and
Fig. 4b (KL divergence vs chain iterations) on ML-100K fold u1:

    DPREC_DATA=../shared/data python experiments/studies/park_acharya_topk.py docs/results/park_acharya/

The score matrix C is non-private Slope One (T, phi_m) = (20, 10) on u1.base, clipped to
[1, 5]; Delta = the paper's U_r = 5 (``--sensitivity 4`` = the clipped range, ``mechanism.sensitivity``'s
default). The paper's Fig. 4 curves are the ``mcmc`` line. For ``--n-users`` random
test users and each epsilon, one top-k set (k = 10) is drawn per user and repetition with

* ``exact``: the O(M k) elementary-symmetric-polynomial sampler over ALL k-subsets, and
* ``mcmc``: the Sec. 4.2 chain (dt = 1/U_s) on the Sec. 4.4 window candidates (N1 = 2,
  N2 = 3), ``--n-iter`` steps from S_0.

``candidate_mass`` is the exact probability that Eq. (28) puts on the window candidates.
Fig. 4b follows one user: ``--chains`` parallel chains, and at each checkpoint t the
empirical law of all states visited in steps 1..t is compared with the exact Eq. (28)
law (ground truth from the exact sampler's normaliser), both restricted to the k_hat = 10
most probable candidate sets and renormalised: KL(P || P_hat), P_hat smoothed with 0.5
pseudo-counts. The "iid" line draws the same number of sets from the exact law
(what ``sampler=exact`` delivers; simulated from that law's exact probabilities); it is
absent where none of those draws would land in the k_hat sets. Writes ``topk_accuracy.csv``, ``topk_kl.csv``,
``fig4a_topk_accuracy.png`` and ``fig4b_kl_iterations.png``. ``top_mass_chain`` (share of chain
steps spent in the k_hat sets) next to ``top_mass_stationary`` (the chain's target share)
shows whether the chain as a whole has mixed, which the renormalised KL cannot.
"""

from __future__ import annotations

import argparse
import csv
import logging
import math
import os
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from dprec_torch.data.ratings import Fold  # noqa: E402
from dprec_torch.errors import DprecError  # noqa: E402
from dprec_torch.study.markers import splice  # noqa: E402
from dprec_torch.mechanisms.exponential_topk import (  # noqa: E402
    mask_to_ids,
    sample_topk_exact,
    topk_log_normalizer,
    topk_log_prob,
    topk_log_weights,
    window_chain,
)
from dprec_torch.predictors.slope_one import SlopeOne  # noqa: E402
from dprec_torch.seeding import SecretGenerator, noise_generator  # noqa: E402

log = logging.getLogger("park_acharya_topk")


def load_fold(data: str, fold: int, data_dir: str | None, seed: int) -> Fold:
    """ML-100K fold ``u<fold>`` from ``--data-dir``/``$DPREC_DATA``, or the seeded ``ml-100k``-sized synthetic set."""
    if data == "synthetic":
        from dprec_torch.data.synthetic import load_synthetic

        return load_synthetic("ml-100k", seed=seed).folds[0]
    from dprec_torch.data.movielens import load_movielens

    return load_movielens("ml-100k", fold=fold, data_dir=data_dir or os.environ.get("DPREC_DATA")).folds[0]


def overlap(sets: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Per row: |S ∩ S_0| / k."""
    return (sets[:, :, None] == reference[:, None, :]).any(2).double().mean(1)


def accuracy_rows(scores: torch.Tensor, eligible: torch.Tensor, args: argparse.Namespace, gen: SecretGenerator) -> list[dict]:
    k, delta = args.k, args.sensitivity
    top = torch.topk(scores.masked_fill(~eligible, -1e9), k, 1).indices
    reference = mask_to_ids(torch.zeros_like(eligible).scatter_(1, top, True), k)
    rows = []
    for eps in args.epsilons:
        logw = topk_log_weights(scores, eligible, eps, delta)
        exact = [overlap(mask_to_ids(sample_topk_exact(logw, k, gen), k), reference).mean() for _ in range(args.reps)]
        chain, members = window_chain(scores, eligible, k, eps, delta, args.n1, args.n2)
        mcmc = []
        for _ in range(args.reps):
            state = chain.run(args.n_iter, gen)
            sets = members.gather(1, state[:, None, None].expand(-1, 1, k)).squeeze(1)
            mcmc.append(overlap(sets.sort(1).values, reference).mean())
        mass = torch.logsumexp(chain.log_w, 1) - topk_log_normalizer(logw, k)  # log P(window candidates)
        rows.append({"epsilon": eps, "exact_accuracy": float(torch.stack(exact).mean()),
                     "mcmc_accuracy": float(torch.stack(mcmc).mean()), "candidate_mass": float(mass.exp().mean()),
                     "n_candidates": float(torch.isfinite(chain.log_w).sum(1).double().mean()), "n_users": scores.shape[0]})
        log.info("eps=%g: exact %.3f, mcmc %.3f, candidate mass %.3g", eps, rows[-1]["exact_accuracy"],
                 rows[-1]["mcmc_accuracy"], rows[-1]["candidate_mass"])
    return rows


def kl(p: torch.Tensor, counts: torch.Tensor) -> float:
    q = (counts + 0.5) / (counts.sum() + 0.5 * counts.numel())
    return float((p * (p / q).log()).sum())


def kl_rows(score: torch.Tensor, eligible: torch.Tensor, args: argparse.Namespace, gen: SecretGenerator) -> list[dict]:
    k, k_hat, n = args.k, args.k_hat, args.chains
    checkpoints = sorted({int(x) for x in np.unique(np.logspace(0, math.log10(args.kl_iter), 25).astype(int))})
    rows = []
    for eps in args.kl_epsilons:
        chain, members = window_chain(score.expand(n, -1), eligible.expand(n, -1), k, eps, args.sensitivity, args.n1, args.n2)
        logw = topk_log_weights(score, eligible, eps, args.sensitivity)
        top_sets = members[0, :k_hat].sort(1).values
        p_full = topk_log_prob(logw.expand(k_hat, -1), top_sets).exp()  # ground truth: exact Eq. (28)
        p = p_full / p_full.sum()
        stationary_top = float(chain.stationary()[0, :k_hat].sum())  # the chain's own target mass on these sets
        counts = torch.zeros(k_hat, dtype=torch.float64)
        state = torch.zeros(n, dtype=torch.long)
        for t in range(1, checkpoints[-1] + 1):
            state = chain.step(state, gen)
            counts += torch.bincount(state[state < k_hat], minlength=k_hat).double()
            if t in checkpoints:
                draws = n * t  # iid reference: as many sets drawn from the exact law
                p_in = float(p_full.sum())
                hits = torch.distributions.Binomial(draws, torch.tensor(p_in)).sample()
                # no draw lands in these sets when their exact mass is tiny: then there is no KL to report
                iid_kl = kl(p, torch.distributions.Multinomial(int(hits), p).sample().double()) if hits > 0 else math.nan
                rows.append({"epsilon": eps, "iteration": t, "kl_mcmc": kl(p, counts), "kl_iid_exact": iid_kl,
                             "iid_hits": int(hits),
                             "top_mass_exact": p_in, "top_mass_stationary": stationary_top,
                             "top_mass_chain": float(counts.sum()) / draws, "dt": float(chain.log_dt[0].exp())})
        log.info("KL eps=%g: after %d steps KL=%.3g (iid %.3g), dt=%.3g", eps, t, rows[-1]["kl_mcmc"],
                 rows[-1]["kl_iid_exact"], rows[-1]["dt"])
    return rows


def plot(acc: list[dict], kls: list[dict], out: Path, args: argparse.Namespace) -> None:
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    eps = [r["epsilon"] for r in acc]
    ax.semilogx(eps, [100 * r["exact_accuracy"] for r in acc], "o-", label="exact sampler (all k-subsets)")
    ax.semilogx(eps, [100 * r["mcmc_accuracy"] for r in acc], "s--", label=f"MCMC, window N1={args.n1}, N2={args.n2}")
    ax.set(xlabel="epsilon", ylabel=f"% overlap with true top-{args.k}", title=f"Fig. 4a: accuracy vs ε (Δ={args.sensitivity:g})", ylim=(0, 102))
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "fig4a_topk_accuracy.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    for i, e in enumerate(args.kl_epsilons):
        rs = [r for r in kls if r["epsilon"] == e]
        c = f"C{i}"
        ax.loglog([r["iteration"] for r in rs], [max(r["kl_mcmc"], 1e-6) for r in rs], "-", c=c, label=f"MCMC ε={e:g}")
        iid = [r for r in rs if math.isfinite(r["kl_iid_exact"])]
        if iid:
            ax.loglog([r["iteration"] for r in iid], [max(r["kl_iid_exact"], 1e-6) for r in iid], ":", c=c,
                      label=f"iid exact ε={e:g}")
    ax.set(xlabel="iterations", ylabel=f"KL(P || P̂), top {args.k_hat} sets", title=f"Fig. 4b: convergence (Δ={args.sensitivity:g})")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "fig4b_kl_iterations.png", dpi=110)
    plt.close(fig)


def write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", nargs="?", default="docs/results/park_acharya/", help="output folder (default docs/results/park_acharya/)")
    p.add_argument("--data", choices=["ml-100k", "synthetic"], default="ml-100k")
    p.add_argument("--data-dir", default=None, help="folder holding ml-100k/ (default $DPREC_DATA)")
    p.add_argument("--fold", type=int, default=1)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--n-users", type=int, default=100)
    p.add_argument("--reps", type=int, default=3, help="draws per user and epsilon")
    p.add_argument("--epsilons", type=float, nargs="+", default=[0.1, 0.3, 1, 3, 10, 30, 100, 300, 1000])
    p.add_argument("--sensitivity", type=float, default=5.0,
                   help="Delta of one score entry (default: the paper's U_r = 5; 4 = the clipped score range)")
    p.add_argument("--n1", type=int, default=2)
    p.add_argument("--n2", type=int, default=3)
    p.add_argument("--n-iter", type=int, default=2000, help="chain steps per MCMC draw (Fig. 4a)")
    p.add_argument("--kl-epsilons", type=float, nargs="+", default=[1.0, 10.0, 100.0])
    p.add_argument("--kl-iter", type=int, default=2000)
    p.add_argument("--chains", type=int, default=500, help="parallel chains for Fig. 4b")
    p.add_argument("--k-hat", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--docs", default=None, help="markdown file to splice the tables into (default: docs/park_acharya.md "
                   "for --data ml-100k; '' = none)")
    args = p.parse_args(argv)
    if args.docs is None:
        args.docs = str(Path(__file__).resolve().parents[2] / "docs" / "park_acharya.md") if args.data == "ml-100k" else ""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    try:
        fold = load_fold(args.data, args.fold, args.data_dir, args.seed)
        model = SlopeOne(T=20, phi_m=10).fit(fold.train)
        users = torch.unique(fold.test.users)
        users = users[model.served_[users]]
        users = users[torch.randperm(users.numel(), generator=gen)[: args.n_users]].sort().values
        scores = model.score(users).clamp(fold.train.scale.lo, fold.train.scale.hi)
        eligible = ~model.rated_mask(users)
        noise = noise_generator(args.seed)  # the samplers' draws: ChaCha20 under the explicit seed's key (seeding)
        acc = accuracy_rows(scores, eligible, args, noise)
        kls = kl_rows(scores[:1], eligible[:1], args, noise)
    except DprecError as err:
        log.error("%s", err)
        return 2
    write_csv(out / "topk_accuracy.csv", acc)
    write_csv(out / "topk_kl.csv", kls)
    plot(acc, kls, out, args)
    md = markdown(acc, kls, args)
    if args.docs:
        splice(args.docs, "park-acharya-topk", md)
    print(md)
    return 0


def markdown(acc: list[dict], kls: list[dict], args: argparse.Namespace) -> str:
    """The top-k tables of docs/park_acharya.md (spliced between its park-acharya-topk markers)."""
    lines = [f"Delta = {args.sensitivity:g}, k = {args.k}, {args.n_users} users x {args.reps} draws; MCMC (`sampler=mcmc`): "
             f"N1 = {args.n1}, N2 = {args.n2}, {args.n_iter} steps.", "",
             "| eps | exact sampler overlap | MCMC (window) overlap | Eq. (28) mass on the window candidates |",
             "|---|---|---|---|"]
    lines += [f"| {r['epsilon']:g} | {100 * r['exact_accuracy']:.1f} % | {100 * r['mcmc_accuracy']:.1f} % | {r['candidate_mass']:.3g} |"
              for r in acc]
    lines += ["", f"| eps (Fig. 4b, one user, {args.chains} chains) | steps | KL MCMC | KL iid exact | "
              f"chain share in top-{args.k_hat} sets | target share |", "|---|---|---|---|---|---|"]
    for e in args.kl_epsilons:
        last = [r for r in kls if r["epsilon"] == e][-1]
        lines.append(f"| {e:g} | {last['iteration']} | {last['kl_mcmc']:.3g} | {last['kl_iid_exact']:.3g} | "
                     f"{last['top_mass_chain']:.3g} | {last['top_mass_stationary']:.3g} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
