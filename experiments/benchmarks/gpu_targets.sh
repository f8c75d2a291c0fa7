#!/usr/bin/env bash
# The speed issue's GPU rows and the design card's GPU wall time in one device call (< 6 minutes on one H200):
#   1. the `-m gpu` tests of the fused kernels and the low-rank model (GPU_TARGETS_PYTEST narrows or widens them);
#   2. start-up: `python train.py mechanism=sgld epsilon=20 data=ml-100k device=cuda`, 5 runs (bench_startup.py);
#   2b. where that start-up goes: one more run under cProfile (cumulative seconds);
#   3. the low-rank step: bench_pnbm_lowrank.py --rows ml1m-400 --device cuda, with a profile of 20 more steps;
#   4. full-S mechanisms on ML-1M (gpu_bench.py's `mechanisms` stage: the `gaussian` row among them);
#   5. the design card on ML-1M as typed, `python train.py mechanism=sgld epsilon=20 data=ml-1m` (device=auto), 3 runs.
# Each writes its file to $OUT (the device call's return folder), named as docs/results/benchmarks/ names it.
# Before (on the CPU machine): DPREC_DATA=/work/shared/data bash experiments/benchmarks/prepare_gpu_pylibs.sh
# Then:   run(command="bash experiments/benchmarks/gpu_targets.sh", carry=[".gpu_pylibs", ".gpu_data"], timeout_s=590)
# Back:   cp <files_at>/*.json docs/results/benchmarks/ && python experiments/benchmarks/publish.py
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
stamp "gpu_targets $(date -u +%FT%TZ) DPREC_DATA=${DPREC_DATA:-unset}"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import torch, hydra, opacus; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" || exit 3

stamp "pytest -m gpu"
timeout 120 "$PY" -m pytest -q -m gpu -p no:cacheprovider ${GPU_TARGETS_PYTEST:-tests/models/test_pair_triton.py \
  tests/privacy/test_secret_keys.py \
  tests/models/test_gpu.py::test_lowrank_pnbm_trains_on_cuda_like_the_cpu \
  "tests/models/test_gpu.py::test_every_pnbm_mechanism_same_rmse_on_cuda[gaussian_pnbm]"} 2>&1 | tail -15

stamp "start-up, ML-100K"
timeout 100 "$PY" $B/bench_startup.py --repeat 5 --out "$OUT_DIR/startup-gpu-ml100k-sgld.json" \
  -- mechanism=sgld epsilon=20 data=ml-100k device=cuda 2>&1 | tail -4

stamp "start-up profile, ML-100K (cProfile, cumulative)"
timeout 60 "$PY" -m cProfile -o /tmp/startup.prof train.py mechanism=sgld epsilon=20 data=ml-100k device=cuda \
  output_dir=/tmp/startup-prof >/dev/null 2>&1
"$PY" -c "import pstats; pstats.Stats('/tmp/startup.prof').sort_stats('cumulative').print_stats(45)" \
  > "$OUT_DIR/startup-gpu-profile.txt" 2>&1

stamp "low-rank step, ML-1M"
timeout 90 "$PY" $B/bench_pnbm_lowrank.py --rows ml1m-400 --device cuda --out "$OUT_DIR/lowrank-gpu.json" \
  --profile "$OUT_DIR/lowrank-gpu-profile.txt" 2>&1 | tail -3

stamp "full-S mechanisms, ML-1M"
timeout 150 "$PY" $B/gpu_bench.py --budget 100 --stages mechanisms --out "$OUT_DIR/gpu-mechanisms.json" 2>&1 | tail -3

stamp "design card, ML-1M, as typed"
timeout 110 "$PY" $B/bench_startup.py --repeat 3 --out "$OUT_DIR/designcard-gpu-ml1m-sgld.json" \
  -- mechanism=sgld epsilon=20 data=ml-1m 2>&1 | tail -4
stamp "done"
