#!/bin/sh
# check_kernel_identity.sh — shows that a change to the GEMM kernel sources (src/kernels) leaves the generated code
# as it was: it compiles every kernel source, in every built-in design and in the problem kinds the sources branch
# on, to an sm_90 cubin with nvcc, once per version of the sources, and compares the two sets. A pair passes when
# the cubins are byte-identical, or else when `cuobjdump -sass` prints the same machine code for both (a cubin may
# differ in what is not code, such as a file name) and the same resources; anything else fails. Made for clean-ups
# that must not change a kernel: run it before committing one.
#
# usage: tools/check_kernel_identity.sh REV [REV2]         the sources of REV against those of REV2 (default: the
#                                                          working tree); e.g. `HEAD` checks the uncommitted change
#        tools/check_kernel_identity.sh build DIR [SRCDIR] compile every design of SRCDIR (default: this checkout's
#                                                          src/kernels) into DIR/*.cubin
#        tools/check_kernel_identity.sh compare DIR1 DIR2  compare the cubins of two such directories
# Environment: NVCC (default nvcc on PATH, else /usr/local/cuda/bin/nvcc), CUOBJDUMP (default: beside nvcc, else on
# PATH; it needs nvdisasm on PATH), JOBS (parallel compiles, default nproc). Exit status 0 only when every pair
# passed. A toolkit without them (the pip-installed one) gets them from PyPI: nvidia-cuda-cuobjdump and
# nvidia-cuda-nvdisasm.
#
# The designs are those of src/ops/gemm_designs.def (which the registry and cmake/ops.cmake read too); the kinds
# cover fp16 and bf16 operands, 16-bit and fp32 outputs, fp16 accumulators, all-row-major, all-column-major
# and mixed majors. One list serves both versions, so a design added by the change is compiled for both too.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)

usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; }

nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
cuobjdump=${CUOBJDUMP:-$(dirname "$nvcc")/cuobjdump}
[ -x "$cuobjdump" ] || cuobjdump=$(command -v cuobjdump || echo cuobjdump)
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}

# The designs of src/ops/gemm_designs.def (this checkout's), one a line: FAMILY BM BN BK WARPS_M WARPS_N WARPS_K STAGES
# VEC
designs() { sed -n 's/^FERRY_GEMM_DESIGN(\([^)]*\)).*/\1/p' "$root/src/ops/gemm_designs.def" | tr -d ' ' | tr ',' ' '; }
mma_designs=$(designs | awk '$1 == "MMA" { print $2, $3, $4, $5, $6, $7, $8, $9 }')
sw_designs=$(designs | awk '$1 == "MMA_SW" { print $2, $3, $4, $5, $6, $8 }')
wgmma_designs=$(designs | awk '$1 == "WGMMA" { print $2, $3, $4, $8 }')

# name:flags of the tensor-core kinds (operand, output, accumulator types; A, B, output majors: r or c). Types are
# given by their codes (1 fp16, 2 bf16, 3 fp32), which every version of the sources reads the same way, whatever
# the names of the codes' macros in it.
tc_kinds="bf16_rrr_bf16:-DFERRY_A_TYPE=2,-DFERRY_OUT_TYPE=2,-DFERRY_A_ROW=1,-DFERRY_B_ROW=1,-DFERRY_OUT_ROW=1
bf16_ccc_bf16:-DFERRY_A_TYPE=2,-DFERRY_OUT_TYPE=2,-DFERRY_A_ROW=0,-DFERRY_B_ROW=0,-DFERRY_OUT_ROW=0
bf16_rrr_f32:-DFERRY_A_TYPE=2,-DFERRY_OUT_TYPE=3,-DFERRY_A_ROW=1,-DFERRY_B_ROW=1,-DFERRY_OUT_ROW=1
bf16_ccc_f32:-DFERRY_A_TYPE=2,-DFERRY_OUT_TYPE=3,-DFERRY_A_ROW=0,-DFERRY_B_ROW=0,-DFERRY_OUT_ROW=0
f16_rrr_f16:-DFERRY_A_TYPE=1,-DFERRY_OUT_TYPE=1,-DFERRY_A_ROW=1,-DFERRY_B_ROW=1,-DFERRY_OUT_ROW=1
f16_ccc_f16:-DFERRY_A_TYPE=1,-DFERRY_OUT_TYPE=1,-DFERRY_A_ROW=0,-DFERRY_B_ROW=0,-DFERRY_OUT_ROW=0
f16_rrr_f32:-DFERRY_A_TYPE=1,-DFERRY_OUT_TYPE=3,-DFERRY_A_ROW=1,-DFERRY_B_ROW=1,-DFERRY_OUT_ROW=1
f16_ccc_f32:-DFERRY_A_TYPE=1,-DFERRY_OUT_TYPE=3,-DFERRY_A_ROW=0,-DFERRY_B_ROW=0,-DFERRY_OUT_ROW=0
f16_rcr_f16:-DFERRY_A_TYPE=1,-DFERRY_OUT_TYPE=1,-DFERRY_A_ROW=1,-DFERRY_B_ROW=0,-DFERRY_OUT_ROW=1
f16_crc_f32:-DFERRY_A_TYPE=1,-DFERRY_OUT_TYPE=3,-DFERRY_A_ROW=0,-DFERRY_B_ROW=1,-DFERRY_OUT_ROW=0"
# fp16 accumulators (gemm_mma.cu and gemm_mma_sw.cu only; wgmma accumulates in fp32)
acc16_kinds="f16_rcr_f16_acc16:-DFERRY_A_TYPE=1,-DFERRY_OUT_TYPE=1,-DFERRY_ACC_TYPE=1,-DFERRY_A_ROW=1,-DFERRY_B_ROW=0,-DFERRY_OUT_ROW=1
f16_ccc_f32_acc16:-DFERRY_A_TYPE=1,-DFERRY_OUT_TYPE=3,-DFERRY_ACC_TYPE=1,-DFERRY_A_ROW=0,-DFERRY_B_ROW=0,-DFERRY_OUT_ROW=0"

# One line per cubin: NAME|SOURCE|ARCH FLAGS|MACRO FLAGS (comma-separated).
jobs_list() {
  echo "$mma_designs" | while read -r bm bn bk wm wn wk st vec; do
    printf '%s\n%s\n' "$tc_kinds" "$acc16_kinds" | while IFS=: read -r kind flags; do
      echo "mma_${bm}x${bn}x${bk}_w${wm}x${wn}x${wk}_s${st}_v${vec}_$kind|gemm_mma.cu|-arch=sm_90|-DFERRY_BM=$bm,-DFERRY_BN=$bn,-DFERRY_BK=$bk,-DFERRY_WARPS_M=$wm,-DFERRY_WARPS_N=$wn,-DFERRY_WARPS_K=$wk,-DFERRY_STAGES=$st,-DFERRY_VEC=$vec,$flags"
    done
  done
  echo "$sw_designs" | while read -r bm bn bk wm wn st; do
    printf '%s\n%s\n' "$tc_kinds" "$acc16_kinds" | while IFS=: read -r kind flags; do
      echo "mma_sw_${bm}x${bn}x${bk}_w${wm}x${wn}_s${st}_$kind|gemm_mma_sw.cu|-arch=sm_90|-DFERRY_BM=$bm,-DFERRY_BN=$bn,-DFERRY_BK=$bk,-DFERRY_WARPS_M=$wm,-DFERRY_WARPS_N=$wn,-DFERRY_STAGES=$st,$flags"
    done
  done
  echo "$wgmma_designs" | while read -r bm bn bk st; do
    echo "$tc_kinds" | while IFS=: read -r kind flags; do
      echo "wgmma_${bm}x${bn}x${bk}_s${st}_$kind|gemm_wgmma.cu|-gencode=arch=compute_90a,code=sm_90a|-DFERRY_BM=$bm,-DFERRY_BN=$bn,-DFERRY_BK=$bk,-DFERRY_STAGES=$st,$flags"
    done
  done
  # gemm_simt.cu: any mix of types; every operand type with every output type, both majors.
  for in in F16:1 BF16:2 F32:3; do
    for out in F16:1 BF16:2 F32:3; do
      for maj in 1 0; do
        echo "simt_${in%:*}_${out%:*}_row$maj|gemm_simt.cu|-arch=sm_90|-DFERRY_A_TYPE=${in#*:},-DFERRY_OUT_TYPE=${out#*:},-DFERRY_A_ROW=$maj,-DFERRY_B_ROW=$maj,-DFERRY_OUT_ROW=$maj"
      done
    done
  done
}

build() { # DIR SRCDIR
  dir=$1
  src=$2
  [ -d "$src" ] || { echo "no kernel sources at $src" >&2; exit 2; }
  mkdir -p "$dir"
  rm -f "$dir"/*.cubin "$dir"/*.sass "$dir"/*.log
  # Each compile runs from the source directory with a relative file name, so nothing that names the checkout's
  # place can enter the cubin.
  jobs_list | xargs -P "$jobs" -I{} sh -c '
    line=$4 && name=${line%%|*} && rest=${line#*|} && file=${rest%%|*} && rest=${rest#*|} && arch=${rest%%|*}
    flags=$(echo "${rest#*|}" | tr "," " ")
    cd "$2" && "$1" $arch -cubin -o "$3/$name.cubin" $flags "$file" > "$3/$name.log" 2>&1 ||
      { echo "FAILED to compile $name:"; cat "$3/$name.log"; exit 1; }
    rm -f "$3/$name.log"' sh "$nvcc" "$src" "$(cd "$dir" && pwd)" {}
  echo "built $(ls "$dir"/*.cubin | wc -l) cubins from $src into $dir"
}

# What must not change in a cubin: its machine code and its resources (registers, shared memory, stack). Fails,
# rather than print nothing comparable, when the disassembly has no instruction (cuobjdump without nvdisasm).
code() {
  "$cuobjdump" -sass "$1" > "$1.sass" && grep -q '/\*0000\*/' "$1.sass" && "$cuobjdump" -res-usage "$1" >> "$1.sass" ||
    { echo "cannot disassemble $1 with $cuobjdump (is nvdisasm on PATH?)" >&2; exit 2; }
}

compare() { # DIR1 DIR2
  n=0 same=0 sass=0 differ=0 missing=0
  for a in "$1"/*.cubin; do
    [ -e "$a" ] || { echo "no cubins in $1" >&2; exit 2; }
    name=$(basename "$a")
    b=$2/$name
    n=$((n + 1))
    if [ ! -e "$b" ]; then
      echo "MISSING  $name (not in $2)"
      missing=$((missing + 1))
    elif cmp -s "$a" "$b"; then
      same=$((same + 1))
    else
      code "$a"
      code "$b"
      if cmp -s "$a.sass" "$b.sass"; then
        echo "sass-identical $name (the cubins differ outside the code)"
        sass=$((sass + 1))
      else
        echo "DIFFERS  $name: diff $a.sass $b.sass"
        differ=$((differ + 1))
      fi
    fi
  done
  for b in "$2"/*.cubin; do
    [ -e "$1/$(basename "$b")" ] || { echo "MISSING  $(basename "$b") (not in $1)"; missing=$((missing + 1)); }
  done
  echo "compared $n cubins: $same byte-identical, $sass with identical SASS only, $differ differ, $missing missing"
  [ "$differ" -eq 0 ] && [ "$missing" -eq 0 ]
}

case "${1:-}" in
  "" | -h | --help) usage ;;
  build) [ $# -ge 2 ] || { usage >&2; exit 2; }; build "$2" "${3:-$root/src/kernels}" ;;
  compare) [ $# -eq 3 ] || { usage >&2; exit 2; }; compare "$2" "$3" ;;
  -*) echo "unknown option '$1' (see --help)" >&2; exit 2 ;;
  *)
    [ $# -le 2 ] || { usage >&2; exit 2; }
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    for i in 1 2; do
      if [ $i -eq 1 ]; then rev=$1; else rev=${2:-}; fi
      if [ -z "$rev" ]; then
        src=$root/src/kernels
      else
        mkdir -p "$work/src$i"
        git -C "$root" archive "$rev" src/kernels include | tar -x -C "$work/src$i"
        src=$work/src$i/src/kernels
      fi
      echo "${rev:-working tree}:"
      build "$work/cubins$i" "$src"
    done
    compare "$work/cubins1" "$work/cubins2"
    ;;
esac
