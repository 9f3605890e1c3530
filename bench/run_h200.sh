#!/usr/bin/env bash
# Runs the project's checks and benchmarks on the NVIDIA H200 board (torch 2.11 + CUDA, no
# internet): installs the carried wheels and the package, then each stage named in STAGES, logging
# to $OUT/<stage>.log. The stages share one deadline (BUDGET seconds from the start, default 570),
# so that a long conformance run leaves its journal for `--resume` instead of being cut by the
# caller. Usage: STAGES="tests conformance" bash bench/run_h200.sh
# The record and its evidence are tracked files: copy the ones a run leaves in $OUT into the
# checkout; an unfinished run leaves its journal in $OUT instead, to carry in .carry/ next time.
#
#   tests        runtime, compile, distributed (one GPU), FP8 against the GPU, onboarding --like nvidia_h200
#   capture      torch-fl conformance capture --device cuda: the zoo's calls at board sizes (copy
#                zoo_calls.json.gz back into conformance/)
#   conformance  torch-fl conformance run nvidia_h200 ($CONFORMANCE_ARGS); a journal in .carry/ is resumed
#   tune         torch-fl routes tune nvidia_h200 on $TUNE_WORKLOAD (large), $TUNE_ARGS (--include-gemm),
#                checked on the zoo models $TUNE_ZOO (llama,gpt2,bert,vit; empty: no zoo check)
#   bench        bench/train_step.py: large ($BENCH_ARGS; every variant) unless SKIP_LARGE, and small
#                (launch-bound; $SMALL_ARGS) unless SKIP_SMALL
#   bisect       bench/flaggems_bisect.py on $BISECT_CONFIGS (default small): which FlagGems kernel
#                breaks training, on plain CUDA and on flagos
#   model        the conformance model suite alone, into $OUT/model (the tracked record is kept)
#   workload     the conformance workload suite (and $ADD_SUITES), added to the tracked record (--add; copy it back)
#   profile      bench/host_profile.py small and large
#   dispatch     bench/dispatch_overhead.py ($DISPATCH_ARGS, e.g. `--rounds 21`)
#   graphs       bench/cuda_graphs.py: reduce-overhead (CUDA graphs) MLP and static-cache decoding,
#                flagos against plain CUDA ($GRAPHS_ARGS)
#   boundary     bench/graph_boundary.py warm and after a $EVICT_MIB (32) MiB eviction ($BOUNDARY_ARGS)
#   zoo          bench/model_zoo.py: public architectures, train / prefill / decode, plain CUDA against
#                flagos tuned and native-only ($ZOO_MODELS: a comma-separated subset; $ZOO_ARGS, e.g.
#                `--interval-width 0.04 --case-seconds 90`: rounds until each interval is about +-0.02;
#                add `--processes 3` where a row or a change is within a few percent of its mark)
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
DEADLINE=$(( $(date +%s) + ${BUDGET:-570} ))
export PYTHONUNBUFFERED=1 FLAGOS_PLATFORM=nvidia_h200 GEMS_VENDOR=nvidia
export FLAGOS_BUILD_DIR=${FLAGOS_BUILD_DIR:-/tmp/torch_fl_build}
# The compiled core an earlier call brought back (.carry/build.tgz) is reused when its sources
# and torch match (the build's own cache key decides); it goes back in $OUT as build.tgz.
[ -f .carry/build.tgz ] && mkdir -p "$FLAGOS_BUILD_DIR" && tar xzf .carry/build.tgz -C "$FLAGOS_BUILD_DIR"
# FlagGems autotuning results and Triton binaries survive across processes and stages. The tuned
# configurations (minutes of autotuning per GEMM shape) go to one file, named without the GPU, that
# comes back in $OUT: carry .cache/flaggems into a later call and they are not measured again.
export FLAGGEMS_CACHE_DIR=${FLAGGEMS_CACHE_DIR:-$PWD/.cache/flaggems} TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$PWD/.cache/triton}
mkdir -p "$FLAGGEMS_CACHE_DIR"
export FLAGGEMS_DB_URL=${FLAGGEMS_DB_URL:-sqlite:///$FLAGGEMS_CACHE_DIR/tuned_configs.db}
PY=python3
RECORDS=platforms/nvidia_h200/records
{
  nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl 2>&1 | tail -2
  $PY -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>&1 | tail -2
  start=$(date +%s); $PY -c "import torch_fl, torch; print('active', torch_fl.active_platform().name, torch.ones(1, device='flagos').device)"
  echo "first import (builds the core if needed) took $(( $(date +%s) - start )) s"
} > /tmp/setup.log 2>&1
tail -4 /tmp/setup.log

left() { echo $(( DEADLINE - $(date +%s) )); }
record_complete() { $PY -c "import json,sys; sys.exit(0 if json.load(open('$RECORDS/torch-2.11.json')).get('complete') else 1)" 2>/dev/null; }

for stage in ${STAGES:-tests}; do
  start=$(date +%s)
  case $stage in
    tests)
      timeout $(( $(left) < ${TESTS_TIMEOUT:-300} ? $(left) : ${TESTS_TIMEOUT:-300} )) $PY -m pytest -q -p no:cacheprovider \
        --timeout 240 -n ${TEST_WORKERS:-8} ${PYTEST_ARGS:-} ${TESTS:-tests/runtime tests/runtime_integrations \
        tests/routing/test_emulated_fp8.py tests/onboarding/test_end_to_end.py::test_onboard_like_nvidia_h200_on_cuda} ;;
    capture) timeout $(( $(left) < ${CAPTURE_TIMEOUT:-240} ? $(left) : ${CAPTURE_TIMEOUT:-240} )) \
        torch-fl conformance capture --device cuda --json && cp conformance/zoo_calls.json.gz "$OUT/" ;;
    conformance)
      # A journal an earlier call brought back, carried in .carry/, is continued (--resume); its
      # Triton binaries, carried as .carry/triton.tgz, are not compiled again.
      resume=; [ -f .carry/torch-2.11.journal.jsonl.gz ] && gunzip -c .carry/torch-2.11.journal.jsonl.gz \
        > $RECORDS/torch-2.11.journal.jsonl && resume=--resume
      [ -f .carry/triton.tgz ] && mkdir -p "$TRITON_CACHE_DIR" && tar xzf .carry/triton.tgz -C "$TRITON_CACHE_DIR"
      timeout $(( $(left) - 40 )) torch-fl conformance run nvidia_h200 ${CONFORMANCE_ARGS:--n 16 --sweep routed} $resume --json
      cp $RECORDS/torch-2.11.json $RECORDS/torch-2.11.md $RECORDS/torch-2.11.cases.jsonl.gz "$OUT/" 2>/dev/null
      # a run cut short leaves its journal (the record beside it may be an older, complete one)
      [ -f $RECORDS/torch-2.11.journal.jsonl ] && gzip -c $RECORDS/torch-2.11.journal.jsonl > "$OUT/torch-2.11.journal.jsonl.gz"
      # Binaries only (no intermediate IR), while they fit what a call brings back.
      (cd "$TRITON_CACHE_DIR" && tar czf /tmp/triton.tgz --exclude='*.ttir' --exclude='*.ttgir' --exclude='*.llir' \
        --exclude='*.ptx' --exclude='*.source' . ) && [ "$(stat -c %s /tmp/triton.tgz)" -lt 16000000 ] \
        && cp /tmp/triton.tgz "$OUT/" ;;
    tune)
      # The tuner measures only candidates the record validated; with an incomplete record it is
      # told so and allowed the declared kernel sets, to be re-run once the record is complete.
      record_complete || { echo "record incomplete: FLAGOS_ALLOW_UNVALIDATED=1 for this tuning"; export FLAGOS_ALLOW_UNVALIDATED=1; }
      zoo=${TUNE_ZOO-llama,gpt2,bert,vit}
      timeout $(( $(left) < ${TUNE_TIMEOUT:-240} ? $(left) : ${TUNE_TIMEOUT:-240} )) torch-fl routes tune nvidia_h200 \
        --workload ${TUNE_WORKLOAD:-large} ${TUNE_ARGS---include-gemm} ${zoo:+--check-zoo $zoo} --json
      unset FLAGOS_ALLOW_UNVALIDATED
      cp platforms/nvidia_h200/routes.yaml "$OUT/" ;;
    bench)
      [ -n "${SKIP_LARGE:-}" ] || timeout $(( $(left) - 60 )) $PY bench/train_step.py --config large \
        --json "$OUT/bench_large.json" ${BENCH_ARGS:-}
      [ -n "${SKIP_SMALL:-}" ] || timeout $(( $(left) )) $PY bench/train_step.py --config small \
        ${SMALL_ARGS:---variants native-only,flaggems-first,tuned} --json "$OUT/bench_small.json" ;;
    bisect) for c in ${BISECT_CONFIGS:-small}; do
        timeout $(( $(left) )) $PY bench/flaggems_bisect.py --config "$c" --modes ${BISECT_MODES:-plain,flagos} \
          --json "$OUT/bisect_$c.json"; done ;;
    model) timeout $(( $(left) )) torch-fl conformance run nvidia_h200 --suite model --paths native \
        --record-dir "$OUT/model" --json ;;
    workload) timeout $(( $(left) - 15 )) torch-fl conformance run nvidia_h200 --suite ${ADD_SUITES:+$ADD_SUITES,}workload \
        --paths flaggems,emulated -n 4 --add --json
      cp $RECORDS/torch-2.11.json $RECORDS/torch-2.11.md "$OUT/" ;;
    profile) for c in ${CONFIGS:-small large}; do timeout $(( $(left) / 2 )) $PY bench/host_profile.py --config "$c" --steps 5; done ;;
    dispatch) timeout $(( $(left) )) $PY bench/dispatch_overhead.py ${DISPATCH_ARGS:-} ;;
    graphs) timeout $(( $(left) )) $PY bench/cuda_graphs.py --json "$OUT/cuda_graphs.json" ${GRAPHS_ARGS:-} ;;
    boundary) for evict in 0 ${EVICT_MIB:-32}; do
        timeout $(( $(left) )) $PY bench/graph_boundary.py --evict-mib $evict ${BOUNDARY_ARGS:-}; done ;;
    zoo) timeout $(( $(left) )) $PY bench/model_zoo.py ${ZOO_MODELS:+--models $ZOO_MODELS} --json "$OUT/zoo.json" \
        ${ZOO_ARGS:-} ;;
    *) echo "unknown stage $stage" ;;
  esac > "$OUT/$stage.log" 2>&1
  echo "== $stage rc=$? $(( $(date +%s) - start ))s"; tail -${TAIL:-25} "$OUT/$stage.log"
done
cp "$FLAGGEMS_CACHE_DIR/tuned_configs.db" "$OUT/" 2>/dev/null
(cd "$FLAGOS_BUILD_DIR" && tar czf "$OUT/build.tgz" --exclude='*.o' --exclude='.ninja*' .) 2>/dev/null
