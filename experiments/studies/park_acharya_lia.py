"""Park & Acharya (2011) Sec. 3.4: Laplace-perturbed Slope One against the LIA attack.

Regenerates Fig. 1a (top-20 difference vs epsilon), Fig. 1b (LIA attack accuracy vs
epsilon) and Fig. 2 (epsilon-Risk vs epsilon-Utility) on ML-100K fold u1:

    DPREC_DATA=../shared/data python experiments/studies/park_acharya_lia.py docs/results/park_acharya/

Protocol (per the paper): Slope One with (T, phi_m) = (20, 10) is fitted on u1.base and the noise
is calibrated with the paper's Delta r = 5 (Delta f = 0.5; ``--delta-r 0`` uses the data's span 4,
the default of ``model=slope_one`` elsewhere).
Every test user with >= T training ratings is attacked: one random training rating
r_il is the target, one random item j of the user's test set is the released query,
and Theorem 3.3's LIA reconstructs r_il from A_ij = f_ij + Lap(Delta f/eps). A hit is
|LIA - r_il| < 0.5 (nearest rating). The top-20 difference compares each user's
top 20 unrated items under noised scores with the non-private top 20. Each epsilon is
repeated ``--reps`` times on fresh noise. Writes ``lia.csv``, ``fig1a_top20_difference.png``,
``fig1b_lia_accuracy.png`` and ``fig2_risk_utility.png`` into the output folder.
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

from dprec_torch.attacks.lia import epsilon_utility, lia_estimate, lia_hit_probability, topn_difference  # noqa: E402
from dprec_torch.data.ratings import Fold, Ratings  # noqa: E402
from dprec_torch.errors import DprecError  # noqa: E402
from dprec_torch.study.markers import splice  # noqa: E402
from dprec_torch.mechanisms.output_perturbation import LaplaceOutputPredictor  # noqa: E402
from dprec_torch.predictors.slope_one import SlopeOne, top_n_unrated  # noqa: E402

log = logging.getLogger("park_acharya_lia")


def load_fold(data: str, fold: int, data_dir: str | None, seed: int) -> Fold:
    """ML-100K fold ``u<fold>`` from ``--data-dir``/``$DPREC_DATA``, or the seeded ``ml-100k``-sized synthetic set."""
    if data == "synthetic":
        from dprec_torch.data.synthetic import load_synthetic

        return load_synthetic("ml-100k", seed=seed).folds[0]
    from dprec_torch.data.movielens import load_movielens

    return load_movielens("ml-100k", fold=fold, data_dir=data_dir or os.environ.get("DPREC_DATA")).folds[0]


def pick_targets(model: SlopeOne, test: Ratings, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Served test users, one random training rating each (target) and one random test item (query)."""
    users = torch.unique(test.users)
    users = users[model.served_[users]]
    rated = model.rated_mask(users)
    target = torch.where(rated, torch.rand(rated.shape, generator=gen, dtype=torch.float64), -1.0).argmax(1)
    # a random test item per user: random keys, then the max within each user's test ratings
    pos = torch.searchsorted(users, test.users).clamp_max(users.numel() - 1)
    keep = users[pos] == test.users
    key = torch.rand(test.users.shape, generator=gen, dtype=torch.float64).masked_fill(~keep, -1.0)
    best = torch.full((users.numel(),), -1.0, dtype=torch.float64).scatter_reduce(0, pos[keep], key[keep], "amax")
    first = keep & (key == best[pos])
    query = torch.zeros(users.numel(), dtype=torch.long)
    query[pos[first]] = test.items[first]
    return users, query, target


def run(args: argparse.Namespace) -> tuple[list[dict[str, float]], float]:
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    fold = load_fold(args.data, args.fold, args.data_dir, args.seed)
    model = SlopeOne(T=args.T, phi_m=args.phi_m, delta_r=args.delta_r or None).fit(fold.train)
    users, query, target = pick_targets(model, fold.test, gen)
    scores = model.score(users)
    rated = model.rated_mask(users)
    reference = top_n_unrated(scores, rated, args.top)
    log.info("Delta f = %.4g; %d attacked users", model.output_sensitivity(), users.numel())
    # f and the side information do not depend on the noise: compute them once, then draw A = f + Lap(b)
    a, b, truth = model.lia_side_information(users, query, target)  # Theorem 3.3, Eq. (23)
    f_query = model.raw_predict(users, query)
    rows = []
    for eps in list(args.epsilons) + [math.inf]:
        mech = LaplaceOutputPredictor(model, eps, seed=args.seed)
        risk = float(lia_hit_probability(a, mech.noise_scale, 0.5).mean())  # Definition 5, exact
        hits, diff = [], []
        for _ in range(args.reps):
            estimate = lia_estimate(mech.perturb(f_query), a, b)  # Eq. (22)
            hits.append(float(((estimate - truth).abs() < 0.5).double().mean()))
            private = top_n_unrated(mech.perturb(scores), rated, args.top)
            diff.append(float(topn_difference(private, reference).mean()))
        rows.append({
            "epsilon": eps, "noise_scale": mech.noise_scale, "attack_accuracy": float(np.mean(hits)),
            "attack_accuracy_se": float(np.std(hits) / math.sqrt(len(hits))), "risk": risk,
            f"top{args.top}_difference": float(np.mean(diff)), "utility": epsilon_utility(torch.tensor(diff)),
            "n_users": int(users.numel()),
        })
        log.info("eps=%g: accuracy %.4f, risk %.4f, top-%d difference %.4f", eps, rows[-1]["attack_accuracy"],
                 rows[-1]["risk"], args.top, rows[-1][f"top{args.top}_difference"])
    return rows, model.output_sensitivity()


def plot(rows: list[dict[str, float]], out: Path, top: int, delta_f: float) -> None:
    fin = [r for r in rows if math.isfinite(r["epsilon"])]
    eps = np.array([r["epsilon"] for r in fin])
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    ax.loglog(eps, [max(r[f"top{top}_difference"], 1e-4) for r in fin], "o-")
    ax.set(xlabel="epsilon", ylabel=f"top-{top} difference", title=f"Fig. 1a: Slope One + Lap(Δf/ε), Δf={delta_f:g}")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "fig1a_top20_difference.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    ax.semilogx(eps, [r["attack_accuracy"] for r in fin], "o", label="LIA (empirical)")
    ax.semilogx(eps, [r["risk"] for r in fin], "-", label="1 - exp(-ε/(2|r_i|Δf))")
    ax.axhline(0.2, ls=":", c="gray", label="uniform guess (1/5)")
    ax.set(xlabel="epsilon", ylabel="attack accuracy", title="Fig. 1b: LIA accuracy", ylim=(0, 1.02))
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "fig1b_lia_accuracy.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    util = [0.0] + [r["utility"] for r in rows] + [1.0]
    risk = [0.0] + [r["risk"] for r in rows] + [1.0]
    ax.plot(util, risk, "o-")
    for r in fin:  # label the decades from 1 up; smaller epsilons pile up at (0, 0)
        if r["epsilon"] < 1 or abs(math.log10(r["epsilon"]) - round(math.log10(r["epsilon"]))) > 0.01:
            continue
        ax.annotate(f"ε={r['epsilon']:g}", (r["utility"], r["risk"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set(xlabel="ε-Utility (1 - top-20 difference)", ylabel="ε-Risk (LIA accuracy)", title="Fig. 2: risk vs utility",
           xlim=(-0.02, 1.02), ylim=(-0.02, 1.02))
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "fig2_risk_utility.png", dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", nargs="?", default="docs/results/park_acharya/", help="output folder (default docs/results/park_acharya/)")
    p.add_argument("--data", choices=["ml-100k", "synthetic"], default="ml-100k")
    p.add_argument("--data-dir", default=None, help="folder holding ml-100k/ (default $DPREC_DATA)")
    p.add_argument("--fold", type=int, default=1)
    p.add_argument("--T", type=int, default=20)
    p.add_argument("--phi-m", type=int, default=10)
    p.add_argument("--delta-r", type=float, default=5.0,
                   help="r_max - r_min in Eq. (11) (default: the paper's 5, Delta f = 0.5; 0 = the data's span, 4)")
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--reps", type=int, default=20, help="fresh-noise repetitions per epsilon")
    p.add_argument("--epsilons", type=float, nargs="+", default=[float(f"{e:.3g}") for e in np.logspace(-2, 3, 16)])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--docs", default=None, help="markdown file to splice the table into (default: docs/park_acharya.md "
                   "for --data ml-100k; '' = none)")
    args = p.parse_args(argv)
    if args.docs is None:
        args.docs = str(Path(__file__).resolve().parents[2] / "docs" / "park_acharya.md") if args.data == "ml-100k" else ""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        rows, delta_f = run(args)
    except DprecError as err:
        log.error("%s", err)
        return 2
    with open(out / "lia.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows)
    plot(rows, out, args.top, delta_f)
    md = markdown(rows, args.top, delta_f)
    if args.docs:
        splice(args.docs, "park-acharya-lia", md)
    print(md)
    return 0


def markdown(rows: list[dict[str, float]], top: int, delta_f: float) -> str:
    """The LIA table of docs/park_acharya.md (spliced between its park-acharya-lia markers)."""
    lines = [f"Delta f = {delta_f:g}; LIA accuracy is empirical, eps-Risk exact (Definition 5).", "",
             f"| eps | b | LIA accuracy | eps-Risk (exact) | top-{top} difference | eps-Utility |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['epsilon']:g} | {r['noise_scale']:.4g} | {r['attack_accuracy']:.3f} | {r['risk']:.3f} | "
              f"{r[f'top{top}_difference']:.3f} | {r['utility']:.3f} |" for r in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
