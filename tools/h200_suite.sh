#!/usr/bin/env bash
# h200_suite.sh — builds ferry on a GPU machine and runs the chosen parts of its GPU evidence: tests, sanitizers,
# benchmarks. Every part logs to $RESULTS/<part>.log (CSV files beside it) and a failing part does not stop the
# others; the exit status is non-zero when any part failed. One command does a whole run: `tools/h200_suite.sh
# all`, or name parts. The parts are the table below; --help prints it.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
RESULTS=${RESULTS:-$here/h200-results}
if [ "${1:-}" = "--results" ]; then
  [ $# -ge 2 ] || { echo "--results needs a directory (see --help)" >&2; exit 2; }
  RESULTS=$2; shift 2
fi
JOBS=${JOBS:-$(nproc)}
PYTHON=${PYTHON:-python3}
build=${BUILD:-$here/build-h200} # BUILD elsewhere keeps a build across device calls whose checkout is replaced

# The operator suite's tests without its fault matrix (the sanitizer parts run these; opsfaults runs the matrix).
ops_tests="every_design_matches_the_float64_reference graphs_capture_replay_and_update_in_place \
registered_kernel_runs_end_to_end"
configure="cmake -S . -B $build -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE=\$(command -v $PYTHON) \
-DFERRY_REQUIRE_PYTHON=ON"

# ---- the parts: name, lines of its log echoed to suite.log, whether `all` runs it, what it does, its command ----
names=()
declare -A tail_of in_all help_of cmd_of
def() { names+=("$1"); tail_of[$1]=$2; in_all[$1]=$3; help_of[$1]=$4; cmd_of[$1]=$5; }

def compile 6 all "configure (Release) and build into \$BUILD" \
  "$configure && cmake --build $build -j$JOBS"
# The kernel emulation is CPU work (minutes): CI runs it, the GPU machine need not.
def ctest 12 all "the CPU suites (ctest -LE gpu), kernel emulation left to CI" \
  "ctest --test-dir $build --output-on-failure -LE gpu -E kernels_emulated"
def gpu 30 all "the GPU suites, verbose (ctest -L gpu: ferry_test_gpu, ferry_test_ops_gpu, ferry_stress)" \
  "ctest --test-dir $build -V -L gpu"
def tests 10 - "ferry info and the GPU transfer tests alone (ferry_test_gpu)" \
  "$build/ferry info && $build/ferry_test_gpu"
def ops 40 - "the operator runtime's GPU tests alone (ferry_test_ops_gpu)" \
  "$build/ferry_test_ops_gpu"
def opsquick 20 - "the operator runtime's GPU tests, one size per class (--quick), without the fault matrix" \
  "$build/ferry_test_ops_gpu --quick $ops_tests"
def opsfaults 8 - "the operator runtime's fault matrix on the real driver" \
  "$build/ferry_test_ops_gpu every_failing_runtime_call_is_clean"
def stress 12 - "16 threads x 1000 random batches, byte-exact (ferry_stress)" \
  "$build/ferry_stress random_batches_are_exact"
def faults 14 - "the transfer path's fault matrix on the real driver" \
  "$build/ferry_stress every_failing_driver_call_is_clean"
def fork 8 - "fork after CUDA initialisation on the real driver" \
  "$build/ferry_stress fork_after_init_is_a_clear_error"
def soak 8 all "ferry_stress for \$SOAK_SECONDS (30) s; fails unless pinned and device bytes plateau" \
  "$build/ferry_stress --seconds \${SOAK_SECONDS:-30} --csv $RESULTS/soak.csv random_batches_are_exact"
# API errors off: ferry asks cuPointerGetAttribute about pageable host pointers, and INVALID_VALUE is the answer.
def memcheck 6 all "compute-sanitizer memcheck over the transfer tests" \
  "compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 $build/ferry_test_gpu --no-fork \
round_trips mixed_dtypes_and_pass_through producer_event_is_waited_for producer_stream_is_waited_for \
pool_never_reuses_under_a_running_copy"
def racecheck 6 all "compute-sanitizer racecheck over the gather kernel's tests (the operators: opsracecheck)" \
  "compute-sanitizer --tool racecheck --error-exitcode 1 $build/ferry_test_gpu --no-fork \
mixed_dtypes_and_pass_through producer_event_is_waited_for"
def synccheck 6 all "compute-sanitizer synccheck over the gather kernel and the operators (--quick)" \
  "compute-sanitizer --tool synccheck --error-exitcode 1 $build/ferry_test_gpu --no-fork \
mixed_dtypes_and_pass_through producer_event_is_waited_for && timeout 100 compute-sanitizer --tool synccheck \
--error-exitcode 1 $build/ferry_test_ops_gpu --no-fork --quick $ops_tests"
def opsracecheck 6 all "racecheck over every GEMM design on one odd size (capped at \$OPS_RACECHECK_S, 400 s)" \
  "timeout \${OPS_RACECHECK_S:-400} compute-sanitizer --tool racecheck --error-exitcode 1 \
$build/ferry_test_ops_gpu --no-fork --sanitize $ops_tests"
def opsmemcheck 6 all "memcheck over the operator tests (--quick)" \
  "compute-sanitizer --tool memcheck --error-exitcode 1 $build/ferry_test_ops_gpu --no-fork --quick $ops_tests"
def stressmemcheck 12 - "memcheck with leak check over ferry_stress (4 threads x \$STRESS_BATCHES, 30)" \
  "compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 --leak-check full \
$build/ferry_stress --no-fork --threads 4 --batches \${STRESS_BATCHES:-30} random_batches_are_exact"
def stressracecheck 12 - "racecheck over ferry_stress (4 threads x \$STRESS_BATCHES, 10)" \
  "compute-sanitizer --tool racecheck --error-exitcode 1 $build/ferry_stress --no-fork --threads 4 \
--batches \${STRESS_BATCHES:-10} random_batches_are_exact"
def overlap 6 all "ferry bench overlap: D2H beside a foreground GEMM (1, 32, 256 tensors)" \
  "$build/ferry bench overlap --num-tensors 1 32 256 --output $RESULTS/overlap.csv \
--samples-output $RESULTS/overlap_samples.csv"
def overlap1ms 6 all "the same with 1 ms of compute per step" \
  "$build/ferry bench overlap --compute-ms 1 --num-tensors 1 32 256 --output $RESULTS/overlap_1ms.csv"
def bandwidth 40 all "ferry bench bandwidth over its default sizes and counts" \
  "$build/ferry bench bandwidth --output $RESULTS/bandwidth.csv"
def bandwidth64 24 - "ferry bench bandwidth at 64 MiB in 1 to 4096 tensors, 51 repeats" \
  "$build/ferry bench bandwidth --sizes 64M --num-tensors 1 32 256 4096 --repeats 51 \
--output $RESULTS/bandwidth64.csv"
def latency 45 all "ferry bench latency: operator host latency and GEMM device time" \
  "$build/ferry bench latency --output $RESULTS/latency.csv"
def gemm 40 all "device time of every tensor-core design beside cuBLAS(Lt): bf16, fp16, int8, FP8 (ferry_time_gemm)" \
  "$build/ferry_time_gemm && $build/ferry_time_gemm --fp16 && $build/ferry_time_gemm --int8 \
&& $build/ferry_time_gemm --fp8"
def wgmma 30 all "the same and the operator tests (--quick) with the wgmma design forced on" \
  "FERRY_WGMMA=1 $build/ferry_time_gemm && FERRY_WGMMA=1 $build/ferry_test_ops_gpu --quick $ops_tests"
def experimental 40 all "every design and those off by default (FERRY_EXPERIMENTAL_DESIGNS=1): ferry_time_gemm \
at 4096³, 8192³ and decode shapes, epilogues, FP8, int8, then the operator tests; each command at most 150 s (a hang)" \
  "export FERRY_EXPERIMENTAL_DESIGNS=1; rc=0; for args in '' '--size 8192' '--shape 16 8192 8192' \
'--shape 16 8192 8192 --b-col' '--shape 16 8192 8192 --fp8' '--shape 16 4096 4096' '--epilogues' '--fp8' '--int8'; \
do timeout 150 $build/ferry_time_gemm \$args || rc=1; done; \
timeout 300 $build/ferry_test_ops_gpu --quick $ops_tests || rc=1; exit \$rc"
def ranks 8 all "ferry bench ranks and overlap under torchrun; a LOCAL_RANK past the devices must fail" \
  "torchrun --nproc-per-node 1 --no-python $build/ferry bench ranks --output $RESULTS/ranks.csv \
&& torchrun --nproc-per-node 1 --no-python $build/ferry bench overlap --num-runs 10 --num-tensors 1 256 \
--output $RESULTS/overlap_torchrun.csv && { LOCAL_RANK=1 $build/ferry bench ranks; test \$? -eq 1; }"
def python 6 all "the pytest suite with the GPU (torch, cupy, jax where installed)" \
  "$PYTHON -m pytest -q -rs tests/python"
def pycall 24 all "Python call overhead: ferry vs torch" \
  "$PYTHON -m ferry.bench.call_overhead --output $RESULTS/py_call_overhead.csv"
def pybench 30 all "the Python overlap benchmark (1, 32, 256 tensors)" \
  "$PYTHON -m ferry.bench.overlap --num-tensors 1 32 256 --output $RESULTS/py_overlap.csv \
--samples-output $RESULTS/py_overlap_samples.csv --diagnostics-output $RESULTS/py_overlap_diagnostics.csv"
def pybench1ms 12 all "the same with 1 ms of compute per step" \
  "$PYTHON -m ferry.bench.overlap --num-tensors 1 32 256 --compute-ms 1 --output $RESULTS/py_overlap_1ms.csv"
def pybenchmany 30 - "the Python overlap benchmark at 4096 and 16384 tensors, even and mixed layouts" \
  "for layout in even mixed; do $PYTHON -m ferry.bench.overlap --num-tensors 4096 16384 --num-runs 15 \
--layout \$layout --output $RESULTS/py_overlap_many_\$layout.csv \
--diagnostics-output $RESULTS/py_overlap_many_\${layout}_diagnostics.csv || exit 1; done"
def pybench4096 18 - "the Python overlap benchmark at 4096 tensors" \
  "$PYTHON -m ferry.bench.overlap --num-tensors 4096 --num-runs 15 --output $RESULTS/py_overlap_4096.csv \
--diagnostics-output $RESULTS/py_overlap_4096_diagnostics.csv"
def pybandwidth 30 all "the Python bandwidth benchmark: ferry vs torch" \
  "$PYTHON -m ferry.bench.bandwidth --output $RESULTS/py_bandwidth.csv"
def pybandwidth64 30 - "the same at 1 and 64 MiB in 1 to 16384 tensors" \
  "$PYTHON -m ferry.bench.bandwidth --sizes 1M 64M --num-tensors 1 256 4096 16384 \
--output $RESULTS/py_bandwidth64.csv"
def pylatency 30 all "ferry.ops host latency from Python, with its plot" \
  "$PYTHON -m ferry.bench.latency --output $RESULTS/py_latency.csv --plot $RESULTS/py_latency.png"
def probepin 40 - "tools/probe_pinning.c at 256 and 2048 MiB: where pinning time goes (THP, threads, register)" \
  "cc -O2 -pthread tools/probe_pinning.c -I/usr/local/cuda/include -lcuda -o $build/probe_pinning \
&& $build/probe_pinning 256 2048"
def probecalls 30 - "tools/probe_python_calls.py at 4096 and 16384 tensors: a Python call's time by thread and setting" \
  "$PYTHON tools/probe_python_calls.py 4096 16384"
def pycheckpoint 30 - "staging state dicts (ferry, Stager, torch, DCP stagers; GB-scale, minutes)" \
  "$PYTHON -m ferry.bench.checkpoint --output $RESULTS/py_checkpoint.csv"
def pycheckpointquick 20 - "staging ResNet-50 + Adam and Llama 3.2 1B shapes: ferry, the Stager, torch's preallocated \
copy_ (about a minute)" \
  "$PYTHON -m ferry.bench.checkpoint --state-dicts resnet50-adam llama-1b --methods ferry ferry.torch.Stager \
'torch prealloc copy_' --output $RESULTS/py_checkpoint_quick.csv"
def plots 6 all "plots of every CSV in \$RESULTS" \
  "$PYTHON -m ferry.bench.plot $RESULTS/*.csv --out-dir $RESULTS/plots"

usage() {
  echo "usage: tools/h200_suite.sh [--results DIR] PART...      (all: every part marked *; build: compile ctest gpu)"
  echo "parts:"
  for n in "${names[@]}"; do
    printf "  %-16s %s %s\n" "$n" "$([ "${in_all[$n]}" = all ] && echo '*' || echo ' ')" "${help_of[$n]}"
  done
  echo "Environment: RESULTS (./h200-results), BUILD (./build-h200), JOBS (nproc), PYTHON (python3),"
  echo "  SOAK_SECONDS (30), OPS_RACECHECK_S (400), STRESS_BATCHES (30 for memcheck, 10 for racecheck),"
  echo "  ARCHIVE (unset; a path outside \$RESULTS: all of it as one .tar.gz there, rewritten after every part)."
}

if [ $# -eq 0 ] || [ "$1" = "--help" ] || [ "$1" = "-h" ]; then usage; exit 0; fi
parts=()
for p in "$@"; do
  case $p in
  all) for n in "${names[@]}"; do [ "${in_all[$n]}" = all ] && parts+=("$n"); done ;;
  build) parts+=(compile ctest gpu) ;;
  *) [ -n "${cmd_of[$p]+x}" ] || { echo "unknown part '$p' (see --help)"; exit 2; }; parts+=("$p") ;;
  esac
done

mkdir -p "$RESULTS"
# $RESULTS as one .tar.gz at $ARCHIVE, where set: after every part, so that a run cut off still leaves what it had
# (a copy-back that takes few files wants one), and at the end, with the summary.
archive() { [ -z "${ARCHIVE:-}" ] || tar czf "$ARCHIVE" -C "$RESULTS" . || echo "   could not write ARCHIVE=$ARCHIVE"; }
export FERRY_REQUIRE_GPU=1 # a GPU suite that finds no GPU fails here instead of skipping
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
failed=()
for p in "${parts[@]}"; do
  t0=$(date +%s%N)
  echo "== $p: ${cmd_of[$p]}" | tee -a "$RESULTS/suite.log"
  ( cd "$here" && eval "${cmd_of[$p]}" ) > "$RESULTS/$p.log" 2>&1
  rc=$?
  echo "   $p: rc=$rc, $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a "$RESULTS/suite.log"
  tail -n "${tail_of[$p]}" "$RESULTS/$p.log" | sed 's/^/   | /' | tee -a "$RESULTS/suite.log"
  [ $rc -eq 0 ] || failed+=("$p")
  archive
done
echo "failed parts: ${failed[*]:-none}" | tee -a "$RESULTS/suite.log"
archive
[ ${#failed[@]} -eq 0 ]
