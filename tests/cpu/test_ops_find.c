/* Discovery, support checks and targets, on a forced target (no GPU needed). */
#include "test_ops.h"

#include <time.h>

static const ferry_op *find_first(const ferry_gemm_args *args, int sm) {
  const ferry_op *ops[32];
  size_t n = 0;
  ASSERT_OK(ferry_ops_find(args, sm, NULL, NULL, ops, 32, &n));
  return n ? ops[0] : NULL;
}

TEST(builtins_are_registered_with_metadata) {
  size_t n = ferry_ops_count();
  ASSERT(n >= 9);
  const ferry_op *op = ferry_op_by_name("gemm_mma_bf16_128x128x32_s4");
  ASSERT(op != NULL);
  const ferry_op_info *i = ferry_op_info_get(op);
  ASSERT(!strcmp(i->instruction, "mma.sync.m16n8k16"));
  ASSERT_EQ(i->tile_m, 128);
  ASSERT_EQ(i->tile_n, 128);
  ASSERT_EQ(i->tile_k, 32);
  ASSERT_EQ(i->stages, 4);
  ASSERT_EQ(i->threads, 128);
  ASSERT_EQ(i->min_sm, 80);
  ASSERT_EQ(i->a_types, FERRY_SCALAR_BIT(FERRY_SCALAR_BF16));
  ASSERT_EQ(i->a_align, 16);
  ASSERT_EQ(i->smem_bytes, 4 * (128 * 40 + 128 * 40) * 2);
  ASSERT_EQ(i->builtin, 1);
  /* the swizzled designs: no padding, the stages or the epilogue's staging, whichever is larger */
  const ferry_op *sw = ferry_op_by_name("gemm_mma_bf16_128x256x64_s3_swz");
  ASSERT(sw != NULL);
  i = ferry_op_info_get(sw);
  ASSERT(!strcmp(i->instruction, "mma.sync.m16n8k16"));
  ASSERT_EQ(i->tile_m, 128);
  ASSERT_EQ(i->tile_n, 256);
  ASSERT_EQ(i->tile_k, 64);
  ASSERT_EQ(i->stages, 3);
  ASSERT_EQ(i->threads, 256);
  ASSERT_EQ(i->a_align, 16);
  ASSERT_EQ(i->smem_bytes, 3 * (128 + 256) * 64 * 2);
  ASSERT_EQ(ferry_op_info_get(ferry_op_by_name("gemm_mma_f16_128x128x64_s3_swz"))->smem_bytes, 3 * 256 * 64 * 2);
  ASSERT_EQ(ferry_op_info_get(ferry_op_by_name("gemm_mma_f16_128x256x64_s4_swz"))->smem_bytes, 4 * 384 * 64 * 2);
  ASSERT_EQ(ferry_op_info_get(ferry_op_by_name("gemm_mma_bf16_256x128x64_s3_swz"))->threads, 256);
  for (uint32_t kind = 0; kind < 4; kind++) /* one layout whatever the majors */
    ASSERT_EQ(ferry__design_smem(sw, kind << 8), 3 * (128 + 256) * 64 * 2);
  ASSERT(ferry_op_by_name("no such operator") == NULL);
  ASSERT(ferry_ops_get(n) == NULL);
  ASSERT(ferry_op_info_get(NULL) == NULL);
}

TEST(find_on_forced_target_orders_tensor_cores_first) {
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F16, FERRY_SCALAR_F16, 128, 128, 128);
  const ferry_op *ops[32];
  size_t n = 0;
  ASSERT_OK(ferry_ops_find(&args, 90, NULL, NULL, ops, 32, &n));
  ASSERT_EQ(n, 18); /* eleven f16 mma.sync designs, the six wgmma ones (sm_90) and the SIMT one */
  /* 128³ wants small tiles: an m = 16 design (3.3 µs on the H200, the 64×64 one 4.4 µs) */
  ASSERT(!strcmp(ferry_op_info_get(ops[0])->name, "gemm_mma_f16_16x32x128_s6_splitk4"));
  ASSERT(!strcmp(ferry_op_info_get(ops[n - 1])->instruction, "simt.fma"));
  for (size_t i = 0; i < n; i++) ASSERT_OK(ferry_op_supports(ops[i], &args, NULL, 0));
  /* 4096³: the designs' speeds decide (registry.c, fitted to measured times). First the wgmma design with TMA
   * copies on sm_90 (181.8 µs on an H100, the plain wgmma one 196.7), the swizzled 128×256×64 s3 where it is not
   * offered and 192 KB do not fit (280 µs on the H200); among the padded designs, 128×128×32 s4 (461 µs) before
   * 128×256×32 s3 (610 µs). */
  test_args(&args, FERRY_SCALAR_BF16, FERRY_SCALAR_BF16, 4096, 4096, 4096);
  ASSERT(!strcmp(ferry_op_info_get(find_first(&args, 90))->name, "gemm_wgmma_bf16_128x256x64_s4_tma"));
  ASSERT(!strcmp(ferry_op_info_get(find_first(&args, 80))->name, "gemm_mma_bf16_128x256x64_s3_swz"));
  ASSERT_OK(ferry_ops_find(&args, 90, NULL, NULL, ops, 32, &n));
  ASSERT_EQ(n, 18);
  size_t at_128 = n, at_256 = n;
  for (size_t i = 0; i < n; i++) {
    if (!strcmp(ferry_op_info_get(ops[i])->name, "gemm_mma_bf16_128x128x32_s4")) at_128 = i;
    if (!strcmp(ferry_op_info_get(ops[i])->name, "gemm_mma_bf16_128x256x32_s3")) at_256 = i;
  }
  ASSERT(at_128 < at_256 && at_256 < n);
  /* capacity smaller than the count: the count is still the total */
  ASSERT_OK(ferry_ops_find(&args, 90, NULL, NULL, ops, 1, &n));
  ASSERT_EQ(n, 18);
  ASSERT_OK(ferry_ops_find(&args, 90, NULL, NULL, NULL, 0, &n));
  ASSERT_EQ(n, 18);
}

TEST(find_gives_decode_steps_the_m16_designs) {
  /* H200 device times (ferry_time_gemm --shape): 16×8192×8192 36.9 µs in the 64×64 wgmma design (one warpgroup,
   * 8 stages), 41.9 µs in the 16×64 mma.sync one (which sm_80 to sm_89 get), 100 µs in the 64×64 mma.sync one;
   * 16×4096×4096 18.0 µs in 16×32 tiles (64 blocks of 16×64 leave half the chip idle); at 16×28672×8192 there are
   * tiles enough for the 128×256 wgmma designs (114.8 µs without TMA, the 16×64 one 145 µs; with TMA it ranks
   * first by its 4096³ speed, not timed at this shape). */
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_BF16, FERRY_SCALAR_BF16, 16, 8192, 8192);
  ASSERT(!strcmp(ferry_op_info_get(find_first(&args, 90))->name, "gemm_wgmma_bf16_64x64x64_s8"));
  ASSERT(!strcmp(ferry_op_info_get(find_first(&args, 80))->name, "gemm_mma_bf16_16x64x64_s8_splitk2"));
  ASSERT(!strcmp(ferry_op_info_get(find_first(&args, 86))->name, "gemm_mma_bf16_16x64x64_s8_splitk2"));
  test_args(&args, FERRY_SCALAR_BF16, FERRY_SCALAR_BF16, 1, 8192, 8192);
  ASSERT(!strcmp(ferry_op_info_get(find_first(&args, 90))->name, "gemm_wgmma_bf16_64x64x64_s8"));
  test_args(&args, FERRY_SCALAR_BF16, FERRY_SCALAR_BF16, 16, 4096, 4096);
  ASSERT(!strcmp(ferry_op_info_get(find_first(&args, 90))->name, "gemm_mma_bf16_16x32x128_s6_splitk4"));
  test_args(&args, FERRY_SCALAR_BF16, FERRY_SCALAR_BF16, 16, 28672, 8192);
  ASSERT(!strcmp(ferry_op_info_get(find_first(&args, 90))->name, "gemm_wgmma_bf16_128x256x64_s4_tma"));
  const ferry_op_info *i = ferry_op_info_get(ferry_op_by_name("gemm_mma_bf16_16x64x128_s9_splitk2"));
  ASSERT_EQ(i->threads, 256); /* 4 warps across n, twice over k */
  ASSERT_EQ(i->smem_bytes, 9 * (128 * 24 + 128 * 72) * 2); /* the larger stage: A column-major, B row-major */
}

/* A m×k row-major, B k×n column-major: how 8-bit operands come; leading dimensions of whole 16-byte chunks. */
static void args_8bit(ferry_gemm_args *args, int in, int out, int acc, int m, int n, int k) {
  test_matrix a, b, c;
  test_matrix_make(&a, 0x10000000, in, 0, m, k, 0, (k + 15) / 16 * 16);
  test_matrix_make(&b, 0x20000000, in, 0, k, n, 1, (k + 15) / 16 * 16);
  test_matrix_make(&c, 0x30000000, out, 0, m, n, 0, 0);
  ASSERT_OK(ferry_gemm_args_init(args, &a.t, &b.t, &c.t, (ferry_scalar)acc));
}

TEST(find_gives_8bit_inputs_their_designs_with_reasons) {
  ferry_gemm_args args;
  const ferry_op *ops[32];
  size_t n = 0;
  args_8bit(&args, FERRY_SCALAR_E4M3, FERRY_SCALAR_BF16, FERRY_SCALAR_F32, 4096, 4096, 4096);
  /* the persistent schedule with TMA copies (123.5 µs on an H100, 145.0 with cp.async, the plain one's 166.0) */
  ASSERT(!strcmp(ferry_op_info_get(find_first(&args, 90))->name, "gemm_wgmma_fp8_128x128x128_s6_tma"));
  ASSERT(!strcmp(ferry_op_info_get(find_first(&args, 89))->name, "gemm_mma_fp8_128x128x64_s4"));
  ASSERT_OK(ferry_ops_find(&args, 86, NULL, NULL, ops, 32, &n)); /* FP8 mma.sync is sm_89's */
  ASSERT_EQ(n, 0);
  args_8bit(&args, FERRY_SCALAR_I8, FERRY_SCALAR_I32, FERRY_SCALAR_I32, 16, 8192, 8192);
  ASSERT(!strcmp(ferry_op_info_get(find_first(&args, 80))->name, "gemm_mma_i8_16x64x128_s8_splitk2"));
  const ferry_op *op = ferry_op_by_name("gemm_wgmma_i8_128x256x128_s4");
  const ferry_op_info *i = ferry_op_info_get(op);
  ASSERT(!strcmp(i->instruction, "wgmma.m64n256k32"));
  ASSERT_EQ(i->tile_k, 128);
  ASSERT_EQ(i->div_k, 16);
  ASSERT_OK(ferry_op_supports(op, &args, NULL, 0));
  char why[256];
  args.alpha = 2.0f; /* the sums go out exact into int32 */
  ASSERT_STATUS(ferry_op_supports(op, &args, why, sizeof why), FERRY_UNSUPPORTED);
  ASSERT_STR_CONTAINS(why, "int32 output takes alpha 1 and beta 0");
  args_8bit(&args, FERRY_SCALAR_I8, FERRY_SCALAR_F16, FERRY_SCALAR_I32, 64, 64, 40);
  ASSERT_STATUS(ferry_op_supports(op, &args, why, sizeof why), FERRY_UNSUPPORTED);
  ASSERT_STR_CONTAINS(why, "k = 40 is not a multiple of 16");
  args_8bit(&args, FERRY_SCALAR_E5M2, FERRY_SCALAR_F16, FERRY_SCALAR_F32, 64, 64, 64);
  ASSERT_STATUS(ferry_op_supports(op, &args, why, sizeof why), FERRY_UNSUPPORTED);
  ASSERT_STR_CONTAINS(why, "operand A: expected int8, got e5m2");
  ASSERT_OK(ferry_op_supports(ferry_op_by_name("gemm_mma_fp8_64x64x64_s3"), &args, NULL, 0));
  ASSERT_STATUS(ferry_op_supports(ferry_op_by_name("gemm_mma_bf16_64x64x32_s3"), &args, why, sizeof why),
                FERRY_UNSUPPORTED);
  ASSERT_STR_CONTAINS(why, "operand A: expected bf16, got e5m2");
}

TEST(find_respects_target_and_filter) {
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F16, FERRY_SCALAR_F32, 64, 64, 64);
  size_t n = 0;
  const ferry_op *ops[32];
  ASSERT_OK(ferry_ops_find(&args, 75, NULL, NULL, ops, 32, &n)); /* sm_75: no cp.async, only SIMT */
  ASSERT_EQ(n, 1);
  ASSERT(!strcmp(ferry_op_info_get(ops[0])->name, "gemm_simt_64x64x16"));
  ASSERT_OK(ferry_ops_find(&args, 60, NULL, NULL, ops, 32, &n));
  ASSERT_EQ(n, 0); /* none is not an error */
  test_args(&args, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 64, 64, 64);
  ASSERT_OK(ferry_ops_find(&args, 90, NULL, NULL, ops, 32, &n));
  ASSERT_EQ(n, 1); /* fp32 operands: SIMT only */
  ASSERT_STATUS(ferry_ops_find(NULL, 90, NULL, NULL, ops, 32, &n), FERRY_INVALID_ARGUMENT);
  ASSERT_STATUS(ferry_ops_find(&args, 90, NULL, NULL, NULL, 3, &n), FERRY_INVALID_ARGUMENT);
}

static int only_128(const ferry_op_info *info, void *user) {
  (void)user;
  return info->tile_m == 128;
}

TEST(find_filter_keeps_what_it_says) {
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_BF16, FERRY_SCALAR_F32, 256, 256, 256);
  const ferry_op *ops[32];
  size_t n = 0;
  ASSERT_OK(ferry_ops_find(&args, 90, only_128, NULL, ops, 32, &n));
  ASSERT_EQ(n, 10); /* 128×256×32, 128×128×32, the swizzled 128×128×64, 128×256×64 s3 and s4, and five wgmma */
  for (size_t i = 0; i < n; i++) ASSERT_EQ(ferry_op_info_get(ops[i])->tile_m, 128);
}

static int named(const ferry_op *const *ops, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(ferry_op_info_get(ops[i])->name, name)) return 1;
  return 0;
}

TEST(find_skips_designs_over_the_targets_shared_memory) {
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_BF16, FERRY_SCALAR_BF16, 4096, 4096, 4096);
  const ferry_op *ops[32];
  size_t n = 0;
  ASSERT_OK(ferry_ops_find(&args, 90, NULL, NULL, ops, 32, &n)); /* 227 KB: every design, wgmma too */
  ASSERT_EQ(n, 18);
  ASSERT(named(ops, n, "gemm_mma_bf16_128x256x64_s4_swz"));
  ASSERT_OK(ferry_ops_find(&args, 80, NULL, NULL, ops, 32, &n)); /* 163 KB: not the 192 and 221 KB ones */
  ASSERT_EQ(n, 10);
  ASSERT(!named(ops, n, "gemm_mma_bf16_128x256x64_s4_swz"));
  ASSERT(named(ops, n, "gemm_mma_bf16_128x256x64_s3_swz"));
  ASSERT_OK(ferry_ops_find(&args, 86, NULL, NULL, ops, 32, &n)); /* 99 KB: not the 144 KB ones either */
  ASSERT_EQ(n, 8);
  ASSERT(!named(ops, n, "gemm_mma_bf16_128x256x64_s3_swz") && !named(ops, n, "gemm_mma_bf16_256x128x64_s3_swz"));
  ASSERT(named(ops, n, "gemm_mma_bf16_128x128x64_s3_swz"));
  for (size_t i = 0; i < n; i++) ASSERT(ferry_op_info_get(ops[i])->smem_bytes <= 99 * 1024);
}

TEST(unaligned_operands_route_to_the_any_alignment_design) {
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F16, FERRY_SCALAR_F16, 127, 127, 127); /* ld 127 fp16 = 254 bytes */
  const ferry_op *ops[32];
  size_t n = 0;
  ASSERT_OK(ferry_ops_find(&args, 90, NULL, NULL, ops, 32, &n));
  ASSERT_EQ(n, 2);
  ASSERT(!strcmp(ferry_op_info_get(ops[0])->name, "gemm_mma_f16_64x64x32_s2_align2"));
  char reason[256];
  const ferry_op *aligned = ferry_op_by_name("gemm_mma_f16_64x64x32_s3");
  ASSERT_STATUS(ferry_op_supports(aligned, &args, reason, sizeof reason), FERRY_UNSUPPORTED);
  ASSERT_STR_CONTAINS(reason, "operand A: needs 16-byte alignment");
  ASSERT_STR_CONTAINS(reason, "it has 2 (leading dimension 127)");
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "gemm_mma_f16_64x64x32_s3 does not support");
}

TEST(supports_reasons_name_operand_and_types) {
  ferry_gemm_args args;
  char reason[256];
  test_args(&args, FERRY_SCALAR_F16, FERRY_SCALAR_F32, 64, 64, 64);
  const ferry_op *bf = ferry_op_by_name("gemm_mma_bf16_64x64x32_s3");
  ASSERT_STATUS(ferry_op_supports(bf, &args, reason, sizeof reason), FERRY_UNSUPPORTED);
  ASSERT(!strcmp(reason, "operand A: expected bf16, got fp16"));
  ASSERT_EQ(ferry_last_error()->status, FERRY_UNSUPPORTED);
  /* fp16 accumulation: the fp16 designs take it, bf16 and SIMT do not */
  test_matrix a, b, c;
  test_matrix_make(&a, 0x10000, FERRY_SCALAR_BF16, 0, 64, 64, 0, 0);
  test_matrix_make(&b, 0x20000, FERRY_SCALAR_BF16, 0, 64, 64, 0, 0);
  test_matrix_make(&c, 0x30000, FERRY_SCALAR_BF16, 0, 64, 64, 0, 0);
  ASSERT_OK(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F16));
  ASSERT_STATUS(ferry_op_supports(bf, &args, reason, sizeof reason), FERRY_UNSUPPORTED);
  ASSERT(!strcmp(reason, "accumulator: expected fp32, got fp16"));
  ASSERT_STATUS(ferry_op_supports(ferry_op_by_name("gemm_simt_64x64x16"), &args, reason, 8), FERRY_UNSUPPORTED);
  ASSERT_EQ(strlen(reason), 7); /* truncated to the buffer, NUL-terminated */
  /* a mixed pair: the SIMT design accepts it, tensor cores say which operand differs */
  test_matrix_make(&a, 0x1000, FERRY_SCALAR_F16, 0, 64, 64, 0, 0);
  ASSERT_OK(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32));
  ASSERT_OK(ferry_op_supports(ferry_op_by_name("gemm_simt_64x64x16"), &args, reason, sizeof reason));
  ASSERT_EQ(reason[0], 0);
  ASSERT_STATUS(ferry_op_supports(ferry_op_by_name("gemm_mma_f16_64x64x32_s3"), &args, reason, sizeof reason),
                FERRY_UNSUPPORTED);
  ASSERT(!strcmp(reason, "operand B: expected fp16, got bf16"));
  ASSERT_STATUS(ferry_op_supports(NULL, &args, reason, sizeof reason), FERRY_INVALID_ARGUMENT);
  ferry_gemm_args junk;
  memset(&junk, 0, sizeof junk);
  ASSERT_STATUS(ferry_op_supports(bf, &junk, reason, sizeof reason), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(reason, "not initialised");
}

TEST(supports_check_costs_nanoseconds) {
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F16, FERRY_SCALAR_F16, 128, 128, 128);
  const ferry_op *op = ferry_op_by_name("gemm_mma_f16_64x64x32_s3");
  enum { N = 2000000 };
  struct timespec t0, t1;
  int ok = 0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < N; i++) ok += ferry_op_supports(op, &args, NULL, 0) == FERRY_OK;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double ns = ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / N;
  ASSERT_EQ(ok, N);
  fprintf(stderr, "  ferry_op_supports: %.1f ns per call (target 200 ns; CUTLASS's Python check 17.7 us)\n", ns);
}

TEST(target_from_environment) {
  int sm = 0;
  setenv("FERRY_ARCH", "sm_90", 1);
  ASSERT_OK(ferry_target_sm(-1, &sm));
  ASSERT_EQ(sm, 90);
  setenv("FERRY_ARCH", "sm_90a", 1);
  ASSERT_OK(ferry_target_sm(-1, &sm));
  ASSERT_EQ(sm, 90);
  setenv("FERRY_ARCH", "8.6", 1);
  ASSERT_OK(ferry_target_sm(-1, &sm));
  ASSERT_EQ(sm, 86);
  setenv("FERRY_ARCH", "100", 1);
  ASSERT_OK(ferry_target_sm(-1, &sm));
  ASSERT_EQ(sm, 100);
  setenv("FERRY_ARCH", "10.0", 1); /* a two-digit major in the "M.m" form */
  ASSERT_OK(ferry_target_sm(-1, &sm));
  ASSERT_EQ(sm, 100);
  setenv("FERRY_ARCH", "12.1", 1);
  ASSERT_OK(ferry_target_sm(-1, &sm));
  ASSERT_EQ(sm, 121);
  setenv("FERRY_ARCH", "hopper", 1);
  ASSERT_STATUS(ferry_target_sm(-1, &sm), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "FERRY_ARCH=\"hopper\"");
  setenv("FERRY_ARCH", "sm_75", 1);
  char reason[200];
  ASSERT_STATUS(ferry_target_supports(80, reason, sizeof reason), FERRY_UNSUPPORTED);
  ASSERT_STR_CONTAINS(reason, "this needs sm_80 or newer; FERRY_ARCH=sm_75 is sm_75");
  ASSERT_OK(ferry_target_supports(75, reason, sizeof reason));
  ASSERT_EQ(reason[0], 0);
}

TEST(target_without_gpu_or_override_says_why) {
  unsetenv("FERRY_ARCH");
  if (ferry_init() == FERRY_OK) {
    fprintf(stderr, "  note: a CUDA driver is present; the no-GPU target message cannot be observed here\n");
    return;
  }
  char reason[300];
  ASSERT_STATUS(ferry_target_supports(80, reason, sizeof reason), FERRY_UNSUPPORTED);
  ASSERT_STR_CONTAINS(reason, "set FERRY_ARCH");
}

TEST(target_from_the_fake_device) {
  unsetenv("FERRY_ARCH");
  fake_driver_use(); /* an sm_90 */
  int sm = 0;
  ASSERT_OK(ferry_target_sm(0, &sm));
  ASSERT_EQ(sm, 90);
}

static int refuse_odd_k(const ferry_gemm_args *args, char *reason, size_t size, void *user) {
  (void)user;
  if (args->problem.k % 2 == 0) return 1;
  if (size) snprintf(reason, size, "k = %d is odd", (int)args->problem.k);
  return 0;
}

TEST(register_validates_and_rejects_duplicates) {
  ferry_op_desc d;
  ferry_op_desc_init(&d);
  const ferry_op *op = NULL;
  ASSERT_STATUS(ferry_op_register(&d, &op), FERRY_INVALID_ARGUMENT); /* no name */
  d.info.name = "my_gemm";
  ASSERT_STATUS(ferry_op_register(&d, &op), FERRY_INVALID_ARGUMENT); /* no source */
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "source and entry are required");
  d.source = "extern \"C\" __global__ void my_gemm(ferry_gemm_params p) {}";
  d.entry = "my_gemm";
  d.info.a_align = 3;
  ASSERT_STATUS(ferry_op_register(&d, &op), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "powers of two");
  d.info.a_align = 1;
  d.info.a_types = 0;
  ASSERT_STATUS(ferry_op_register(&d, &op), FERRY_INVALID_ARGUMENT);
  d.info.a_types = FERRY_SCALAR_BIT(FERRY_SCALAR_F32);
  d.info.div_k = 0;
  ASSERT_STATUS(ferry_op_register(&d, &op), FERRY_INVALID_ARGUMENT);
  d.info.div_k = 1;
  const int32_t tile_k = d.info.tile_k, stages = d.info.stages;
  d.info.tile_k = 0;
  ASSERT_STATUS(ferry_op_register(&d, &op), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "must be positive");
  d.info.tile_k = tile_k;
  d.info.stages = -3;
  ASSERT_STATUS(ferry_op_register(&d, &op), FERRY_INVALID_ARGUMENT);
  d.info.stages = stages;
  d.params = (ferry_op_params_fn)1;
  d.params_size = 1000;
  ASSERT_STATUS(ferry_op_register(&d, &op), FERRY_INVALID_ARGUMENT);
  d.params = NULL;
  d.supports = refuse_odd_k;
  ASSERT_OK(ferry_op_register(&d, &op));
  ASSERT(op == ferry_op_by_name("my_gemm"));
  ASSERT_EQ(ferry_op_info_get(op)->builtin, 0);
  ASSERT(!strcmp(ferry_op_info_get(op)->instruction, "custom"));
  ASSERT_STATUS(ferry_op_register(&d, NULL), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "already registered");
  /* It takes part in discovery, its own check included. */
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 16, 16, 16);
  const ferry_op *ops[32];
  size_t n = 0;
  ASSERT_OK(ferry_ops_find(&args, 90, NULL, NULL, ops, 32, &n));
  ASSERT_EQ(n, 2);
  ASSERT(ops[0] == op); /* registered before SIMT */
  test_args(&args, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 16, 16, 15);
  char reason[100];
  ASSERT_STATUS(ferry_op_supports(op, &args, reason, sizeof reason), FERRY_UNSUPPORTED);
  ASSERT(!strcmp(reason, "k = 15 is odd"));
  ASSERT_OK(ferry_ops_find(&args, 90, NULL, NULL, ops, 32, &n));
  ASSERT_EQ(n, 1);
}

static int accept_anything(const ferry_gemm_args *args, char *reason, size_t size, void *user) {
  (void)args, (void)reason, (void)size, (void)user;
  return 1;
}

TEST(epilogues_go_to_builtins_and_to_registered_operators_that_accept_them) {
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F16, FERRY_SCALAR_F16, 128, 128, 128);
  int64_t shape[1] = {128};
  ferry_tensor bias = {(void *)0x40000000, {FERRY_DEVICE_CUDA, 0}, 1, test_dtype(FERRY_SCALAR_F16), shape, NULL, 0};
  ferry_op_desc d;
  ferry_op_desc_init(&d);
  d.source = "extern \"C\" __global__ void plain_only(ferry_gemm_params p) {}";
  d.entry = "plain_only";
  d.info.name = "plain_only";
  const ferry_op *plain = NULL, *checking = NULL, *fusing = NULL;
  ASSERT_OK(ferry_op_register(&d, &plain));
  d.info.name = "checking"; /* a supports callback that checks shapes only: no promise about epilogues */
  d.supports = accept_anything;
  ASSERT_OK(ferry_op_register(&d, &checking));
  d.info.name = "fusing";
  d.info.fuses_epilogue = 1;
  ASSERT_OK(ferry_op_register(&d, &fusing));
  ASSERT_EQ(ferry_op_info_get(fusing)->fuses_epilogue, 1);
  ASSERT_EQ(ferry_op_info_get(plain)->fuses_epilogue, 0);
  ASSERT_OK(ferry_op_supports(plain, &args, NULL, 0));
  ASSERT_OK(ferry_gemm_args_set_epilogue(&args, &bias, FERRY_BIAS_ROW, FERRY_ACTIVATION_SILU));
  char why[256];
  ASSERT_STATUS(ferry_op_supports(plain, &args, why, sizeof why), FERRY_UNSUPPORTED);
  ASSERT_STR_CONTAINS(why, "fuses no epilogue");
  ASSERT_STATUS(ferry_op_supports(checking, &args, why, sizeof why), FERRY_UNSUPPORTED);
  ASSERT_STR_CONTAINS(why, "without fuses_epilogue");
  ASSERT_OK(ferry_op_supports(fusing, &args, NULL, 0));
  const ferry_op *ops[32];
  size_t n = 0;
  ASSERT_OK(ferry_ops_find(&args, 90, NULL, NULL, ops, 32, &n));
  int builtins = 0;
  for (size_t i = 0; i < n; i++) {
    ASSERT(ops[i] != plain && ops[i] != checking);
    builtins += ferry_op_info_get(ops[i])->builtin;
    ASSERT_EQ(ferry_op_info_get(ops[i])->fuses_epilogue, 1);
  }
  ASSERT_EQ(builtins, 18); /* every built-in design fuses every epilogue */
}
