#!/bin/sh
# mutants.sh — checks that the emulator (emulate_gemm.cpp) would catch the mistakes that matter in the new kernels:
# each mutant is gemm_mma_sw.cu or gemm_wgmma.cu with one plausible bug (a missing barrier or wait, a copy into a
# stage still being read, a wrong swizzle or descriptor, an off-by-one at an edge, a full-tile copy past k, a
# missing __syncwarp or wgmma.fence, a wide store past n, a wrong accumulator row, a broken mbarrier protocol in the
# persistent schedule or between the blocks of a cluster, FP8 sums promoted wrongly in either schedule), gemm_mma.cu
# with its sets of warps over k summed wrongly, or gemm_output.cuh with a wrong epilogue (bias index, order,
# activation) or 8-bit handling (pairs along k, scales), and each must FAIL the emulated cases. A surviving mutant
# means the emulation cannot see that kind of bug.
#
# usage: tests/kernels/mutants.sh [BUILD_DIR]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$(mktemp -d)}
mkdir -p "$out"
cxx=${CXX:-c++}
cases="129,127,65,1,8,1,0 127,129,129,3,8,-1.5,0.25 264,392,328,1,8,1,0 392,264,456,1,8,0.5,0"
rm -f "$out/survivors" # the loops below run in subshells: survivors are counted in this file
# gemm_wgmma.cu's 128×128 design, K-major B (8-bit operands take no other)
wgmma_128="-DFERRY_BM=128 -DFERRY_BN=128 -DFERRY_BK=64 -DFERRY_STAGES=6 -DFERRY_A_ROW=1 -DFERRY_B_ROW=0"

# name | sed expression (addressed by a pattern that matches one line of the kernel)
sw_mutants='no_barrier_in_k_tile|/^        __syncthreads();$/s/__syncthreads();/;/
wait_one_group_short|/^        cp_async_wait<STAGES - 2>();$/s/STAGES - 2/STAGES - 1/
copy_into_stage_being_read|/load_stage<FULL>(\*this, write_stage,/s/write_stage,/read_stage,/
a_swizzle_add_not_xor|/if (A_ROW) return (base ^/s/(base ^ (((2 \* ks) \& 7) << 4))/(base + (((2 * ks) \& 7) << 4))/
b_swizzle_add_not_xor|/if (B_ROW) return (base ^/s/(base ^ ((j \& 7) << 4))/(base + ((j \& 7) << 4))/
edge_row_off_by_one|/i \* STEP < rows_left/s/i \* STEP < rows_left/i * STEP <= rows_left/
full_copies_one_tile_too_far|/p.k \/ BK - (STAGES - 1)/s/(STAGES - 1)/(STAGES - 2)/
no_syncwarp_before_reading_strip|/^      __syncwarp();$/s/__syncwarp();/;/
no_syncwarp_before_next_strip|/__syncwarp(); \/\/ the strip/s/__syncwarp();/;/
wide_store_past_n|/col + 3 < p.n/s/col + 3 < p.n/col < p.n/'

wg_mutants='mn_major_lbo_sbo_swapped|/return smem_desc(sb + ks \* 16 \* 128, BK \* 128, 1024);/s/BK \* 128, 1024/1024, BK * 128/
k_major_step_64_bytes|/sa + wg \* 64 \* 128 + ks \* 32/s/ks \* 32/ks * 64/
b_transpose_flag_inverted|/B_ROW ? 1 : 0>/s/B_ROW ? 1 : 0>/B_ROW ? 0 : 1>/
stage_refilled_while_wgmma_runs|/wgmma_wait<1>();/s/wgmma_wait<1>/wgmma_wait<2>/
no_barrier_in_k_tile|/^    __syncthreads();             \/\/ everyone/s/__syncthreads();/;/
wait_one_group_short|/cp_async_wait<STAGES - 3>();/s/STAGES - 3/STAGES - 2/
copies_into_the_wrong_stage|/write_stage = STAGES - 2;/s/STAGES - 2/STAGES - 1/
no_wgmma_fence|/^ *wgmma_fence();$/s/wgmma_fence();/;/
copies_not_swizzled|/((((c >> 3) ^ r) \& 7) << 4)/s/((((c >> 3) ^ r) \& 7) << 4)/((((c >> 3)) \& 7) << 4)/
accumulator_rows_wrong|/(warp % 4) \* 16;/s/(warp % 4) \* 16/(warp % 4) * 8/'

# The persistent, warp-specialised schedule: its mbarrier protocol, the copying warpgroup's chunk offsets and the
# staged epilogue.
ws_mutants='copier_ignores_empty|/mbar_wait(empty(stage), phase ^ 1);/s/mbar_wait(empty(stage), phase ^ 1);/;/
copier_waits_wrong_parity|/mbar_wait(empty(stage), phase ^ 1);/s/phase ^ 1/phase/
full_arrival_before_the_copies|/load_stage<false>(loader, stage, kt);/{s/load_stage.*/cp_async_mbar_arrive(full(stage));/;n;s/cp_async_mbar_arrive(full(stage));/load_stage<false>(loader, stage, kt);/;}
multipliers_ignore_full|/mbar_wait(full(stage), phase);/s/mbar_wait(full(stage), phase);/;/
full_completes_at_half_the_copiers|/mbar_init(full(s), TMA ? 1 : COPY_THREADS);/s/: COPY_THREADS/: COPY_THREADS \/ 2/
empty_completes_at_one_warpgroup|/mbar_init(empty(s), WARPS \* CLUSTER);/s/WARPS \*/WARPS \/ 2 */
stage_released_before_its_wgmma_ends|/^        if (in_flight >= 0) release(in_flight);$/s/release(in_flight)/release(stage)/
last_stage_of_a_tile_never_released|/^      if (in_flight >= 0) release(in_flight);$/s/release/(void)/
phase_never_flips|/if (++stage == STAGES) stage = 0, phase ^= 1;/s/, phase ^= 1//
chunks_of_a_256_wide_tile_unswizzled|/return panel_offset<ROWS>(row0() + i \* STEP, col0()) - dst0();/s/return .*/return i * STEP * 128;/
no_syncwarp_before_next_columns|/__syncwarp(); \/\/ read before the next columns/s/__syncwarp();/;/'

# The persistent schedule with TMA copies: boxes at the wrong coordinates, fewer bytes expected than the boxes bring
# (the phase completes early), the copier not waiting for a stage to be released, a box that ignores the batch.
tma_mutants='a_box_at_the_next_k_tile|/tma_load(sa, \&maps.a, k0, m0, za, bar);/s/k0, m0/k0 + BK, m0/
mn_major_panels_overlap|/tma_load(sb + i \* BK \* 128, \&maps.b, n0 + 64 \* i, k0, zb, bar);/s/n0 + 64 \* i/n0 + 32 * i/
full_expects_half_the_bytes|/mbar_arrive_expect_tx(full(stage), STAGE_BYTES);/s/STAGE_BYTES/STAGE_BYTES \/ 2/
tma_copier_ignores_empty|/^        mbar_wait(empty(stage), phase ^ 1);$/s/mbar_wait(empty(stage), phase ^ 1);/;/
boxes_ignore_the_batch|/const int za = p.batch_a ? z : 0, zb = p.batch_b ? z : 0;/s/p.batch_b ? z : 0/0/
multipliers_ignore_full|/mbar_wait(full(stage), phase);/s/mbar_wait(full(stage), phase);/;/'

# Clusters of two sharing B (TMA multicast): a stage refilled once one block's warps freed it, or freed in one block
# only, B's share not multicast, both blocks loading the same rows of a K-major B, both taking the same output rows,
# the walk stepping by blocks instead of clusters, the peer's multicast bytes not expected, no cluster barrier
# between the mbarriers' initialisation and the other block's use of them.
cluster_mutants='empty_counts_one_block|/mbar_init(empty(s), WARPS \* CLUSTER);/s/WARPS \* CLUSTER/WARPS/
stage_freed_in_own_block_only|/mbar_arrive_cluster(cluster_map(empty(s), r));/s/empty(s), r)/empty(s), rank)/
mn_major_share_not_multicast|/tma_load_multicast(sb + i \* BK \* 128/s/every_block);/(u16)(1u << rank));/
k_major_share_at_the_same_rows|/tma_load_multicast(sb + rank \* ROWS \* 128/s/n0 + rank \* ROWS/n0/
blocks_take_the_same_rows|/m0 = tm \* CLUSTER \* BM + rank \* BM/s/ + rank \* BM//
walk_steps_by_blocks|/t += gridDim.x \/ CLUSTER;/s/ \/ CLUSTER//
full_expects_own_share_of_b|/mbar_arrive_expect_tx(full(stage), STAGE_BYTES);/s/STAGE_BYTES/A_BYTES + B_BYTES \/ 2/
no_cluster_barrier_after_init|/^    cluster_sync();$/s/cluster_sync();/__syncthreads();/'

split_mutants='sets_take_the_same_k_steps|/const int ks = kk \* WARPS_K + kw;/s/kk \* WARPS_K + kw/kk * WARPS_K/
sets_share_one_partial_slot|/return partial + ((((set - 1)/s/(set - 1)/0/
partials_read_before_written|/^    __syncthreads();$/s/__syncthreads();/;/
stages_reused_for_partials_early|/__syncthreads(); \/\/ every warp is done reading the stages/s/__syncthreads();/;/'

host_smem='s/asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(have));/have = dynamic_smem_size();/
s/extern __shared__ __align__(1024) unsigned char smem_raw\[\];/unsigned char *const smem_raw = emu::smem_here();/'

# kernel file | entry | design flags | mutants
run_mutants() {
  kernel=$1
  entry=$2
  flags=$3
  list=$4
  types=${5:--DFERRY_A_TYPE=2 -DFERRY_OUT_TYPE=2}
  run_cases=${6:-$cases}
  echo "$list" | while IFS='|' read -r name expr; do
    # (gemm_mma.cu reads its shared-memory size with inline PTX, and gemm_wgmma.cu's blocks of a cluster need their
    # own shared memory: the emulation answers instead, as in emulate.sh)
    sed -e "$expr" -e "$host_smem" "$root/src/kernels/$kernel" > "$out/${entry}_$name.cu"
    if [ "$(sed -e "$host_smem" "$root/src/kernels/$kernel" | cmp -s - "$out/${entry}_$name.cu"; echo $?)" = 0 ]; then
      echo "STALE    $entry $name: the expression no longer matches $kernel"
      echo 1 >> "$out/survivors"
      continue
    fi
    # shellcheck disable=SC2086
    $cxx -std=c++17 -O2 -Wno-unknown-pragmas -Wno-psabi -I "$root/src/kernels" -I "$here" -I "$out" \
      -DEMU_KERNEL="\"${entry}_$name.cu\"" -DEMU_ENTRY="$entry" $types \
      $flags "$here/emulate_gemm.cpp" -o "$out/${entry}_$name"
    # shellcheck disable=SC2086
    if "$out/${entry}_$name" $run_cases > "$out/${entry}_$name.log" 2>&1; then
      echo "SURVIVED $entry $name"
      echo 1 >> "$out/survivors"
    else
      echo "killed   $entry $name: $(grep -m1 -E 'FAIL|FAILURE' "$out/${entry}_$name.log")"
    fi
  done
}

run_mutants gemm_mma_sw.cu ferry_gemm_mma_sw "-DFERRY_BM=128 -DFERRY_BN=256 -DFERRY_BK=64 -DFERRY_WARPS_M=2 \
-DFERRY_WARPS_N=4 -DFERRY_STAGES=3" "$sw_mutants"
# gemm_wgmma.cu in its default design, A and B row-major (N-major B) and, for the K-major paths, B column-major.
run_mutants gemm_wgmma.cu ferry_gemm_wgmma "" "$wg_mutants"
run_mutants gemm_wgmma.cu ferry_gemm_wgmma "-DFERRY_B_ROW=0" "$(echo "$wg_mutants" | grep -E '^k_major|^b_transpose')"
# The persistent schedule: its own mutants, and the wgmma ones that apply to it (not the plain schedule's barrier and
# copy-ahead ones).
run_mutants gemm_wgmma.cu ferry_gemm_wgmma "-DFERRY_PERSISTENT=1" "$ws_mutants"
run_mutants gemm_wgmma.cu ferry_gemm_wgmma "-DFERRY_PERSISTENT=1" \
  "$(echo "$wg_mutants" | grep -vE '^no_barrier_in_k_tile|^wait_one_group_short|^copies_into_the_wrong_stage')"
# The persistent epilogue's row bias, read once by each lane for the rows it stores: read at the tile's first columns.
run_mutants gemm_wgmma.cu ferry_gemm_wgmma "-DFERRY_PERSISTENT=1 -DFERRY_BIAS=1" \
  'lane_bias_of_the_first_columns|/const int lane_col = n0 + c0 + lane % (EPI_COLS \/ 4) \* 4;/s/n0 + c0 + /n0 + /'
# The TMA copier, A and B row-major (B's MN-major panels) and B column-major, blocks taking several tiles of a batch.
tma_flags="-DFERRY_PERSISTENT=1 -DFERRY_TMA=1"
run_mutants gemm_wgmma.cu ferry_gemm_wgmma "$tma_flags" "$tma_mutants" "" "$cases 520,600,200,2,8,1,0.5"
run_mutants gemm_wgmma.cu ferry_gemm_wgmma "$tma_flags -DFERRY_B_ROW=0" "$(echo "$tma_mutants" | grep -E '^a_box|^full_')"
# Clusters: B's MN-major panels and its K-major rows, in 128×256 and 128×128 tiles.
cluster_flags="-DFERRY_PERSISTENT=1 -DFERRY_TMA=1 -DFERRY_CLUSTER=2"
run_mutants gemm_wgmma.cu ferry_gemm_wgmma "$cluster_flags" "$(echo "$cluster_mutants" | grep -v '^k_major')" "" \
  "$cases 520,600,200,2,8,1,0.5"
run_mutants gemm_wgmma.cu ferry_gemm_wgmma "$cluster_flags $wgmma_128" \
  "$(echo "$cluster_mutants" | grep -E '^k_major|^stage_freed|^full_expects')" "" "$cases 520,600,200,2,8,1,0.5"
# gemm_mma.cu's sets of warps over k, in its 16×32×128 design with 4 sets.
run_mutants gemm_mma.cu ferry_gemm_mma "-DFERRY_BM=16 -DFERRY_BN=32 -DFERRY_BK=128 -DFERRY_WARPS_M=1 -DFERRY_WARPS_N=2 \
-DFERRY_WARPS_K=4 -DFERRY_STAGES=6 -DFERRY_VEC=8" "$split_mutants"

# The fused epilogue, in the shared header gemm_output.cuh: a mutated copy of it is found first (its own directory
# ahead of src/kernels on the include path), under gemm_mma_sw.cu with an fp32 output (tight rounding), in the kind
# that reaches the mutated line. name | sed expression | kind flags
epilogue_mutants='row_bias_read_by_row|/return to_f32<FERRY_OUT_TYPE>(e.bias\[col\]);/s/bias\[col\]/bias[row]/|-DFERRY_BIAS=1
col_bias_read_by_column|/return to_f32<FERRY_OUT_TYPE>(e.bias\[row\]);/s/bias\[row\]/bias[col]/|-DFERRY_BIAS=2 -DFERRY_OUT_ROW=0
wide_store_one_bias_for_four|/bias_of(e, row, col + i)/s/col + i/col/|-DFERRY_BIAS=1
bias_after_the_activation|/activate(plus_bias(v, bias_of(e, row, col)))/s/activate(plus_bias(v, bias_of(e, row, col)))/plus_bias(activate(v), bias_of(e, row, col))/|-DFERRY_BIAS=2 -DFERRY_ACTIVATION=1 -DFERRY_OUT_ROW=0
gelu_cubic_coefficient|/0.044715f/s/0.044715f/0.04f/|-DFERRY_ACTIVATION=2
silu_sign|/return times_sigmoid(x, MINUS_LOG2E \* x);/s/MINUS_LOG2E \* x/-MINUS_LOG2E * x/|-DFERRY_ACTIVATION=3
sigmoid_sign|/exp2_approx(s)/s/exp2_approx(s)/exp2_approx(-s)/|-DFERRY_ACTIVATION=2
relu_at_zero_lets_negatives_through|/return x < 0.0f ? 0.0f : x;/s/x < 0.0f/x < -0.5f/|-DFERRY_ACTIVATION=1'
# header mutants: list (name | sed expression | kind flags), the kernel's flags, the cases
run_header_mutants() {
  echo "$1" | while IFS='|' read -r name expr flags; do
    mkdir -p "$out/header_$name"
    sed "$expr" "$root/src/kernels/gemm_output.cuh" > "$out/header_$name/gemm_output.cuh"
    if cmp -s "$root/src/kernels/gemm_output.cuh" "$out/header_$name/gemm_output.cuh"; then
      echo "STALE    gemm_output.cuh $name: the expression no longer matches"
      echo 1 >> "$out/survivors"
      continue
    fi
    # shellcheck disable=SC2086
    $cxx -std=c++17 -O2 -Wno-unknown-pragmas -I "$out/header_$name" -I "$root/src/kernels" -I "$here" \
      $2 $flags "$here/emulate_gemm.cpp" -o "$out/header_$name/emulate"
    # shellcheck disable=SC2086
    if "$out/header_$name/emulate" $3 > "$out/header_$name.log" 2>&1; then
      echo "SURVIVED gemm_output.cuh $name"
      echo 1 >> "$out/survivors"
    else
      echo "killed   gemm_output.cuh $name: $(grep -m1 -E 'FAIL|FAILURE' "$out/header_$name.log")"
    fi
  done
}
run_header_mutants "$epilogue_mutants" "-DFERRY_A_TYPE=2 -DFERRY_OUT_TYPE=3" "$cases"

# 8-bit inputs: the pairs along k and the per-tensor scales, under the wgmma kernel's 128×128 design (FP8 has no
# wider one), over cases whose k and strides are whole 16-byte chunks (a batch among them).
cases8="129,127,80,1,16,1,0 127,129,144,3,16,-1.5,0.25 392,264,464,1,16,0.5,0"
narrow_mutants='pairs_keep_a_batch_stride|/p.k \/= 2, p.lda \/= 2/s/p.batch_a \/= 2, //|-DFERRY_A_TYPE=6 -DFERRY_OUT_TYPE=7 -DFERRY_ACC_TYPE=7
scales_ignored|/p.alpha \* \*p.scale_a \* \*p.scale_b;/s/ \* \*p.scale_a \* \*p.scale_b//|-DFERRY_A_TYPE=4 -DFERRY_OUT_TYPE=3 -DFERRY_SCALED=1
scale_a_read_twice|/p.alpha \* \*p.scale_a \* \*p.scale_b;/s/\*p.scale_b;/*p.scale_a;/|-DFERRY_A_TYPE=6 -DFERRY_OUT_TYPE=2 -DFERRY_ACC_TYPE=7 -DFERRY_SCALED=1'
run_header_mutants "$narrow_mutants" "-DEMU_KERNEL=\"gemm_wgmma.cu\" -DEMU_ENTRY=ferry_gemm_wgmma $wgmma_128" "$cases8"

# FP8 sums promoted each k-tile (gemm_wgmma.cu): a k-tile's sums kept after they were added (counted again), or
# added before their group is done (the last group's lost, the others late).
promote_mutants='sums_not_cleared_after_adding|/^        part\[i\] = 0;$/s/part\[i\] = 0;/;/
sums_added_before_their_group_ends|/^      wgmma_wait<0>();$/s/wgmma_wait<0>/wgmma_wait<1>/'
run_mutants gemm_wgmma.cu ferry_gemm_wgmma "$wgmma_128" "$promote_mutants" "-DFERRY_A_TYPE=4 -DFERRY_B_TYPE=4 -DFERRY_OUT_TYPE=3" \
  "$cases8"
# The persistent schedule's promotion, two sets of sums taking turns: a set kept after it was added, added while its
# group runs, the stage of the group still running released, the tail adding the wrong set, the last group not
# waited for. Cases with one to four k-tiles (odd and even tails), blocks taking several tiles.
persistent_promote_mutants='sets_not_cleared_after_adding|/^      set\[i\] = 0;$/s/set\[i\] = 0;/;/
set_added_while_its_group_runs|/^    wgmma_wait<1>();$/s/wgmma_wait<1>/wgmma_wait<2>/
running_groups_stage_released|/^    release(older);$/s/older/newer/
tail_adds_the_wrong_set|/^          finish(sums1);$/s/sums1/sums0/
last_group_not_waited_for|/^    wgmma_wait<0>();$/s/wgmma_wait<0>/wgmma_wait<1>/'
run_mutants gemm_wgmma.cu ferry_gemm_wgmma "-DFERRY_PERSISTENT=1 $wgmma_128" "$persistent_promote_mutants" \
  "-DFERRY_A_TYPE=4 -DFERRY_B_TYPE=4 -DFERRY_OUT_TYPE=3" "$cases8 264,392,336,1,16,1,0 520,600,208,2,16,1,0.5"

if [ -s "$out/survivors" ]; then
  echo "some mutants survived: the emulation misses those bugs"
  exit 1
fi
echo "every mutant was caught"
