/* ferry_gemm_args: what init accepts, the descriptor it computes, and a clear error for each bad input. */
#include "test_ops.h"

TEST(args_compact_row_major_descriptor) {
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F16, FERRY_SCALAR_F32, 127, 129, 64);
  const ferry_gemm_problem *p = &args.problem;
  ASSERT_EQ(p->m, 127);
  ASSERT_EQ(p->n, 129);
  ASSERT_EQ(p->k, 64);
  ASSERT_EQ(p->l, 1);
  ASSERT_EQ(p->lda, 64);
  ASSERT_EQ(p->ldb, 129);
  ASSERT_EQ(p->ldc, 129);
  ASSERT_EQ(p->a_major, FERRY_MAJOR_ROW);
  ASSERT_EQ(p->a_align, 16);  /* 64 fp16 = 128 bytes */
  ASSERT_EQ(p->b_align, 2);   /* 129 fp16 = 258 bytes */
  ASSERT_EQ(p->out_align, 4); /* 129 fp32 */
  ASSERT_EQ(p->kind, FERRY_GEMM_KIND(FERRY_SCALAR_F16, FERRY_SCALAR_F16, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 0, 0, 0));
  ASSERT(args.alpha == 1.0f && args.beta == 0.0f);
  ASSERT_EQ(args.struct_size, sizeof args);
}

TEST(args_column_major_and_batch) {
  test_matrix a, b, c;
  test_matrix_make(&a, 0x100000, FERRY_SCALAR_BF16, 3, 100, 40, 1, 104); /* column-major, padded */
  test_matrix_make(&b, 0x200000, FERRY_SCALAR_BF16, 0, 40, 50, 1, 0);    /* rank 2: broadcast over the batch */
  test_matrix_make(&c, 0x300000, FERRY_SCALAR_F32, 3, 100, 50, 0, 0);
  ferry_gemm_args args;
  ASSERT_OK(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32));
  ASSERT_EQ(args.problem.l, 3);
  ASSERT_EQ(args.problem.a_major, FERRY_MAJOR_COL);
  ASSERT_EQ(args.problem.b_major, FERRY_MAJOR_COL);
  ASSERT_EQ(args.problem.lda, 104);
  ASSERT_EQ(args.problem.ldb, 40);
  ASSERT_EQ(args.problem.batch_a, 104 * 40);
  ASSERT_EQ(args.problem.batch_b, 0);
  ASSERT_EQ(args.problem.batch_c, 100 * 50);
}

TEST(args_byte_offset_and_set_data_update_alignment) {
  test_matrix a, b, c;
  test_matrix_make(&a, 0x10000, FERRY_SCALAR_F16, 0, 64, 64, 0, 0);
  test_matrix_make(&b, 0x20000, FERRY_SCALAR_F16, 0, 64, 64, 0, 0);
  test_matrix_make(&c, 0x30000, FERRY_SCALAR_F16, 0, 64, 64, 0, 0);
  a.t.byte_offset = 2;
  ferry_gemm_args args;
  ASSERT_OK(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32));
  ASSERT(args.a == (const void *)0x10002);
  ASSERT_EQ(args.problem.a_align, 2);
  ASSERT_OK(ferry_gemm_args_set_data(&args, (const void *)0x40000, NULL, NULL));
  ASSERT(args.a == (const void *)0x40000 && args.b == (const void *)0x20000);
  ASSERT_EQ(args.problem.a_align, 16);
  /* an fp16 operand at an odd address: alignment 0, which no operator supports */
  ASSERT_OK(ferry_gemm_args_set_data(&args, (const void *)0x40001, NULL, NULL));
  ASSERT_EQ(args.problem.a_align, 0);
  a.t.byte_offset = 1;
  ASSERT_STATUS(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "operand A: its first element, at 0x10001, is not aligned to its "
                      "2-byte elements");
  a.t.byte_offset = 0;
  ASSERT_STATUS(ferry_gemm_args_init(&args, &a.t, &b.t, &a.t, FERRY_SCALAR_F32), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "out overlaps A");
  ASSERT_STATUS(ferry_gemm_args_set_data(NULL, NULL, NULL, NULL), FERRY_INVALID_ARGUMENT);
}

/* New addresses may not bring back what init refuses: out meeting A, B, the bias or a scale (a kernel reads them
 * while other blocks write out). The arguments stay as they were; adjacent operands are fine. */
TEST(args_set_data_refuses_an_out_that_overlaps_what_the_kernel_reads) {
  test_matrix a, b, c, bias;
  test_matrix_make(&a, 0x10000, FERRY_SCALAR_F16, 0, 64, 64, 0, 0); /* 8 KiB each */
  test_matrix_make(&b, 0x20000, FERRY_SCALAR_F16, 0, 64, 64, 0, 0);
  test_matrix_make(&c, 0x30000, FERRY_SCALAR_F16, 0, 64, 64, 0, 0);
  ferry_gemm_args args;
  ASSERT_OK(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32));
  ASSERT_STATUS(ferry_gemm_args_set_data(&args, NULL, NULL, (void *)(0x10000 + 8190)), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "out (at 0x11ffe) overlaps A (at 0x10000)");
  ASSERT(args.out == (void *)0x30000);
  ASSERT_STATUS(ferry_gemm_args_set_data(&args, NULL, (const void *)0x30000 - 64 * 64 * 2 + 2, NULL),
                FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "overlaps B");
  ASSERT(args.b == (const void *)0x20000);
  ASSERT_OK(ferry_gemm_args_set_data(&args, NULL, NULL, (void *)(0x10000 + 8192))); /* right after A */
  ASSERT_OK(ferry_gemm_args_set_data(&args, NULL, NULL, (void *)0x30000));
  int64_t n = 64;
  bias.t = (ferry_tensor){(void *)0x50000, {FERRY_DEVICE_CUDA, 0}, 1, {FERRY_DTYPE_FLOAT, 16, 1}, &n, NULL, 0};
  ASSERT_OK(ferry_gemm_args_set_epilogue(&args, &bias.t, FERRY_BIAS_ROW, FERRY_ACTIVATION_NONE));
  ASSERT_STATUS(ferry_gemm_args_set_data(&args, NULL, NULL, (void *)(0x50000 - 64)), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "overlaps the bias");
  bias.t.data = (void *)0x30040; /* inside out */
  ASSERT_STATUS(ferry_gemm_args_set_epilogue(&args, &bias.t, FERRY_BIAS_ROW, FERRY_ACTIVATION_NONE),
                FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "bias overlaps out");
}

TEST(args_rejects_nulls) {
  test_matrix a, b, c;
  test_matrix_make(&a, 0x1000, FERRY_SCALAR_F16, 0, 8, 8, 0, 0);
  test_matrix_make(&b, 0x2000, FERRY_SCALAR_F16, 0, 8, 8, 0, 0);
  test_matrix_make(&c, 0x3000, FERRY_SCALAR_F16, 0, 8, 8, 0, 0);
  ferry_gemm_args args;
  ASSERT_STATUS(ferry_gemm_args_init(NULL, &a.t, &b.t, &c.t, FERRY_SCALAR_F32), FERRY_INVALID_ARGUMENT);
  ASSERT_STATUS(ferry_gemm_args_init(&args, NULL, &b.t, &c.t, FERRY_SCALAR_F32), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "operand A is NULL");
  ASSERT_STATUS(ferry_gemm_args_init(&args, &a.t, &b.t, NULL, FERRY_SCALAR_F32), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "operand out is NULL");
  b.t.shape = NULL;
  ASSERT_STATUS(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "operand B: shape is NULL");
  b.t.shape = b.shape;
  a.t.data = NULL;
  ASSERT_STATUS(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "data is NULL");
}

TEST(args_rejects_bad_ranks_types_devices) {
  test_matrix a, b, c;
  ferry_gemm_args args;
  test_matrix_make(&a, 0x1000, FERRY_SCALAR_F16, 0, 8, 8, 0, 0);
  test_matrix_make(&b, 0x2000, FERRY_SCALAR_F16, 0, 8, 8, 0, 0);
  test_matrix_make(&c, 0x3000, FERRY_SCALAR_F16, 0, 8, 8, 0, 0);
  a.t.ndim = 1;
  ASSERT_STATUS(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "operand A has rank 1");
  a.t.ndim = 4;
  ASSERT_STATUS(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32), FERRY_INVALID_ARGUMENT);
  a.t.ndim = 2;
  b.t.dtype = (ferry_dtype){FERRY_DTYPE_UINT, 8, 1};
  ASSERT_STATUS(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "operand B: dtype uint8 is not a GEMM type");
  b.t.dtype = (ferry_dtype){FERRY_DTYPE_INT, 8, 1};
  ASSERT_STATUS(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "operands A (fp16) and B (int8) do not pair");
  b.t.dtype = (ferry_dtype){FERRY_DTYPE_FLOAT, 16, 2};
  ASSERT_STATUS(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "float16x2");
  b.t.dtype = test_dtype(FERRY_SCALAR_F16);
  c.t.device.device_type = FERRY_DEVICE_CPU;
  ASSERT_STATUS(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "not on a CUDA device");
  c.t.device = (ferry_device){FERRY_DEVICE_CUDA, 1};
  ASSERT_STATUS(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32), FERRY_DEVICE_MISMATCH);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "A on cuda:0, B on cuda:0, out on cuda:1");
  c.t.device.device_id = 0;
  ASSERT_STATUS(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, (ferry_scalar)7), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "accumulator type 7");
}

TEST(args_rejects_mismatched_shapes_and_batches) {
  test_matrix a, b, c;
  ferry_gemm_args args;
  test_matrix_make(&a, 0x1000, FERRY_SCALAR_F16, 0, 8, 16, 0, 0);
  test_matrix_make(&b, 0x2000, FERRY_SCALAR_F16, 0, 15, 8, 0, 0);
  test_matrix_make(&c, 0x3000, FERRY_SCALAR_F16, 0, 8, 8, 0, 0);
  ASSERT_STATUS(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "A is 8×16, B 15×8, out 8×8");
  test_matrix_make(&a, 0x1000, FERRY_SCALAR_F16, 2, 8, 15, 0, 0);
  ASSERT_STATUS(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "out has rank 2");
  test_matrix_make(&c, 0x3000, FERRY_SCALAR_F16, 3, 8, 8, 0, 0);
  ASSERT_STATUS(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "batch sizes differ: A 2, B 1, out 3");
}

TEST(args_rejects_strides_neither_row_nor_column_major) {
  test_matrix a, b, c;
  ferry_gemm_args args;
  test_matrix_make(&a, 0x1000, FERRY_SCALAR_F32, 0, 8, 8, 0, 0);
  test_matrix_make(&b, 0x2000, FERRY_SCALAR_F32, 0, 8, 8, 0, 0);
  test_matrix_make(&c, 0x3000, FERRY_SCALAR_F32, 0, 8, 8, 0, 0);
  a.strides[0] = 16;
  a.strides[1] = 2; /* every other column */
  ASSERT_STATUS(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "neither row-major");
  a.strides[0] = -8;
  a.strides[1] = 1;
  ASSERT_STATUS(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "negative stride");
  a.strides[0] = 8;
  c.strides[0] = 4; /* rows of out overlap */
  ASSERT_STATUS(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "leading dimension 4 < 8");
  c.strides[0] = 8;
  b.strides[0] = 0; /* an input broadcast along k is fine: it is only read */
  ASSERT_OK(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32));
  ASSERT_EQ(args.problem.ldb, 0);
}

TEST(args_vectors_pick_the_wider_major) {
  test_matrix a, b, c;
  ferry_gemm_args args;
  test_matrix_make(&a, 0x1000, FERRY_SCALAR_F16, 0, 128, 1, 1, 0); /* m×1, contiguous along m */
  test_matrix_make(&b, 0x2000, FERRY_SCALAR_F16, 0, 1, 64, 0, 0);
  test_matrix_make(&c, 0x3000, FERRY_SCALAR_F16, 0, 128, 64, 0, 0);
  ASSERT_OK(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32));
  ASSERT_EQ(args.problem.a_major, FERRY_MAJOR_COL);
  ASSERT_EQ(args.problem.lda, 128);
  ASSERT_EQ(args.problem.a_align, 16);
  ASSERT_EQ(args.problem.b_major, FERRY_MAJOR_ROW);
}

TEST(args_detects_overflow) {
  test_matrix a, b, c;
  ferry_gemm_args args;
  test_matrix_make(&a, 0x1000, FERRY_SCALAR_F32, 0, 8, 8, 0, 0);
  test_matrix_make(&b, 0x2000, FERRY_SCALAR_F32, 0, 8, 8, 0, 0);
  test_matrix_make(&c, 0x3000, FERRY_SCALAR_F32, 0, 8, 8, 0, 0);
  a.shape[0] = (int64_t)1 << 31;
  ASSERT_STATUS(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32), FERRY_OVERFLOW);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "past 2^31-1");
  a.shape[0] = 8;
  a.strides[0] = (int64_t)1 << 61; /* 7 rows × 2^61 elements × 4 bytes */
  ASSERT_STATUS(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32), FERRY_OVERFLOW);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "2^63");
  a.strides[0] = 8;
  a.shape[1] = -1;
  ASSERT_STATUS(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "negative dimension");
}

TEST(args_empty_problems_are_valid) {
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 0, 5, 3);
  ASSERT_EQ(args.problem.m, 0);
  test_args(&args, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 4, 5, 0);
  ASSERT_EQ(args.problem.k, 0);
}

TEST(scalar_names) {
  ASSERT(!strcmp(ferry_scalar_name(FERRY_SCALAR_F16), "fp16"));
  ASSERT(!strcmp(ferry_scalar_name(FERRY_SCALAR_BF16), "bf16"));
  ASSERT(!strcmp(ferry_scalar_name(FERRY_SCALAR_F32), "fp32"));
  ASSERT(!strcmp(ferry_scalar_name(FERRY_SCALAR_E4M3), "e4m3"));
  ASSERT(!strcmp(ferry_scalar_name(FERRY_SCALAR_E5M2), "e5m2"));
  ASSERT(!strcmp(ferry_scalar_name(FERRY_SCALAR_I8), "int8"));
  ASSERT(!strcmp(ferry_scalar_name(FERRY_SCALAR_I32), "int32"));
  ASSERT(!strcmp(ferry_scalar_name((ferry_scalar)9), "?"));
}

TEST(args_epilogue_is_validated_and_joins_the_kind) {
  ferry_gemm_args args, before;
  test_args(&args, FERRY_SCALAR_BF16, FERRY_SCALAR_BF16, 48, 64, 32);
  const uint32_t plain = args.problem.kind;
  int64_t n_shape[1] = {64}, m_shape[1] = {48}, strided[1] = {2};
  ferry_tensor row = {(void *)0x40000000, {FERRY_DEVICE_CUDA, 0}, 1, test_dtype(FERRY_SCALAR_BF16), n_shape, NULL, 6};
  ferry_tensor col = row;
  col.shape = m_shape;
  ASSERT_OK(ferry_gemm_args_set_epilogue(&args, &row, FERRY_BIAS_ROW, FERRY_ACTIVATION_GELU_TANH));
  ASSERT_EQ(args.problem.kind, plain | FERRY_GEMM_KIND_EPILOGUE(FERRY_BIAS_ROW, FERRY_ACTIVATION_GELU_TANH));
  ASSERT_EQ(args.problem.bias, FERRY_BIAS_ROW);
  ASSERT_EQ(args.problem.activation, FERRY_ACTIVATION_GELU_TANH);
  ASSERT(args.bias == (const void *)0x40000006); /* data + byte_offset */
  ASSERT_OK(ferry_gemm_args_set_epilogue(&args, &col, FERRY_BIAS_COL, FERRY_ACTIVATION_NONE));
  ASSERT_EQ(args.problem.kind, plain | FERRY_GEMM_KIND_EPILOGUE(FERRY_BIAS_COL, 0));
  ASSERT_OK(ferry_gemm_args_set_epilogue(&args, NULL, FERRY_BIAS_NONE, FERRY_ACTIVATION_SILU)); /* no bias */
  ASSERT(args.bias == NULL);
  ASSERT_OK(ferry_gemm_args_set_epilogue(&args, NULL, FERRY_BIAS_NONE, FERRY_ACTIVATION_NONE)); /* plain again */
  ASSERT_EQ(args.problem.kind, plain);
  ASSERT_OK(ferry_gemm_args_set_epilogue(&args, &row, FERRY_BIAS_ROW, FERRY_ACTIVATION_RELU));
  before = args;
#define REFUSED(call, text)                                                                                         \
  do {                                                                                                              \
    ASSERT_STATUS(call, FERRY_INVALID_ARGUMENT);                                                                    \
    ASSERT_STR_CONTAINS(ferry_last_error_message(), text);                                                          \
    ASSERT(!memcmp(&args, &before, sizeof args));                                                                   \
  } while (0)
  REFUSED(ferry_gemm_args_set_epilogue(&args, &row, (ferry_bias)3, FERRY_ACTIVATION_NONE), "bias mode 3");
  REFUSED(ferry_gemm_args_set_epilogue(&args, NULL, FERRY_BIAS_NONE, (ferry_activation)4), "activation 4");
  REFUSED(ferry_gemm_args_set_epilogue(&args, &row, FERRY_BIAS_NONE, FERRY_ACTIVATION_NONE), "FERRY_BIAS_NONE");
  REFUSED(ferry_gemm_args_set_epilogue(&args, NULL, FERRY_BIAS_COL, FERRY_ACTIVATION_NONE), "needs a bias tensor");
  REFUSED(ferry_gemm_args_set_epilogue(&args, &row, FERRY_BIAS_COL, FERRY_ACTIVATION_NONE), "has 64 elements");
  REFUSED(ferry_gemm_args_set_epilogue(&args, &col, FERRY_BIAS_ROW, FERRY_ACTIVATION_NONE), "has 48 elements");
  ferry_tensor bad = row;
  bad.dtype = test_dtype(FERRY_SCALAR_F32);
  REFUSED(ferry_gemm_args_set_epilogue(&args, &bad, FERRY_BIAS_ROW, FERRY_ACTIVATION_NONE), "must be out's, bf16");
  bad = row;
  bad.strides = strided;
  REFUSED(ferry_gemm_args_set_epilogue(&args, &bad, FERRY_BIAS_ROW, FERRY_ACTIVATION_NONE), "stride 2");
  bad = row;
  bad.ndim = 2;
  REFUSED(ferry_gemm_args_set_epilogue(&args, &bad, FERRY_BIAS_ROW, FERRY_ACTIVATION_NONE), "rank 2");
  bad = row;
  bad.data = NULL;
  bad.byte_offset = 0;
  REFUSED(ferry_gemm_args_set_epilogue(&args, &bad, FERRY_BIAS_ROW, FERRY_ACTIVATION_NONE), "data is NULL");
#undef REFUSED
  bad = row;
  bad.device.device_id = 1;
  ASSERT_STATUS(ferry_gemm_args_set_epilogue(&args, &bad, FERRY_BIAS_ROW, FERRY_ACTIVATION_NONE),
                FERRY_DEVICE_MISMATCH);
  ASSERT(!memcmp(&args, &before, sizeof args));
  ferry_gemm_args junk;
  memset(&junk, 0, sizeof junk);
  ASSERT_STATUS(ferry_gemm_args_set_epilogue(&junk, NULL, FERRY_BIAS_NONE, FERRY_ACTIVATION_RELU),
                FERRY_INVALID_ARGUMENT);
}

/* A m×k row-major, B k×n column-major (k contiguous in both, as 8-bit operands must be), out m×n row-major. */
static ferry_status args_8bit(ferry_gemm_args *args, int a_type, int b_type, int out_type, int acc, int b_col) {
  test_matrix a, b, c;
  test_matrix_make(&a, 0x10000000, a_type, 0, 48, 64, 0, 0);
  test_matrix_make(&b, 0x20000000, b_type, 0, 64, 32, b_col, 0);
  test_matrix_make(&c, 0x30000000, out_type, 0, 48, 32, 0, 0);
  return ferry_gemm_args_init(args, &a.t, &b.t, &c.t, (ferry_scalar)acc);
}

TEST(args_8bit_inputs_pair_and_need_k_contiguous) {
  ferry_gemm_args args;
  ASSERT_OK(args_8bit(&args, FERRY_SCALAR_E4M3, FERRY_SCALAR_E5M2, FERRY_SCALAR_BF16, FERRY_SCALAR_F32, 1));
  ASSERT_EQ(args.problem.kind, FERRY_GEMM_KIND(FERRY_SCALAR_E4M3, FERRY_SCALAR_E5M2, FERRY_SCALAR_BF16,
                                               FERRY_SCALAR_F32, FERRY_MAJOR_ROW, FERRY_MAJOR_COL, FERRY_MAJOR_ROW));
  ASSERT_EQ(FERRY_GEMM_KIND_B_TYPE(args.problem.kind), FERRY_SCALAR_E5M2);
  ASSERT_EQ(args.problem.a_align, 16);
  ASSERT_OK(args_8bit(&args, FERRY_SCALAR_I8, FERRY_SCALAR_I8, FERRY_SCALAR_I32, FERRY_SCALAR_I32, 1));
  ASSERT_EQ(FERRY_GEMM_KIND_OUT_TYPE(args.problem.kind), FERRY_SCALAR_I32);
  ASSERT_EQ(args.problem.ldc, 32);
  ASSERT_OK(args_8bit(&args, FERRY_SCALAR_I8, FERRY_SCALAR_I8, FERRY_SCALAR_F16, FERRY_SCALAR_I32, 1));
#define REFUSED(call, text)                                                                                         \
  do {                                                                                                              \
    ASSERT_STATUS(call, FERRY_INVALID_ARGUMENT);                                                                    \
    ASSERT_STR_CONTAINS(ferry_last_error_message(), text);                                                          \
  } while (0)
  REFUSED(args_8bit(&args, FERRY_SCALAR_E4M3, FERRY_SCALAR_E4M3, FERRY_SCALAR_BF16, FERRY_SCALAR_F32, 0),
          "A row-major and B column-major");
  REFUSED(args_8bit(&args, FERRY_SCALAR_E4M3, FERRY_SCALAR_I8, FERRY_SCALAR_BF16, FERRY_SCALAR_F32, 1), "do not pair");
  REFUSED(args_8bit(&args, FERRY_SCALAR_E4M3, FERRY_SCALAR_BF16, FERRY_SCALAR_BF16, FERRY_SCALAR_F32, 1),
          "do not pair");
  REFUSED(args_8bit(&args, FERRY_SCALAR_E4M3, FERRY_SCALAR_E4M3, FERRY_SCALAR_I32, FERRY_SCALAR_F32, 1),
          "FP8 operands give a float output");
  REFUSED(args_8bit(&args, FERRY_SCALAR_E4M3, FERRY_SCALAR_E4M3, FERRY_SCALAR_F16, FERRY_SCALAR_F16, 1),
          "accumulate in fp32");
  REFUSED(args_8bit(&args, FERRY_SCALAR_I8, FERRY_SCALAR_I8, FERRY_SCALAR_I32, FERRY_SCALAR_F32, 1),
          "accumulate in int32");
  REFUSED(args_8bit(&args, FERRY_SCALAR_I8, FERRY_SCALAR_I8, FERRY_SCALAR_E4M3, FERRY_SCALAR_I32, 1),
          "8-bit types are GEMM inputs only");
  REFUSED(args_8bit(&args, FERRY_SCALAR_I32, FERRY_SCALAR_I8, FERRY_SCALAR_I32, FERRY_SCALAR_I32, 1),
          "operand A is int32");
  REFUSED(args_8bit(&args, FERRY_SCALAR_BF16, FERRY_SCALAR_BF16, FERRY_SCALAR_I32, FERRY_SCALAR_F32, 1),
          "needs int8 inputs");
  REFUSED(args_8bit(&args, FERRY_SCALAR_BF16, FERRY_SCALAR_BF16, FERRY_SCALAR_BF16, FERRY_SCALAR_I32, 1),
          "is not fp32");
  /* an int32 output takes no epilogue; its sums go out exact */
  ASSERT_OK(args_8bit(&args, FERRY_SCALAR_I8, FERRY_SCALAR_I8, FERRY_SCALAR_I32, FERRY_SCALAR_I32, 1));
  REFUSED(ferry_gemm_args_set_epilogue(&args, NULL, FERRY_BIAS_NONE, FERRY_ACTIVATION_RELU), "takes no epilogue");
#undef REFUSED
}

TEST(args_scales_are_validated_and_join_the_kind) {
  ferry_gemm_args args, before;
  ASSERT_OK(args_8bit(&args, FERRY_SCALAR_E4M3, FERRY_SCALAR_E4M3, FERRY_SCALAR_BF16, FERRY_SCALAR_F32, 1));
  const uint32_t plain = args.problem.kind;
  int64_t one[1] = {1}, two[1] = {2};
  ferry_tensor sa = {(void *)0x50000000, {FERRY_DEVICE_CUDA, 0}, 0, test_dtype(FERRY_SCALAR_F32), NULL, NULL, 4};
  ferry_tensor sb = {(void *)0x50000100, {FERRY_DEVICE_CUDA, 0}, 1, test_dtype(FERRY_SCALAR_F32), one, NULL, 0};
  ASSERT_OK(ferry_gemm_args_set_scales(&args, &sa, &sb));
  ASSERT_EQ(args.problem.kind, plain | FERRY_GEMM_KIND_SCALED);
  ASSERT_EQ(args.problem.scaled, 1);
  ASSERT(args.scale_a == (const float *)0x50000004 && args.scale_b == (const float *)0x50000100);
  /* an epilogue keeps the scales, and taking the epilogue away leaves them */
  ASSERT_OK(ferry_gemm_args_set_epilogue(&args, NULL, FERRY_BIAS_NONE, FERRY_ACTIVATION_SILU));
  ASSERT_EQ(args.problem.kind, plain | FERRY_GEMM_KIND_SCALED | FERRY_GEMM_KIND_EPILOGUE(0, FERRY_ACTIVATION_SILU));
  ASSERT_OK(ferry_gemm_args_set_epilogue(&args, NULL, FERRY_BIAS_NONE, FERRY_ACTIVATION_NONE));
  ASSERT_EQ(args.problem.kind, plain | FERRY_GEMM_KIND_SCALED);
  before = args;
#define REFUSED(call, status, text)                                                                                 \
  do {                                                                                                              \
    ASSERT_STATUS(call, status);                                                                                    \
    ASSERT_STR_CONTAINS(ferry_last_error_message(), text);                                                          \
    ASSERT(!memcmp(&args, &before, sizeof args));                                                                   \
  } while (0)
  REFUSED(ferry_gemm_args_set_scales(&args, &sa, NULL), FERRY_INVALID_ARGUMENT, "scale A was given without scale B");
  ferry_tensor bad = sb;
  bad.shape = two;
  REFUSED(ferry_gemm_args_set_scales(&args, &sa, &bad), FERRY_INVALID_ARGUMENT, "scale_b has 2 elements");
  bad = sb;
  bad.dtype = test_dtype(FERRY_SCALAR_BF16);
  REFUSED(ferry_gemm_args_set_scales(&args, &bad, &sb), FERRY_INVALID_ARGUMENT, "a scale is float32");
  bad = sb;
  bad.data = NULL;
  REFUSED(ferry_gemm_args_set_scales(&args, &sa, &bad), FERRY_INVALID_ARGUMENT, "data is NULL");
  bad = sb;
  bad.device.device_type = FERRY_DEVICE_CPU;
  REFUSED(ferry_gemm_args_set_scales(&args, &sa, &bad), FERRY_DEVICE_MISMATCH, "must be on out's device");
  ASSERT_OK(ferry_gemm_args_set_scales(&args, NULL, NULL));
  ASSERT_EQ(args.problem.kind, plain);
  ASSERT(args.scale_a == NULL && args.scale_b == NULL && args.problem.scaled == 0);
  ASSERT_OK(args_8bit(&args, FERRY_SCALAR_I8, FERRY_SCALAR_I8, FERRY_SCALAR_I32, FERRY_SCALAR_I32, 1));
  before = args;
  REFUSED(ferry_gemm_args_set_scales(&args, &sa, &sb), FERRY_INVALID_ARGUMENT, "int32 output takes no scales");
#undef REFUSED
}
