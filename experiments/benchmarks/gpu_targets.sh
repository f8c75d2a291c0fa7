#!/usr/bin/env bash
# The speed issue's GPU rows and the design card's GPU wall time in one device call (400 s on an H200, 2026-11-28):
#   0. what the image does with bytecode (why `import torch` takes seconds there) and `import torch` with its bytecode
#      written under a PYTHONPYCACHEPREFIX (writing on), second run;
#   1. the `-m gpu` tests of the newest GPU code (GPU_TARGETS_PYTEST; default: the CUDA driver opened off the GIL, the
#      warm-up, the CUDA-graph steps and the low-rank kernels), their failures printed (the whole log in
#      $OUT/gpu-tests.txt); GPU_TARGETS_MORE_TESTS: more, after them;
#   2. the low-rank step: bench_pnbm_lowrank.py --rows ml1m-400 --device cuda once with DPREC_STEP_GRAPH=0 (eager steps,
#      the comparison), then --repeat 2 (the row; the first run compiles the kernels), then 20 profiled steps;
#   3. start-up: first probe_cuda_init.py (torch's CUDA init against the driver opened through ctypes: seconds, and
#      whether the GIL is held meanwhile), then `python train.py mechanism=sgld epsilon=20 data=ml-100k device=cuda`
#      (bench_startup.py), 3 runs with the bytecode cached (--bytecode-cache: the table's row);
#   4. the design card on ML-1M as typed, `python train.py mechanism=sgld epsilon=20 data=ml-1m` (device=auto), 2 runs;
#   5. full-S mechanisms on ML-1M (gpu_bench.py's `mechanisms` stage: the `gaussian_pnbm` row among them), and one
#      gaussian_pnbm run under torch.profiler (gpu_probe.py);
#   6. start-up on the image as it is (bytecode compiled by every process), 2 runs.
# The stages run in the order of what is least measured; each has its own time limit.
# Each writes its file to $OUT (the device call's return folder), named as docs/results/benchmarks/ names it.
# Before (on the CPU machine): DPREC_DATA=/work/shared/data bash experiments/benchmarks/prepare_gpu_pylibs.sh
# Then:   run(command="DPREC_CODE_VERSION=$(git rev-parse --short=10 HEAD) bash experiments/benchmarks/gpu_targets.sh",
#             carry=[".gpu_pylibs", ".gpu_data"], timeout_s=560)   (type the commit in: the rows record it as `code`)
# Back:   cp <files_at>/*.json docs/results/benchmarks/ (lowrank-gpu.json is JSON lines: append it) &&
#         python experiments/benchmarks/publish.py --only speed-targets
# (at most 8 files come back from a device call: the bytecode stage prints, it writes no file)
# GPU_TARGETS_STAGES="tests lowrank startup" runs only those stages (names: bytecode tests lowrank startup designcard
# fulls image); unset, all of them.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
export PYTHONPATH="$ROOT/.gpu_pylibs:$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
[ -d "$ROOT/.gpu_data" ] && export DPREC_DATA="${DPREC_DATA:-$ROOT/.gpu_data}"
export DPREC_CACHE="${DPREC_CACHE:-$(mktemp -d /tmp/dprec-cache.XXXX)}"
OUT_DIR="${OUT:-/tmp/gpu-targets}"
mkdir -p "$OUT_DIR"
PY="$(command -v python || command -v python3)"
B=experiments/benchmarks
T0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - T0 )) s] $*"; }
STAGES=" ${GPU_TARGETS_STAGES:-bytecode tests lowrank startup designcard fulls image} "
want() { [[ "$STAGES" == *" $1 "* ]]; }
stamp "gpu_targets $(date -u +%FT%TZ) DPREC_DATA=${DPREC_DATA:-unset}"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import torch, hydra, opacus; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" || exit 3

if want bytecode; then
stamp "bytecode"
"$PY" - <<'PY' 2>&1
import importlib.util, os, sys
spec = importlib.util.find_spec("torch")
pkg = os.path.dirname(spec.origin)
print("dont_write_bytecode", sys.dont_write_bytecode, "PYTHONDONTWRITEBYTECODE", os.environ.get("PYTHONDONTWRITEBYTECODE"),
      "pycache_prefix", sys.pycache_prefix, "torch dir writable", os.access(pkg, os.W_OK),
      "torch/__pycache__ exists", os.path.isdir(os.path.join(pkg, "__pycache__")))
PY
for i in 1 2; do /usr/bin/time -f "import torch %e s" "$PY" -c "import torch" 2>&1 | tail -1; done
for i in 1 2; do env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/dprec-pyc /usr/bin/time -f "import torch, bytecode written under a PYTHONPYCACHEPREFIX, run $i: %e s" "$PY" -c "import torch" 2>&1 | tail -1; done

fi
if want tests; then
stamp "pytest -m gpu"
# the newest kernels' tests alone first, their failures printed (a stage killed at its limit prints no summary);
# -v and tee: each test's line reaches $OUT as it finishes
timeout ${GPU_TARGETS_TEST_LIMIT:-150} "$PY" -m pytest -v -m gpu -p no:cacheprovider --tb=short -rfEs \
  ${GPU_TARGETS_PYTEST:-tests/test_cuda_driver.py tests/training/test_device.py tests/training/test_step_graph.py tests/models/test_lowrank_triton.py} 2>&1 \
  | tee "$OUT_DIR/gpu-tests.txt" | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|^E |Error" | tail -40
if [ -n "${GPU_TARGETS_MORE_TESTS:-}" ]; then
  timeout ${GPU_TARGETS_MORE_LIMIT:-120} "$PY" -m pytest -v -m gpu -p no:cacheprovider --tb=short -rfEs $GPU_TARGETS_MORE_TESTS 2>&1 \
    | tee "$OUT_DIR/gpu-tests-more.txt" | grep -E "PASSED|FAILED|ERROR|passed|failed|^E " | tail -30
fi
fi
if want lowrank; then
stamp "low-rank step, ML-1M"
# the eager step first (DPREC_STEP_GRAPH=0: the comparison), then the row: publish.py reads a row's last line
DPREC_STEP_GRAPH=0 timeout 40 "$PY" $B/bench_pnbm_lowrank.py --rows ml1m-400 --device cuda \
  --out "$OUT_DIR/lowrank-gpu.json" 2>&1 | tail -1
line=$(timeout 60 "$PY" $B/bench_pnbm_lowrank.py --rows ml1m-400 --device cuda --repeat 2 --out "$OUT_DIR/lowrank-gpu.json" 2>&1 | tail -3)
echo "$line"
case "$line" in *'"row"'*) ;; *)  # the kernels failed: measure the masked torch path (its line says lowrank_kernel=torch)
  DPREC_LOWRANK_KERNEL=torch timeout 60 "$PY" $B/bench_pnbm_lowrank.py --rows ml1m-400 --device cuda --repeat 2 \
    --out "$OUT_DIR/lowrank-gpu.json" 2>&1 | tail -3 ;;
esac
timeout 40 "$PY" $B/bench_pnbm_lowrank.py --rows ml1m-400 --device cuda --profile "$OUT_DIR/lowrank-gpu-profile.txt" 2>&1 | tail -1

fi
if want startup; then
stamp "the first CUDA work of a process: torch's init against the driver opened through ctypes (GIL held or free)"
# its six lines go to the call's log, not to a file (a device call returns at most 8 files; the stages write 8)
timeout 60 env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/dprec-pyc "$PY" $B/probe_cuda_init.py --repeat 2 2>&1 | tail -6
stamp "start-up, ML-100K, bytecode cached"
timeout 90 "$PY" $B/bench_startup.py --repeat 3 --bytecode-cache /tmp/dprec-pyc \
  --out "$OUT_DIR/startup-gpu-ml100k-sgld-bytecode.json" -- mechanism=sgld epsilon=20 data=ml-100k device=cuda 2>&1 | tail -2
fi
if want designcard; then
stamp "design card, ML-1M, as typed"
timeout 80 "$PY" $B/bench_startup.py --repeat 2 --out "$OUT_DIR/designcard-gpu-ml1m-sgld.json" \
  -- mechanism=sgld epsilon=20 data=ml-1m 2>&1 | tail -2
fi
if want fulls; then
stamp "full-S mechanisms, ML-1M"
timeout 120 "$PY" $B/gpu_bench.py --budget 100 --stages mechanisms --out "$OUT_DIR/gpu-mechanisms.json" 2>&1 | tail -2
timeout 40 "$PY" $B/gpu_probe.py --out "$OUT_DIR/gaussian-profile.txt" -- data=ml-1m model=pnbm mechanism=gaussian_pnbm \
  mechanism.epochs=4 2>&1 | tail -2

fi
if want image; then
stamp "start-up, ML-100K, the image as it is"
timeout 70 "$PY" $B/bench_startup.py --repeat 2 --out "$OUT_DIR/startup-gpu-ml100k-sgld.json" \
  -- mechanism=sgld epsilon=20 data=ml-100k device=cuda 2>&1 | tail -2

fi
stamp "done"
