/* test_bad_inputs.c — the bad-input table: every way a caller can hand ferry a wrong argument, each with the
 * status it must get back and the value the message must name, run through the simulated driver.
 *
 * A row is one call with one defect. It runs in its own process (a crash is that row's failure, not the suite's)
 * on a fresh library, and then the leak checks run: nothing held by the pool, no simulated device allocation,
 * and after ferry_pool_trim no registered range and no live event. Rows whose call must succeed check their
 * result too (byte-exact, or passed through untouched).
 *
 * The table prints itself: `ferry_test_reliability --table` runs every row and writes the markdown table that
 * docs/reliability.md quotes, with the status and message each row actually got.
 */
#include "fake_driver.h"
#include "reliability_util.h"
#include "test.h"

#include <limits.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- result checks ------------------------------------------------------------------------------------------ */

/* Compares a compact output with its (possibly strided) input element by element. */
static void check_copy(const ferry_tensor *in, const ferry_tensor *out) {
  size_t bad = rel_diff_elements(in, out);
  if (bad) FAIL_AT("%zu elements (or the dtype or rank) differ from the source", bad);
}

/* Submits, waits, checks every output against its input (copied ones byte-exact, the rest passed through), and
 * releases. Returns the submission's status, so the row reports it. */
static ferry_status transfer_checked(int h2d, const ferry_tensor *in, size_t n, const ferry_transfer_options *o) {
  ferry_transfer *t = NULL;
  ferry_status st = h2d ? ferry_transfer_h2d(in, n, o, &t) : ferry_transfer_d2h(in, n, o, &t);
  if (st != FERRY_OK) return st;
  ASSERT_OK(ferry_transfer_wait(t));
  ASSERT_EQ(ferry_transfer_count(t), n);
  const ferry_tensor *out = ferry_transfer_outputs(t);
  for (size_t i = 0; i < n; i++) {
    if (ferry_transfer_output_copied(t, i)) {
      ASSERT_EQ(out[i].device.device_type, h2d ? FERRY_DEVICE_CUDA : FERRY_DEVICE_CPU);
      check_copy(&in[i], &out[i]);
    } else {
      ASSERT(out[i].data == in[i].data);
      ASSERT(out[i].ndim == in[i].ndim && out[i].device.device_type == in[i].device.device_type);
      if (in[i].ndim > 0 && in[i].ndim <= FERRY_MAX_NDIM && in[i].shape) { /* copied into the ticket's memory */
        ASSERT(out[i].shape != in[i].shape);
        ASSERT(memcmp(out[i].shape, in[i].shape, (size_t)in[i].ndim * sizeof(int64_t)) == 0);
        ASSERT((out[i].strides == NULL) == (in[i].strides == NULL));
        if (in[i].strides) ASSERT(memcmp(out[i].strides, in[i].strides, (size_t)in[i].ndim * sizeof(int64_t)) == 0);
      }
    }
  }
  ferry_transfer_release(t);
  return FERRY_OK;
}

/* What a row that must succeed measured, for the table (e.g. the time of 10^6 tensors). */
static char row_note[256];

/* ---- inputs ------------------------------------------------------------------------------------------------- */

static unsigned char buf[1 << 16];
static int64_t shape[FERRY_MAX_NDIM], strides[FERRY_MAX_NDIM];

/* A compact 1-D uint8 tensor of `n` bytes on cuda:0 (D2H) or the host (H2D), over `buf` filled with a pattern. */
static ferry_tensor bytes_on(int32_t device_type, int64_t n) {
  for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)(i * 131 + 7);
  shape[0] = n;
  return (ferry_tensor){buf, {device_type, 0}, 1, {FERRY_DTYPE_UINT, 8, 1}, shape, NULL, 0};
}
static ferry_tensor dev_bytes(int64_t n) { return bytes_on(FERRY_DEVICE_CUDA, n); }

static ferry_transfer_options opts(void) {
  ferry_transfer_options o;
  ferry_transfer_options_init(&o);
  o.device = 0;
  return o;
}

static ferry_status d2h1(ferry_tensor t) {
  ferry_transfer_options o = opts();
  return transfer_checked(0, &t, 1, &o);
}

/* Simulated handles the one-device fake driver cannot make: a stream on cuda:1, a stream of a second context on
 * cuda:0, and a stream the driver no longer knows. Installed over the fake's table after it loads. */
#define STREAM_OF_CUDA1 ((void *)0x51001)
#define STREAM_OF_OTHER_CTX ((void *)0x52002)
#define STREAM_DESTROYED ((void *)0x53003)
static char cuda1_ctx, second_ctx;
static _Thread_local CUcontext pushed;
static CUresult (*fake_stream_ctx)(CUstream, CUcontext *);
static CUresult (*fake_push)(CUcontext);

static CUresult sim_stream_ctx(CUstream s, CUcontext *c) {
  if (s == (CUstream)STREAM_OF_CUDA1) return *c = (CUcontext)&cuda1_ctx, CUDA_SUCCESS;
  if (s == (CUstream)STREAM_OF_OTHER_CTX) return *c = (CUcontext)&second_ctx, CUDA_SUCCESS;
  if (s == (CUstream)STREAM_DESTROYED) return CUDA_ERROR_INVALID_VALUE;
  return fake_stream_ctx(s, c);
}
static CUresult sim_push(CUcontext c) {
  pushed = c;
  return fake_push(c);
}
static CUresult sim_ctx_device(CUdevice *d) {
  *d = pushed == (CUcontext)&cuda1_ctx ? 1 : 0;
  return CUDA_SUCCESS;
}
static void simulate_foreign_streams(void) {
  fake_stream_ctx = ferry__drv.cuStreamGetCtx;
  fake_push = ferry__drv.cuCtxPushCurrent;
  ferry__drv.cuStreamGetCtx = sim_stream_ctx;
  ferry__drv.cuCtxPushCurrent = sim_push;
  ferry__drv.cuCtxGetDevice = sim_ctx_device;
}

static ferry_status with_stream(void *stream, int device) {
  ferry_tensor t = dev_bytes(64);
  ferry_transfer_options o = opts();
  o.stream = stream;
  o.device = device;
  return transfer_checked(0, &t, 1, &o);
}

/* ---- the rows: arguments of the transfer calls ------------------------------------------------------------- */

static ferry_status r_out_null(void) {
  ferry_tensor t = dev_bytes(16);
  ferry_transfer_options o = opts();
  return ferry_transfer_d2h(&t, 1, &o, NULL);
}
static ferry_status r_inputs_null(void) {
  ferry_transfer_options o = opts();
  ferry_transfer *t = NULL;
  return ferry_transfer_d2h(NULL, 3, &o, &t);
}
static ferry_status r_count_huge(void) {
  ferry_tensor t = dev_bytes(16);
  ferry_transfer_options o = opts();
  ferry_transfer *tr = NULL;
  return ferry_transfer_d2h(&t, SIZE_MAX, &o, &tr);
}
static ferry_status r_count_zero(void) {
  ferry_transfer_options o = opts();
  ferry_transfer *t = NULL;
  ferry_status st = ferry_transfer_d2h(NULL, 0, &o, &t);
  if (st != FERRY_OK) return st;
  ASSERT_EQ(ferry_transfer_count(t), 0);
  ASSERT(ferry_transfer_slab(t) == NULL);
  ASSERT_OK(ferry_transfer_wait(t));
  ferry_transfer_release(t);
  return FERRY_OK;
}
static ferry_status r_count_zero_h2d_no_options(void) {
  ferry_tensor t = dev_bytes(16);
  ferry_transfer *tr = NULL;
  ferry_status st = ferry_transfer_h2d(&t, 0, NULL, &tr);
  if (st == FERRY_OK) ASSERT_EQ(ferry_transfer_count(tr), 0);
  ferry_transfer_release(tr);
  return st;
}
static ferry_status struct_size(uint32_t size) {
  ferry_tensor t = dev_bytes(64);
  ferry_transfer_options o = opts();
  o.struct_size = size;
  return transfer_checked(0, &t, 1, &o);
}
static ferry_status r_struct_size_zero(void) { return struct_size(0); }
static ferry_status r_struct_size_short(void) { return struct_size((uint32_t)sizeof(ferry_transfer_options) - 8); }
static ferry_status r_struct_size_newer(void) {
  /* A caller built against a later header with a longer struct: the fields ferry knows are read, the rest are
   * the caller's. The copy reads sizeof(ferry_transfer_options) bytes only, so the struct need not be longer. */
  return struct_size((uint32_t)sizeof(ferry_transfer_options) + 64);
}
static ferry_status r_options_null(void) {
  ferry_tensor t = dev_bytes(64);
  return transfer_checked(0, &t, 1, NULL);
}
static ferry_status r_device_past_count(void) {
  ferry_tensor t = dev_bytes(64);
  ferry_transfer_options o = opts();
  o.device = 7;
  return transfer_checked(0, &t, 1, &o);
}
static ferry_status r_stream_without_device(void) { return with_stream(STREAM_OF_OTHER_CTX, -1); }
static ferry_status r_stream_of_other_device(void) { return with_stream(STREAM_OF_CUDA1, 0); }
static ferry_status r_stream_of_other_context(void) { return with_stream(STREAM_OF_OTHER_CTX, 0); }
static ferry_status r_stream_destroyed(void) { return with_stream(STREAM_DESTROYED, 0); }

/* ---- the rows: tensor descriptors -------------------------------------------------------------------------- */

static ferry_status ndim(int32_t nd) {
  ferry_tensor t = dev_bytes(16);
  t.ndim = nd;
  for (int d = 0; d < FERRY_MAX_NDIM; d++) shape[d] = 1;
  return d2h1(t);
}
static ferry_status r_ndim_negative(void) { return ndim(-1); }
static ferry_status r_ndim_17(void) { return ndim(FERRY_MAX_NDIM + 1); }
static ferry_status r_ndim_int_max(void) { return ndim(INT32_MAX); }
static ferry_status r_ndim_16_ok(void) { return ndim(FERRY_MAX_NDIM); }
static ferry_status r_ndim_int_max_passed_through(void) {
  /* Not ferry's to copy (a host tensor in a D2H batch): passed through whatever its descriptor says. */
  ferry_tensor t[2] = {dev_bytes(16), bytes_on(FERRY_DEVICE_CPU, 16)};
  t[1].ndim = INT32_MAX;
  ferry_transfer_options o = opts();
  return transfer_checked(0, t, 2, &o);
}
static ferry_status r_shape_null(void) {
  ferry_tensor t = dev_bytes(16);
  t.ndim = 2;
  t.shape = NULL;
  return d2h1(t);
}
static ferry_status r_dim_negative(void) {
  ferry_tensor t = dev_bytes(16);
  t.ndim = 2, shape[0] = 4, shape[1] = -5;
  return d2h1(t);
}
static ferry_status r_shape_product_overflows(void) {
  ferry_tensor t = dev_bytes(16);
  t.ndim = 2, shape[0] = INT64_MAX, shape[1] = 3;
  return d2h1(t);
}
static ferry_status r_shape_bytes_overflow(void) {
  ferry_tensor t = dev_bytes(16);
  t.dtype.bits = 64; /* 2^61 elements of 8 bytes: 2^64 bytes */
  t.ndim = 2, shape[0] = (int64_t)1 << 31, shape[1] = (int64_t)1 << 30;
  return d2h1(t);
}
static ferry_status r_shape_absurd(void) {
  ferry_tensor t = dev_bytes(16);
  t.ndim = 2, shape[0] = (int64_t)1 << 32, shape[1] = (int64_t)1 << 31; /* 2^63 bytes: fits, but absurd */
  return d2h1(t);
}
static ferry_status r_batch_total_overflows(void) {
  /* Each tensor is 2^61 bytes (below the per-tensor bound); the three together pass 2^62. */
  ferry_tensor t[3];
  for (int i = 0; i < 3; i++) t[i] = dev_bytes(16);
  shape[0] = (int64_t)1 << 61;
  ferry_transfer_options o = opts();
  return transfer_checked(0, t, 3, &o);
}
static ferry_status r_batch_total_wraps(void) {
  /* Four tensors of 2^62 bytes: their sum is 2^64, which a 64-bit layout would wrap to a 0-byte slab. */
  ferry_tensor t[4];
  for (int i = 0; i < 4; i++) t[i] = dev_bytes(16);
  shape[0] = (int64_t)1 << 62;
  ferry_transfer_options o = opts();
  return transfer_checked(0, t, 4, &o);
}
static ferry_status r_more_than_memory(void) {
  ferry_tensor t = dev_bytes(16);
  shape[0] = (int64_t)1 << 50; /* 1 PiB: no machine pins that */
  return d2h1(t);
}
static ferry_status dtype(uint8_t code, uint8_t bits, uint16_t lanes) {
  ferry_tensor t = dev_bytes(16);
  t.dtype = (ferry_dtype){code, bits, lanes};
  shape[0] = 8;
  return d2h1(t);
}
static ferry_status r_dtype_zero_bits(void) { return dtype(FERRY_DTYPE_FLOAT, 0, 1); }
static ferry_status r_dtype_zero_lanes(void) { return dtype(FERRY_DTYPE_FLOAT, 32, 0); }
static ferry_status r_dtype_4_bits(void) { return dtype(FERRY_DTYPE_INT, 4, 1); }
static ferry_status r_dtype_12_bits(void) { return dtype(FERRY_DTYPE_INT, 12, 1); }
static ferry_status r_dtype_4_bits_2_lanes(void) { return dtype(FERRY_DTYPE_INT, 4, 2); }
static ferry_status r_dtype_unknown_code(void) { return dtype(99, 32, 1); }
static ferry_status r_dtype_24_bits(void) { return dtype(FERRY_DTYPE_UINT, 24, 1); }
static ferry_status r_dtype_vector(void) { return dtype(FERRY_DTYPE_FLOAT, 32, 4); }
static ferry_status r_data_null(void) {
  ferry_tensor t = dev_bytes(16);
  t.data = NULL;
  return d2h1(t);
}
static ferry_status r_data_null_empty(void) {
  ferry_tensor t = dev_bytes(0);
  t.data = NULL;
  ferry_transfer_options o = opts();
  ferry_transfer *tr = NULL;
  ferry_status st = ferry_transfer_d2h(&t, 1, &o, &tr);
  if (st != FERRY_OK) return st;
  ASSERT(ferry_transfer_outputs(tr)[0].data != NULL); /* a valid address, even if empty */
  ASSERT_EQ(ferry_transfer_outputs(tr)[0].shape[0], 0);
  ferry_transfer_release(tr);
  return st;
}
static ferry_status r_byte_offset_wraps(void) {
  ferry_tensor t = dev_bytes(16);
  t.byte_offset = UINT64_MAX - 8;
  return d2h1(t);
}
static ferry_status r_stride_span_overflows(void) {
  ferry_tensor t = dev_bytes(16);
  t.dtype.bits = 32;
  t.ndim = 2, shape[0] = 2, shape[1] = 2, strides[0] = INT64_MAX / 2, strides[1] = 1;
  t.strides = strides;
  return d2h1(t);
}
static ferry_status r_stride_below_address_zero(void) {
  ferry_tensor t = dev_bytes(16);
  t.data = (void *)(uintptr_t)0x1000; /* a negative stride would walk below address 0 */
  t.ndim = 1, shape[0] = 8, strides[0] = -((int64_t)1 << 20);
  t.strides = strides;
  return d2h1(t);
}
static ferry_status r_stride_negative(void) {
  ferry_tensor t = dev_bytes(16);
  t.dtype.bits = 16;
  t.ndim = 2, shape[0] = 3, shape[1] = 5, strides[0] = -5, strides[1] = -1; /* the buffer read backwards */
  t.strides = strides;
  t.byte_offset = 14 * 2;
  return d2h1(t);
}
static ferry_status r_stride_zero(void) {
  ferry_tensor t = dev_bytes(16);
  t.dtype.bits = 32;
  t.ndim = 2, shape[0] = 4, shape[1] = 6, strides[0] = 0, strides[1] = 1; /* one row broadcast 4 times */
  t.strides = strides;
  return d2h1(t);
}
static ferry_status r_strided_too_many_dims(void) {
  ferry_tensor t = dev_bytes(16);
  t.ndim = 9;
  for (int d = 0; d < 9; d++) shape[d] = 2, strides[d] = (int64_t)1 << (2 * (8 - d) + 1); /* every 2nd element */
  t.strides = strides;
  return d2h1(t);
}
static ferry_status r_misaligned(void) {
  ferry_tensor t = dev_bytes(16);
  t.dtype.bits = 32, t.data = buf + 1, shape[0] = 1000;
  ferry_tensor u = t;
  u.data = buf + 4003, u.ndim = 2, u.shape = &shape[1], shape[1] = 10, shape[2] = 10, u.strides = strides;
  strides[0] = 1, strides[1] = 10; /* a transposed view at an odd address */
  ferry_tensor both[2] = {t, u};
  ferry_transfer_options o = opts();
  return transfer_checked(0, both, 2, &o);
}
static ferry_status r_same_tensor_1000_times(void) {
  ferry_tensor t[1000];
  t[0] = dev_bytes(100);
  for (int i = 1; i < 1000; i++) t[i] = t[0];
  ferry_transfer_options o = opts();
  return transfer_checked(0, t, 1000, &o);
}
static ferry_status r_other_device(void) {
  ferry_tensor t[2] = {dev_bytes(64), dev_bytes(64)};
  t[1].device.device_id = 1;
  ferry_transfer_options o = opts();
  return transfer_checked(0, t, 2, &o);
}
static ferry_status r_device_type_unknown(void) {
  ferry_tensor t[2] = {dev_bytes(64), dev_bytes(64)};
  t[1].device.device_type = 999;
  t[1].device.device_id = -3;
  ferry_transfer_options o = opts();
  return transfer_checked(0, t, 2, &o);
}
static ferry_status r_h2d_device_tensor(void) {
  ferry_tensor t[2] = {bytes_on(FERRY_DEVICE_CPU, 64), dev_bytes(64)};
  ferry_transfer_options o = opts();
  return transfer_checked(1, t, 2, &o);
}
static ferry_status r_h2d_cuda_host_not_pinned(void) {
  ferry_tensor t[3] = {bytes_on(FERRY_DEVICE_CUDA_HOST, 64), bytes_on(FERRY_DEVICE_CUDA_HOST, 64),
                       bytes_on(FERRY_DEVICE_CUDA_HOST, 64)};
  shape[0] = 5000;
  ferry_transfer_options o = opts();
  return transfer_checked(1, t, 3, &o);
}

/* 10^6 tensors of one int32 each, views of consecutive elements of one buffer: the gather (D2H) or pack (H2D)
 * route at its largest. Must be exact, and quick. */
enum { MILLION = 1000000 };
static ferry_status million(int h2d) {
  int32_t *data = malloc(sizeof(int32_t) * MILLION);
  ferry_tensor *t = malloc(sizeof(ferry_tensor) * MILLION);
  static int64_t one[1] = {1};
  for (int i = 0; i < MILLION; i++) {
    data[i] = i * 2654435761u;
    t[i] = (ferry_tensor){&data[i], {h2d ? FERRY_DEVICE_CPU : FERRY_DEVICE_CUDA, 0}, 1, {FERRY_DTYPE_INT, 32, 1},
                          one, NULL, 0};
  }
  ferry_transfer_options o = opts();
  o.flags = FERRY_TRANSFER_BLOCKING;
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  ferry_status st = transfer_checked(h2d, t, MILLION, &o);
  clock_gettime(CLOCK_MONOTONIC, &b);
  double s = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
  ferry_pool_stats ps;
  ferry_pool_stats_get(&ps);
  snprintf(row_note, sizeof row_note, "%.2f s with the check; %.0f MiB pinned at peak for %.1f MiB of payload", s,
           (double)ps.bytes_peak_pinned / (1 << 20), MILLION * 4.0 / (1 << 20));
  if (s > 30) FAIL_AT("10^6 tiny tensors took %.1f s", s);
  free(t);
  free(data);
  return st;
}
static ferry_status r_million_d2h(void) { return million(0); }
static ferry_status r_million_h2d(void) { return million(1); }

/* ---- the rows: the other entry points ---------------------------------------------------------------------- */

static ferry_status r_nbytes_null_tensor(void) {
  uint64_t n;
  return ferry_tensor_nbytes(NULL, &n);
}
static ferry_status r_nbytes_null_out(void) {
  ferry_tensor t = dev_bytes(16);
  return ferry_tensor_nbytes(&t, NULL);
}
static ferry_status r_wait_null(void) { return ferry_transfer_wait(NULL); }
static ferry_status r_query_null(void) { return ferry_transfer_query(NULL); }
static ferry_status r_null_accepted(void) {
  ferry_transfer_release(NULL);
  ferry_slab_retain(NULL);
  ferry_slab_release(NULL);
  ferry_pool_stats_get(NULL);
  ferry_transfer_options_init(NULL);
  ASSERT_EQ(ferry_transfer_count(NULL), 0);
  ASSERT(ferry_transfer_outputs(NULL) == NULL);
  ASSERT(ferry_transfer_slab(NULL) == NULL);
  ASSERT_EQ(ferry_transfer_device(NULL), -1);
  ASSERT_EQ(ferry_transfer_output_copied(NULL, 0), 0);
  ASSERT(ferry_slab_data(NULL) == NULL);
  ASSERT_EQ(ferry_slab_size(NULL), 0);
  /* An index past the count is "not copied", not a read past the array. */
  ferry_tensor t = dev_bytes(16);
  ferry_transfer_options o = opts();
  ferry_transfer *tr = NULL;
  ASSERT_OK(ferry_transfer_d2h(&t, 1, &o, &tr));
  ASSERT_EQ(ferry_transfer_output_copied(tr, 1), 0);
  ASSERT_EQ(ferry_transfer_output_copied(tr, SIZE_MAX), 0);
  ferry_transfer_release(tr);
  ASSERT(strcmp(ferry_status_name((ferry_status)12345), "UNKNOWN") == 0);
  ASSERT(ferry_last_error() != NULL);
  return FERRY_OK;
}
static ferry_status r_resolve_null(void) { return ferry_device_resolve(0, NULL); }
static ferry_status r_info_null(void) { return ferry_device_info_get(0, NULL); }
static ferry_status r_info_past_count(void) {
  ferry_device_info info;
  return ferry_device_info_get(9, &info);
}
static ferry_status r_copy_stream_null(void) { return ferry_copy_stream(0, NULL); }
static ferry_status r_copy_stream_past_count(void) {
  void *s;
  return ferry_copy_stream(5, &s);
}
static ferry_status r_reserve_size_max(void) { return ferry_pool_reserve(SIZE_MAX); }
static ferry_status r_reserve_more_than_memory(void) { return ferry_pool_reserve((size_t)1 << 50); }

/* ---- the table ---------------------------------------------------------------------------------------------- */

typedef struct bad_row {
  const char *call;     /* the entry point */
  const char *input;    /* the defect, in words */
  ferry_status want;
  const char *names;    /* an error: text its message must contain (the offending value); OK: what was checked */
  ferry_status (*run)(void);
  int heavy;            /* runs as its own test and is left out of the sanitizer runs */
} bad_row;

#define D2H "ferry_transfer_d2h"
#define H2D "ferry_transfer_h2d"
#define INVALID FERRY_INVALID_ARGUMENT
static const bad_row rows[] = {
    {D2H, "out_transfer NULL", INVALID, "out_transfer is NULL", r_out_null, 0},
    {D2H, "inputs NULL, count 3", INVALID, "count 3", r_inputs_null, 0},
    {D2H, "count SIZE_MAX (more descriptors than memory holds)", FERRY_OVERFLOW, "18446744073709551615",
     r_count_huge, 0},
    {D2H, "count 0, inputs NULL", FERRY_OK, "empty ticket, no slab", r_count_zero, 0},
    {H2D, "count 0, options NULL", FERRY_OK, "empty ticket", r_count_zero_h2d_no_options, 0},
    {D2H, "options.struct_size 0 (options not initialised)", INVALID, "struct_size is 0", r_struct_size_zero, 0},
    {D2H, "options.struct_size 8 bytes short (an older header)", INVALID, "struct_size is 40", r_struct_size_short,
     0},
    {D2H, "options.struct_size 64 bytes longer (a newer header)", FERRY_OK, "exact", r_struct_size_newer, 0},
    {D2H, "options NULL (defaults: device from LOCAL_RANK or 0)", FERRY_OK, "exact", r_options_null, 0},
    {D2H, "options.device 7 on a 1-device machine", FERRY_DEVICE_UNAVAILABLE, "cuda:7", r_device_past_count, 0},
    {D2H, "options.stream set, options.device -1", INVALID, "0x52002", r_stream_without_device, 0},
    {D2H, "options.stream of cuda:1, options.device 0", FERRY_DEVICE_MISMATCH, "cuda:1", r_stream_of_other_device,
     0},
    {D2H, "options.stream from a second (non-primary) context of cuda:0", FERRY_DEVICE_MISMATCH, "0x52002",
     r_stream_of_other_context, 0},
    {D2H, "options.stream the driver rejects (destroyed)", FERRY_DRIVER_ERROR, "cuStreamGetCtx", r_stream_destroyed,
     0},
    {D2H, "ndim -1", INVALID, "ndim is -1", r_ndim_negative, 0},
    {D2H, "ndim 17 (FERRY_MAX_NDIM + 1)", INVALID, "ndim is 17", r_ndim_17, 0},
    {D2H, "ndim INT32_MAX", INVALID, "ndim is 2147483647", r_ndim_int_max, 0},
    {D2H, "ndim 16, every dimension 1", FERRY_OK, "exact", r_ndim_16_ok, 0},
    {D2H, "ndim INT32_MAX on a host tensor (not ferry's to copy)", FERRY_OK, "passed through", 
     r_ndim_int_max_passed_through, 0},
    {D2H, "shape NULL with ndim 2", INVALID, "shape is NULL with ndim 2", r_shape_null, 0},
    {D2H, "shape [4, -5]", INVALID, "(-5)", r_dim_negative, 0},
    {D2H, "shape [INT64_MAX, 3]: the element count overflows", FERRY_OVERFLOW, "dimension 1 (3)",
     r_shape_product_overflows, 0},
    {D2H, "shape [2^31, 2^30] of 8-byte elements: the byte size overflows", FERRY_OVERFLOW, "dimension 1 (1073741824)",
     r_shape_bytes_overflow, 0},
    {D2H, "shape [2^32, 2^31] uint8: 2^63 bytes", FERRY_OVERFLOW, "9223372036854775808", r_shape_absurd, 0},
    {D2H, "3 tensors of 2^61 bytes: the batch passes 2^62", FERRY_OVERFLOW, "tensor 2", r_batch_total_overflows,
     0},
    {D2H, "4 tensors of 2^62 bytes: the slab size would wrap to 0", FERRY_OVERFLOW, "tensor 1",
     r_batch_total_wraps, 0},
    {D2H, "one tensor of 2^50 bytes (more than the machine's memory)", FERRY_OUT_OF_HOST_MEMORY, "1073741824 MiB",
     r_more_than_memory, 0},
    {D2H, "dtype bits 0", INVALID, "bits=0", r_dtype_zero_bits, 0},
    {D2H, "dtype lanes 0", INVALID, "lanes=0", r_dtype_zero_lanes, 0},
    {D2H, "dtype int4 (sub-byte)", FERRY_UNSUPPORTED, "4 bits x 1 lanes", r_dtype_4_bits, 0},
    {D2H, "dtype 12 bits (not whole bytes)", FERRY_UNSUPPORTED, "12 bits x 1 lanes", r_dtype_12_bits, 0},
    {D2H, "dtype int4 x 2 lanes (one byte)", FERRY_OK, "exact", r_dtype_4_bits_2_lanes, 0},
    {D2H, "dtype code 99 (unknown to DLPack), 32 bits", FERRY_OK, "exact, code carried to the output",
     r_dtype_unknown_code, 0},
    {D2H, "dtype 24 bits (3-byte elements)", FERRY_OK, "exact", r_dtype_24_bits, 0},
    {D2H, "dtype float32 x 4 lanes", FERRY_OK, "exact", r_dtype_vector, 0},
    {D2H, "data NULL, 16 bytes", INVALID, "data is NULL but the tensor holds 16 bytes", r_data_null, 0},
    {D2H, "data NULL, shape [0]", FERRY_OK, "empty output at a valid address", r_data_null_empty, 0},
    {D2H, "byte_offset UINT64_MAX - 8: the address wraps", FERRY_OVERFLOW, "byte_offset 18446744073709551607",
     r_byte_offset_wraps, 0},
    {D2H, "strides [INT64_MAX/2, 1]: the extent overflows", FERRY_OVERFLOW, "4611686018427387903",
     r_stride_span_overflows, 0},
    {D2H, "stride -2^20 from address 0x1000: the view starts below address 0", FERRY_OVERFLOW, "-1048576",
     r_stride_below_address_zero, 0},
    {D2H, "strides [-5, -1] (a buffer read backwards)", FERRY_OK, "exact", r_stride_negative, 0},
    {D2H, "strides [0, 1] (a broadcast row)", FERRY_OK, "exact", r_stride_zero, 0},
    {D2H, "strided view with 9 dimensions that do not merge", FERRY_UNSUPPORTED, "9 non-mergeable",
     r_strided_too_many_dims, 0},
    {D2H, "float32 data at odd addresses, compact and transposed", FERRY_OK, "exact", r_misaligned, 0},
    {D2H, "one tensor 1000 times in one batch", FERRY_OK, "exact", r_same_tensor_1000_times, 0},
    {D2H, "a tensor on cuda:1 (another device) in a cuda:0 batch", FERRY_OK, "passed through", r_other_device, 0},
    {D2H, "device_type 999, device_id -3", FERRY_OK, "passed through", r_device_type_unknown, 0},
    {H2D, "a device tensor in an H2D batch", FERRY_OK, "passed through", r_h2d_device_tensor, 0},
    {H2D, "CUDA_HOST tensors whose memory is not pinned", FERRY_OK, "exact (read as pageable)",
     r_h2d_cuda_host_not_pinned, 0},
    {D2H, "10^6 tensors of 4 bytes in one batch", FERRY_OK, "exact, < 30 s", r_million_d2h, 1},
    {H2D, "10^6 pageable tensors of 4 bytes in one batch", FERRY_OK, "exact, < 30 s", r_million_h2d, 1},
    {"ferry_tensor_nbytes", "tensor NULL", INVALID, "tensor is NULL", r_nbytes_null_tensor, 0},
    {"ferry_tensor_nbytes", "out_bytes NULL", INVALID, "out_bytes is NULL", r_nbytes_null_out, 0},
    {"ferry_transfer_wait", "transfer NULL", INVALID, "transfer is NULL", r_wait_null, 0},
    {"ferry_transfer_query", "transfer NULL", INVALID, "transfer is NULL", r_query_null, 0},
    {"release, retain, accessors", "NULL, or an output index past the count", FERRY_OK, "no effect, 0 or NULL",
     r_null_accepted, 0},
    {"ferry_device_resolve", "out_device NULL", INVALID, "out_device is NULL", r_resolve_null, 0},
    {"ferry_device_info_get", "out NULL", INVALID, "out is NULL", r_info_null, 0},
    {"ferry_device_info_get", "device 9 on a 1-device machine", FERRY_DEVICE_UNAVAILABLE, "cuda:9",
     r_info_past_count, 0},
    {"ferry_copy_stream", "out_stream NULL", INVALID, "out_stream is NULL", r_copy_stream_null, 0},
    {"ferry_copy_stream", "device 5 on a 1-device machine", FERRY_DEVICE_UNAVAILABLE, "cuda:5",
     r_copy_stream_past_count, 0},
    {"ferry_pool_reserve", "SIZE_MAX bytes", FERRY_OUT_OF_HOST_MEMORY, "18446744073709551615", r_reserve_size_max,
     0},
    {"ferry_pool_reserve", "2^50 bytes (more than the machine's memory)", FERRY_OUT_OF_HOST_MEMORY,
     "1125899906842624", r_reserve_more_than_memory, 0},
};
enum { N_ROWS = sizeof rows / sizeof rows[0] };

/* ---- running a row ------------------------------------------------------------------------------------------ */

/* What a row's process reports back through a pipe. */
typedef struct row_result {
  int32_t status;
  char message[512];
} row_result;

/* In the child: runs the row, checks the status, the message and the leak counters (exit 1 on a failure, with
 * the reason on stderr), and writes what it got to `fd`. */
static void row_child(const bad_row *r, int fd) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  simulate_foreign_streams();
  setenv("LOCAL_RANK", "0", 1);
  ferry_clear_error();
  ferry_status st = r->run();
  row_result res;
  memset(&res, 0, sizeof res);
  res.status = st;
  snprintf(res.message, sizeof res.message, "%s", st == FERRY_OK ? row_note : ferry_last_error_message());
  if (write(fd, &res, sizeof res) != (ssize_t)sizeof res) FAIL_AT("writing the row's result");
  if (st != r->want)
    FAIL_AT("%s with %s returned %s, expected %s (message: %s)", r->call, r->input, ferry_status_name(st),
            ferry_status_name(r->want), res.message);
  if (st != FERRY_OK) {
    ASSERT_EQ(ferry_last_error()->status, st);
    ASSERT_STR_CONTAINS(res.message, r->names);
  }
  /* Nothing held, nothing leaked. */
  ferry_pool_stats s;
  ferry_pool_stats_get(&s);
  if (s.bytes_in_use != 0) FAIL_AT("the pool holds %llu bytes after the call", (unsigned long long)s.bytes_in_use);
  if (fake_live_devmem != 0) FAIL_AT("%d simulated device allocations are live after the call", fake_live_devmem);
  ASSERT_OK(ferry_pool_trim());
  ferry__events_trim(); /* trim returns early when nothing was pinned; free events are pooled, not leaked */
  if (fake_registered != 0) FAIL_AT("%d host ranges stay registered after trim", fake_registered);
  if (fake_live_events != 0) FAIL_AT("%d events are live after trim", fake_live_events);
  if (fake_live_streams > 2) FAIL_AT("%d streams are live (the thread's two copy streams are 2)", fake_live_streams);
}

/* Runs row `i` in its own process. Returns 1 when it passed; fills `res` (status -1000 when the child died). */
static int run_row(size_t i, row_result *res, int *exit_code) {
  int fds[2];
  if (pipe(fds) != 0) FAIL_AT("pipe failed");
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    alarm(60);
    row_child(&rows[i], fds[1]);
    fflush(NULL);
    _exit(0);
  }
  close(fds[1]);
  memset(res, 0, sizeof *res);
  res->status = -1000;
  ssize_t got = read(fds[0], res, sizeof *res);
  if (got != (ssize_t)sizeof *res) res->status = -1000;
  close(fds[0]);
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  *exit_code = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
  return *exit_code == 0;
}

static void run_rows(int heavy) {
  int failed = 0;
  for (size_t i = 0; i < N_ROWS; i++) {
    if (rows[i].heavy != heavy) continue;
    row_result res;
    int code;
    if (!run_row(i, &res, &code)) {
      fprintf(stderr, "  row %zu (%s: %s) failed, child exit %d\n", i + 1, rows[i].call, rows[i].input, code);
      failed++;
    }
  }
  if (failed) FAIL_AT("%d bad-input rows failed", failed);
}

TEST(bad_inputs_table) { run_rows(0); }
TEST(million_tiny_tensors) { run_rows(1); }

/* `--table`: every row, as the markdown table docs/reliability.md quotes. Exit status 1 if any row failed. */
int reliability_main_hook(int argc, char **argv) {
  int table = 0;
  for (int i = 1; i < argc; i++) table |= !strcmp(argv[i], "--table");
  if (!table) return -1;
  int failed = 0;
  printf("| # | call | input | expected | got | message (or what was checked) | |\n");
  printf("|---|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < N_ROWS; i++) {
    row_result res;
    int code;
    int ok = run_row(i, &res, &code);
    failed += !ok;
    char got[64];
    if (res.status == -1000) snprintf(got, sizeof got, "died (exit %d)", code);
    else snprintf(got, sizeof got, "%s", ferry_status_name((ferry_status)res.status));
    for (char *p = res.message; *p; p++)
      if (*p == '|') *p = '/';
    if (res.status == FERRY_OK && res.message[0]) { /* a measured note: say what was checked, then the figures */
      char note[sizeof row_note];
      snprintf(note, sizeof note, "%.200s", res.message);
      snprintf(res.message, sizeof res.message, "%.200s; %.250s", rows[i].names, note);
    }
    printf("| %zu | `%s` | %s | %s | %s | %s | %s |\n", i + 1, rows[i].call, rows[i].input,
           ferry_status_name(rows[i].want), got, res.status == FERRY_OK && !res.message[0] ? rows[i].names
                                                                                              : res.message,
           ok ? "ok" : "**FAIL**");
  }
  printf("\n%zu rows, %d failed\n", (size_t)N_ROWS, failed);
  return failed ? 1 : 0;
}
