"""The package's CSPRNG: ChaCha20 keystream, Laplace and Gaussian noise added in place (dprec_torch/chacha.py).

The block function is RFC 8439's (section 2.3.2's vector); a draw depends on its key alone (not on the thread
count, nor on the device: the torch kernels give the numba kernels' words); the noise has the right law (KS tests
on 10^6 draws with a fixed key). The 256-bit keys and their derivation: tests/privacy/test_secret_keys.py.
"""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
import torch
from scipy import stats

from dprec_torch import chacha as noise
from dprec_torch import chacha_numba

KEY = np.arange(8, dtype=np.uint32) * np.uint32(0x01010101)
N = 1_000_000


@pytest.fixture
def threads():
    """torch.set_num_threads (which the sampler's numba kernels follow), restored afterwards."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def test_block_function_matches_rfc8439_2_3_2() -> None:
    key = np.frombuffer(bytes(range(32)), dtype="<u4")
    nonce = struct.unpack("<3I", bytes.fromhex("000000090000004a00000000"))
    out = noise.chacha20_block(key, 1, nonce)
    assert [int(w) for w in out] == [
        0xE4E7F110, 0x15593BD1, 0x1FDD0F50, 0xC47120A3, 0xC7F4D1C7, 0x0368C033, 0x9AAA2204, 0x4E6CD4C3,
        0x466482D2, 0x09AA9F07, 0x05D7C214, 0xA2028BD9, 0xD19C12B5, 0xB94E16DE, 0xE883D0CB, 0x4E3C50A2]
    serialized = out.astype("<u4").tobytes()  # RFC 8439 2.3.2's serialized block, first and last bytes
    assert serialized[:8].hex() == "10f1e7e4d13b5915" and serialized[-4:].hex() == "a2503c4e"


def test_element_k_uses_block_k_div_8_in_stream_order() -> None:
    n = 3 * 8192 + 37  # several groups and pieces, a ragged end
    words = noise.keystream_words(KEY, n)
    for k in (0, 1, 7, 8, 511, 512, 8191, 8192, n - 1):
        block = noise.chacha20_block(KEY, k // 8, (0, 0, 0))
        j = k % 8
        assert int(words[k]) == int(block[2 * j]) | (int(block[2 * j + 1]) << 32)


def test_draws_do_not_depend_on_the_thread_count(threads) -> None:
    base_values = torch.linspace(-1, 1, 5 * 8192 + 3, dtype=torch.float64)
    out = {}
    for n in (1, 2):
        threads(n)
        lap = noise.add_laplace_(base_values.clone(), 0.7, KEY)
        gau = noise.add_gaussian_(base_values.clone(), 0.7, KEY)
        out[n] = (lap, gau, noise.uniform(KEY, 40_001))
    assert torch.equal(out[1][0], out[2][0]) and torch.equal(out[1][1], out[2][1])
    assert torch.equal(out[1][2], out[2][2])


def test_same_key_same_draws_other_key_other_draws() -> None:
    a = noise.add_laplace_(torch.zeros(10_000), 1.0, KEY)
    b = noise.add_laplace_(torch.zeros(10_000), 1.0, KEY.copy())
    other = KEY.copy()
    other[3] ^= np.uint32(1)  # one key bit
    c = noise.add_laplace_(torch.zeros(10_000), 1.0, other)
    assert torch.equal(a, b)
    assert (a != c).float().mean() > 0.99


def test_a_prefix_of_a_longer_draw_is_the_shorter_draw() -> None:
    long = noise.add_gaussian_(torch.zeros(20_001, dtype=torch.float64), 1.0, KEY)
    for n in (1, 2, 7, 511, 512, 8193):
        assert torch.equal(noise.add_gaussian_(torch.zeros(n, dtype=torch.float64), 1.0, KEY), long[:n])


def test_uniforms_lie_in_the_half_open_unit_interval() -> None:
    u = noise.uniform(KEY, N, open_interval=True).numpy()
    assert u.min() > 0 and u.max() <= 1
    assert abs(u.mean() - 0.5) < 5 * np.sqrt(1 / 12 / N)
    assert stats.kstest(u, stats.uniform().cdf).pvalue > 1e-3
    assert np.all(np.modf(u * 2.0**53)[0] == 0)  # on the 2^-53 grid


def test_the_cpu_kernels_read_the_same_layout_and_scaling() -> None:
    """chacha_numba compiles its own copies of chacha's constants (chacha imports it only on a CPU draw)."""
    assert chacha_numba.ELEMENTS_PER_BLOCK == noise.ELEMENTS_PER_BLOCK
    assert (chacha_numba._TWO_M53, chacha_numba._TWO_PI) == (noise._TWO_M53, noise._TWO_PI)


def test_log_is_accurate_to_an_ulp() -> None:
    x = np.concatenate([noise.uniform(KEY, 20_000, open_interval=True).numpy(), [2.0**-53, 2.0**-52, 0.5, 1 - 2.0**-53, 1.0, np.sqrt(0.5)]])
    got = np.array([chacha_numba._log(v) for v in x])
    ref = np.log(x)
    assert np.all(np.abs(got - ref) <= np.spacing(np.abs(ref)) + 1e-300)


def test_box_muller_angle_is_accurate() -> None:
    k = np.concatenate([noise.keystream_words(KEY, 20_000) >> np.uint64(11),
                        np.array([0, 1, 2**50 - 1, 2**50, 2**51, 2**52, 3 * 2**51, 7 * 2**50, 2**53 - 1], dtype=np.uint64)])
    got = np.array([chacha_numba._cos_sin_turn(np.uint64(x)) for x in k])
    theta = 2 * np.pi * (k.astype(np.float64) * 2.0**-53)  # np.cos / np.sin of the rounded angle: within ~1e-15
    assert np.abs(got[:, 0] - np.cos(theta)).max() < 2e-15 and np.abs(got[:, 1] - np.sin(theta)).max() < 2e-15


@pytest.mark.parametrize("scale", [0.3, 2.5])
def test_laplace_has_the_laplace_law(scale: float) -> None:
    x = noise.add_laplace_(torch.zeros(N, dtype=torch.float64), scale, KEY).numpy()
    assert stats.kstest(x, stats.laplace(0.0, scale).cdf).pvalue > 1e-3
    sd_mean = np.sqrt(2 * scale**2 / N)
    assert abs(x.mean()) < 5 * sd_mean
    assert abs(x.var() / (2 * scale**2) - 1) < 0.01  # sd of the ratio ~ sqrt(5 / N) = 0.0022
    hi, lo = (x > 3 * scale).mean(), (x < -3 * scale).mean()
    expected = 0.5 * np.exp(-3)
    assert abs(hi - expected) < 5 * np.sqrt(expected / N) and abs(lo - expected) < 5 * np.sqrt(expected / N)
    assert stats.kstest(x[x > 0], -x[x < 0]).pvalue > 1e-3  # symmetric tails


@pytest.mark.parametrize("std", [0.5, 3.0])
def test_gaussian_has_the_normal_law(std: float) -> None:
    x = noise.add_gaussian_(torch.zeros(N + 1, dtype=torch.float64), std, KEY).numpy()  # odd: the last pair half used
    assert stats.kstest(x, stats.norm(0.0, std).cdf).pvalue > 1e-3
    assert abs(x.mean()) < 5 * std / np.sqrt(N)
    assert abs(x.var() / std**2 - 1) < 0.01  # sd of the ratio ~ sqrt(2 / N) = 0.0014
    hi, lo = (x > 2.5 * std).mean(), (x < -2.5 * std).mean()
    expected = stats.norm.sf(2.5)
    assert abs(hi - expected) < 5 * np.sqrt(expected / N) and abs(lo - expected) < 5 * np.sqrt(expected / N)
    assert abs(np.corrcoef(x[0:-1:2], x[1::2])[0, 1]) < 5 / np.sqrt(N / 2)  # the two halves of a pair


@pytest.mark.parametrize("add", [noise.add_laplace_, noise.add_gaussian_])
def test_in_place_add_on_float32_and_float64(add) -> None:
    start = torch.linspace(-3, 3, 10_007, dtype=torch.float64)
    drawn = add(torch.zeros_like(start), 1.3, KEY)  # the noise in float64
    t64 = start.clone()
    assert add(t64, 1.3, KEY) is t64 and torch.equal(t64, start + drawn)
    t32 = start.float()
    assert add(t32, 1.3, KEY) is t32 and t32.dtype == torch.float32
    assert torch.equal(t32, (start.float().double() + drawn).float())  # added in float64, rounded once


@pytest.mark.parametrize("add", [noise.add_laplace_, noise.add_gaussian_])
def test_non_contiguous_targets_get_the_row_major_draws(add) -> None:
    full = torch.arange(60.0).reshape(6, 10)
    view = full.t()  # non-contiguous, written through
    expected = add(view.contiguous(), 0.9, KEY)
    assert add(view, 0.9, KEY) is view
    assert torch.equal(view, expected) and torch.equal(full.t(), expected)
    half = torch.zeros(100, dtype=torch.bfloat16)  # another dtype: drawn on a float32 copy
    assert torch.equal(add(half, 0.9, KEY), add(torch.zeros(100), 0.9, KEY).bfloat16())


def test_the_torch_kernels_give_the_same_words_on_any_device() -> None:
    """CUDA draws come from torch integer kernels: the same keystream as the CPU's numba kernels (checked on the CPU
    here; on CUDA in tests/privacy/test_secret_keys.py when a GPU is present)."""
    n = 2 * 8 + 5
    lo, hi = noise.torch_keystream(KEY, n, "cpu")
    words = noise.keystream_words(KEY, n)
    assert np.array_equal((hi.numpy().astype(np.uint64) << np.uint64(32)) | lo.numpy().astype(np.uint64), words)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_half_open_uniforms_never_reach_one(dtype) -> None:
    u = noise.uniform(KEY, 100_000, dtype=dtype)
    assert u.dtype == dtype and u.min() >= 0 and u.max() < 1
    assert stats.kstest(u.double().numpy(), stats.uniform().cdf).pvalue > 1e-3


TRITON_CHECK = r"""
import numpy as np, torch
from dprec_torch import chacha
assert chacha._triton(torch.device("cpu")) is not None
for n in (1, 21, 1001, 128 * 8 * 3 + 5):  # a partial program, several programs
    lo, hi = chacha.torch_keystream(np.arange(8, dtype=np.uint32) * 0x9E3779B9, n, "cpu")
    words = (hi.numpy().astype(np.uint64) << np.uint64(32)) | lo.numpy().astype(np.uint64)
    assert np.array_equal(words, chacha.keystream_words(np.arange(8, dtype=np.uint32) * 0x9E3779B9, n)), n
from dprec_torch import chacha_triton
key = chacha.as_key(np.arange(8, dtype=np.uint32) * 0x9E3779B9)
for n in (0, 1, 7, 9, 128 * 8 + 3):  # the one-launch uniforms: chacha.uniform's bits, every mode
    for dtype, open_ in ((torch.float64, False), (torch.float64, True), (torch.float32, False), (torch.float32, True),
                         (torch.float16, False)):
        got = chacha_triton.uniform(key, chacha._CONSTANTS, n, torch.device("cpu"), dtype, open_)
        want = chacha.uniform(key, n, "cpu", dtype, open_interval=open_)
        assert got.dtype == want.dtype and torch.equal(got, want), (n, dtype, open_)
print("same")
"""


def test_the_triton_kernel_gives_the_same_words_in_the_interpreter() -> None:
    """On a GPU the words come from one Triton kernel (dprec_torch/chacha_triton.py): here it runs in Triton's CPU
    interpreter (a subprocess: the flag is read at import) and must give the numba kernels' words."""
    pytest.importorskip("triton", reason="Triton is not installed (CPU wheels of torch ship without it)")
    import subprocess
    import sys
    from pathlib import Path

    proc = subprocess.run([sys.executable, "-c", TRITON_CHECK], cwd=Path(__file__).resolve().parents[2],
                          env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "same", proc.stderr[-2000:]


FUSED_NOISE_CHECK = r"""
import sys
import numpy as np, torch
from scipy import stats
from dprec_torch import chacha, chacha_triton
device = sys.argv[1]
key = chacha.as_key(np.arange(8, dtype=np.uint32) * 0x9E3779B9)
exact = True
for n in (1, 7, 9, 1001, 128 * 8 * 3 + 5):  # a partial block, a partial program, several programs
    for dtype in (torch.float64, torch.float32):
        base = torch.linspace(-1, 1, n, dtype=dtype, device=device)
        for fused, ref in ((chacha_triton.add_gaussian_, chacha.gaussian_noise), (chacha_triton.add_laplace_, chacha.laplace_noise)):
            got = fused(base.clone(), 0.7, key, chacha._CONSTANTS)
            want = base.clone().add_(ref(key, n, 0.7, device).to(dtype))
            gap = (got.double() - want.double()).abs().max().item()
            exact = exact and gap == 0
            # the same formula in float64; the transcendental functions may round differently by an ulp
            assert gap <= (4e-15 if dtype == torch.float64 else 3e-7), (fused.__name__, n, dtype, gap)
ks = 200_000 if device == "cuda" else 16_384  # (the interpreter is slow)
big = chacha_triton.add_gaussian_(torch.zeros(ks, dtype=torch.float64, device=device), 1.0, key, chacha._CONSTANTS)
assert stats.kstest(big.cpu().numpy(), "norm").pvalue > 1e-3
lap = chacha_triton.add_laplace_(torch.zeros(ks, dtype=torch.float64, device=device), 1.0, key, chacha._CONSTANTS)
assert stats.kstest(lap.cpu().numpy(), "laplace").pvalue > 1e-3
print("same" if exact else "close")
"""


def _fused_noise(device: str, env: dict[str, str]) -> str:
    import subprocess
    import sys
    from pathlib import Path

    proc = subprocess.run([sys.executable, "-c", FUSED_NOISE_CHECK, device], cwd=Path(__file__).resolve().parents[2],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


def test_the_fused_triton_noise_is_the_torch_formula_in_the_interpreter() -> None:
    """On a GPU one Triton kernel draws the words and adds the Gaussian or Laplace noise in place
    (chacha_triton.add_gaussian_ / add_laplace_): the torch path's numbers to an ulp of the transcendental functions
    (numpy's here, in Triton's interpreter), and Gaussian / Laplace by a KS test."""
    pytest.importorskip("triton", reason="Triton is not installed (CPU wheels of torch ship without it)")
    assert _fused_noise("cpu", {"TRITON_INTERPRET": "1"}) in ("same", "close")


@pytest.mark.gpu
def test_the_fused_triton_noise_is_the_torch_formula_on_a_gpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    print(_fused_noise("cuda", {}))  # "same": libdevice rounds as torch's CUDA functions do
