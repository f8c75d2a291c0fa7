"""Every Triton kernel compiles for a Hopper GPU (sm_90) without one: Triton's front end and LLVM run on the CPU.

The interpreter (``TRITON_INTERPRET=1``) runs a kernel's Python, not its compilation: it accepted a float global that
the compiler refuses (a kernel reads only ``tl.constexpr(...)`` globals), which a GPU session then found. This test
compiles each kernel, for each dtype and switch it is launched with, to PTX. It skips where Triton does not import
(CPU wheels of torch ship without it).
"""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton", reason="Triton is not installed (CPU wheels of torch ship without it)")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from dprec_torch import chacha_triton  # noqa: E402
from dprec_torch.models import pair_triton  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)


def _ptx(fn, signature: dict[str, str], constexprs: dict) -> str:
    src = ASTSource(fn=fn, signature={**signature, **{k: "constexpr" for k in constexprs}}, constexprs=constexprs)
    return triton.compile(src, target=HOPPER).asm["ptx"]


def test_the_keystream_kernel_compiles() -> None:
    assert ".entry chacha_blocks" in _ptx(chacha_triton.chacha_blocks,
                                          {"key": "*u32", "out": "*u32", "n_blocks": "i64"}, {"BLOCK": 128})


@pytest.mark.parametrize("mode,out", [(0, "*fp64"), (1, "*fp64"), (2, "*fp32")])
def test_the_uniform_kernel_compiles(mode: int, out: str) -> None:
    assert ".entry uniform_fill" in _ptx(chacha_triton.uniform_fill, {"key": "*u32", "out": out, "n": "i64"},
                                         {"MODE": mode, "BLOCK": 128})


@pytest.mark.parametrize("target", ["*fp32", "*fp64"])
@pytest.mark.parametrize("name", ["gaussian_add", "laplace_add"])
def test_the_fused_noise_kernels_compile(name: str, target: str) -> None:
    ptx = _ptx(getattr(chacha_triton, name), {"key": "*u32", "target": target, "n": "i64"}, {"BLOCK": 128})
    assert f".entry {name}" in ptx
    if name == "gaussian_add":
        assert "sqrt.rn.f64" in ptx  # float64 sqrt correctly rounded, as torch's


@pytest.mark.parametrize("terms", [False, True])
@pytest.mark.parametrize("square", [False, True])
def test_the_pair_norm_kernel_compiles(terms: bool, square: bool) -> None:
    f64 = "*fp64"
    sig = {"rows": "*i64", "items": "*i64", "crow": "*i64", "cols": "*i64", "xv": f64, "e": f64,
           "den": "*i8" if terms else f64, "a": "*i8" if terms else f64, "active": "*i8" if terms else f64,
           "floor": f64, "S": "*fp32", "stride_s": "i64", "out": f64}
    ptx = _ptx(pair_triton._kernel(), sig, {"INCLUDE_DIAGONAL": False, "SQUARE": square, "TERMS": terms, "BLOCK": 128})
    assert ".entry target_norm" in ptx


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("d", [1, 3, 8, 33])
def test_the_lowrank_kernels_compile(masked: bool, d: int) -> None:
    from dprec_torch.models import lowrank_triton

    forward, norms, scatter = lowrank_triton._kernels()
    mask = "*i1" if masked else "*i64"
    shape = {"MASKED": masked, **lowrank_triton._shape(d)}
    base = {"U": "*fp64", "items": "*i64", "seg": "*i64", "y": "*fp32"}
    assert ".entry forward_sums" in _ptx(forward, {**base, "w": "*fp32", "sampled": mask, "p_sum": "*fp64",
                                                   "f": "*fp64", "d": "i32"}, shape)
    grad = {**base, "e": "*fp64", "p_sum": "*fp64", "inv_sqrt": "*fp64"}
    for l1 in (False, True):
        assert ".entry gradient_norms" in _ptx(norms, {**grad, "sampled": mask, "q_out": "*fp64", "norms": "*fp64",
                                                       "d": "i32"}, {"L1": l1, **shape})
    ptx = _ptx(scatter, {**grad, "q_in": "*fp64", "factor": "*fp64", "sampled": mask, "grad": "*fp64", "d": "i32"}, shape)
    assert ".entry scatter_clipped" in ptx and "atom.global" in ptx  # float64 atomic adds
