"""Start-up of ``python train.py``: seconds to the first epoch, end to end, and the slowest imports.

Runs the command ``--repeat`` times in fresh processes (the first run also warms the OS file and
numba caches; the minimum over runs is reported) and reads the times from Hydra's log stamps:

* ``to_first_epoch``: command start -> the ``mechanism ...`` log line, written just before the
  first epoch starts (imports, config, reading the data, folds, model and mechanism set-up);
* ``end_to_end``: command start -> process exit;
* ``cpu_seconds``: user + system CPU time of the process (less sensitive than wall time to other
  jobs on a shared machine);
* ``cpu_to_first_epoch``: the process's user + system CPU time when that log line arrives (read from
  ``/proc``, so Linux only, else None; it may include the first few ms of the epoch): the steady
  figure for "to the first epoch" on a loaded machine;
* ``imports``: ``python -X importtime`` of the same command, the top-level modules over 50 ms
  (from the fastest run);
* ``import_torch`` and ``end_to_end_over_import_torch``: ``python -c "import torch"`` timed in the same call
  (interleaved with the runs, minimum), and the end-to-end figure over it (the start-up target is a ratio to it);
* ``machine`` (``bench.py``'s line: CPU, cores, RAM, torch, Python, and the GPU unless ``device=cpu``) and
  ``omp_num_threads``, read after the runs (this process imports torch only then).

    python experiments/benchmarks/bench_startup.py --out docs/results/benchmarks/startup-cpu.json -- data=ml-1m device=cpu mechanism=none
    python experiments/benchmarks/bench_startup.py --root /tmp/head -- data=ml-1m device=cpu   # another checkout (before/after)
    OMP_NUM_THREADS=2 python experiments/benchmarks/bench_startup.py --repeat 5 -- data=ml-100k device=cpu   # issue 28, 3: <= 3 s
    DPREC_DATA=../shared/data OMP_NUM_THREADS=2 python experiments/benchmarks/bench_startup.py --repeat 5 \
        --out docs/results/benchmarks/startup-cpu-ml100k-sgld.json -- mechanism=sgld epsilon=20 data=ml-100k device=cpu
    python experiments/benchmarks/bench_startup.py --repeat 3 --bytecode-cache /tmp/pyc -- mechanism=sgld epsilon=20 device=cuda

``--bytecode-cache DIR``: the runs write and read their bytecode under DIR (``PYTHONPYCACHEPREFIX``), writing on even
where ``PYTHONDONTWRITEBYTECODE`` is set: the lent GPU image sets it and ships torch without ``__pycache__``, so each
process there compiles torch's sources again; an install that keeps its bytecode does that once. The JSON records
``bytecode_cache`` and the environment's ``PYTHONDONTWRITEBYTECODE`` (``env_dont_write_bytecode``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def python_path(root: Path) -> str:
    """``root`` first, then the caller's PYTHONPATH (the GPU check's carried Hydra/Opacus copies live there)."""
    return os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)


#: ``--bytecode-cache DIR``: the runs' bytecode goes to (and is read from) DIR, written even where the environment
#: turns writing off (the lent GPU image sets PYTHONDONTWRITEBYTECODE=1 and ships torch without __pycache__, so every
#: process there compiles torch from source: 4-5 s of `import torch`, which an installed torch does once)
BYTECODE: dict[str, str] = {}


def child_env(root: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not (BYTECODE and k == "PYTHONDONTWRITEBYTECODE")}
    env.update(BYTECODE)
    if root is not None:
        env["PYTHONPATH"] = python_path(root)
    return env
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[([^\]]+)\]\[\w+\] - (.*)$")


def _stamp(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def top_imports(stderr: str, min_ms: float = 50.0) -> dict[str, float]:
    """Top-level (un-indented) modules of ``-X importtime`` output with a cumulative time >= ``min_ms``."""
    out = {}
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line or "cumulative" in line:
            continue
        _, cum, name = line[len("import time:"):].split("|", 2)
        name = name[1:]
        if not name.startswith(" ") and int(cum) / 1e3 >= min_ms:
            out[name.strip()] = round(int(cum) / 1e6, 3)
    return out


def _first_epoch_line(line: str) -> re.Match | None:
    """The ``mechanism ...`` log line of ``training.run``, written just before the first epoch starts."""
    m = STAMP.match(line)
    return m if m and m.group(2).endswith("training.run") and m.group(3).startswith("mechanism ") else None


def _cpu_now(pid: int) -> float | None:
    """User + system CPU seconds of the running process ``pid`` (its threads included), from ``/proc``; None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)
    except (OSError, ValueError, IndexError):
        return None


def run_once(root: Path, overrides: list[str], importtime: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), "train.py", *overrides, f"hydra.run.dir={tmp}/run"]
        t0, ru0 = time.time(), resource.getrusage(resource.RUSAGE_CHILDREN)
        # one pipe for both streams, read as it comes: the CPU time is taken when the first-epoch line arrives
        proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=child_env(root))
        lines, cpu_first = [], None
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if cpu_first is None and _first_epoch_line(line):
                cpu_first = _cpu_now(proc.pid)
        proc.wait()
        t_end, ru1 = time.time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    output = "".join(lines)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{output[-2000:]}")
    first = None
    for line in lines:
        m = _first_epoch_line(line)
        if m:
            first = _stamp(m.group(1))
            break
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return {"to_first_epoch": None if first is None else round(first - t0, 3), "end_to_end": round(t_end - t0, 3),
            "cpu_seconds": round(cpu, 3), "cpu_to_first_epoch": None if cpu_first is None else round(cpu_first, 3),
            "imports": top_imports(output) if importtime else None}


def import_torch_seconds() -> float:
    """Wall seconds of ``python -c "import torch"`` in a fresh process (the start-up target's yardstick)."""
    t0 = time.time()
    subprocess.run([sys.executable, "-c", "import torch"], check=True, env=child_env())
    return time.time() - t0


def measure(root: Path, overrides: list[str], repeat: int) -> dict:
    torch_runs = []
    runs = []
    for _ in range(repeat):  # interleaved, so a machine that slows down slows both
        torch_runs.append(import_torch_seconds())
        runs.append(run_once(root, overrides, importtime=False))
    imp = run_once(root, overrides, importtime=True)
    firsts = [r["to_first_epoch"] for r in runs if r["to_first_epoch"] is not None]
    cpu_firsts = [r["cpu_to_first_epoch"] for r in runs if r["cpu_to_first_epoch"] is not None]
    return {"command": "python train.py " + " ".join(overrides), "root": str(root), "runs": runs,
            "to_first_epoch": min(firsts) if firsts else None, "end_to_end": min(r["end_to_end"] for r in runs),
            "cpu_seconds": min(r["cpu_seconds"] for r in runs), "cpu_to_first_epoch": min(cpu_firsts) if cpu_firsts else None,
            "imports": imp["imports"], "import_torch": round(min(torch_runs), 3),
            "end_to_end_over_import_torch": round(min(r["end_to_end"] for r in runs) / min(torch_runs), 2),
            "load_avg": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose train.py runs")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--bytecode-cache", type=Path, default=None,
                    help="write and read the runs' bytecode under this folder (PYTHONPYCACHEPREFIX, writing on): the "
                         "first run compiles, later ones read it, as on an install that keeps its __pycache__")
    ap.add_argument("overrides", nargs="*", default=["data=ml-1m", "device=cpu", "mechanism=none"])
    args = ap.parse_args()
    if args.bytecode_cache is not None:
        BYTECODE["PYTHONPYCACHEPREFIX"] = str(args.bytecode_cache.resolve())
    result = measure(args.root.resolve(), args.overrides, args.repeat)
    result["bytecode_cache"] = BYTECODE.get("PYTHONPYCACHEPREFIX")
    result["env_dont_write_bytecode"] = os.environ.get("PYTHONDONTWRITEBYTECODE")
    from bench import code_version, machine  # imports torch: after the runs

    result.update(machine=machine(gpu="device=cpu" not in args.overrides), omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
                  code=code_version())
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
