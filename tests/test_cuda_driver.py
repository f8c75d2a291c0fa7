"""The CUDA driver's first calls made off the GIL (``dprec_torch.cuda_driver``), and the warm-up that makes them first."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from dprec_torch import cuda_driver
from dprec_torch import device as dev


class FakeDriver:
    """Records the driver calls; ``fail_at`` names the call that returns an error (CUDA_ERROR_NO_DEVICE = 100)."""

    def __init__(self, fail_at: str | None = None) -> None:
        self.calls: list[tuple] = []
        self.fail_at = fail_at

    def _result(self, name: str) -> int:
        return 100 if name == self.fail_at else 0

    def cuInit(self, flags):  # noqa: N802 - the driver's name
        self.calls.append(("cuInit", flags))
        return self._result("cuInit")

    def cuDeviceGet(self, device_ref, ordinal):  # noqa: N802
        self.calls.append(("cuDeviceGet", ordinal))
        ctypes.cast(device_ref, ctypes.POINTER(ctypes.c_int))[0] = 40 + ordinal  # a handle, not the ordinal
        return self._result("cuDeviceGet")

    def cuDevicePrimaryCtxRetain(self, context_ref, device):  # noqa: N802
        self.calls.append(("cuDevicePrimaryCtxRetain", device.value))
        return self._result("cuDevicePrimaryCtxRetain")

    def cuDevicePrimaryCtxRelease_v2(self, device):  # noqa: N802
        self.calls.append(("cuDevicePrimaryCtxRelease_v2", device.value))
        return self._result("cuDevicePrimaryCtxRelease_v2")


@pytest.fixture()
def fake_driver(monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    fake = FakeDriver()
    monkeypatch.setattr(cuda_driver, "_load_driver", lambda: fake)
    monkeypatch.setattr(cuda_driver, "_EARLY", {})
    return fake


def test_open_device_initialises_the_driver_then_retains_the_devices_primary_context(monkeypatch) -> None:
    fake = FakeDriver()
    monkeypatch.setattr(cuda_driver, "_load_driver", lambda: fake)
    monkeypatch.delenv("CUDA_MODULE_LOADING", raising=False)
    assert cuda_driver.open_device(2)
    assert fake.calls == [("cuInit", 0), ("cuDeviceGet", 2), ("cuDevicePrimaryCtxRetain", 42)]
    assert os.environ["CUDA_MODULE_LOADING"] == "LAZY"  # torch's default, set before cuInit reads it


def test_open_device_keeps_the_users_module_loading(monkeypatch) -> None:
    monkeypatch.setattr(cuda_driver, "_load_driver", lambda: FakeDriver())
    monkeypatch.setenv("CUDA_MODULE_LOADING", "EAGER")
    assert cuda_driver.open_device(0)
    assert os.environ["CUDA_MODULE_LOADING"] == "EAGER"


@pytest.mark.parametrize("fail_at", ["cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain"])
def test_open_device_stops_at_the_first_error_and_leaves_it_to_torch(monkeypatch, fail_at) -> None:
    fake = FakeDriver(fail_at)
    monkeypatch.setattr(cuda_driver, "_load_driver", lambda: fake)
    assert not cuda_driver.open_device(0)
    assert [c[0] for c in fake.calls][-1] == fail_at  # nothing after the failing call


def test_open_device_without_a_driver_or_with_an_old_one(monkeypatch) -> None:
    monkeypatch.setattr(cuda_driver, "DRIVER_LIBRARY", {sys.platform: "libdprec-no-such-driver.so"})
    assert cuda_driver._load_driver() is None
    assert not cuda_driver.open_device(0)
    monkeypatch.setattr(cuda_driver, "_load_driver", lambda: object())  # no such symbols
    assert not cuda_driver.open_device(0)


def main_thread_turns_while(call) -> int:
    """Loop turns the main thread makes while ``call`` runs on another thread (entered 20 ms before counting starts):
    millions where the call frees the GIL, a handful of switch-interval turns where it holds it."""
    thread = threading.Thread(target=call)
    thread.start()
    time.sleep(0.02)  # the thread is inside the slow C call now
    t0, turns = time.perf_counter(), 0
    while thread.is_alive() and time.perf_counter() - t0 < 5:
        turns += 1
    thread.join()
    return turns


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="loads the C library by its Linux name")
def test_the_driver_library_is_called_with_the_gil_released(monkeypatch) -> None:
    """What the module is for: the library ``_load_driver`` returns (libc standing in for libcuda) releases the GIL
    during a call, so the main thread runs Python meanwhile (a ``PyDLL`` would hold it: the loop would not advance)."""
    monkeypatch.setattr(cuda_driver, "DRIVER_LIBRARY", {sys.platform: "libc.so.6"})
    libc = cuda_driver._load_driver()
    assert libc is not None
    assert main_thread_turns_while(lambda: libc.usleep(400_000)) > 10_000  # 0.4 s inside C, as cuInit would be


def test_the_early_warm_up_opens_the_device_before_torch_asks_the_driver(monkeypatch) -> None:
    monkeypatch.setattr(dev, "_WARMING", {})
    order: list[str] = []
    monkeypatch.setattr(cuda_driver, "open_device", lambda index: order.append(f"open {index}"))
    monkeypatch.setattr(dev, "resolve_device", lambda name: order.append(f"resolve {name}") or torch.device("cpu"))
    for name, opened in (("cuda:1", "open 1"), ("auto", "open 0"), ("cuda", "open 0")):
        order.clear()
        dev.warm_up_early(name, []).join(timeout=10)
        assert order == [opened, f"resolve {name}"]
    assert dev.warm_up_early("cpu", []) is None


def test_the_warm_up_thread_opens_its_device_before_the_first_tensor(monkeypatch) -> None:
    monkeypatch.setattr(dev, "_WARMING", {})
    monkeypatch.setattr(dev, "_warm_triton", lambda device: None)
    order: list[str] = []
    monkeypatch.setattr(cuda_driver, "open_device", lambda index: order.append(f"open {index}"))
    monkeypatch.setattr(torch, "ones", lambda *a, **k: order.append("torch.ones") or (_ for _ in ()).throw(RuntimeError("no CUDA")))
    dev.warm_up(torch.device("cuda:3")).join(timeout=10)
    assert order == ["open 3", "torch.ones"]


def test_a_device_setting_names_a_cuda_ordinal_or_none() -> None:
    assert [cuda_driver.cuda_index_named(n) for n in ("auto", "cuda", "CUDA:3", "'cuda:1'", "cpu", "mps", "cuda:x")] == \
        [0, 0, 3, 1, None, None, None]


def opened(fake: FakeDriver) -> list[int]:
    return [c[1] for c in fake.calls if c[0] == "cuDevicePrimaryCtxRetain"]


@pytest.mark.parametrize(("argv", "config_line", "retained"), [
    (["mechanism=sgld", "epsilon=20"], "device: auto             # auto | cpu | cuda", [40]),  # the design card
    (["device=cuda:2"], "device: auto", [42]),            # the command line wins
    (["device=cpu", "epsilon=1"], "device: auto", []),
    (["epsilon=1"], "device: cpu", []),                   # the config file's default
    (["epsilon=1"], "seed: 1", []),                       # no device anywhere: nothing guessed
    (["++device=cuda:1"], "device: cpu", [41]),
    (["-m", "epsilon=1,20"], "device: auto", []),          # jobs may be pinned to other GPUs
    (["--cfg", "job"], "device: auto", []),                # a Hydra flag: maybe no run at all
    (["+hydra.job.env_set.CUDA_VISIBLE_DEVICES=1"], "device: auto", []),
])
def test_open_early_opens_the_device_the_command_line_names(fake_driver, tmp_path, argv, config_line, retained) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"defaults:\n  - data: ml-100k\n{config_line}\n")
    thread = cuda_driver.open_early(argv, config)
    if thread is not None:
        thread.join(timeout=10)
    assert opened(fake_driver) == retained


@pytest.mark.parametrize(("early", "run_index", "released"), [
    (["device=cuda:1"], 1, []),       # the run uses it: kept
    (["device=cuda:1"], 0, [41]),     # another GPU: released
    (["device=auto"], None, [40]),    # the composed config says cpu after all: released
    (["device=cpu"], None, []),       # nothing was opened
])
def test_settle_early_keeps_only_the_runs_own_context(fake_driver, tmp_path, early, run_index, released) -> None:
    cuda_driver.open_early(early, tmp_path / "no-config.yaml")
    cuda_driver.settle_early(run_index).join(timeout=10)
    assert [c[1] for c in fake_driver.calls if c[0] == "cuDevicePrimaryCtxRelease_v2"] == released
    assert cuda_driver.settle_early(run_index) is None  # settled once


@pytest.mark.parametrize(("name", "argv", "settled"), [
    ("auto", ["mechanism=sgld"], 0), ("cuda:2", [], 2), ("cpu", [], None), ("auto", ["-m", "epsilon=1,2"], None),
])
def test_the_checked_config_settles_the_early_context(monkeypatch, name, argv, settled) -> None:
    monkeypatch.setattr(dev, "_WARMING", {})
    got: list[int | None] = []
    monkeypatch.setattr(cuda_driver, "settle_early", got.append)
    monkeypatch.setattr(dev, "warm_up", lambda d: None)
    monkeypatch.setattr(cuda_driver, "open_device", lambda index: False)
    monkeypatch.setattr(dev, "resolve_device", lambda n: torch.device("cpu"))
    thread = dev.warm_up_early(name, argv)
    if thread is not None:
        thread.join(timeout=10)
    assert got == [settled]


ACTIVE = r"""
import ctypes, sys
from pathlib import Path
from dprec_torch import cuda_driver
driver = cuda_driver._load_driver()
def active():
    dev, flags, on = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
    assert driver.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert driver.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(on)) == 0
    return on.value
cuda_driver.open_early(["device=cuda:0"], Path("conf/config.yaml")).join()
opened = active()
cuda_driver.settle_early(None if sys.argv[1] == "cpu" else 0).join()
print(opened, active())
if sys.argv[1] == "cuda":
    import torch
    a = torch.ones(64, 64, device="cuda:0"); assert float((a @ a).sum()) == 64 ** 3
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(("run", "states"), [("cuda", "1 1"), ("cpu", "1 0")])
def test_the_early_context_is_kept_for_a_gpu_run_and_gone_for_a_cpu_run(run, states) -> None:
    proc = subprocess.run([sys.executable, "-c", ACTIVE, run], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert (proc.returncode, proc.stdout.strip()) == (0, states), proc.stderr[-2000:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_torch_uses_the_context_the_driver_warm_up_made() -> None:
    """In a fresh process: the driver opened through ctypes, torch then computes on the same device, lazily loading."""
    code = ("import os, torch; from dprec_torch import cuda_driver; "
            "assert cuda_driver.open_device(0); assert os.environ['CUDA_MODULE_LOADING'] == 'LAZY'; "
            "a = torch.ones(64, 64, device='cuda:0'); assert float((a @ a).sum()) == 64 ** 3; print('ok')")
    env = {k: v for k, v in os.environ.items() if k != "CUDA_MODULE_LOADING"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


EXIT_DURING_CUINIT = r"""
import sys, time
from pathlib import Path
from dprec_torch import cuda_driver
class SlowDriver:
    def cuInit(self, flags):
        time.sleep(0.5)
        Path(sys.argv[1]).write_text("cuInit returned")
        return 100  # no device: nothing more
cuda_driver._load_driver = lambda: SlowDriver()
cuda_driver.open_early(["device=cuda"], Path("conf/config.yaml"))
sys.exit(2)  # as a bad command line does, while the driver thread is still inside cuInit
"""


def test_the_exit_waits_for_a_driver_call_in_flight(tmp_path) -> None:
    """The driver's exit handlers must not run while another thread is inside cuInit: the exit joins that thread."""
    marker = tmp_path / "marker.txt"
    proc = subprocess.run([sys.executable, "-c", EXIT_DURING_CUINIT, str(marker)], capture_output=True, text=True,
                          timeout=60, cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert marker.read_text() == "cuInit returned"


FAKE_LIBCUDA = r"""
#include <unistd.h>
/* The four driver entry points open_device/release_device call, with the driver's C signatures: CUresult is an int,
   CUdevice an int handle, CUcontext a pointer. cuInit sleeps as a real first cuInit takes time. */
static int init_flags = -1, got_ordinal = -1, retained_device = -1, retains = 0, releases = 0;
static int context_storage;
int cuInit(unsigned int flags) { usleep(300000); init_flags = (int)flags; return 0; }
int cuDeviceGet(int *device, int ordinal) { got_ordinal = ordinal; *device = 100 + ordinal; return 0; }
int cuDevicePrimaryCtxRetain(void **context, int device) {
    retained_device = device; retains++; *context = &context_storage; return 0; }
int cuDevicePrimaryCtxRelease_v2(int device) { return device == retained_device ? (releases++, 0) : 201; }
int fake_state(int what) {
    return what == 0 ? init_flags : what == 1 ? got_ordinal : what == 2 ? retained_device : what == 3 ? retains : releases; }
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("cc") is None, reason="needs a C compiler on Linux")
def test_open_device_through_a_compiled_driver_with_the_c_signatures(monkeypatch, tmp_path) -> None:
    """The ctypes calls as the driver's C ABI sees them (pointers written, the device handle passed back by value),
    with the GIL free during the slow cuInit, through the same loading path as libcuda.so.1."""
    source, library = tmp_path / "fakecuda.c", tmp_path / "libfakecuda.so"
    source.write_text(FAKE_LIBCUDA)
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(library), str(source)], check=True, timeout=60)
    monkeypatch.setattr(cuda_driver, "DRIVER_LIBRARY", {sys.platform: str(library)})
    monkeypatch.delenv("CUDA_MODULE_LOADING", raising=False)
    state = ctypes.CDLL(str(library)).fake_state
    opened: list[bool] = []
    assert main_thread_turns_while(lambda: opened.append(cuda_driver.open_device(3))) > 10_000  # ran during cuInit
    assert opened == [True]
    assert [state(i) for i in range(5)] == [0, 3, 103, 1, 0]  # cuInit(0); ordinal 3; its handle retained once
    assert cuda_driver.release_device(3) and state(4) == 1
