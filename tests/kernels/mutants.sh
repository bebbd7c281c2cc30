#!/bin/sh
# mutants.sh — checks that the emulator (emulate_gemm.cpp) would catch the mistakes that matter in
# gemm_mma_sw.cu: each mutant is the kernel with one plausible bug (a missing barrier or wait, a copy into a stage
# still being read, a wrong swizzle, an off-by-one at an edge, a full-tile copy past k, a missing __syncwarp, a
# wide store past n), and each must FAIL the emulated cases of tests/kernels/emulate.sh. A surviving mutant means
# the emulation cannot see that kind of bug.
#
# usage: tests/kernels/mutants.sh [BUILD_DIR]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$(mktemp -d)}
mkdir -p "$out"
cxx=${CXX:-c++}
src="$root/src/kernels/gemm_mma_sw.cu"
cases="129,127,65,1,8,1,0 127,129,129,3,8,-1.5,0.25 264,392,328,1,8,1,0 392,264,456,1,8,0.5,0"

# name | sed expression (addressed by a pattern that matches one line of the kernel)
mutants='no_barrier_in_k_tile|/^        __syncthreads();$/s/__syncthreads();/;/
wait_one_group_short|/^        cp_async_wait<STAGES - 2>();$/s/STAGES - 2/STAGES - 1/
copy_into_stage_being_read|/load_stage<FULL>(write_stage,/s/(write_stage,/(read_stage,/
a_swizzle_add_not_xor|/if (A_ROW) return (base ^/s/(base ^ (((2 \* ks) \& 7) << 4))/(base + (((2 * ks) \& 7) << 4))/
b_swizzle_add_not_xor|/if (B_ROW) return (base ^/s/(base ^ ((j \& 7) << 4))/(base + ((j \& 7) << 4))/
edge_row_off_by_one|/i \* STEP < rows_left/s/i \* STEP < rows_left/i * STEP <= rows_left/
full_copies_one_tile_too_far|/p.k \/ BK - (STAGES - 1)/s/(STAGES - 1)/(STAGES - 2)/
no_syncwarp_before_reading_strip|/^      __syncwarp();$/s/__syncwarp();/;/
no_syncwarp_before_next_strip|/__syncwarp(); \/\/ the strip/s/__syncwarp();/;/
wide_store_past_n|/col + 3 < p.n/s/col + 3 < p.n/col < p.n/'

rm -f "$out/survivors" # the pipe below runs in a subshell: survivors are counted in this file
echo "$mutants" | while IFS='|' read -r name expr; do
  sed "$expr" "$src" > "$out/$name.cu"
  if cmp -s "$src" "$out/$name.cu"; then
    echo "STALE  $name: the expression no longer matches gemm_mma_sw.cu"
    echo 1 >> "$out/survivors"
    continue
  fi
  $cxx -std=c++17 -O2 -Wno-unknown-pragmas -I "$root/src/kernels" -I "$here" -I "$out" \
    -DEMU_KERNEL="\"$name.cu\"" -DEMU_ENTRY=ferry_gemm_mma_sw -DFERRY_A_TYPE=FERRY_BF16 -DFERRY_OUT_TYPE=FERRY_BF16 \
    -DFERRY_BM=128 -DFERRY_BN=256 -DFERRY_BK=64 -DFERRY_WARPS_M=2 -DFERRY_WARPS_N=4 -DFERRY_STAGES=3 \
    "$here/emulate_gemm.cpp" -o "$out/$name"
  # shellcheck disable=SC2086
  if "$out/$name" $cases > "$out/$name.log" 2>&1; then
    echo "SURVIVED $name"
    echo 1 >> "$out/survivors"
  else
    echo "killed   $name: $(grep -m1 -E 'FAIL|FAILURE' "$out/$name.log")"
  fi
done
if [ -s "$out/survivors" ]; then
  echo "some mutants survived: the emulation misses those bugs"
  exit 1
fi
echo "every mutant was caught"
