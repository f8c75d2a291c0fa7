"""The LIA (Park & Acharya 2011, Sec. 3.3) against PNBM trained under each mechanism.

    DPREC_DATA=../shared/data python experiments/studies/lia_pnbm.py docs/results/            # ML-100K u1
    python experiments/studies/lia_pnbm.py docs/results/ --data synthetic                      # no data needed

Threat model (Park & Acharya's): the adversary knows the released model (S restricted to the
top-N_k neighbours, r_bar) and all of user u's ratings but one, r_ul, and sees one released
prediction A = r_hat_uq for an item q that u has not rated. Eq. (2) is affine in r_ul:

    r_hat_uq = r_bar_q + (s_ql (r_ul - r_bar_l) + N_rest) / D,   D = max(C, sum_j |s_qj| I_uj)

(D depends on which items u rated, not on the value), so LIA(A) = a A + b with

    a = D / s_ql,    b = r_bar_l - (r_bar_q D + N_rest) / s_ql,

reconstructs r_ul exactly whenever s_ql != 0 and A was not clipped to the scale. The adversary
picks l = the rated item with the largest |s_ql|. A hit is |LIA - r_ul| < 0.5.

The point: DP training of S (dpsgd_paper, dpsgd_l1, gaussian) protects u against people who see the
model and OTHER users' predictions; u's own predictions are a deterministic function of u's raw
ratings and leak them to whoever sees them, at every epsilon. Only output perturbation
(``mechanism=laplace_output``-style noise on A) lowers the attack accuracy. Writes
``lia_pnbm.md`` (table) into the output folder.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from dprec_torch.attacks.lia import lia_attack
from dprec_torch.data.ratings import Fold, dense_rows
from dprec_torch.errors import DprecError

log = logging.getLogger("lia_pnbm")
CONF = str(Path(__file__).resolve().parents[2] / "conf")
MECHANISMS = [("none", "inf"), ("dpsgd_paper", "1"), ("dpsgd_l1", "1"), ("gaussian", "1")]  # dpsgd_paper: Alg. 1 as printed


class PNBMSideInformation:
    """``lia_side_information`` for a trained PNBM (Eq. (2) solved for one history rating)."""

    def __init__(self, model) -> None:
        self.model = model
        self.Sk = model.neighbour_matrix().double()
        hist = model.history
        self.x = hist.centered_csr(model.item_means)
        self.ind = hist.indicator_csr()
        self.r = hist.csr()

    def pick_targets(self, users: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """For each (u, q): the rated item l maximising |s_ql| (-1 if none is nonzero)."""
        ind = dense_rows(self.ind, users).bool()
        w = self.Sk[query].abs().masked_fill(~ind, -1.0)
        w[torch.arange(users.numel()), query] = -1.0
        best = w.argmax(1)
        return torch.where(w.gather(1, best[:, None]).squeeze(1) > 0, best, torch.full_like(best, -1))

    def lia_side_information(self, users, query_items, target_items):
        m = self.model
        x = dense_rows(self.x, users).double()
        ind = dense_rows(self.ind, users).double()
        truth = dense_rows(self.r, users).double().gather(1, target_items[:, None]).squeeze(1)
        s_q = self.Sk[query_items]
        den = (s_q.abs() * ind).sum(1).clamp_min(m.floor_c)
        s_ql = s_q.gather(1, target_items[:, None]).squeeze(1)
        x_l = x.gather(1, target_items[:, None]).squeeze(1)
        n_rest = (s_q * x).sum(1) - s_ql * x_l
        rbar = m.item_means.double()
        a = den / s_ql
        b = rbar[target_items] - (rbar[query_items] * den + n_rest) / s_ql
        return a, b, truth


def load_fold(data: str, seed: int) -> Fold:
    if data == "synthetic":
        from dprec_torch.data.synthetic import load_synthetic

        return load_synthetic("tiny", seed=seed).folds[0]
    from dprec_torch.data.movielens import load_movielens

    return load_movielens("ml-100k", fold=1, data_dir=os.environ.get("DPREC_DATA")).folds[0]


def attack_one(mechanism: str, epsilon: str, fold: Fold, n_users: int, seed: int) -> dict:
    from dprec_torch.audit.runner import train_once

    data = "synthetic" if fold.name.startswith("holdout") else "ml-100k"
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("config", overrides=["model=pnbm", f"mechanism={mechanism}", f"epsilon={epsilon}", f"data={data}"])
    model, report = train_once(cfg, fold.train, fold.test.select(slice(0, 50)), seed)
    gen = torch.Generator().manual_seed(seed)
    test_users = torch.unique(fold.test.users)
    users = test_users[torch.randperm(test_users.numel(), generator=gen)[:n_users]]
    # query: a random test item of each user (an item u has not rated in train)
    first = torch.searchsorted(fold.test.users.sort().values, users)
    order = torch.argsort(fold.test.users, stable=True)
    counts = torch.bincount(fold.test.users, minlength=fold.train.n_users)[users]
    pick = first + (torch.rand(users.numel(), generator=gen) * counts).long()
    query = fold.test.items[order][pick]
    side = PNBMSideInformation(model)
    target = side.pick_targets(users, query)
    ok = target >= 0
    res = lia_attack(side, lambda u, i: model.predict(u, i).double(), users[ok], query[ok], target[ok])
    eps = report.get("epsilon")
    return {"mechanism": mechanism, "epsilon_config": epsilon, "epsilon_defended": eps, "relation": report.get("relation"),
            "attacked": int(ok.sum()), "accuracy": res.accuracy}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--data", choices=["ml-100k", "synthetic"], default="ml-100k")
    p.add_argument("--users", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        fold = load_fold(args.data, args.seed)
        rows = [attack_one(m, e, fold, args.users, args.seed) for m, e in MECHANISMS]
    except DprecError as err:
        log.error("%s", err)
        return 2
    lines = ["| mechanism | ε (config) | ε defended (relation) | users attacked | LIA accuracy |", "|---|---|---|---|---|"]
    for r in rows:
        d = "not established" if r["epsilon_defended"] is None else f"{float(r['epsilon_defended']):.3g} ({r['relation']})"
        lines.append(f"| {r['mechanism']} | {r['epsilon_config']} | {d} | {r['attacked']} | {r['accuracy']:.3f} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "lia_pnbm.md").write_text(
        f"LIA on PNBM ({args.data} fold 1): one hidden training rating per user reconstructed from one released "
        "prediction, the model and the user's other ratings (experiments/studies/lia_pnbm.py).\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
