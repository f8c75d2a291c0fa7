"""The same code path on CUDA: predictions and one DPSGD step match the CPU (skipped without a GPU)."""

from __future__ import annotations

import pytest
import torch

from dprec_torch.models.batching import full_batch
from dprec_torch.models.pnbm import PNBM
from dprec_torch.predictors.knn import ItemKNN
from tests.helpers import tiny_fold

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_pnbm_gradient_same_on_cuda():
    fold = tiny_fold()
    grads = []
    for dev in ("cpu", "cuda"):
        f = fold.to(dev)
        m = PNBM(f.train.n_items, floor_c=1.0, seed=0).to(dev).attach(f.train)
        b = full_batch(f.train, m.item_means)
        pred = m.batch_predict(b)
        m.surrogate_loss(b, pred - b.values).backward()
        grads.append(m.S.grad.cpu())
    assert torch.allclose(grads[0], grads[1], atol=1e-4, rtol=1e-4)


def test_knn_same_on_cuda():
    fold = tiny_fold()
    out = [ItemKNN("pearson", k=50, device=d).fit(fold.train).predict(fold.test.users, fold.test.items).cpu() for d in ("cpu", "cuda")]
    assert torch.allclose(out[0], out[1], atol=1e-4)


#: |RMSE_cuda - RMSE_cpu| for the same noise-free run: float32 sums in another order (GEMM vs CSR/pairs)
RMSE_TOL = 1e-4


# sgld is not here: its Langevin noise is drawn at every epsilon, from a per-device generator stream
@pytest.mark.parametrize("mechanism", ["none", "dpsgd", "dpsgd_paper", "gaussian_pnbm"])
def test_every_pnbm_mechanism_same_rmse_on_cuda(mechanism, tmp_path):
    """Each PNBM mechanism's whole run (clipping, DP means, projection, evaluation) at epsilon = inf and full batches,
    so no random draw differs between the devices: the test RMSE on CUDA is the CPU's within ``RMSE_TOL``.
    (First GPU run: gaussian_pnbm at its default q = 0.5 differed by 3.2e-4 -- different Poisson batches, not numerics.)"""
    import dprec_torch

    rmse = []
    for dev in ("cpu", "cuda"):
        # full batches: a Poisson sample would be drawn from each device's own generator stream
        run = dprec_torch.train(["data=synthetic", "model=pnbm", f"mechanism={mechanism}", "epsilon=inf", "mechanism.epochs=2",
                                 "mechanism.sampling_ratio=1",
                                 f"device={dev}", "compare_baselines=false", "tensorboard=false", f"output_dir={tmp_path / dev}"])
        rmse.append(run.metrics["test_rmse"])
    assert abs(rmse[0] - rmse[1]) <= RMSE_TOL, rmse


@pytest.mark.parametrize("mechanism", ["none", "gaussian", "dpsgd", "sgld"])
def test_lowrank_pnbm_trains_on_cuda_like_the_cpu(mechanism, tmp_path):
    """``model=pnbm_lowrank`` through the Trainer on CUDA. At epsilon = inf and full batches no random draw
    differs between the devices (U_0 is drawn on the CPU), so the test RMSE matches the CPU's; a private run on CUDA
    reports the typed epsilon and ``load_run`` reproduces its released model's test RMSE there."""
    import dprec_torch

    rmse = []
    for dev in ("cpu", "cuda"):
        run = dprec_torch.train(["data=synthetic", "model=pnbm_lowrank", f"mechanism={mechanism}", "epsilon=inf",
                                 "mechanism.epochs=2", "mechanism.sampling_ratio=1", f"device={dev}", "compare_baselines=false",
                                 "tensorboard=false", f"output_dir={tmp_path / dev}"])
        rmse.append(run.metrics["test_rmse"])
    assert abs(rmse[0] - rmse[1]) <= RMSE_TOL, rmse
    if mechanism != "none":
        run = dprec_torch.train(["data=synthetic", "model=pnbm_lowrank", f"mechanism={mechanism}", "epsilon=8",
                                 "mechanism.epochs=2", "device=cuda", "compare_baselines=false", "tensorboard=false",
                                 f"output_dir={tmp_path / 'private'}"])
        assert run.metrics["privacy"]["epsilon"] <= 8.0 + 1e-9
        assert run.evaluate()["test_rmse"] == pytest.approx(run.metrics["test_rmse"], abs=1e-6)
