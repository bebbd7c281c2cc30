#!/bin/sh
# emulate.sh — builds tests/kernels/emulate_gemm.cpp for every gemm_mma_sw and gemm_wgmma design (both schedules) of
# src/ops/gemm_designs.def, in seven problem kinds (all four A/B major pairs, row- and column-major outputs,
# bf16/fp16/fp32 outputs, fp16 accumulators, three fused epilogues), runs each over edge, batched, alpha/beta and k=0
# cases, and does the same for gemm_mma.cu in its 128×128 design (a control: its kernels passed on the H200) and its
# m ≤ 16 designs. gemm_wgmma.cu and gemm_mma.cu also run in five 8-bit kinds (FP8 in three pairings, int8 into
# exact int32 and into bf16, with scales and epilogues), over cases whose k and strides are whole 16-byte chunks.
# Needs a C++17 compiler; no GPU.
#
# usage: tests/kernels/emulate.sh [BUILD_DIR]   (default: a temporary directory; prints a table, exits 1 on failure)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$(mktemp -d)}
mkdir -p "$out"
cxx=${CXX:-c++}

# The H200 matrix's padded cases, a case with whole k-tiles inside the operands and edges after them, a batch
# with alpha and beta, k = 0, a single row.
cases="128,128,128,1,0,1,0 129,127,65,1,8,1,0 127,129,129,3,8,-1.5,0.25 264,392,328,1,8,1,0 392,264,456,1,8,0.5,0
64,64,0,1,8,1,0.5 1,8,8,1,8,1,0"

# 8-bit inputs: k and every stride whole 16-byte chunks (what the host requires of them).
cases8="128,128,128,1,0,1,0 129,127,80,1,16,1,0 127,129,144,3,16,-1.5,0.25 264,392,336,1,16,1,0
392,264,464,1,16,0.5,0 64,64,0,1,16,1,0.5 1,8,16,1,16,1,0"

# Types by their codes: 1 fp16, 2 bf16, 3 fp32, 4 e4m3, 5 e5m2, 6 int8, 7 int32 (ferry_scalar).
kinds="bf16_rrr:-DFERRY_A_TYPE=2,-DFERRY_OUT_TYPE=2,-DFERRY_A_ROW=1,-DFERRY_B_ROW=1,-DFERRY_OUT_ROW=1
bf16_ccc_f32:-DFERRY_A_TYPE=2,-DFERRY_OUT_TYPE=3,-DFERRY_A_ROW=0,-DFERRY_B_ROW=0,-DFERRY_OUT_ROW=0
f16_rcr_acc16:-DFERRY_A_TYPE=1,-DFERRY_OUT_TYPE=1,-DFERRY_ACC_TYPE=1,-DFERRY_A_ROW=1,-DFERRY_B_ROW=0,-DFERRY_OUT_ROW=1
f16_crr_f32:-DFERRY_A_TYPE=1,-DFERRY_OUT_TYPE=3,-DFERRY_A_ROW=0,-DFERRY_B_ROW=1,-DFERRY_OUT_ROW=1
bf16_rrr_row_bias_gelu:-DFERRY_A_TYPE=2,-DFERRY_OUT_TYPE=2,-DFERRY_A_ROW=1,-DFERRY_B_ROW=1,-DFERRY_OUT_ROW=1,-DFERRY_BIAS=1,-DFERRY_ACTIVATION=2
f16_rcc_f32_col_bias_silu:-DFERRY_A_TYPE=1,-DFERRY_OUT_TYPE=3,-DFERRY_A_ROW=1,-DFERRY_B_ROW=0,-DFERRY_OUT_ROW=0,-DFERRY_BIAS=2,-DFERRY_ACTIVATION=3
f16_rrr_col_bias_relu:-DFERRY_A_TYPE=1,-DFERRY_OUT_TYPE=1,-DFERRY_A_ROW=1,-DFERRY_B_ROW=1,-DFERRY_OUT_ROW=1,-DFERRY_BIAS=2,-DFERRY_ACTIVATION=1"
# 8-bit operands: A row-major and B column-major only (k contiguous in both).
kinds8="e4m3_rcr_bf16:-DFERRY_A_TYPE=4,-DFERRY_B_TYPE=4,-DFERRY_OUT_TYPE=2,-DFERRY_A_ROW=1,-DFERRY_B_ROW=0,-DFERRY_OUT_ROW=1
e4m3_e5m2_rcc_f32_scaled:-DFERRY_A_TYPE=4,-DFERRY_B_TYPE=5,-DFERRY_OUT_TYPE=3,-DFERRY_A_ROW=1,-DFERRY_B_ROW=0,-DFERRY_OUT_ROW=0,-DFERRY_SCALED=1
e5m2_e4m3_rcr_f16_row_bias_gelu:-DFERRY_A_TYPE=5,-DFERRY_B_TYPE=4,-DFERRY_OUT_TYPE=1,-DFERRY_A_ROW=1,-DFERRY_B_ROW=0,-DFERRY_OUT_ROW=1,-DFERRY_BIAS=1,-DFERRY_ACTIVATION=2
i8_rcr_i32:-DFERRY_A_TYPE=6,-DFERRY_B_TYPE=6,-DFERRY_OUT_TYPE=7,-DFERRY_ACC_TYPE=7,-DFERRY_A_ROW=1,-DFERRY_B_ROW=0,-DFERRY_OUT_ROW=1
i8_rcc_bf16_scaled_col_bias_silu:-DFERRY_A_TYPE=6,-DFERRY_B_TYPE=6,-DFERRY_OUT_TYPE=2,-DFERRY_ACC_TYPE=7,-DFERRY_A_ROW=1,-DFERRY_B_ROW=0,-DFERRY_OUT_ROW=0,-DFERRY_SCALED=1,-DFERRY_BIAS=2,-DFERRY_ACTIVATION=3"

# The designs of src/ops/gemm_designs.def, one a line: FAMILY BM BN BK WARPS_M WARPS_N WARPS_K STAGES VEC SPEED
# EXPERIMENTAL (experimental ones too: the emulation needs no GPU).
designs() { sed -n 's/^FERRY_GEMM_DESIGN(\([^)]*\)).*/\1/p' "$root/src/ops/gemm_designs.def" | tr -d ' ' | tr ',' ' '; }
designs | awk '$1 == "MMA_SW" { print $2, $3, $4, $5, $6, $8 }' > "$out/designs"
designs | awk '$1 == "WGMMA" { print $2, $3, $4, $8, 0, 0, 1 } $1 == "WGMMA_PERSISTENT" { print $2, $3, $4, $8, 1, 0, 1 }
  $1 == "WGMMA_TMA" { print $2, $3, $4, $8, 1, 1, 1 } $1 == "WGMMA_TMA_CLUSTER" { print $2, $3, $4, $8, 1, 1, 2 }' \
  > "$out/wgmma_designs"
designs | awk '$1 == "MMA" && (($2 == 128 && $3 == 128) || $2 == 16) { print $2, $3, $4, $5, $6, $7, $8, $9 }' \
  > "$out/control_designs"
for f in designs wgmma_designs control_designs; do
  [ -s "$out/$f" ] || { echo "src/ops/gemm_designs.def has none of the $f this script emulates"; exit 1; }
done

# gemm_mma.cu reads its shared-memory size with inline PTX; the copy built here asks emulate_cuda.h instead.
sed 's/asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(have));/have = dynamic_smem_size();/' \
  "$root/src/kernels/gemm_mma.cu" > "$out/gemm_mma_host.cu"
grep -q 'have = dynamic_smem_size();' "$out/gemm_mma_host.cu"
# gemm_wgmma.cu's blocks of a cluster run together here, so its shared memory is the running block's.
sed 's/extern __shared__ __align__(1024) unsigned char smem_raw\[\];/unsigned char *const smem_raw = emu::smem_here();/' \
  "$root/src/kernels/gemm_wgmma.cu" > "$out/gemm_wgmma_host.cu"
grep -q 'smem_raw = emu::smem_here();' "$out/gemm_wgmma_host.cu"

pass=0
fail=0
table=""
run() { # name, flags...
  name=$1
  shift
  if ! $cxx -std=c++17 -O2 -Wall -Wno-unknown-pragmas -Wno-psabi -I "$root/src/kernels" -I "$here" -I "$out" "$@" \
      "$here/emulate_gemm.cpp" -o "$out/$name" 2> "$out/$name.build.log"; then
    cat "$out/$name.build.log"
    fail=$((fail + 1))
    table="$table
FAIL  $name (does not build)"
    return
  fi
  # shellcheck disable=SC2086
  if "$out/$name" $run_cases > "$out/$name.log" 2>&1; then
    pass=$((pass + 1))
    table="$table
ok    $name"
  else
    fail=$((fail + 1))
    table="$table
FAIL  $name (see $out/$name.log)"
    grep -v '^ok' "$out/$name.log" | head -20
  fi
}

# The cases of a kind (8-bit ones: cases8) and schedule (persistent: also a batch of two with more tiles than blocks,
# so that blocks cross from one batch to the next).
cases_for() { # kind name, persistent (0/1)
  case $1 in e4m3* | e5m2* | i8*) c=$cases8 extra=520,600,208,2,16,1,0.5 ;; *) c=$cases extra=520,600,200,2,8,1,0.5 ;; esac
  if [ "$2" = 1 ]; then echo "$c $extra"; else echo "$c"; fi
}

while read -r bm bn bk wm wn st; do
  for kind in $kinds; do
    run_cases=$(cases_for "${kind%%:*}" 0)
    kname=${kind%%:*}
    flags=$(echo "${kind#*:}" | tr ',' ' ')
    # shellcheck disable=SC2086
    run "sw_${bm}x${bn}x${bk}_s${st}_$kname" -DFERRY_BM="$bm" -DFERRY_BN="$bn" -DFERRY_BK="$bk" \
      -DFERRY_WARPS_M="$wm" -DFERRY_WARPS_N="$wn" -DFERRY_STAGES="$st" $flags
  done
done < "$out/designs"

# gemm_wgmma.cu in its registered designs, both schedules, the persistent one with cp.async or TMA copies, the TMA
# one also in clusters of two (fp32 accumulation only: the fp16-accumulator kind runs with fp32). The persistent
# one runs each case with three blocks, or two clusters of two, each taking several tiles (emulate_gemm.cpp).
while read -r bm bn bk st persistent tma cluster; do
  schedule=$([ "$tma" = 1 ] && echo _tma || { [ "$persistent" = 1 ] && echo _persistent; } || true)
  [ "$cluster" = 1 ] || schedule=${schedule}_cluster$cluster
  for kind in $kinds $kinds8; do
    kname=${kind%%:*}
    # FP8 sums are promoted each k-tile, which a 256-wide tile has no registers for: not registered (registry.c)
    case $kname in e4m3* | e5m2*) [ "$bn" -gt 128 ] && continue ;; esac
    run_cases=$(cases_for "$kname" "$persistent")
    flags=$(echo "${kind#*:}" | tr ',' ' ' | sed 's/-DFERRY_ACC_TYPE=1//')
    # shellcheck disable=SC2086
    run "wgmma_${bm}x${bn}x${bk}_s${st}${schedule}_$kname" -DEMU_KERNEL='"gemm_wgmma_host.cu"' \
      -DEMU_ENTRY=ferry_gemm_wgmma -DFERRY_BM="$bm" -DFERRY_BN="$bn" -DFERRY_BK="$bk" -DFERRY_STAGES="$st" \
      -DFERRY_PERSISTENT="$persistent" -DFERRY_TMA="$tma" -DFERRY_CLUSTER="$cluster" $flags
  done
done < "$out/wgmma_designs"

# The padded-tile kernel: its 128×128 design, as it ran on the H200 (a control), and the m ≤ 16 designs.
while read -r bm bn bk wm wn wk st vec; do
  for kind in $kinds $kinds8; do
    kname=${kind%%:*}
    run_cases=$(cases_for "$kname" 0)
    flags=$(echo "${kind#*:}" | tr ',' ' ')
    # shellcheck disable=SC2086
    run "mma_${bm}x${bn}x${bk}_s${st}_k${wk}_$kname" -DEMU_KERNEL='"gemm_mma_host.cu"' -DEMU_ENTRY=ferry_gemm_mma \
      -DFERRY_BM="$bm" -DFERRY_BN="$bn" -DFERRY_BK="$bk" -DFERRY_WARPS_M="$wm" -DFERRY_WARPS_N="$wn" \
      -DFERRY_WARPS_K="$wk" -DFERRY_STAGES="$st" -DFERRY_VEC="$vec" $flags
  done
done < "$out/control_designs"

echo "$table" | sed '/^$/d'
echo "emulated: $pass builds passed every case, $fail failed (logs in $out)"
[ "$fail" -eq 0 ]
