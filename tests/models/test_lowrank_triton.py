"""The low-rank PNBM's GPU kernels (``models.lowrank_triton``) equal the torch path to float64 rounding: f and p_u,
the per-user norms (Frobenius and L1) and the clipped gradient sum, with and without a sampled-row mask, and whole
masked training steps (the Trainer, the mechanism's clip and noise).

On a GPU the kernels run natively (``-m gpu``); without one in Triton's CPU interpreter (``TRITON_INTERPRET=1`` with
``DPREC_LOWRANK_KERNEL=triton``, in a subprocess: the flag is read when a kernel is defined). Both skip only where
Triton does not import (CPU wheels of torch ship without it).
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import script_json

triton = pytest.importorskip("triton", reason="Triton is not installed (CPU wheels of torch ship without it)")

CHECK = r"""
import json, os, sys, torch
from dprec_torch.models import lowrank_triton as lt
from dprec_torch.models.pnbm_lowrank import per_user_gradients
from tests.models.test_pnbm_lowrank import random_ratings

device = torch.device(sys.argv[1])
out = {}

def rel(a, b):
    return float(((a - b).abs() / b.abs().clamp_min(1e-12)).max()) if b.numel() else 0.0

# (d = 40: a 64-wide tile of 32 ratings; on a GPU two ranks, one of each tile shape: fewer compilations)
for d, seed in ((1, 4), (3, 1), (8, 2), (40, 3)) if device.type == "cpu" else ((3, 1), (40, 3)):
    data = random_ratings(seed, n_users=9, n_items=300, density=0.6)  # users with 2-3 blocks of ratings
    gen = torch.Generator().manual_seed(seed)
    U = (torch.randn(data.n_items, d, generator=gen, dtype=torch.float64) * 0.7).to(device)
    users, items = data.users.to(device), data.items.to(device)
    seg = torch.zeros(data.n_users + 1, dtype=torch.int64)
    seg[1:] = torch.cumsum(torch.bincount(data.users, minlength=data.n_users), 0)
    seg = seg.to(device)
    y = (torch.rand(len(data), generator=gen) * 2 - 1).to(device)
    w = torch.bincount(data.users, minlength=data.n_users).float().clamp_min(1).rsqrt().to(device)
    inv = torch.bincount(data.users, minlength=data.n_users).double().clamp_min(1).rsqrt().to(device)
    e = torch.randn(len(data), generator=gen, dtype=torch.float64).to(device)
    factor = torch.rand(data.n_users, generator=gen, dtype=torch.float64).to(device)
    for masked in (False, True):
        mask = torch.arange(data.n_users, device=device) % 3 != 1 if masked else None
        keep = torch.ones(len(data), dtype=torch.bool, device=device) if mask is None else mask[users]
        ek = torch.where(keep, e, 0.0)
        # the torch path's numbers (pnbm_lowrank._f and per_user_gradients)
        ui = U.index_select(0, items)
        p_ref = torch.zeros(data.n_users, d, dtype=torch.float64, device=device).index_add_(0, users, ui * y[:, None])
        p_w = p_ref * w[:, None]
        f_ref = (ui * p_w.index_select(0, users)).sum(1) - (U * U).sum(1).index_select(0, items) * y * w[users]
        p_sum, f = lt.forward_sums(U, items, seg, y, w, mask)
        # a sum in another order moves by rounding of its terms' magnitudes, not of the (possibly cancelled) sum
        scale = torch.zeros_like(p_ref).index_add_(0, users, (ui * y[:, None]).abs())
        sel = mask if mask is not None else slice(None)
        row = {"p": float(((p_sum[sel] - p_ref[sel]).abs() / scale[sel].clamp_min(1e-300)).max()),
               "f": float((f[keep] - f_ref[keep]).abs().max() / f_ref[keep].abs().max()),  # (f cancels: per scale)
               "f_unsampled_zero": bool((f[~keep] == 0).all())}
        for l1 in (False, True):
            rows, n_ref = per_user_gradients(users, items, y, U, data.n_users, ek, (ui, p_ref), norm=1 if l1 else 2)
            q, norms = lt.gradient_norms(U, items, seg, y, ek, p_ref, inv, mask, l1)
            row[f"norm_l1={l1}"] = rel(norms, n_ref)
            g_ref = torch.zeros_like(U).index_add_(0, items, rows * factor.index_select(0, users)[:, None])
            g = lt.scatter_clipped(U, items, seg, y, ek, p_ref, inv, q, factor, mask)
            row[f"sum_l1={l1}"] = float((g - g_ref).abs().max() / g_ref.abs().max())
        row["positive"] = int((f_ref[keep] != 0).sum())
        out[f"d={d} masked={masked}"] = row

# whole masked steps through the Trainer: the kernels against the torch path, the same secret draws
from dprec_torch.training import run as run_module
from dprec_torch.training.run import setup_training
from dprec_torch.training.trainer import Trainer
from tests.helpers import tiny_cfg, tiny_fold
from tests.models.test_pnbm_lowrank import BASE, DPSGD, GAUSSIAN

run_module.masked_steps = lambda model, dev: True
os.environ["DPREC_STEP_GRAPH"] = "0"  # eager steps: the kernels against the torch path (test_step_graph replays them)
for name, mech in (("gaussian", GAUSSIAN), ("dpsgd", DPSGD)):
    finals = {}
    for mode in ("torch", "triton" if device.type == "cpu" else "auto"):
        os.environ["DPREC_LOWRANK_KERNEL"] = mode
        cfg = tiny_cfg(*[o if o != "device=cpu" else f"device={device.type}" for o in BASE], *mech, "epsilon=5",
                       "noise_seed=3")
        setup = setup_training(cfg, tiny_fold().to(device), device)
        trainer = Trainer(setup.model, setup.optimizer, setup.sampler, 1)
        sq = [float(trainer._step()[0]) for _ in range(3)]
        finals[mode] = (setup.model.U.detach().cpu(), sq, float(setup.optimizer.state["mechanism"]["clipped_fraction"]))
    (u_a, sq_a, c_a), (u_b, sq_b, c_b) = finals.values()
    out[f"steps {name}"] = {"U": float((u_a - u_b).abs().max() / u_a.abs().max()), "sq": rel(torch.tensor(sq_b), torch.tensor(sq_a)),
                            "clipped_same": c_a == c_b, "moved": bool(sq_a[0] > 0)}
print(json.dumps(out))
"""


def _check(device: str, env: dict[str, str]) -> dict:
    return script_json(CHECK, device, env=env)


def _assert_same(out: dict) -> None:
    for name, row in out.items():
        if name.startswith("steps"):
            assert row["U"] < 1e-12 and row["sq"] < 1e-12 and row["clipped_same"] and row["moved"], (name, row)
            continue
        assert row["positive"] > 0, name  # the check is not vacuous
        assert row["f_unsampled_zero"], name
        for key, value in row.items():
            if key not in ("positive", "f_unsampled_zero"):
                assert value < 1e-12, (name, key, row)


@pytest.mark.slow
def test_lowrank_kernels_equal_the_torch_path_in_the_interpreter():
    _assert_same(_check("cpu", {"TRITON_INTERPRET": "1", "DPREC_LOWRANK_KERNEL": "triton"}))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_lowrank_kernels_equal_the_torch_path_on_cuda():
    _assert_same(_check("cuda", {}))
