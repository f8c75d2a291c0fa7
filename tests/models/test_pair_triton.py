"""The fused Triton per-user L1 and L2 norms (``models.pair_triton``) equal the torch pair enumeration, with the
targets' d_t and a_t given (``target_terms``) or summed in the kernel (the training path on a GPU).

On a GPU the kernel runs natively (``-m gpu``); without one it runs in Triton's CPU interpreter
(``TRITON_INTERPRET=1``, a subprocess, since the flag is read when the kernel is defined). Both skip
only where Triton does not import (CPU wheels of torch ship without it).
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import script_json

triton = pytest.importorskip("triton", reason="Triton is not installed (CPU wheels of torch ship without it)")

CHECK = r"""
import json, sys, torch
from dprec_torch.models import pair_triton
from dprec_torch.models.batching import full_batch
from dprec_torch.models.pnbm import PNBM
from dprec_torch.privacy import pnbm_clipping as pc
from tests.helpers import tiny_fold

device = sys.argv[1]
train = tiny_fold().train
model = PNBM(train.n_items, floor_c=2.0, seed=0, pair_backend="torch").attach(train).to(device)
with torch.no_grad():  # signs of every kind, exact zeros included
    model.S.copy_(torch.randn(model.S.shape, generator=torch.Generator().manual_seed(1)).to(device))
    model.S.view(-1)[:: 7].zero_()
batch = full_batch(train.to(device), model.item_means)
res = torch.randn(batch.n_targets, generator=torch.Generator().manual_seed(2), dtype=torch.float64).to(device)
out = {}
for diag, p in ((False, 1), (True, 1), (False, 2), (True, 2)):
    ref = pc.per_user_grad_norms(model, batch, res, p=p, include_diagonal=diag, method="pairs")
    _, den, a = pc.target_terms(model, batch)
    crow, cols, xv = pc._history(batch)
    args = (batch.rows, batch.items, crow, cols, xv, res, den, a, model.S, len(batch.users), diag)
    got, again = pair_triton.user_norms(*args, p=p), pair_triton.user_norms(*args, p=p)
    # d_t and a_t summed in the kernel (the training path: per_user_grad_norms on a GPU), not by target_terms
    terms = pair_triton.user_norms(*args[:6], None, None, *args[8:], p=p, active=model.floor_mask(batch),
                                   floor_c=model.floor_c)
    out[f"diag={diag} p={p}"] = {"max_rel": float(((got - ref).abs() / ref.abs().clamp_min(1e-300)).max()),
                      "max_rel_terms": float(((terms - ref).abs() / ref.abs().clamp_min(1e-300)).max()),
                      "deterministic": bool(torch.equal(got, again)), "n": int(ref.numel()),
                      "positive": int((ref > 0).sum())}
print(json.dumps(out))
"""


def _check(device: str, env: dict[str, str]) -> dict:
    return script_json(CHECK, device, env=env)


def _assert_same(out: dict) -> None:
    for diag, row in out.items():
        assert row["positive"] > 0, diag  # the check is not vacuous
        assert row["max_rel"] < 1e-12 and row["max_rel_terms"] < 1e-12, (diag, row)
        assert row["deterministic"], diag


@pytest.mark.slow
def test_triton_norms_equal_the_pair_enumeration_in_the_interpreter():
    _assert_same(_check("cpu", {"TRITON_INTERPRET": "1"}))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_triton_norms_equal_the_pair_enumeration_on_cuda():
    _assert_same(_check("cuda", {}))
