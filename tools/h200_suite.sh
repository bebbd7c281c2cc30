#!/usr/bin/env bash
# h200_suite.sh — builds ferry on a GPU machine and runs the chosen parts of its GPU evidence: tests, sanitizers,
# benchmarks. Every part logs to $RESULTS/<part>.log (CSV files beside it) and a failing part does not stop the
# others; the exit status is non-zero when any part failed. Made for the lent H200, where one command should do
# a whole run: `tools/h200_suite.sh all`, or name parts.
#
# usage: tools/h200_suite.sh [--results DIR] PART...
#   parts: build (= compile + ctest) compile ctest tests memcheck racecheck opsracecheck synccheck overlap
#          overlap1ms bandwidth bandwidth64 python pycall pycalltrim pycallviews pybench pybenchmany pybench4096 pybench4096arena pybench4096notrim pybench1ms pybenchnopacing pybandwidth
#          pybandwidth64 ops
#          opsfaults opsmemcheck gemm wgmma latency pylatency stress faults fork soak ranks plots all
#   ferry_stress under compute-sanitizer: stressmemcheck stressracecheck (STRESS_BATCHES per thread)
#   placement parts (tools/cpu_placement.sh): topology placementcall placementbench; threadab (main vs new thread) evictab idleab
#   a soak beside other parts: soakstart (detached, setsid) ... soakwait
# Environment also: BUILD (default ./build-h200), SOAK_SECONDS (default 30), OPS_RACECHECK_S (opsracecheck's cap, default 400).
# Environment: RESULTS (default ./h200-results), JOBS (default nproc), PYTHON (default python3).
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
RESULTS=${RESULTS:-$here/h200-results}
if [ "${1:-}" = "--results" ]; then RESULTS=$2; shift 2; fi
if [ $# -eq 0 ] || [ "$1" = "--help" ]; then sed -n '2,16p' "$0"; exit 0; fi
JOBS=${JOBS:-$(nproc)}
PYTHON=${PYTHON:-python3}
mkdir -p "$RESULTS"
build=${BUILD:-$here/build-h200} # BUILD elsewhere keeps a build across device calls whose checkout is replaced
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
failed=()

part() { # part NAME COMMAND...: runs the command with its output in $RESULTS/NAME.log, records a failure
  local name=$1; shift
  local t0=$(date +%s%N)
  echo "== $name: $*" | tee -a "$RESULTS/suite.log"
  ( cd "$here" && eval "$@" ) > "$RESULTS/$name.log" 2>&1
  local rc=$?
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  echo "   $name: rc=$rc, ${ms} ms" | tee -a "$RESULTS/suite.log"
  tail -n "${TAILN:-6}" "$RESULTS/$name.log" | sed 's/^/   | /' | tee -a "$RESULTS/suite.log"
  [ $rc -eq 0 ] || failed+=("$name")
}

parts=("$@")
[ "${parts[0]}" = all ] && parts=(build tests memcheck racecheck opsracecheck synccheck overlap overlap1ms bandwidth python pycall
                                  pybench pybench1ms pybandwidth ops opsmemcheck gemm wgmma latency pylatency stress faults fork soak ranks plots)
for p in "${parts[@]}"; do
  case $p in
  build) part build "cmake -S . -B $build -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE=\$(command -v $PYTHON) \
           -DFERRY_REQUIRE_PYTHON=ON && cmake --build $build -j$JOBS && ctest --test-dir $build --output-on-failure \
           -E kernels_emulated" ;; # the kernel emulation is CPU work (minutes): CI runs it, the GPU machine need not
  compile) part compile "cmake -S . -B $build -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE=\$(command -v $PYTHON) \
           -DFERRY_REQUIRE_PYTHON=ON && cmake --build $build -j$JOBS" ;; # build without ctest
  ctest) part ctest "ctest --test-dir $build --output-on-failure -E kernels_emulated" ;;
  tests) part tests "$build/ferry info && $build/ferry_test_gpu" ;;
  memcheck) part memcheck "compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 \
           $build/ferry_test_gpu round_trips mixed_dtypes_and_pass_through producer_event_is_waited_for \
           producer_stream_is_waited_for pool_never_reuses_under_a_running_copy" ;;
  racecheck) part racecheck "compute-sanitizer --tool racecheck --error-exitcode 1 $build/ferry_test_gpu \
           mixed_dtypes_and_pass_through producer_event_is_waited_for" ;; # the operators: opsracecheck
  synccheck) part synccheck "compute-sanitizer --tool synccheck --error-exitcode 1 $build/ferry_test_gpu \
           mixed_dtypes_and_pass_through producer_event_is_waited_for && timeout 100 compute-sanitizer --tool \
           synccheck --error-exitcode 1 $build/ferry_test_ops_gpu --quick" ;;
  opsracecheck) part opsracecheck "timeout \${OPS_RACECHECK_S:-400} compute-sanitizer --tool racecheck --error-exitcode 1 \
           $build/ferry_test_ops_gpu --sanitize" ;;
  overlap) part overlap "$build/ferry bench overlap --num-tensors 1 32 256 --output $RESULTS/overlap.csv \
           --samples-output $RESULTS/overlap_samples.csv" ;;
  overlap1ms) part overlap1ms "$build/ferry bench overlap --compute-ms 1 --num-tensors 1 32 256 \
           --output $RESULTS/overlap_1ms.csv" ;;
  bandwidth64) TAILN=24 part bandwidth64 "$build/ferry bench bandwidth --sizes 64M --num-tensors 1 32 256 4096 \
           --repeats 51 --output $RESULTS/bandwidth64.csv" ;; # the 64 MiB targets, more repeats
  bandwidth) TAILN=40 part bandwidth "$build/ferry bench bandwidth --output $RESULTS/bandwidth.csv" ;;
  python) part python "$PYTHON -m pytest -q -rs tests/python" ;;
  pycall) TAILN=24 part pycall "$PYTHON -m ferry.bench.call_overhead --output $RESULTS/py_call_overhead.csv" ;;
  pycalltrim) TAILN=24 part pycalltrim "GLIBC_TUNABLES=glibc.malloc.trim_threshold=1073741824:glibc.malloc.mmap_threshold=33554432 \
           $PYTHON -m ferry.bench.call_overhead --num-tensors 256 4096 --small-calls 200 \
           --output $RESULTS/py_call_overhead_notrim.csv" ;; # A/B: glibc never trims or unmaps
  pycallviews) TAILN=24 part pycallviews "$PYTHON -m ferry.bench.call_overhead --num-tensors 256 4096 --views \
           --device-arg --small-calls 200 --output $RESULTS/py_call_overhead_views.csv" ;; # inputs as the bandwidth bench's
  pybench4096) TAILN=18 part pybench4096 "$PYTHON -m ferry.bench.overlap --num-tensors 4096 --num-runs 15 \
           --output $RESULTS/py_overlap_4096.csv --diagnostics-output $RESULTS/py_overlap_4096_diagnostics.csv" ;;
  pybench4096arena) TAILN=12 part pybench4096arena "GLIBC_TUNABLES=glibc.malloc.arena_max=1 $PYTHON -m \
           ferry.bench.overlap --num-tensors 4096 --num-runs 15 --output $RESULTS/py_overlap_4096_arena1.csv \
           --diagnostics-output $RESULTS/py_overlap_4096_arena1_diagnostics.csv" ;; # A/B: the worker on the main arena
  pybench4096notrim) TAILN=12 part pybench4096notrim "GLIBC_TUNABLES=glibc.malloc.trim_threshold=1073741824 \
           $PYTHON -m ferry.bench.overlap --num-tensors 4096 --num-runs 15 --output $RESULTS/py_overlap_4096_notrim.csv \
           --diagnostics-output $RESULTS/py_overlap_4096_notrim_diagnostics.csv" ;; # A/B: glibc never trims
  pybench) TAILN=30 part pybench "$PYTHON -m ferry.bench.overlap --num-tensors 1 32 256 \
           --output $RESULTS/py_overlap.csv --samples-output $RESULTS/py_overlap_samples.csv \
           --diagnostics-output $RESULTS/py_overlap_diagnostics.csv" ;;
  pybenchmany) TAILN=30 part pybenchmany "for layout in even mixed; do $PYTHON -m ferry.bench.overlap \
           --num-tensors 4096 16384 --num-runs 15 --layout \$layout --output $RESULTS/py_overlap_many_\$layout.csv \
           --diagnostics-output $RESULTS/py_overlap_many_\${layout}_diagnostics.csv || exit 1; done" ;;
  pybenchnopacing) TAILN=20 part pybenchnopacing "$PYTHON -m ferry.bench.overlap --num-tensors 1 32 256 4096 \
           --ferry-gil-slice-us 0 --ferry-gil-switch-us 0 --output $RESULTS/py_overlap_nopacing.csv" ;; # A/B: no GIL pacing
  pybandwidth) TAILN=30 part pybandwidth "$PYTHON -m ferry.bench.bandwidth --output $RESULTS/py_bandwidth.csv" ;;
  pybandwidth64) TAILN=30 part pybandwidth64 "$PYTHON -m ferry.bench.bandwidth --sizes 1M 64M \
           --num-tensors 1 256 4096 16384 --output $RESULTS/py_bandwidth64.csv" ;;
  pybench1ms) TAILN=12 part pybench1ms "$PYTHON -m ferry.bench.overlap --num-tensors 1 32 256 --compute-ms 1 \
           --output $RESULTS/py_overlap_1ms.csv" ;;
  plots) part plots "$PYTHON -m ferry.bench.plot $RESULTS/*.csv --out-dir $RESULTS/plots" ;;
  ops) TAILN=40 part ops "$build/ferry_test_ops_gpu" ;;
  opsfaults) TAILN=8 part opsfaults "$build/ferry_test_ops_gpu --faults" ;;
  opsmemcheck) part opsmemcheck "compute-sanitizer --tool memcheck --error-exitcode 1 $build/ferry_test_ops_gpu --quick" ;;
  pylatency) TAILN=30 part pylatency "$PYTHON -m ferry.bench.latency --output $RESULTS/py_latency.csv \
           --plot $RESULTS/py_latency.png" ;;
  gemm) TAILN=30 part gemm "$build/ferry_time_gemm && $build/ferry_time_gemm --fp16" ;;
  wgmma) TAILN=30 part wgmma "FERRY_WGMMA=1 $build/ferry_time_gemm && FERRY_WGMMA=1 $build/ferry_test_ops_gpu --quick" ;;
  latency) TAILN=45 part latency "$build/ferry bench latency --output $RESULTS/latency.csv" ;;
  stress) TAILN=12 part stress "$build/ferry_stress" ;;
  # API errors off: ferry asks cuPointerGetAttribute about pageable host pointers, and INVALID_VALUE is the answer
  stressmemcheck) TAILN=12 part stressmemcheck "compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 --leak-check full \
           $build/ferry_stress --threads 4 --batches \${STRESS_BATCHES:-30}" ;;
  stressracecheck) TAILN=12 part stressracecheck "compute-sanitizer --tool racecheck --error-exitcode 1 \
           $build/ferry_stress --threads 4 --batches \${STRESS_BATCHES:-10}" ;;
  faults) TAILN=14 part faults "$build/ferry_stress --faults" ;;
  fork) TAILN=8 part fork "$build/ferry_stress --fork" ;;
  soak) TAILN=8 part soak "$build/ferry_stress --seconds \${SOAK_SECONDS:-30} --csv $RESULTS/soak.csv" ;;
  ranks) TAILN=8 part ranks "torchrun --nproc-per-node 1 --no-python $build/ferry bench ranks --output $RESULTS/ranks.csv \
           && torchrun --nproc-per-node 1 --no-python $build/ferry bench overlap --num-runs 10 --num-tensors 1 256 \
              --output $RESULTS/overlap_torchrun.csv && { LOCAL_RANK=1 $build/ferry bench ranks; test \$? -eq 1; }" ;;
  threadab) TAILN=40 part threadab "for r in 1 2 3; do for where in main new; do \
             flag=; [ \$where = new ] && flag=--in-thread; echo \"=== calls from the \$where thread, round \$r\"; \
             $PYTHON -m ferry.bench.call_overhead --num-tensors 256 4096 --small-calls 200 \$flag \
               --output $RESULTS/py_call_\$where.\$r.csv 2>&1 | grep -E 'ferry|torch|probe'; done; done" ;;
             # A/B: the same calls on the main thread and on a new one (the overlap harness's worker is a thread)
  evictab) TAILN=40 part evictab "for r in 1 2; do for mib in 0 32; do echo \"=== scratch \$mib MiB before each call, round \$r\"; \
             $PYTHON -m ferry.bench.call_overhead --num-tensors 256 4096 --small-calls 200 --in-thread \
               --evict-mib \$mib --output $RESULTS/py_call_evict\$mib.\$r.csv 2>&1 | grep -E 'ferry|torch|probe'; done; done" ;;
             # A/B: warm caches (a tight loop of calls) against cold ones (a worker's call after other work)
  topology) TAILN=40 part topology "tools/cpu_placement.sh topology" ;;
  placementcall) TAILN=40 part placementcall "PLACEMENTS=\"unpinned fast slow\" tools/cpu_placement.sh ab 3 sh -c \"$PYTHON -m ferry.bench.call_overhead \
           --num-tensors 256 4096 --small-calls 200 --output $RESULTS/py_call_\\\$PLACEMENT.\\\$ROUND.csv\"" ;;
  idleab) TAILN=60 part idleab "tools/cpu_placement.sh idleab 2 sh -c \"$PYTHON -m ferry.bench.overlap \
           --num-tensors 4096 --num-runs 15 --output $RESULTS/py_overlap_4096_spin\\\$SPIN.\\\$ROUND.csv \
           --diagnostics-output $RESULTS/py_overlap_4096_spin\\\$SPIN.\\\$ROUND.diag.csv\" | grep -E '===|speed probe|    4096  '" ;;
             # A/B: the harness with its vCPUs kept from halting between blocks (SCHED_IDLE busy loops)
  placementbench) TAILN=40 part placementbench "PLACEMENTS=\"unpinned fast slow\" tools/cpu_placement.sh ab 1 sh -c \"$PYTHON -m ferry.bench.overlap \
           --num-tensors 1 32 256 4096 --num-runs 30 --output $RESULTS/py_overlap_\\\$PLACEMENT.csv \
           --diagnostics-output $RESULTS/py_overlap_diag_\\\$PLACEMENT.csv\"" ;;
  soakstart) # the soak in its own session, so that it outlives this command (the device tool keeps such
             # processes until the machine goes back); soakwait collects it
    echo "== soakstart: ferry_stress --seconds ${SOAK_SECONDS:-30}" | tee -a "$RESULTS/suite.log"
    setsid sh -c "'$build/ferry_stress' --seconds \${SOAK_SECONDS:-30} --csv '$RESULTS/soak.csv' > '$RESULTS/soak.log' 2>&1;
                  echo \$? > '$RESULTS/soak.rc'" < /dev/null > /dev/null 2>&1 &
    ;;
  soakwait) TAILN=12 part soakwait "while [ ! -e $RESULTS/soak.rc ]; do sleep 2; done; cat $RESULTS/soak.log; \
           exit \$(cat $RESULTS/soak.rc)" ;;
  *) echo "unknown part '$p' (see --help)"; exit 2 ;;
  esac
done
echo "failed parts: ${failed[*]:-none}" | tee -a "$RESULTS/suite.log"
[ ${#failed[@]} -eq 0 ]
