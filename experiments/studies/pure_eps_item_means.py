"""What a pure-epsilon, user-level item-mean release leaves on ML-1M: the limit behind `mechanism=dpsgd`'s row.

`python train.py mechanism=dpsgd epsilon=10 data=ml-1m` releases (under pure epsilon, user level) the item means and U.
Its size rule already spends ~99 % of epsilon on the means, and the model's prediction without U is the "not learning"
part: r_hat_ui = r_bar_i + b_u + q_u . phi_i (the user's own offset and ridge weights on the public catalogue features,
joint DP, no epsilon). This script measures that prediction with U = 0 on the five ML-1M folds for four item-mean
releases at each epsilon:

* ``exact``: the non-private item means, unshrunk (a shrunk release can beat them on rare items);
* ``laplace``: the package's pure-epsilon release (`release_item_means`, posterior estimator, Laplace, user level,
  count weight 0.3, prior std 0.5: each user's (S, gamma C) contribution has L1 norm 1), shrunk towards a constant;
* ``laplace_feature_prior``: the same release shrunk towards a ridge on the public item features
  (`mean_feature_prior`, post-processing): what `dpsgd` releases;
* ``laplace_oracle``: an OPTIMISTIC bound on re-weighted Laplace releases, NOT a DP release: each rating's weight
  is a_i = (n_i / max n)^-0.7 from the TRUE item counts (free information no DP release has), the statistics are centred at
  the exact global mean, and the shrinkage prior's mean is a public-feature ridge fitted to the noisy deviations;
* ``gaussian``: the (epsilon, delta = 1e-6) Gaussian release of the same statistics with popularity re-weighting
  (alpha 0.5, share 0.2; `noisy_gram`'s validated item means) -- what L2 sensitivity buys.

Output: docs/results/pnbm_lowrank/pure_eps_item_means.json and the ``pure_eps_means`` block of docs/pnbm_lowrank.md.
MEASUREMENT only: nothing here chooses a default.

    python experiments/studies/pure_eps_item_means.py run      # ~10 min on 2 cores
    python experiments/studies/pure_eps_item_means.py report
    python experiments/studies/pure_eps_item_means.py prior-check   # the mean_feature_prior choice, on validation splits
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "results" / "pnbm_lowrank" / "pure_eps_item_means.json"
EPSILONS = (5.0, 10.0, 20.0, 50.0)
RELEASES = ("exact", "laplace", "laplace_feature_prior", "laplace_oracle", "gaussian")
DELTA, REPEATS, BETA_P, FEATURE_REG = 1e-6, 2, 5.0, 10.0
TARGET = 0.895  # the dpsgd epsilon=10 ML-1M row of the defaults issue


def _per(index, v, n):
    import torch

    return torch.zeros(n, dtype=torch.float64).index_add_(0, index, v)


def _score(train, test, features, means) -> float:
    """Test RMSE of r_bar_i + b_u + q_u . phi_i (U = 0) with the item means ``means``."""
    import torch

    from dprec_torch.models.content import feature_weights

    e = train.values.double() - means[train.items]
    b = _per(train.users, e, train.n_users) / (_per(train.users, torch.ones_like(e), train.n_users) + BETA_P)
    q, _ = feature_weights(train, e - b[train.users], features, FEATURE_REG)
    phi = features.matrix.double()
    pred = means[test.items] + b[test.users] + (q[test.users] * phi[test.items]).sum(1)
    return float(((pred.clamp(train.scale.lo, train.scale.hi) - test.values.double()) ** 2).mean().sqrt())


def _oracle_laplace(train, features, epsilon, gen):
    """The optimistic re-weighted Laplace bound (module docstring; reads the true counts, so NOT differentially private)."""
    import torch

    m, lo, hi = train.n_items, train.scale.lo, train.scale.hi
    half, gamma, tau2 = (hi - lo) / 2, 0.3, (0.5 / ((hi - lo) / 2)) ** 2
    g = float(train.values.double().mean())
    counts = _per(train.items, torch.ones(len(train.values), dtype=torch.float64), m)
    a = counts.clamp_min(1.0) ** -0.7
    a = a / a.max()
    z = (train.values.double() - g) / half
    t = a[train.items]
    w = t / _per(train.users, t * (z.abs() + gamma), train.n_users).clamp_min(1e-12)[train.users]
    lap = gen.add_laplace_(torch.zeros(2 * m, dtype=torch.float64), 1.0 / epsilon)
    s, c = (_per(train.items, w * z, m) + lap[:m]) / a, (_per(train.items, w * gamma, m) + lap[m:]) / (gamma * a)
    std = math.sqrt(2.0) / epsilon / a
    cp = c.clamp_min(0.0)
    den = cp * cp * tau2 + std * std
    x = torch.cat([torch.ones(m, 1, dtype=torch.float64), features.matrix.double()], 1)
    wt = cp * cp / den
    est = torch.where(cp > 0, s / cp.clamp_min(1e-9), torch.zeros_like(s))
    beta = torch.linalg.solve(x.t() @ (x * wt[:, None]) + torch.eye(x.shape[1], dtype=torch.float64), x.t() @ (wt * est))
    return (g + half * ((x @ beta) * std * std + cp * tau2 * s) / den).clamp(lo, hi)


def run(out: Path) -> None:
    import torch

    import dprec_torch
    from dprec_torch.api import compose_config
    from dprec_torch.config import instantiate_node
    from dprec_torch.data.item_features import item_features_of
    from dprec_torch.privacy.calibration import _gdp_mu
    from dprec_torch.privacy.item_means import ItemMeansSpec, release_item_means
    from dprec_torch.seeding import noise_generator

    torch.set_num_threads(2)
    dataset = instantiate_node(compose_config(["data=ml-1m", "data.fold=all"]).data)
    laplace = ItemMeansSpec("posterior", "user", "laplace", 0.5, count_weight=0.3)
    prior = ItemMeansSpec("posterior", "user", "laplace", 0.5, count_weight=0.3, feature_prior=True)
    gaussian = ItemMeansSpec("posterior", "user", "gaussian", 0.5, count_weight=0.3, popularity_alpha=0.5, popularity_share=0.2)
    rows: dict[str, dict[str, list[float]]] = {}
    t0 = time.perf_counter()
    for fold in dataset.folds:
        train, test = fold.train, fold.test
        features = item_features_of(train, "pure_eps_item_means")
        exact = release_item_means(train, laplace, noise_generator(None), epsilon=math.inf).means.double()
        for eps in EPSILONS:
            cell = rows.setdefault(f"{eps:g}", {r: [] for r in RELEASES})
            cell["exact"].append(_score(train, test, features, exact))
            for _ in range(REPEATS):  # secret noise, a fresh key each draw
                gen = noise_generator(None)
                cell["laplace"].append(_score(train, test, features, release_item_means(train, laplace, gen, epsilon=eps).means.double()))
                rel = release_item_means(train, prior, gen, epsilon=eps, features=features.matrix)
                cell["laplace_feature_prior"].append(_score(train, test, features, rel.means.double()))
                cell["laplace_oracle"].append(_score(train, test, features, _oracle_laplace(train, features, eps, gen)))
                mu = _gdp_mu(eps, DELTA)
                cell["gaussian"].append(_score(train, test, features, release_item_means(train, gaussian, gen, mu=mu).means.double()))
        print(f"fold {fold.index}: {time.perf_counter() - t0:.0f} s", flush=True)
    doc = {"dataset": "ml-1m, 5 per-user keyed 90/10 folds", "delta_gaussian": DELTA, "repeats": REPEATS,
           "prediction": "r_bar_i + b_u + q_u . phi_i (U = 0)", "package_version": dprec_torch.__version__,
           "secret_noise": True, "results": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))


PRIOR_CHECK = ROOT / "docs" / "results" / "pnbm_lowrank" / "feature_prior_check.json"


def prior_check(out: Path) -> None:
    """The choice of ``mechanism.mean_feature_prior`` for `dpsgd` on the low-rank PNBM, made on other people: each
    dataset's fold-1 80/20 per-user validation split (ML-100K's decides for ML-1M runs, ML-1M's for ML-100K runs;
    the two share no users), the Laplace release at eps in (1, 5, 10, 50) with and without the feature prior, U = 0,
    three secret noise draws each. Test splits are never read."""
    import torch

    from dprec_torch.api import compose_config
    from dprec_torch.config import instantiate_node
    from dprec_torch.data.item_features import item_features_of
    from dprec_torch.data.validation import validation_fold
    from dprec_torch.privacy.item_means import ItemMeansSpec, release_item_means
    from dprec_torch.seeding import noise_generator

    torch.set_num_threads(2)
    doc: dict[str, dict[str, dict[str, list[float]]]] = {}
    for data in ("ml-100k", "ml-1m"):
        fold = validation_fold(instantiate_node(compose_config([f"data={data}"]).data).folds[0], 0.2, 0)
        features = item_features_of(fold.train, "prior_check")
        for eps in (1.0, 5.0, 10.0, 50.0):
            cell = doc.setdefault(data, {}).setdefault(f"{eps:g}", {"constant_prior": [], "feature_prior": []})
            for _ in range(3):
                for name, on in (("constant_prior", False), ("feature_prior", True)):
                    spec = ItemMeansSpec("posterior", "user", "laplace", 0.5, count_weight=0.3, feature_prior=on)
                    rel = release_item_means(fold.train, spec, noise_generator(None), epsilon=eps, features=features.matrix)
                    cell[name].append(_score(fold.train, fold.test, features, rel.means.double()))
    out.write_text(json.dumps({"splits": "fold-1 80/20 per-user validation split of each dataset (seed 0)",
                               "results": doc}, indent=1))


def summary(path: Path) -> str:
    """The markdown table of the JSON: mean test RMSE over folds (and noise draws) per release and epsilon."""
    doc = json.loads(path.read_text())
    head = "| release (user level, U = 0, public features) | " + " | ".join(f"ε={e}" for e in doc["results"]) + " |"
    lines = [head, "|---|" + "---|" * len(doc["results"])]
    names = {"exact": "exact item means, unshrunk (no privacy)", "laplace": "pure ε: Laplace means, shrunk to a constant",
             "laplace_feature_prior": "pure ε: Laplace means, shrunk to a feature ridge (what `dpsgd` releases)",
             "laplace_oracle": "pure ε, optimistic: true-count weights + feature prior (not DP)",
             "gaussian": f"(ε, δ={doc['delta_gaussian']:g}): Gaussian means, popularity-weighted"}
    for r in RELEASES:
        vals = [sum(c[r]) / len(c[r]) for c in doc["results"].values()]
        lines.append(f"| {names[r]} | " + " | ".join(f"{v:.4f}" for v in vals) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("stage", choices=["run", "report", "prior-check"])
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args()
    if a.stage == "prior-check":
        prior_check(PRIOR_CHECK)
        print(PRIOR_CHECK.read_text())
        return
    if a.stage == "run":
        run(a.out)
    from dprec_torch.study.markers import splice

    splice(ROOT / "docs" / "pnbm_lowrank.md", "pure_eps_means", summary(a.out))
    print(summary(a.out))


if __name__ == "__main__":
    main()
