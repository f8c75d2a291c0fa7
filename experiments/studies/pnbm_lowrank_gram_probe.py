"""Probe for issue 27, item 4 (a noisy-Gram start for the low-rank PNBM): is U_0 from the top eigenvectors of the item
Gram worth an epsilon share? ML-100K u1, the default model with the exact item means (epsilon=inf, no steps taken):
U_0 = alpha V_8 diag(sqrt(lambda_8 / N)) from G = sum_u x_u x_u^T (x_u: the model's residuals y_u clipped to L2 norm
c) plus symmetric N(0, (sigma c^2)^2) noise, scored on u1.test. Prints one line per (c, sigma, alpha).

    DPREC_DATA=../shared/data python experiments/studies/pnbm_lowrank_gram_probe.py
"""

import sys, math, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
from hydra import compose, initialize_config_dir
from dprec_torch.training.run import setup_training
from dprec_torch.data.movielens import load_movielens
from dprec_torch.models.pnbm_lowrank import user_residuals
from dprec_torch.predictors.noisy_gram import gram, top_eigen, symmetric_noise
torch.set_num_threads(2)
fold = load_movielens(name="ml-100k", fold=1).folds[0]
with initialize_config_dir(config_dir=str(__import__("pathlib").Path(__file__).resolve().parents[2] / "conf"), version_base="1.3"):
    cfg = compose("config", overrides=["mechanism=gaussian", "epsilon=inf", "device=cpu", "tensorboard=false"])
setup = setup_training(cfg, fold, torch.device("cpu"))
model = setup.model
tr = fold.train
b, y = user_residuals(tr.users, tr.items, tr.values, model.item_means, tr.n_users, model.beta_p, model.clamp_r)
n = torch.bincount(tr.users, minlength=tr.n_users).double()
def rmse():
    model._predict_cache.clear()
    p = model.predict(fold.test.users, fold.test.items)
    return float(((p - fold.test.values) ** 2).mean().sqrt())
print("U0 random", rmse())
for clip in (1.0, 3.0):
    x = y.double()
    norm = torch.zeros(tr.n_users, dtype=torch.float64).index_add_(0, tr.users, x * x).sqrt()
    x = x * torch.clamp(clip / norm.clamp_min(1e-12), max=1.0)[tr.users]
    G = gram(tr, x)
    for sigma in (0.0, 2.0, 5.0):
        gen = torch.Generator().manual_seed(0)
        Gn = G + (symmetric_noise(G.shape[0], sigma * clip**2, gen, torch.device("cpu")) if sigma else 0)
        lam, V = top_eigen(Gn, 8, 3 * sigma * clip**2 * math.sqrt(G.shape[0]) if sigma else 0.0, torch.Generator().manual_seed(1))
        for alpha in (0.5, 1.0, 2.0, 4.0, 8.0):
            U0 = V * (lam.clamp_min(0) / tr.n_users).sqrt() * alpha
            with torch.no_grad():
                model.U.copy_(U0.float())
            print(f"clip {clip} sigma {sigma} alpha {alpha}: {rmse():.4f}")
