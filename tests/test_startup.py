"""``dprec_torch.startup``: the exit without teardown still finishes what an exit must, the composition the
command line's check made is recalled only for exactly the same command, and numba loads only for a CPU kernel."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dprec_torch.config import recall_composed, remember_composed
from dprec_torch.api import compose_config
from dprec_torch.startup import lazy_import

ROOT = Path(__file__).resolve().parents[1]

EXITING = r"""
import atexit, logging, sys, threading, time
from dprec_torch.startup import fast_exit
out = sys.argv[1]
logging.basicConfig(filename=out + "/log.txt", level=logging.INFO)
def late():
    time.sleep(0.3)
    open(out + "/thread.txt", "w").write("done")
threading.Thread(target=late).start()  # not a daemon: the exit waits for it
atexit.register(lambda: open(out + "/atexit.txt", "w").write("ran"))
logging.getLogger("x").info("logged last")
sys.stdout.write("buffered, no newline")
fast_exit(3)
print("never")
"""


def test_fast_exit_joins_threads_runs_atexit_and_flushes(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", EXITING, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 3
    assert proc.stdout == "buffered, no newline"
    assert (tmp_path / "thread.txt").read_text() == "done"
    assert (tmp_path / "atexit.txt").read_text() == "ran"
    assert "logged last" in (tmp_path / "log.txt").read_text()


EXECUTOR_LEFT_OPEN = r"""
import concurrent.futures, sys
from dprec_torch.startup import fast_exit
threads = concurrent.futures.ThreadPoolExecutor(2)
processes = concurrent.futures.ProcessPoolExecutor(2)  # a management thread, as joblib's loky executor keeps
assert threads.submit(pow, 2, 5).result() == 32 and processes.submit(pow, 3, 2).result() == 9
sys.stdout.write("jobs done")
fast_exit(0)  # neither executor shut down: their idle threads must be told to stop, as the interpreter's exit does
"""


def test_fast_exit_stops_executors_left_open() -> None:
    """``train.py -m hydra/launcher=joblib`` hung after its last job: the executor's idle threads were joined without
    the threading-atexit hooks that tell them to stop."""
    proc = subprocess.run([sys.executable, "-c", EXECUTOR_LEFT_OPEN], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert (proc.returncode, proc.stdout) == (0, "jobs done"), proc.stderr[-2000:]


def test_a_remembered_composition_is_recalled_for_the_same_command_only() -> None:
    cfg = compose_config(["mechanism=sgld", "epsilon=20"])
    remember_composed("config", ["mechanism=sgld", "epsilon=20"], cfg)
    got = recall_composed("config", ["mechanism=sgld", "epsilon=20"])
    assert got == cfg and got is not cfg
    got.epsilon = 1.0  # a copy: the caller's changes stay its own
    assert recall_composed("config", ["mechanism=sgld", "epsilon=20"]).epsilon == 20
    assert recall_composed("config", ["epsilon=20", "mechanism=sgld"]) is None  # another order is another command
    assert recall_composed("config", ["mechanism=sgld"]) is None
    assert recall_composed("evaluate", ["mechanism=sgld", "epsilon=20"]) is None


NO_DYNAMO = r"""
import sys, torch
from dprec_torch.api import compose_config
from dprec_torch.training.run import instantiate_node, setup_training, validate
from dprec_torch.training.trainer import Trainer
cfg = compose_config(["data=synthetic", "data.preset=tiny", "mechanism=gaussian", "model=pnbm_lowrank", "epsilon=5",
                      "mechanism.epochs=1", "device=cpu", "compare_baselines=false", "tensorboard=false"])
validate(cfg)
fold = instantiate_node(cfg.data).folds[0]
setup = setup_training(cfg, fold, torch.device("cpu"))
Trainer(setup.model, setup.optimizer, setup.sampler, setup.epochs)._step()  # zero_grad, step: torch's wrapped methods
print("torch._dynamo" in sys.modules)
"""


def test_setup_training_never_imports_dynamo() -> None:
    """torch.optim's wrapped methods import torch._dynamo on their first call (6 s on the GPU image, which compiles
    every module from source); ``setup_training`` skips that for every caller, the benchmarks included."""
    proc = subprocess.run([sys.executable, "-c", NO_DYNAMO], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "False"


NUMBA_ON_DEMAND = r"""
import sys
import dprec_torch.training.run, dprec_torch.models.pnbm_topk, dprec_torch.privacy.pnbm_clipping  # what runs import
loaded = lambda: "numba" in sys.modules
print(loaded())
import torch
from dprec_torch import chacha
lap = chacha.laplace_noise(bytes(32), 4, 1.0, "meta")  # off the CPU: the torch path (meta: shapes only), no numba
print(loaded())
chacha.add_gaussian_(torch.zeros(8), 1.0, bytes(32))  # the first CPU draw loads the numba kernels
print(loaded())
"""


def test_numba_loads_with_the_first_cpu_kernel_only() -> None:
    """A run imports every model and the CSPRNG, but numba (about 0.2 s) loads only when a CPU kernel runs, so a run
    whose draws and steps are all on a GPU never loads it (``chacha_numba``, ``lazy_import``)."""
    proc = subprocess.run([sys.executable, "-c", NUMBA_ON_DEMAND], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False", "False", "True"]


def test_lazy_import_runs_the_module_at_its_first_use(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "lazy_pkg").mkdir()
    (tmp_path / "lazy_pkg" / "__init__.py").write_text("")
    (tmp_path / "lazy_pkg" / "heavy.py").write_text("import sys\nsys.lazy_pkg_ran = True\nVALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delattr(sys, "lazy_pkg_ran", raising=False)
    try:
        heavy = lazy_import("lazy_pkg.heavy")
        assert not hasattr(sys, "lazy_pkg_ran") and "lazy_pkg.heavy" not in sys.modules  # not run, not registered
        import inspect

        inspect.getmodule(inspect.currentframe())  # scans sys.modules (as torch's op registration does): still not run
        assert not hasattr(sys, "lazy_pkg_ran")
        assert heavy.VALUE == 7 and sys.lazy_pkg_ran  # the first read imports it
        module = sys.modules["lazy_pkg.heavy"]
        monkeypatch.setattr(module, "VALUE", 8)
        assert heavy.VALUE == 8  # every read goes to the module (a test's monkeypatch is seen)
        assert lazy_import("lazy_pkg.heavy") is module  # imported: the module itself
    finally:
        for name in ("lazy_pkg.heavy", "lazy_pkg"):
            sys.modules.pop(name, None)


TENSORBOARD_WITHOUT_REMOTE = r"""
import importlib.util, sys
from dprec_torch.startup import REMOTE_FILE_SYSTEMS, summary_writer_class
writer_class = summary_writer_class()
from torch.utils.tensorboard import SummaryWriter
assert writer_class is SummaryWriter
loaded = [name for name in REMOTE_FILE_SYSTEMS if name in sys.modules]
from tensorboard.compat.tensorflow_stub.io import gfile
writer = writer_class(log_dir=sys.argv[1])
writer.add_scalar("test/rmse", 0.94, 1)
writer.close()
installed = [name for name in REMOTE_FILE_SYSTEMS if importlib.util.find_spec(name) is not None]
for name in installed:
    __import__(name)  # hidden for TensorBoard's import only: the program can still import them
print(loaded, gfile.S3_ENABLED, gfile.FSSPEC_ENABLED)
"""


def test_the_summary_writer_is_imported_without_remote_file_systems(tmp_path: Path) -> None:
    """TensorBoard's boto3/fsspec imports (s3:// and fsspec log dirs) are skipped; a local event file is written, and
    the program may still import both afterwards."""
    proc = subprocess.run([sys.executable, "-c", TENSORBOARD_WITHOUT_REMOTE, str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["[]", "False", "False"]
    events = list(tmp_path.glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0


def test_the_summary_writer_already_imported_is_left_as_it_is() -> None:
    code = ("import sys, torch.utils.tensorboard as tb; from tensorboard.compat.tensorflow_stub.io import gfile; "
            "from dprec_torch.startup import summary_writer_class; s3 = gfile.S3_ENABLED; "
            "assert summary_writer_class() is tb.SummaryWriter and gfile.S3_ENABLED == s3; print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout.strip()) == (0, "ok"), proc.stderr[-2000:]
