/* gemm.c — find, compile once and launch a GEMM operator with ferry (compiles for sm_90 without a GPU). */
#include <ferry/ops.h>
#include <stdio.h>
#include <stdlib.h>

int main(void) {
  /* Descriptors only: a 128x128x128 fp16 GEMM with fp32 accumulation. The addresses are not touched until a run,
   * so a made-up device address is enough to find and compile an operator. */
  int64_t shape[2] = {128, 128};
  ferry_tensor A = {(void *)0x10000, {FERRY_DEVICE_CUDA, 0}, 2, {FERRY_DTYPE_FLOAT, 16, 1}, shape, NULL, 0};
  ferry_tensor B = A, out = A;
  B.data = (void *)0x20000;
  out.data = (void *)0x30000;
  ferry_gemm_args args;
  if (ferry_gemm_args_init(&args, &A, &B, &out, FERRY_SCALAR_F32) != FERRY_OK) goto fail;
  int sm = 0;
  if (ferry_target_sm(-1, &sm) != FERRY_OK) { /* no GPU and no FERRY_ARCH: say so */
    printf("no target: %s (set FERRY_ARCH=sm_90 to compile without a GPU)\n", ferry_last_error_message());
    return 0;
  }
  const ferry_op *ops[16];
  size_t n = 0;
  if (ferry_ops_find(&args, sm, NULL, NULL, ops, 16, &n) != FERRY_OK) goto fail;
  if (n == 0) { /* not an error, so there is no last error to print: say what was asked */
    printf("no operator supports this GEMM on sm_%d (try another target, e.g. FERRY_ARCH=sm_90)\n", sm);
    return 0;
  }
  printf("%zu operators support this GEMM on sm_%d; the first is %s\n", n, sm, ferry_op_info_get(ops[0])->name);
  ferry_artifact *art = NULL; /* NVRTC once; later runs (and processes) hit the memo or the disk cache */
  if (ferry_op_compile_for(ops[0], &args, sm, &art) != FERRY_OK) goto fail;
  size_t cubin_bytes = 0;
  (void)ferry_artifact_cubin(art, &cubin_bytes);
  printf("compiled: %zu bytes of cubin\n", cubin_bytes);
  /* On a GPU, with real operands: ferry_op_run(ops[0], &args, stream, art, FERRY_RUN_ASSUME_SUPPORTED); */
  ferry_artifact_release(art);
  return 0;
fail:
  fprintf(stderr, "ferry: %s\n", ferry_last_error_message());
  return 1;
}
