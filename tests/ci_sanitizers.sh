#!/usr/bin/env bash
# ci_sanitizers.sh — the reliability suite's CI stanzas (docs/reliability.md), on a machine without a GPU:
#
#   tsan      the CPU suites (ferry_test_cpu, ferry_test_reliability, ferry_test_ops) built with ThreadSanitizer
#             (gcc), including 16 threads transferring at once through the simulated driver and one thread arming
#             driver faults while others transfer (not the 10^6-tensor test: single-threaded, time-bounded, and
#             run under ASan by .ci/run; nor the fault matrix, ~1400 single-threaded processes that take minutes
#             under TSan and run under ASan+UBSan in .ci/run)
#   valgrind  the CPU suites under valgrind memcheck (--leak-check=full, errors and definite/possible leaks fail),
#             leaving out what valgrind cannot judge or takes minutes for: NVRTC compiles (the ops suite and the
#             reliability tests named cache_* and fork_after_nvrtc*: NVRTC is slow there and reports its own
#             internals; they run under ASan+UBSan in .ci/run), 10^6 tiny tensors (runs under ASan), the
#             fork-beside-busy-threads tests, fork_while_* (a leak checker counts what the parent's other threads
#             held as lost in the child), and the fault matrix (minutes under valgrind, and a failed destroy leaves
#             its simulated object by design)
#   fuzz      two libFuzzer targets (clang, ASan + UBSan, every report fatal): artifact files and the disk-cache
#             reader (corpus tests/fuzz/corpus), and tensor descriptors through the transfer planner against an
#             oracle (tests/fuzz/corpus-descriptors), each for FUZZ_SECONDS (default 60). Any sanitizer report,
#             crash, leak or oracle failure fails the stanza, with the log's tail and the input kept
#
# usage: tests/ci_sanitizers.sh [tsan] [valgrind] [fuzz]     (no argument: all three)
# Environment: JOBS (default 2), FUZZ_SECONDS (60). Build directories: build-tsan, build-valgrind, build-fuzz.
# Missing valgrind or clang is installed with apt-get when possible. Exit status non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-2}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
stanzas=("$@")
[ ${#stanzas[@]} -eq 0 ] && stanzas=(tsan valgrind fuzz)
common=(-DFERRY_BUILD_TOOLS=OFF -DFERRY_BUILD_PYTHON=OFF)
need() { # need COMMAND PACKAGE...: installs the packages when the command is missing
  local cmd=$1; shift
  command -v "$cmd" >/dev/null || { apt-get update -qq && apt-get install -y -qq "$@"; }
}
step() { echo "== ci_sanitizers: $* (at ${SECONDS} s)"; }

for s in "${stanzas[@]}"; do
  case $s in
  tsan)
    step "ThreadSanitizer"
    cmake -S . -B build-tsan -DFERRY_TSAN=ON "${common[@]}" >/dev/null
    cmake --build build-tsan -j"$JOBS" --target ferry_test_cpu ferry_test_reliability ferry_test_ops
    # halt_on_error: the first race fails the test that hit it (the runner reports which).
    # tests/tsan.supp: races inside NVRTC, which is not instrumented (ferry's own code is never suppressed).
    export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tests/tsan.supp"
    mapfile -t cpu < <(build-tsan/ferry_test_cpu --list | grep -v -e '^every_call_failing_')
    build-tsan/ferry_test_cpu "${cpu[@]}"
    # 10^6 tiny tensors is one thread's work and has a time bound; it runs under ASan in .ci/run instead.
    mapfile -t rel < <(build-tsan/ferry_test_reliability --list | grep -v -e '^million_tiny_tensors$')
    FERRY_THREADS_ROUNDS=3 build-tsan/ferry_test_reliability "${rel[@]}"
    build-tsan/ferry_test_ops
    unset TSAN_OPTIONS
    ;;
  valgrind)
    step "valgrind memcheck"
    need valgrind valgrind
    cmake -S . -B build-valgrind "${common[@]}" >/dev/null
    cmake --build build-valgrind -j"$JOBS" --target ferry_test_cpu ferry_test_reliability
    vg=(valgrind -q --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,possible)
    # Each test gets 600 s instead of the runner's 60: valgrind runs one thread at a time, 20-50x slower, and a
    # threaded test's time there varies several-fold with how it schedules them.
    mapfile -t cpu < <(build-valgrind/ferry_test_cpu --list | grep -v -e '^every_call_failing_')
    "${vg[@]}" build-valgrind/ferry_test_cpu --timeout 600 "${cpu[@]}"
    mapfile -t rel < <(build-valgrind/ferry_test_reliability --list |
                       grep -v -e '^million_tiny_tensors$' -e '^fork_while_' -e '^fork_after_nvrtc' -e '^cache_')
    FERRY_THREADS_ROUNDS=2 "${vg[@]}" build-valgrind/ferry_test_reliability --timeout 600 "${rel[@]}"
    ;;
  fuzz)
    step "libFuzzer, ${FUZZ_SECONDS} s per target"
    need clang clang libclang-rt-14-dev
    # clang without its runtime libraries (libFuzzer, the sanitizers) cannot link the targets: install the
    # compiler-rt package of the clang that is there.
    if [ ! -f "$(clang -print-file-name=libclang_rt.fuzzer-x86_64.a)" ]; then
      v=$(clang --version | sed -nE '1s/.*version ([0-9]+).*/\1/p')
      apt-get update -qq && apt-get install -y -qq "libclang-rt-$v-dev"
    fi
    CC=clang CXX=clang++ cmake -S . -B build-fuzz -DFERRY_FUZZ=ON "${common[@]}" >/dev/null
    cmake --build build-fuzz -j"$JOBS" --target ferry_fuzz_artifact ferry_fuzz_descriptors
    mkdir -p build-fuzz/crashes
    for target in artifact:corpus:8192 descriptors:corpus-descriptors:512; do
      IFS=: read -r name corpus max_len <<<"$target"
      work=$(mktemp -d)
      mkdir -p "$work/new"
      # New inputs go to the scratch directory; the committed corpus is read, never written. A finding's input is
      # kept in build-fuzz/crashes. UBSan and ASan halt on their first report (the build sets
      # -fno-sanitize-recover=all), and the log is searched for reports as well, so none can pass unseen.
      rc=0
      build-fuzz/ferry_fuzz_"$name" -max_total_time="$FUZZ_SECONDS" -max_len="$max_len" -print_final_stats=1 \
        -artifact_prefix=build-fuzz/crashes/"$name"- "$work/new" tests/fuzz/"$corpus" > "$work/log" 2>&1 || rc=$?
      echo "-- $name"
      grep -E "^stat::(number_of_executed_units|average_exec_per_sec|new_units_added)|DONE" "$work/log" || true
      reports=$(grep -cE "runtime error:|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|^descriptor fuzz:" \
                "$work/log" || true)
      if [ "$rc" -ne 0 ] || [ "$reports" -ne 0 ]; then
        tail -n 60 "$work/log"
        echo "fuzzing $name failed (exit $rc, $reports reports); the input is in build-fuzz/crashes"
        rm -rf "$work"
        exit 1
      fi
      rm -rf "$work"
    done
    ;;
  *) echo "unknown stanza '$s' (tsan, valgrind, fuzz)"; exit 2 ;;
  esac
done
echo "== ci_sanitizers: ${stanzas[*]}: passed"
