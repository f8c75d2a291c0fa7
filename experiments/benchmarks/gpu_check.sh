#!/usr/bin/env bash
# Issue 18's GPU check, one prepared script for a session that is lent a GPU (< 8 minutes on one H100/H200):
#   1. the `-m gpu` tests;
#   2. experiments/benchmarks/gpu_bench.py: ML-1M s/epoch + GPU peak for every PNBM mechanism, start-up, the
#      batched-vs-separate 7-job sweep, an ML-20M-size synthetic epoch, GPU-vs-CPU RMSE parity;
#   3. JSON to $OUT (the device run's return folder) and docs/results/benchmarks/gpu-check.json, which
#      `python experiments/benchmarks/publish.py` turns into docs/performance.md's GPU table with the targets' verdicts.
#
# Before (on the CPU machine): DPREC_DATA=/work/shared/data bash experiments/benchmarks/prepare_gpu_pylibs.sh
# Then:   run(command="bash experiments/benchmarks/gpu_check.sh", carry=[".gpu_pylibs", ".gpu_data"], timeout_s=580)
# Back:   cp <files_at>/gpu-check.json docs/results/benchmarks/ && python experiments/benchmarks/publish.py
# CPU rehearsal (tiny data, device=cpu, no GPU needed): bash experiments/benchmarks/gpu_check.sh --dry-run
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
DRY=""
BUDGET="${GPU_CHECK_BUDGET:-400}"   # seconds for gpu_bench.py's stages; the tests (<= 90 s) and set-up come on top
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY="--dry-run" ;;
    *) echo "usage: bash experiments/benchmarks/gpu_check.sh [--dry-run]" >&2; exit 2 ;;
  esac
done
# the device image has no Hydra/OmegaConf/Opacus (it has pytest): the carried copies first, then the project itself
export PYTHONPATH="$ROOT/.gpu_pylibs:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
[ -d "$ROOT/.gpu_data" ] && export DPREC_DATA="${DPREC_DATA:-$ROOT/.gpu_data}"
export DPREC_CACHE="${DPREC_CACHE:-$(mktemp -d /tmp/dprec-cache.XXXX)}"
OUT_DIR="${OUT:-$ROOT/docs/results/benchmarks}"
mkdir -p "$OUT_DIR"
JSON="$OUT_DIR/gpu-check${DRY:+-dry}.json"
# a rerun of some stages writes its own file; publish.py lays it over gpu-check.json (same GPU model only)
[ -n "${GPU_CHECK_STAGES:-}" ] && JSON="$OUT_DIR/gpu-check-rerun${DRY:+-dry}.json"
T0=$(date +%s)
PY="$(command -v python || command -v python3)"
echo "== gpu_check $(date -u +%FT%TZ) dry=${DRY:-no} PYTHONPATH=$PYTHONPATH DPREC_DATA=${DPREC_DATA:-unset}"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import torch, hydra, omegaconf; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'hydra', hydra.__version__)" \
  || { echo "missing packages: run experiments/benchmarks/prepare_gpu_pylibs.sh and carry .gpu_pylibs" >&2; exit 3; }

TEST_RC=skipped
if [ -z "$DRY" ]; then
  # GPU_CHECK_PYTEST="tests/models/test_pair_triton.py ..." narrows the GPU tests where the session's device time is short
  echo "== pytest -m gpu ${GPU_CHECK_PYTEST:-tests}"
  timeout "${GPU_CHECK_TEST_TIMEOUT:-90}" "$PY" -m pytest -q -m gpu ${GPU_CHECK_PYTEST:-tests} -p no:cacheprovider 2>&1 | tail -25
  TEST_RC=${PIPESTATUS[0]}
fi
echo "== gpu_bench (budget ${BUDGET} s)"
# GPU_CHECK_STAGES="ml20m sweep" reruns only those stages (names: mechanisms parity startup sweep ml20m)
timeout $((BUDGET + 60)) "$PY" experiments/benchmarks/gpu_bench.py $DRY --budget "$BUDGET" --out "$JSON" \
  ${GPU_CHECK_STAGES:+--stages $GPU_CHECK_STAGES}
BENCH_RC=$?
"$PY" - "$JSON" "$TEST_RC" "$BENCH_RC" "$(( $(date +%s) - T0 ))" "${GPU_CHECK_PYTEST:-tests}" <<'PY'
import json, sys
path, test_rc, bench_rc, wall, selection = sys.argv[1:]
try:
    data = json.load(open(path))
except (OSError, ValueError):
    data = {"error": "gpu_bench.py wrote no JSON"}
data["gpu_tests"] = {"exit_code": test_rc, "passed": test_rc == "0", "selection": selection}
data["bench_exit_code"] = int(bench_rc)
data["check_wall_seconds"] = int(wall)
json.dump(data, open(path, "w"), indent=2)
print(f"wrote {path}: tests exit {test_rc}, bench exit {bench_rc}, {wall} s")
PY
[ "$OUT_DIR" != "$ROOT/docs/results/benchmarks" ] && [ -z "$DRY" ] && cp "$JSON" "$ROOT/docs/results/benchmarks/" 2>/dev/null
exit 0
