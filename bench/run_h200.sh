#!/usr/bin/env bash
# Runs the project's checks and benchmarks on the NVIDIA H200 board (torch 2.11 + CUDA, no
# internet): installs the carried wheels and the package, then each stage named in STAGES,
# logging to $OUT/<stage>.log. Usage: STAGES="smoke tests profile" bash bench/run_h200.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 FLAGOS_PLATFORM=nvidia_h200 GEMS_VENDOR=nvidia
export FLAGOS_BUILD_DIR=${FLAGOS_BUILD_DIR:-/tmp/torch_fl_build}
export FLAGGEMS_CACHE_DIR=${FLAGGEMS_CACHE_DIR:-$PWD/.cache/flaggems} TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$PWD/.cache/triton}
PY=python3
{
  nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl 2>&1 | tail -2
  $PY -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>&1 | tail -2
  start=$(date +%s); $PY -c "import torch_fl, torch; print('active', torch_fl.active_platform().name, torch.ones(1, device='flagos').device)"
  echo "first import (builds the core) took $(( $(date +%s) - start )) s"
} > "$OUT/setup.log" 2>&1
tail -3 "$OUT/setup.log"
for stage in ${STAGES:-smoke}; do
  start=$(date +%s)
  case $stage in
    smoke) timeout 120 $PY bench/smoke.py ;;
    tests) timeout ${TESTS_TIMEOUT:-420} $PY -m pytest -q -p no:cacheprovider --timeout 120 ${PYTEST_ARGS:-} ${TESTS:-tests/runtime tests/runtime_integrations} ;;
    profile) for c in ${CONFIGS:-small large}; do timeout ${PROFILE_TIMEOUT:-240} $PY bench/host_profile.py --config "$c" --steps 5; done ;;
    conformance) timeout ${CONFORMANCE_TIMEOUT:-540} torch-fl conformance run nvidia_h200 ${CONFORMANCE_ARGS:---paths native,flaggems --suite ops -n 4} --json; cp -r platforms/nvidia_h200/records "$OUT/" ;;
    tune) timeout 300 torch-fl routes tune nvidia_h200 --json ;;
    bench) timeout 420 $PY bench/train_step.py ${BENCH_ARGS:-} ;;
    dispatch) timeout 120 $PY bench/dispatch_overhead.py ;;
    *) echo "unknown stage $stage" ;;
  esac > "$OUT/$stage.log" 2>&1
  echo "== $stage rc=$? $(( $(date +%s) - start ))s"; tail -${TAIL:-25} "$OUT/$stage.log"
done
