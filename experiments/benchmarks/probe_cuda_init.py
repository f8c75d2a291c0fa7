"""How long a process's first CUDA work takes, and whether the GIL is free meanwhile (``dprec_torch/cuda_driver.py``).

Each case runs in a fresh process on device 0 and prints one JSON line:

* ``torch``: ``import torch``, then ``torch.cuda.init()`` and a first tensor on a second thread while the main thread
  counts loop turns: seconds, and the turns a second the main thread made during the init, beside the same figure
  while the thread sleeps (``turns_per_s_alone``; near 0 where the init holds the GIL, near that figure where it is free);
* ``driver``: ``cuda_driver.open_device(0)`` (``cuInit`` and the primary context through ctypes) on a second thread,
  counted the same way, then torch's init and first tensor on the main thread (what is left of torch's own work);
* ``early``: what ``train.py`` does, ``cuda_driver.open_early`` before ``import torch``: seconds of the import, of
  torch's init and first tensor afterwards, and the whole, to set beside ``torch``'s import + init.

    python experiments/benchmarks/probe_cuda_init.py --out /tmp/cuda-init-probe.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

COUNTING = r"""
import threading, time
def counted(work):
    '''Run work() on a thread; return (seconds, the main thread's loop turns a second meanwhile).'''
    done, failed = threading.Event(), []
    def run():
        try:
            work()
        except BaseException as err:
            failed.append(err)
        finally:
            done.set()
    t0 = time.perf_counter(); thread = threading.Thread(target=run); thread.start(); turns = 0
    while not done.is_set():
        turns += 1
    seconds = time.perf_counter() - t0; thread.join()
    if failed:
        raise failed[0]
    return seconds, turns / max(seconds, 1e-9)
def alone(seconds=0.2):
    '''The same figure while the other thread sleeps (the GIL free all along): the scale for the figures above.'''
    return counted(lambda: time.sleep(seconds))[1]
"""

CASES = {
    "torch": COUNTING + r"""
import json, time
t0 = time.perf_counter(); import torch; imported = time.perf_counter() - t0
def init():
    torch.cuda.init(); torch.ones(1, device="cuda:0").sum().item()
seconds, turns = counted(init)
print(json.dumps({"case": "torch", "import_torch_s": round(imported, 3), "cuda_init_and_first_tensor_s": round(seconds, 3),
                  "main_thread_turns_per_s_during_init": round(turns), "turns_per_s_alone": round(alone())}))
""",
    "driver": COUNTING + r"""
import json, time
from dprec_torch import cuda_driver
opened = []
seconds, turns = counted(lambda: opened.append(cuda_driver.open_device(0)))
import torch
t0 = time.perf_counter(); torch.cuda.init(); torch.ones(1, device="cuda:0").sum().item(); rest = time.perf_counter() - t0
print(json.dumps({"case": "driver", "opened": opened[0], "open_device_s": round(seconds, 3),
                  "main_thread_turns_per_s_during_open": round(turns), "turns_per_s_alone": round(alone()),
                  "torch_init_after_s": round(rest, 3)}))
""",
    "early": r"""
import json, sys, time
from pathlib import Path
t0 = time.perf_counter()
from dprec_torch import cuda_driver
cuda_driver.open_early(["device=cuda:0"], Path("conf/config.yaml"))
import torch
imported = time.perf_counter() - t0
t1 = time.perf_counter(); torch.cuda.init(); torch.ones(1, device="cuda:0").sum().item(); rest = time.perf_counter() - t1
print(json.dumps({"case": "early", "import_torch_s": round(imported, 3), "torch_init_after_s": round(rest, 3),
                  "whole_s": round(time.perf_counter() - t0, 3)}))
""",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2, help="runs of each case (the first also warms the OS caches)")
    parser.add_argument("--out", type=Path, help="write the JSON lines here too")
    args = parser.parse_args()
    lines = []
    for _ in range(args.repeat):
        for name, code in CASES.items():
            proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
            line = proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 and proc.stdout.strip() else \
                json.dumps({"case": name, "failed": proc.stderr.strip().splitlines()[-1:]})
            print(line, flush=True)
            lines.append(line)
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
