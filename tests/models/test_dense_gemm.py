"""The accelerator's dense-GEMM products (``models.batching.rows_times``) give the CSR path's numbers.

On the CPU the CSR product is always used; here the GEMM branch is forced (``dense_gemm_wins`` patched
to True) so the code a GPU runs is checked on every machine: forward, gradient, prediction and the
per-user norms the private mechanisms clip. Tolerance: float32 sums in another order (1e-5 relative).
"""

from __future__ import annotations

import pytest
import torch

from dprec_torch.models import batching
from dprec_torch.models import pnbm as pnbm_module
from dprec_torch.models.batching import make_batch
from dprec_torch.models.pnbm import PNBM
from dprec_torch.privacy import pnbm_clipping as pc
from tests.helpers import tiny_fold


def force_gemm(monkeypatch, on: bool) -> None:
    wins = (lambda n_rows, n_cols, device: True) if on else (lambda n_rows, n_cols, device: False)
    monkeypatch.setattr(batching, "dense_gemm_wins", wins)
    monkeypatch.setattr(pnbm_module, "dense_gemm_wins", wins)


def quantities(train, test, gradient: str) -> dict[str, torch.Tensor]:
    """Everything that reads the history block through a product with S, for one model and batch."""
    model = PNBM(train.n_items, floor_c=2.0, init_scale=0.4, seed=3, formulation="dense", gradient=gradient,
                 n_neighbors=5).attach(train)
    users = torch.zeros(train.n_users, dtype=torch.bool)
    users[::2] = True
    batch = make_batch(train, model.item_means, users[train.users], users)
    pred = model.batch_predict(batch)
    res = (pred - batch.values).detach()
    model.zero_grad()
    model.surrogate_loss(batch, res).backward()
    out = {"pred": pred.detach(), "grad": model.S.grad.clone(), "predict": model.predict(test.users, test.items)}
    if gradient == "exact":
        out["l2"] = pc.per_user_grad_norms(model, batch, res, p=2)
        out["l1"] = pc.per_user_grad_norms(model, batch, res, p=1)
        out["terms"] = torch.stack(pc.target_terms(model, batch))
    return out


@pytest.mark.parametrize("gradient", ["exact", "paper_eq5"])
def test_gemm_branch_matches_csr_branch(monkeypatch, gradient):
    fold = tiny_fold()
    force_gemm(monkeypatch, False)
    csr = quantities(fold.train, fold.test, gradient)
    force_gemm(monkeypatch, True)
    gemm = quantities(fold.train, fold.test, gradient)
    assert set(csr) == set(gemm)
    for key in csr:
        assert csr[key].abs().max() > 0, key  # a product that is all zeros would compare equal vacuously
        torch.testing.assert_close(gemm[key], csr[key], rtol=1e-5, atol=1e-5, msg=key)


def test_gemm_rule_cpu_and_memory_bound():
    """The CSR product on the CPU (its numbers are the published ones); on an accelerator the GEMM up to the byte bound."""
    cpu, gpu = torch.device("cpu"), torch.device("meta")
    assert not batching.dense_gemm_wins(10, 10, cpu)
    assert batching.dense_gemm_wins(6040, 3706, gpu)  # ML-1M's full batch: 179 MB as float64
    too_many = batching.DENSE_ROWS_MAX_BYTES // 8 + 1
    assert not batching.dense_gemm_wins(too_many, 1, gpu)


def test_dense_rows_cached_per_block():
    fold = tiny_fold()
    model = PNBM(fold.train.n_items, seed=0)
    users = torch.ones(fold.train.n_users, dtype=torch.bool)
    batch = make_batch(fold.train, model.item_means, users[fold.train.users], users)
    first = batching.dense_rows(batch, "x")
    assert batching.dense_rows(batch, "x") is first
    torch.testing.assert_close(first, batch.x.to_dense())
    batch.x = batch.ind  # a replaced block is densified again
    assert batching.dense_rows(batch, "x") is not first


def test_run_records_float32_matmul(tmp_path):
    """The default run keeps float32 matmuls (no silent TF32) and says so in metrics.json."""
    import dprec_torch

    run = dprec_torch.train(["data=synthetic", "model=pnbm", "mechanism=none", "mechanism.epochs=1", "compare_baselines=false",
                             "tensorboard=false", f"output_dir={tmp_path}"])
    assert run.metrics["matmul_precision"] == "highest"
    assert torch.get_float32_matmul_precision() == "highest"
