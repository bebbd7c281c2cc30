// emulate_gemm.cpp — runs a tensor-core GEMM kernel of src/kernels (gemm_mma_sw.cu, or gemm_mma.cu with EMU_KERNEL)
// on the CPU through emulate_cuda.h, for one design and one problem kind given as the same FERRY_* macros NVRTC
// gets, and checks every output element against a float64
// reference: values within rounding, no element left unwritten (the output starts as NaN), nothing written outside
// the matrices (guard bytes around them, and in the padding between rows, stay as they were), every cp.async in
// bounds. A kind with an epilogue (FERRY_BIAS, FERRY_ACTIVATION) gets a random bias vector and the reference applies
// the same epilogue. tests/kernels/emulate.sh builds it for each design and kind.
//
// usage: emulate_gemm [--seed S] CASE...   where CASE is m,n,k,l,pad,alpha,beta (pad: leading dimensions rounded
// up to a multiple of pad elements, as tests/gpu/test_ops_gpu.c does). Each case runs twice: cp.async performed at
// issue with wgmma at its wait, then cp.async at the issuer's wait with wgmma at issue. Exit status 0 only when
// every case passed.
#include "emulate_cuda.h"

#ifndef EMU_KERNEL
#define EMU_KERNEL "gemm_mma_sw.cu"
#define EMU_ENTRY ferry_gemm_mma_sw
#endif
#ifndef EMU_ALIGN
#define EMU_ALIGN 16 // bytes of alignment the design requires of A and B (the host checks it)
#endif
#include EMU_KERNEL

namespace {

using ferry::u16;
using ferry::u32;

constexpr int GUARD = 256; // bytes before and after each matrix

bool narrow(int type) { return type >= FERRY_SCALAR_E4M3 && type <= FERRY_SCALAR_I8; }
size_t esize(int type) {
  return type == FERRY_SCALAR_F32 || type == FERRY_SCALAR_I32 ? 4 : narrow(type) ? 1 : 2;
}

double get(const unsigned char *p, size_t i, int type) {
  if (narrow(type)) return ferry::narrow_value(p[i], type);
  if (type == FERRY_SCALAR_I32) {
    int v;
    memcpy(&v, p + 4 * i, 4);
    return v;
  }
  if (type == FERRY_SCALAR_F32) {
    float f;
    memcpy(&f, p + 4 * i, 4);
    return f;
  }
  u16 h;
  memcpy(&h, p + 2 * i, 2);
  return type == FERRY_SCALAR_F16 ? ferry::f16_to_f32(h) : ferry::bf16_to_f32(h);
}

void put(unsigned char *p, size_t i, int type, double v) {
  if (type == FERRY_SCALAR_I32) {
    const int x = (int)v;
    memcpy(p + 4 * i, &x, 4);
    return;
  }
  if (type == FERRY_SCALAR_F32) {
    float f = (float)v;
    memcpy(p + 4 * i, &f, 4);
    return;
  }
  u16 h = type == FERRY_SCALAR_F16 ? ferry::f32_to_f16((float)v) : ferry::f32_to_bf16((float)v);
  memcpy(p + 2 * i, &h, 2);
}

// A rows×cols matrix (l of them), laid out as the GPU test lays them out.
struct mat {
  int type, col, rows, cols, l;
  long long ld, batch;
  size_t elems;
  std::vector<unsigned char> mem; // GUARD, the elements, GUARD
  size_t at(int z, int i, int j) const {
    return (size_t)z * (size_t)batch + (col ? (size_t)i + (size_t)j * (size_t)ld : (size_t)i * (size_t)ld + (size_t)j);
  }
  bool logical(size_t e) const { // element e is inside the matrix, not in the padding
    const size_t in_batch = e % (size_t)batch, inner = in_batch % (size_t)ld;
    return (size_t)e / (size_t)batch < (size_t)l && (int)inner < (col ? rows : cols);
  }
};

mat make(int type, int col, int l, int rows, int cols, int pad) {
  mat m;
  m.type = type, m.col = col, m.rows = rows, m.cols = cols, m.l = l;
  const long long inner = col ? rows : cols, outer = col ? cols : rows;
  m.ld = pad ? (inner + pad - 1) / pad * pad : inner;
  if (m.ld < 1) m.ld = 1;
  m.batch = m.ld * outer;
  if (m.batch < 1) m.batch = 1;
  m.elems = (size_t)(m.batch * l);
  // 1024-aligned storage: the matrix starts 16-byte aligned, as cudaMalloc's would.
  m.mem.assign(m.elems * esize(type) + 2 * GUARD + 1024, 0xa5);
  return m;
}

unsigned char *base_of(mat &m) {
  // Align the element area itself to 1024 bytes inside the vector, keeping GUARD bytes before it.
  uintptr_t p = (uintptr_t)m.mem.data() + GUARD;
  p = (p + 1023) & ~(uintptr_t)1023;
  return (unsigned char *)p;
}

ferry_gemm_params params;
#if FERRY_TMA
ferry::tma_maps maps;
void kernel() { ferry::EMU_ENTRY(params, maps); }
#else
void kernel() { ferry::EMU_ENTRY(params); }
#endif

// The epilogue's activation in float64 (ferry_activation: 1 ReLU, 2 GELU with tanh, 3 SiLU), and the most its
// slope reaches, by which an error before it can grow.
double activate(double x) {
  switch (FERRY_ACTIVATION) {
  case 1: return x < 0 ? 0 : x;
  case 2: return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
  case 3: return x / (1 + std::exp(-x));
  default: return x;
  }
}
constexpr double ACTIVATION_SLOPE = FERRY_ACTIVATION == 2 ? 1.13 : FERRY_ACTIVATION == 3 ? 1.1 : 1.0;

uint64_t rng_state = 1;
double uniform() { // [-1, 1)
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

// An operand element: uniform in [-1, 1) for 16- and 32-bit types; for 8-bit ones a random byte, any int8 or a
// finite FP8 value of magnitude at most 2. Padding, which no kernel may read, gets NaN (FP8: 0x7f in both formats)
// or, for int8, 127 (not a NaN, but a wrong sum wherever it is read).
void put_operand(unsigned char *p, size_t i, int type, bool logical) {
  if (!narrow(type)) {
    put(p, i, type, logical ? uniform() : NAN);
    return;
  }
  if (!logical) {
    p[i] = 0x7f;
    return;
  }
  for (;;) {
    const unsigned char b = (unsigned char)((uniform() + 1.0) * 128.0);
    const double v = ferry::narrow_value(b, type);
    if (type == FERRY_SCALAR_I8 || (std::isfinite(v) && std::fabs(v) <= 2.0)) {
      p[i] = b;
      return;
    }
  }
}

// Runs one case in one cp.async mode; returns the number of bad elements.
int run_case(int m, int n, int k, int l, int pad, float alpha, float beta, bool early, unsigned seed) {
  if (FERRY_OUT_TYPE == FERRY_SCALAR_I32) alpha = 1, beta = 0; // an exact int32 output takes no epilogue
  mat A = make(FERRY_A_TYPE, !FERRY_A_ROW, l, m, k, pad), B = make(FERRY_B_TYPE, !FERRY_B_ROW, l, k, n, pad);
  mat C = make(FERRY_OUT_TYPE, !FERRY_OUT_ROW, l, m, n, pad);
  unsigned char *a = base_of(A), *b = base_of(B), *c = base_of(C);
  // Everything around and between the elements starts as a pattern that must survive.
  memset(c - GUARD, 0x5a, C.elems * esize(C.type) + 2 * GUARD);
  for (size_t e = 0; e < A.elems; e++) put_operand(a, e, A.type, A.logical(e));
  for (size_t e = 0; e < B.elems; e++) put_operand(b, e, B.type, B.logical(e));
  std::vector<double> c0(C.elems, 0.0);
  for (size_t e = 0; e < C.elems; e++)
    if (C.logical(e)) {
      if (beta != 0.0f) {
        put(c, e, C.type, uniform());
        c0[e] = get(c, e, C.type);
      } else { // must be overwritten: NaN, or for int32 0x80808080
        memset(c + e * esize(C.type), C.type == FERRY_SCALAR_I32 ? 0x80 : 0xff, esize(C.type));
      }
    }
  const std::vector<unsigned char> before(c - GUARD, c + C.elems * esize(C.type) + GUARD);
  // The bias: one value per column (FERRY_BIAS 1) or per row (2), of out's type, shared by the batches.
  const int bias_len = FERRY_BIAS == 1 ? n : FERRY_BIAS == 2 ? m : 0;
  std::vector<unsigned char> bias_mem((size_t)(bias_len > 0 ? bias_len : 1) * esize(C.type));
  for (int i = 0; i < bias_len; i++) put(bias_mem.data(), (size_t)i, C.type, 2 * uniform());
  for (long long v : {A.ld * (long long)esize(A.type), B.ld * (long long)esize(B.type),
                      A.batch * (long long)esize(A.type), B.batch * (long long)esize(B.type)})
    if (k > 0 && v % EMU_ALIGN) { // (k = 0: nothing is loaded, the host accepts any layout)
      fprintf(stderr, "case %d,%d,%d,%d,%d: operands not 16-byte aligned; the host would not run this design\n", m,
              n, k, l, pad);
      exit(2);
    }

  params = ferry_gemm_params{};
  params.a = a, params.b = b, params.out = c;
  params.lda = A.ld, params.ldb = B.ld, params.ldc = C.ld;
  params.batch_a = l > 1 ? A.batch : 0, params.batch_b = l > 1 ? B.batch : 0, params.batch_c = C.batch;
  params.m = m, params.n = n, params.k = k, params.l = l;
  params.alpha = alpha, params.beta = beta;
  params.bias = FERRY_BIAS ? bias_mem.data() : nullptr;
  // Per-tensor scales (FERRY_SCALED): the kernel multiplies alpha by both, read from "device" memory.
  static float scale_a = 0.5f, scale_b = 3.0f;
  params.scale_a = &scale_a, params.scale_b = &scale_b;
  const double alpha_total = FERRY_SCALED ? (double)alpha * scale_a * scale_b : (double)alpha;
  emu::globals = {{a, a + A.elems * esize(A.type)}, {b, b + B.elems * esize(B.type)}};
#if FERRY_TMA
  // The tensor maps as src/ops/tma.c encodes them: 2-byte elements (8-bit operands as pairs along k), the
  // contiguous dimension first; a K-major operand's box is the tile's rows by 64 of k, an MN-major one's 64 of m
  // or n by the k-tile's 64 rows; a broadcast operand (batch stride 0) has one batch.
  const auto map_of = [&](const unsigned char *base, int rows, int cols, bool row_major, long long ld,
                          long long batch, int elem, uint32_t k_major_rows) {
    const uint64_t pair = narrow(elem) ? 2 : 1, es = esize(elem);
    ferry::tma_map t{};
    t.base = base;
    t.dims[0] = row_major ? (uint64_t)cols : (uint64_t)rows;
    t.dims[1] = row_major ? (uint64_t)rows : (uint64_t)cols;
    t.dims[0] /= pair;
    t.dims[2] = batch ? (uint64_t)l : 1;
    t.strides[0] = (uint64_t)ld * es;
    t.strides[1] = batch ? (uint64_t)batch * es : t.strides[0];
    t.box_rows = k_major_rows;
    return t;
  };
  maps.a = map_of(a, m, k, FERRY_A_ROW, A.ld, params.batch_a, A.type, FERRY_A_ROW ? FERRY_BM : 64);
  maps.b = map_of(b, k, n, FERRY_B_ROW, B.ld, params.batch_b, B.type, FERRY_B_ROW ? 64 : FERRY_BN / ferry::CLUSTER);
#endif
  emu::early_copies = early;
  emu::early_wgmma = !early;

  // The kernel's own figure (src/ops/registry.c computes the same; the CPU tests compare the two).
  const unsigned smem = ferry::SMEM_BYTES;
  [[maybe_unused]] const int tiles = (m + FERRY_BM - 1) / FERRY_BM * ((n + FERRY_BN - 1) / FERRY_BN);
#if FERRY_PERSISTENT && FERRY_CLUSTER > 1
  // Clusters of two: two clusters here (as src/ops/run.c sizes the grid: whole clusters, no more than there are
  // cluster tiles), each cluster's blocks running together.
  const int cluster_tiles = (m + 2 * FERRY_BM - 1) / (2 * FERRY_BM) * ((n + FERRY_BN - 1) / FERRY_BN);
  const int clusters = std::min(cluster_tiles * l, 2);
  emu::grid = {(unsigned)(2 * clusters), 1, 1};
  for (int c = 0; c < clusters; c++) {
    const emu_dim3 pair[2] = {{(unsigned)(2 * c), 0, 0}, {(unsigned)(2 * c + 1), 0, 0}};
    emu::run_cluster(pair, 2, ferry::THREADS, smem, seed + (unsigned)(c * 131), kernel);
  }
#elif FERRY_PERSISTENT
  // A persistent kernel gets at most one block per SM and loops over the tiles of every batch; three "SMs" here, so
  // that blocks take several tiles each, across batches.
  const int blocks = std::min(tiles * l, 3);
  emu::grid = {(unsigned)blocks, 1, 1};
  for (int x = 0; x < blocks; x++)
    emu::run_block({(unsigned)x, 0, 0}, ferry::THREADS, smem, seed + (unsigned)(x * 131), kernel);
#else
  emu::grid = {(unsigned)tiles, 1, (unsigned)l};
  for (int z = 0; z < l; z++)
    for (int x = 0; x < tiles; x++)
      emu::run_block({(unsigned)x, 0, (unsigned)z}, ferry::THREADS, smem, seed + (unsigned)(x * 131 + z), kernel);
#endif

  // The reference, and what must not have changed.
  // int32: exact. Else the output's rounding, and the accumulator's over the sum of |products|.
  const double rel_out = C.type == FERRY_SCALAR_BF16  ? 1.0 / 128
                         : C.type == FERRY_SCALAR_F16 ? 1.0 / 1024
                         : C.type == FERRY_SCALAR_I32 ? 0.0
                                                      : 1e-6;
  const double eps_acc = FERRY_ACC_TYPE == FERRY_SCALAR_F16   ? 4e-3
                         : FERRY_ACC_TYPE == FERRY_SCALAR_I32 ? 0.0
                                                              : 1e-6;
  int bad = 0;
  double worst = 0;
  std::vector<double> av((size_t)m * k), bv((size_t)k * n);
  for (int z = 0; z < l; z++) {
    for (int i = 0; i < m; i++)
      for (int p = 0; p < k; p++) av[(size_t)i * k + p] = get(a, A.at(l > 1 ? z : 0, i, p), A.type);
    for (int p = 0; p < k; p++)
      for (int j = 0; j < n; j++) bv[(size_t)p * n + j] = get(b, B.at(l > 1 ? z : 0, p, j), B.type);
    for (int i = 0; i < m; i++)
      for (int j = 0; j < n; j++) {
        double acc = 0, mag = 0;
        for (int p = 0; p < k; p++) {
          const double x = av[(size_t)i * k + p] * bv[(size_t)p * n + j];
          acc += x;
          mag += std::fabs(x);
        }
        const size_t e = C.at(z, i, j);
        const double bias = FERRY_BIAS ? get(bias_mem.data(), (size_t)(FERRY_BIAS == 1 ? j : i), C.type) : 0.0;
        const double pre = alpha_total * acc + beta * c0[e] + bias, ref = activate(pre), got = get(c, e, C.type);
        const double tol = C.type == FERRY_SCALAR_I32
                               ? 0.0
                               : rel_out * std::fabs(ref) +
                                     ACTIVATION_SLOPE * (eps_acc * std::fabs(alpha_total) * mag +
                                                         1e-6 * std::fabs(pre)) +
                                     1e-30;
        const double err = std::fabs(got - ref);
        if (!(err <= tol)) {
          if (bad < 5)
            fprintf(stderr, "  out[%d][%d][%d] = %.6g, expected %.6g (tolerance %.2g)\n", z, i, j, got, ref, tol);
          bad++;
        }
        const double rel = err / (std::fabs(ref) + 1e-3);
        if (std::isnan(rel) || (!std::isnan(worst) && rel > worst)) worst = rel; // a NaN stays the worst
      }
  }
  const unsigned char *now = c - GUARD;
  int stray = 0;
  for (size_t byte = 0; byte < before.size(); byte++) {
    const long long rel = (long long)byte - GUARD;
    const bool element = rel >= 0 && (size_t)rel < C.elems * esize(C.type) && C.logical((size_t)rel / esize(C.type));
    if (!element && now[byte] != before[byte]) stray++;
  }
  if (stray) fprintf(stderr, "  %d bytes written outside the output's elements\n", stray);
  printf("%s %4d×%4d×%4d l=%d pad=%d alpha=%g beta=%g %s: %s (worst relative error %.2g)\n",
         bad || stray ? "FAIL" : "ok  ", m, n, k, l, pad, alpha, beta,
         early ? "copies at issue, wgmma at wait" : "copies at wait, wgmma at issue",
         bad || stray ? "wrong" : "exact within rounding", worst);
  return bad + stray;
}

} // namespace

int main(int argc, char **argv) {
  unsigned seed = 1;
  int failures = 0, cases = 0;
  static const char *const type_names[] = {"?", "fp16", "bf16", "fp32", "e4m3", "e5m2", "int8", "int32"};
  printf("%s %dx%dx%d, %d threads, s%d; A %s %s, B %s %s, out %s %s, acc %s, bias mode %d, activation %d%s\n",
         EMU_KERNEL, FERRY_BM, FERRY_BN, FERRY_BK, ferry::THREADS, FERRY_STAGES, type_names[FERRY_A_TYPE],
         FERRY_A_ROW ? "row" : "col", type_names[FERRY_B_TYPE], FERRY_B_ROW ? "row" : "col",
         type_names[FERRY_OUT_TYPE], FERRY_OUT_ROW ? "row" : "col", type_names[FERRY_ACC_TYPE], FERRY_BIAS,
         FERRY_ACTIVATION, FERRY_SCALED ? ", scaled" : "");
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
      seed = (unsigned)strtoul(argv[++i], nullptr, 10);
      continue;
    }
    int m, n, k, l, pad;
    float alpha, beta;
    if (sscanf(argv[i], "%d,%d,%d,%d,%d,%f,%f", &m, &n, &k, &l, &pad, &alpha, &beta) != 7) {
      fprintf(stderr, "bad case '%s' (m,n,k,l,pad,alpha,beta)\n", argv[i]);
      return 2;
    }
    rng_state = seed * 7919u + (unsigned)i;
    failures += run_case(m, n, k, l, pad, alpha, beta, true, seed) != 0;
    rng_state = seed * 7919u + (unsigned)i;
    failures += run_case(m, n, k, l, pad, alpha, beta, false, seed + 1000) != 0;
    cases += 2;
  }
  printf("%d of %d runs passed\n", cases - failures, cases);
  return failures ? 1 : 0;
}
