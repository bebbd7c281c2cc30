/* Compilation with the real NVRTC (no GPU needed), the memo, and runs and graphs through the fake driver, which
 * loads cubins as tokens and records launches instead of running them. */
#include "test_ops.h"

#include <pthread.h>
#include <stdatomic.h>

/* The examples published with the standard (NIST's "abc", the two-block 448-bit message, a million 'a') and the
 * empty message; each checked against Python's hashlib. */
TEST(sha256_matches_the_standard_vectors) {
  uint8_t out[32];
  char hex[65];
  ferry__sha256_of("abc", 3, out);
  ferry__hex(out, 32, hex);
  ASSERT(!strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
  ferry__sha256_of("", 0, out);
  ferry__hex(out, 32, hex);
  ASSERT(!strcmp(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
  const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  ferry__sha256_of(two, strlen(two), out);
  ferry__hex(out, 32, hex);
  ASSERT(!strcmp(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"));
  /* a million 'a', fed in uneven pieces through the streaming interface */
  ferry__sha256 s;
  ferry__sha256_init(&s);
  char block[1000];
  memset(block, 'a', sizeof block);
  size_t fed = 0;
  for (size_t piece = 1; fed < 1000000; piece = piece % 997 + 1) {
    size_t n = 1000000 - fed < piece ? 1000000 - fed : piece;
    ferry__sha256_update(&s, block, n);
    fed += n;
  }
  ferry__sha256_final(&s, out);
  ferry__hex(out, 32, hex);
  ASSERT(!strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"));
}

/* The pseudo-random buffer of xxHash's sanity check (its reference test program): byte i is the top byte of
 * PRIME32 * PRIME64^i (mod 2^64). */
static void xxhash_sanity_buffer(unsigned char *buf, size_t n) {
  uint64_t gen = 2654435761u;
  for (size_t i = 0; i < n; i++) {
    buf[i] = (unsigned char)(gen >> 56);
    gen *= 11400714785074694797ull;
  }
}

/* SHA-256 across the padding boundaries (55 bytes: the length fits the last block; 56 to 64: it needs another),
 * values from Python's hashlib. */
TEST(sha256_matches_across_the_padding_boundaries) {
  unsigned char buf[65];
  xxhash_sanity_buffer(buf, sizeof buf);
  const struct { size_t n; const char *hex; } cases[] = {
      {55, "5b39a58741c0585914865dce2e4d3a36464014c084fbd725976ed33cbb482f0f"},
      {56, "0882d13811deba21bbb6c5176d22da6db6672fba8c92db7672870d3e0497631d"},
      {63, "1d26aea8a98b18978a7f73ba1da20b383d4c7fe481acac9e08307f57dfc40788"},
      {64, "151818c81c5d18649d637e2c3ad20e393d590a9fe65c6c72eb89f62b1738f940"},
      {65, "faec206ffcbf1a972b4b7fe39b3bcedaac1223c2327f83ec43d6ca0f070dbfd6"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint8_t out[32];
    char hex[65];
    ferry__sha256_of(buf, cases[i].n, out);
    ferry__hex(out, 32, hex);
    if (strcmp(hex, cases[i].hex)) FAIL_AT("SHA-256 of %zu bytes: %s, expected %s", cases[i].n, hex, cases[i].hex);
  }
}

/* XXH64 of xxHash's sanity-check buffer, seeds 0 and PRIME32, over lengths that take each path (empty, the 1-, 4-
 * and 8-byte tails, one stripe, many stripes); values from the xxhash package (4.1.0, the reference library). */
TEST(xxh64_matches_the_reference_sanity_vectors) {
  static unsigned char buf[4161];
  xxhash_sanity_buffer(buf, sizeof buf);
  const struct { size_t n; uint64_t seed0, seed_prime32; } cases[] = {
      {0, 0xef46db3751d8e999ull, 0xac75fda2929b17efull},    {1, 0xe934a84adb052768ull, 0x5014607643a9b4c3ull},
      {4, 0x9136a0dca57457eeull, 0xcaab286bd8e9fdb5ull},    {8, 0xcdbcf538e71d1348ull, 0xfe0c047a5353cdacull},
      {14, 0x8282dcc4994e35c8ull, 0xc3bd6bf63deb6df0ull},   {32, 0x18b216492bb44b70ull, 0xb3f33bdf93ade409ull},
      {222, 0xb641ae8cb691c174ull, 0x20cb8ab7ae10c14aull},  {4161, 0xcd3d6df2db509a75ull, 0x2394cb79e97368d1ull},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint64_t h0 = ferry__xxh64(buf, cases[i].n, 0), h1 = ferry__xxh64(buf, cases[i].n, 2654435761u);
    if (h0 != cases[i].seed0 || h1 != cases[i].seed_prime32)
      FAIL_AT("XXH64 of %zu bytes: %016llx/%016llx, expected %016llx/%016llx", cases[i].n, (unsigned long long)h0,
              (unsigned long long)h1, (unsigned long long)cases[i].seed0, (unsigned long long)cases[i].seed_prime32);
  }
}

TEST(xxh64_matches_the_published_values) {
  /* The values of the xxHash reference implementation (XXH64, seeds 0 and 0x9e3779b97f4a7c15; checked against the
   * xxhash package 4.1.0). */
  unsigned char ramp[1027];
  for (int i = 0; i < 1024; i++) ramp[i] = (unsigned char)i;
  memcpy(ramp + 1024, "xyz", 3);
  const char *spam = "Nobody inspects the spammish repetition";
  const struct { const void *data; size_t n; uint64_t seed0, seed1; } cases[] = {
      {"", 0, 0xef46db3751d8e999ull, 0xc4349fc93c010000ull},
      {"a", 1, 0xd24ec4f1a98c6e5bull, 0x9a7c6d2ea45568c9ull},
      {"abc", 3, 0x44bc2cf5ad770999ull, 0x2ed0f59d6b43ac8bull},
      {spam, 39, 0xfbcea83c8a378bf1ull, 0xeb8b157ca26cbf34ull},
      {ramp, sizeof ramp, 0xe146cb31b65bc21aull, 0x86b7211d04e93c1full},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint64_t h0 = ferry__xxh64(cases[i].data, cases[i].n, 0);
    uint64_t h1 = ferry__xxh64(cases[i].data, cases[i].n, 0x9e3779b97f4a7c15ull);
    if (h0 != cases[i].seed0 || h1 != cases[i].seed1)
      FAIL_AT("XXH64 of case %zu (%zu bytes): %016llx/%016llx, expected %016llx/%016llx", i, cases[i].n,
              (unsigned long long)h0, (unsigned long long)h1, (unsigned long long)cases[i].seed0,
              (unsigned long long)cases[i].seed1);
  }
  /* Unaligned input reads the same bytes. */
  unsigned char shifted[1028];
  memcpy(shifted + 1, ramp, sizeof ramp);
  ASSERT(ferry__xxh64(shifted + 1, sizeof ramp, 0) == 0xe146cb31b65bc21aull);
}

/* The SHA-256 of everything after the source's head (the "#define FERRY_TARGET_SM" line ends it). */
static void digest_after_head(const ferry_op *op, uint32_t kind, int sm, uint8_t out[32]) {
  char *source = NULL;
  size_t size = 0;
  ASSERT_OK(ferry__op_source(op, kind, sm, &source, &size));
  ASSERT_EQ(strlen(source), size);
  const char *end = strstr(source, "#define FERRY_TARGET_SM ");
  ASSERT(end != NULL);
  end = strchr(end, '\n') + 1;
  ferry__sha256_of(end, size - (size_t)(end - source), out);
  free(source);
}

/* The value `name` is #defined to in `text` (the first such line), -1 when there is none. */
static int defined_value(const unsigned char *text, size_t size, const char *name) {
  char line[64];
  int n = snprintf(line, sizeof line, "#define %s ", name);
  for (size_t at = 0; at + (size_t)n < size; at++)
    if (!memcmp(text + at, line, (size_t)n)) return atoi((const char *)text + at + n);
  return -1;
}

/* ferry gives NVRTC the element type codes from ferry_scalar (source.c); the defaults in gemm_kind.cuh, which the
 * nvcc checks and the CPU emulation compile with, must be the same values. */
TEST(kernel_type_code_defaults_are_ferry_scalar) {
  const unsigned char *kind = ferry__kernel_gemm_kind;
  size_t size = ferry__kernel_gemm_kind_size;
  ASSERT_EQ(defined_value(kind, size, "FERRY_SCALAR_F16"), FERRY_SCALAR_F16);
  ASSERT_EQ(defined_value(kind, size, "FERRY_SCALAR_BF16"), FERRY_SCALAR_BF16);
  ASSERT_EQ(defined_value(kind, size, "FERRY_SCALAR_F32"), FERRY_SCALAR_F32);
}

TEST(compile_key_covers_the_whole_source) {
  ferry_gemm_args f16, f32;
  test_args(&f16, FERRY_SCALAR_F16, FERRY_SCALAR_F16, 64, 64, 64);
  test_args(&f32, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 64, 64, 64);
  const ferry_op *tiny_a = tiny_op("tiny_key_a");
  ferry_op_desc d;
  ferry_op_desc_init(&d);
  d.info.name = "tiny_key_b"; /* tiny_key_a's source but for one character */
  d.source = "extern \"C\" __global__ void tiny(ferry_gemm_params p) {\n"
             "  if (threadIdx.x == 0 && p.m > 0) static_cast<float *>(p.out)[0] = p.beta;\n"
             "}\n";
  d.entry = "tiny";
  const ferry_op *tiny_b = NULL;
  ASSERT_OK(ferry_op_register(&d, &tiny_b));
  /* The memoised digest the key uses is the digest of the source's bytes after the head, for every kind. */
  const ferry_op *ops[3] = {ferry_op_by_name("gemm_mma_f16_64x64x32_s3"), tiny_a, tiny_b};
  for (int i = 0; i < 3; i++) {
    uint8_t want[32], got[32];
    ferry__op_body_digest(ops[i], got);
    digest_after_head(ops[i], f16.problem.kind, 90, want);
    ASSERT(!memcmp(want, got, 32));
    if (i > 0) {
      digest_after_head(ops[i], f32.problem.kind, 80, want);
      ASSERT(!memcmp(want, got, 32));
    }
  }
  /* Each shared header stands whole in a built-in operator's source, so the digest, and with it the key, covers
   * every one of them (NVRTC is given no headers: source.c places them). */
  char *source = NULL;
  size_t size = 0;
  ASSERT_OK(ferry__op_source(ops[0], f16.problem.kind, 90, &source, &size));
  const struct { const unsigned char *text; size_t n; const char *name; } headers[] = {
      {ferry__kernel_gemm_params, ferry__kernel_gemm_params_size, "ferry/gemm_params.h"},
      {ferry__kernel_gemm_kind, ferry__kernel_gemm_kind_size, "gemm_kind.cuh"},
      {ferry__kernel_gemm_common, ferry__kernel_gemm_common_size, "gemm_common.cuh"},
      {ferry__kernel_gemm_output, ferry__kernel_gemm_output_size, "gemm_output.cuh"},
  };
  for (size_t h = 0; h < sizeof headers / sizeof headers[0]; h++) {
    int found = 0;
    for (size_t at = 0; !found && at + headers[h].n <= size; at++)
      found = !memcmp(source + at, headers[h].text, headers[h].n);
    if (!found) FAIL_AT("%s is not in the source of %s", headers[h].name, ferry_op_info_get(ops[0])->name);
  }
  free(source);
  /* Every input changes the key; the same inputs give the same key. */
  const char *opts[3] = {"--gpu-architecture=sm_90", "--std=c++17", "-DX=1"};
  uint8_t base[32], again[32], other[32];
  ferry__compile_key(tiny_a, f32.problem.kind, 90, opts, 2, 13000, 13000, base);
  ferry__compile_key(tiny_a, f32.problem.kind, 90, opts, 2, 13000, 13000, again);
  ASSERT(!memcmp(base, again, 32));
  ferry__compile_key(tiny_b, f32.problem.kind, 90, opts, 2, 13000, 13000, other);
  ASSERT(memcmp(base, other, 32)); /* one character of the kernel */
  ferry__compile_key(tiny_a, f16.problem.kind, 90, opts, 2, 13000, 13000, other);
  ASSERT(memcmp(base, other, 32)); /* the kind */
  ferry__compile_key(tiny_a, f32.problem.kind, 89, opts, 2, 13000, 13000, other);
  ASSERT(memcmp(base, other, 32)); /* the target */
  ferry__compile_key(tiny_a, f32.problem.kind, 90, opts, 3, 13000, 13000, other);
  ASSERT(memcmp(base, other, 32)); /* an option */
  ferry__compile_key(tiny_a, f32.problem.kind, 90, opts, 2, 13010, 13000, other);
  ASSERT(memcmp(base, other, 32)); /* NVRTC's version */
  ferry__compile_key(tiny_a, f32.problem.kind, 90, opts, 2, 13000, 12080, other);
  ASSERT(memcmp(base, other, 32)); /* the driver's version */
}

TEST(compile_to_cubin_for_sm80_and_sm90) {
  if (!test_have_nvrtc()) return;
  char home[300];
  test_cache_home(home, sizeof home, "compile");
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_BF16, FERRY_SCALAR_BF16, 128, 128, 128);
  const char *names[] = {"gemm_mma_bf16_64x64x32_s3", "gemm_simt_64x64x16"};
  for (int i = 0; i < 2; i++)
    for (int sm = 80; sm <= 90; sm += 10) {
      ferry_artifact *art = NULL;
      ASSERT_OK(ferry_op_compile_for(ferry_op_by_name(names[i]), &args, sm, &art));
      size_t size = 0;
      const unsigned char *cubin = ferry_artifact_cubin(art, &size);
      ASSERT(size > 1000 && !memcmp(cubin, "\x7f" "ELF", 4));
      ASSERT_EQ(ferry_artifact_target_sm(art), sm);
      ASSERT_EQ(ferry_artifact_kind(art), args.problem.kind);
      ASSERT(ferry_artifact_op(art) == ferry_op_by_name(names[i]));
      ferry_artifact_release(art);
    }
  ferry_cache_stats st;
  ferry_cache_stats_get(&st);
  ASSERT_EQ(st.compiles, 4);
  fprintf(stderr, "  4 NVRTC compiles in %.2f s\n", st.compile_seconds);
  /* FERRY_ARCH picks the target of ferry_op_compile without a GPU */
  setenv("FERRY_ARCH", "sm_80", 1);
  ferry_artifact *art = NULL;
  ASSERT_OK(ferry_op_compile(ferry_op_by_name(names[1]), &args, &art));
  ASSERT_EQ(ferry_artifact_target_sm(art), 80);
  ferry_artifact_release(art);
  test_rm_rf(home);
}

TEST(compile_is_memoised) {
  if (!test_have_nvrtc()) return;
  char home[300];
  test_cache_home(home, sizeof home, "memo");
  const ferry_op *op = tiny_op("tiny_memo");
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 8, 8, 8);
  ferry_artifact *a = NULL, *b = NULL;
  ASSERT_OK(ferry_op_compile_for(op, &args, 90, &a));
  ASSERT_OK(ferry_op_compile_for(op, &args, 90, &b));
  ASSERT(a == b); /* the same artifact, one more reference */
  ferry_cache_stats st;
  ferry_cache_stats_get(&st);
  ASSERT_EQ(st.compiles, 1);
  ASSERT_EQ(st.memo_hits, 1);
  ferry_artifact_release(a);
  ferry_artifact_release(b);
  /* Another kind is another artifact. */
  test_args(&args, FERRY_SCALAR_F16, FERRY_SCALAR_F32, 8, 8, 8);
  ASSERT_OK(ferry_op_compile_for(op, &args, 90, &a));
  ASSERT(a != b);
  ferry_artifact_release(a);
  /* Cleared memo: the disk serves the next compile, no NVRTC. */
  ferry_ops_clear_memo();
  test_args(&args, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 8, 8, 8);
  ASSERT_OK(ferry_op_compile_for(op, &args, 90, &a));
  ferry_cache_stats_get(&st);
  ASSERT_EQ(st.compiles, 2);
  ASSERT_EQ(st.disk_hits, 1);
  ferry_artifact_release(a);
  ferry_artifact_release(NULL);
  test_rm_rf(home);
}

/* ---- every built-in design through NVRTC ------------------------------------------------------------------- */

/* A memo hit takes its reference under the memo lock, so ferry_ops_clear_memo (which drops the memo's
 * references) cannot free the artifact between the lookup and the retain: two threads compile the same kernel
 * over and over while a third clears the memo. A reference taken too late shows as a use after free under ASan,
 * or as a freed artifact's cubin handed out. */
enum { RACE_COMPILES = 20000 };
static const ferry_op *race_op;
static atomic_int race_done;

static void *race_compiler(void *unused) {
  (void)unused;
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 8, 8, 8);
  for (int i = 0; i < RACE_COMPILES; i++) {
    ferry_artifact *art = NULL;
    if (ferry_op_compile_for(race_op, &args, 80, &art) != FERRY_OK) abort();
    size_t n = 0;
    const unsigned char *cubin = ferry_artifact_cubin(art, &n);
    if (n < 4 || memcmp(cubin, "\x7f" "ELF", 4) != 0) abort();
    ferry_artifact_release(art);
  }
  atomic_fetch_add(&race_done, 1);
  return NULL;
}

TEST(compile_memo_hit_is_safe_against_clear_memo) {
  if (!test_have_nvrtc()) return;
  char home[300];
  test_cache_home(home, sizeof home, "memo_race");
  race_op = tiny_op("tiny_memo_race");
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 8, 8, 8);
  ferry_artifact *first = NULL;
  ASSERT_OK(ferry_op_compile_for(race_op, &args, 80, &first)); /* NVRTC, then on disk for the threads */
  ferry_artifact_release(first);
  pthread_t tid[2];
  for (int i = 0; i < 2; i++) ASSERT_EQ(pthread_create(&tid[i], NULL, race_compiler, NULL), 0);
  while (atomic_load(&race_done) < 2) ferry_ops_clear_memo();
  for (int i = 0; i < 2; i++) pthread_join(tid[i], NULL);
  ferry_cache_stats st;
  ferry_cache_stats_get(&st);
  ASSERT_EQ(st.compiles, 1); /* NVRTC once; every other compile came from the memo or the disk */
  ASSERT(st.memo_hits > 0);
  ferry_ops_clear_memo();
  test_rm_rf(home);
}


typedef struct build_job {
  const ferry_op *op;
  ferry_gemm_args args;
  int sm;
  ferry_status st;
  size_t cubin_size;
  char why[400];
} build_job;

static build_job build_jobs[96];
static int n_build_jobs;
static _Atomic int next_build_job;

static void *build_worker(void *unused) {
  (void)unused;
  for (int j; (j = atomic_fetch_add(&next_build_job, 1)) < n_build_jobs;) {
    build_job *b = &build_jobs[j];
    ferry_artifact *art = NULL;
    b->st = ferry_op_compile_for(b->op, &b->args, b->sm, &art);
    if (b->st == FERRY_OK) {
      const unsigned char *cubin = ferry_artifact_cubin(art, &b->cubin_size);
      if (b->cubin_size < 1000 || memcmp(cubin, "\x7f" "ELF", 4) != 0) b->st = FERRY_INTERNAL;
    } else {
      snprintf(b->why, sizeof b->why, "%s", ferry_last_error_message());
    }
    ferry_artifact_release(art);
  }
  return NULL;
}

static void add_build_job(const ferry_op *op, int sm, int in, int out, int acc, int a_col, int b_col, int c_col) {
  test_matrix a, b, c;
  const int k = in == FERRY_SCALAR_E4M3 || in == FERRY_SCALAR_I8 ? 96 : 72; /* 8-bit inputs: k a multiple of 16 */
  test_matrix_make(&a, 0x10000000, in, 0, 200, k, a_col, 0);
  test_matrix_make(&b, 0x20000000, in, 0, k, 136, b_col, 0);
  test_matrix_make(&c, 0x30000000, out, 0, 200, 136, c_col, 0);
  build_job *job = &build_jobs[n_build_jobs++];
  job->op = op;
  job->sm = sm;
  ASSERT_OK(ferry_gemm_args_init(&job->args, &a.t, &b.t, &c.t, (ferry_scalar)acc));
  ASSERT_OK(ferry_op_supports(op, &job->args, NULL, 0));
}

/* Starts a list of build jobs. */
static void build_jobs_reset(void) {
  n_build_jobs = 0;
  atomic_store(&next_build_job, 0);
}

/* Compiles the listed jobs on this thread; each must succeed (its NVRTC log printed if not). */
static void build_jobs_run_all(void) {
  build_worker(NULL);
  for (int j = 0; j < n_build_jobs; j++) {
    if (build_jobs[j].st != FERRY_OK) fprintf(stderr, "  job %d: %s\n", j, build_jobs[j].why);
    ASSERT_OK(build_jobs[j].st);
  }
}

/* Every built-in operator compiles for `sm` in the all-row-major kind of its own type; or (`layouts`) the swizzled
 * designs in the other kinds their source branches on: column-major throughout with an fp32 output (.trans
 * fragments, element epilogue), A row-major with B column-major, and fp16 accumulators. Fresh cache: every one
 * goes through NVRTC (several seconds each for the swizzled designs, hence two tests). */
static void compile_every_builtin(int sm, int layouts) {
  if (!test_have_nvrtc()) return;
  char home[300];
  test_cache_home(home, sizeof home, layouts ? "layouts" : sm == 80 ? "every80" : "every90");
  build_jobs_reset();
  int designs = 0;
  for (size_t i = 0; i < ferry_ops_count(); i++) {
    const ferry_op *op = ferry_ops_get(i);
    const ferry_op_info *info = ferry_op_info_get(op);
    if (!info->builtin) continue;
    designs++;
    if (info->min_sm > sm) continue; /* the wgmma design is sm_90a code: not compiled for sm_80 */
    int in = info->a_types & FERRY_SCALAR_BIT(FERRY_SCALAR_BF16) ? FERRY_SCALAR_BF16
             : info->a_types & FERRY_SCALAR_BIT(FERRY_SCALAR_F16) ? FERRY_SCALAR_F16 : FERRY_SCALAR_F32;
    if (info->a_types & FERRY_SCALARS_FP8) {
      /* 8-bit inputs: A row-major, B column-major only; FP8 into bf16, int8 into exact int32 */
      if (!layouts) add_build_job(op, sm, FERRY_SCALAR_E4M3, FERRY_SCALAR_BF16, FERRY_SCALAR_F32, 0, 1, 0);
      continue;
    }
    if (info->a_types & FERRY_SCALAR_BIT(FERRY_SCALAR_I8)) {
      if (!layouts) add_build_job(op, sm, FERRY_SCALAR_I8, FERRY_SCALAR_I32, FERRY_SCALAR_I32, 0, 1, 0);
      continue;
    }
    if (!layouts) {
      add_build_job(op, sm, in, in, FERRY_SCALAR_F32, 0, 0, 0);
    } else if (strstr(info->name, "_swz")) {
      add_build_job(op, sm, in, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 1, 1, 1);
      add_build_job(op, sm, in, in, in == FERRY_SCALAR_F16 ? FERRY_SCALAR_F16 : FERRY_SCALAR_F32, 0, 1, 0);
    }
  }
  /* 2 × (7 gemm_mma + 4 gemm_mma_sw + 6 gemm_wgmma) for fp16 and bf16, 6 gemm_mma + 4 gemm_wgmma for FP8 (no
   * 256-wide tile), 6 gemm_mma + 6 gemm_wgmma for int8, SIMT */
  ASSERT_EQ(designs, 57);
  pthread_t threads[4];
  int started = 0;
  for (; started < 4; started++)
    if (pthread_create(&threads[started], NULL, build_worker, NULL) != 0) break;
  if (!started) build_worker(NULL);
  for (int i = 0; i < started; i++) pthread_join(threads[i], NULL);
  int failed = 0;
  for (int j = 0; j < n_build_jobs; j++) {
    const build_job *b = &build_jobs[j];
    if (b->st != FERRY_OK) {
      fprintf(stderr, "  %s (kind 0x%03x) for sm_%d: %s %s\n", ferry_op_info_get(b->op)->name, b->args.problem.kind,
              sm, ferry_status_name(b->st), b->why);
      failed++;
    }
  }
  ASSERT_EQ(failed, 0);
  ferry_cache_stats st;
  ferry_cache_stats_get(&st);
  ASSERT_EQ(st.compiles, (uint64_t)n_build_jobs);
  fprintf(stderr, "  %d NVRTC compiles for sm_%d in %.1f s of compile time\n", n_build_jobs, sm, st.compile_seconds);
  test_rm_rf(home);
}

TEST(compile_every_builtin_design_for_sm80) { compile_every_builtin(80, 0); }
TEST(compile_every_builtin_design_for_sm90) { compile_every_builtin(90, 0); }
TEST(compile_swizzled_designs_in_every_layout_for_sm90) { compile_every_builtin(90, 1); }

/* gemm_wgmma.cu: registered by default (FERRY_WGMMA is read when the registry first fills, which in this test's own
 * process is now), found only for sm_90 and ranked first there, compiled by NVRTC for sm_90a in every layout its
 * source branches on. */
TEST(wgmma_design_by_default_for_sm90a_only) {
  unsetenv("FERRY_WGMMA");
  unsetenv("FERRY_EXPERIMENTAL_DESIGNS");
  const ferry_op *op = ferry_op_by_name("gemm_wgmma_bf16_128x256x64_s4");
  ASSERT(op != NULL);
  ASSERT(ferry_op_by_name("gemm_wgmma_bf16_128x256x64_s4_persistent") == NULL); /* only when asked for */
  const ferry_op_info *info = ferry_op_info_get(op);
  ASSERT(!strcmp(info->instruction, "wgmma.m64n256k16"));
  ASSERT_EQ(info->min_sm, 90);
  ASSERT_EQ(info->threads, 256);
  ASSERT_EQ(info->smem_bytes, 4 * (128 + 256) * 64 * 2 + 1024);
  ASSERT_EQ(info->acc_types, FERRY_SCALAR_BIT(FERRY_SCALAR_F32));
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_BF16, FERRY_SCALAR_BF16, 4096, 4096, 4096);
  const ferry_op *ops[32];
  size_t n = 0;
  ASSERT_OK(ferry_ops_find(&args, 90, NULL, NULL, ops, 32, &n));
  ASSERT_EQ(n, 18);
  /* right behind the same tile with TMA copies (181.8 against 196.7 µs at 4096³ on an H100); the any-alignment
   * design and SIMT last */
  ASSERT(ops[0] == ferry_op_by_name("gemm_wgmma_bf16_128x256x64_s4_tma"));
  ASSERT(ops[1] == op);
  ASSERT(!strcmp(ferry_op_info_get(ops[n - 2])->name, "gemm_mma_bf16_64x64x32_s2_align2"));
  ASSERT_OK(ferry_ops_find(&args, 100, NULL, NULL, ops, 32, &n)); /* sm_90a code: not for sm_100 */
  for (size_t i = 0; i < n; i++) ASSERT(ops[i] != op);
  ASSERT_OK(ferry_ops_find(&args, 80, NULL, NULL, ops, 32, &n));
  for (size_t i = 0; i < n; i++) ASSERT(ops[i] != op);
  if (!test_have_nvrtc()) return;
  char home[300];
  test_cache_home(home, sizeof home, "wgmma");
  build_jobs_reset();
  const ferry_op *f16 = ferry_op_by_name("gemm_wgmma_f16_128x256x64_s4");
  ASSERT(f16 != NULL);
  add_build_job(op, 90, FERRY_SCALAR_BF16, FERRY_SCALAR_BF16, FERRY_SCALAR_F32, 0, 0, 0);
  add_build_job(op, 90, FERRY_SCALAR_BF16, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 1, 1, 1);
  add_build_job(f16, 90, FERRY_SCALAR_F16, FERRY_SCALAR_F16, FERRY_SCALAR_F32, 0, 1, 0);
  add_build_job(f16, 90, FERRY_SCALAR_F16, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 1, 0, 0);
  build_jobs_run_all();
  /* the options name the "a" target */
  char arch[32];
  const char *opts[8];
  ferry__op_options(op, 90, arch, opts);
  ASSERT(!strcmp(arch, "--gpu-architecture=sm_90a"));
  ferry__op_options(ferry_op_by_name("gemm_mma_bf16_128x256x64_s3_swz"), 90, arch, opts);
  ASSERT(!strcmp(arch, "--gpu-architecture=sm_90"));
  /* any other target is refused with the source's own reason */
  ferry_artifact *art = NULL;
  test_args(&args, FERRY_SCALAR_BF16, FERRY_SCALAR_BF16, 256, 256, 256);
  ASSERT_STATUS(ferry_op_compile_for(op, &args, 100, &art), FERRY_COMPILE_FAILED);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "needs the sm_90a target");
  test_rm_rf(home);
}

/* gemm_wgmma.cu's persistent schedule: its 128×256 design absent unless FERRY_EXPERIMENTAL_DESIGNS=1 (read when the
 * registry first fills: in this test's own process, now), then found for sm_90 alone, behind the plain schedule, the
 * TMA designs and the 128×256 cluster design, ahead of the 128×128 cluster design, at 4096³ (203.0 against 199.3 µs
 * on the H200; on an H100 TMA 182.8 and 194.7 µs, the cluster designs 184.1 and 217.5 µs), with its copying
 * warpgroup's threads and its shared memory (stages,
 * the epilogue's own space, the mbarriers, the alignment slack); compiled by NVRTC for sm_90a in the layouts and input
 * types its source branches on, FP8's promoted sums in the 128×128 design (registered by default) among them. */
TEST(wgmma_persistent_design_only_when_asked) {
  unsetenv("FERRY_WGMMA");
  setenv("FERRY_EXPERIMENTAL_DESIGNS", "1", 1);
  const ferry_op *op = ferry_op_by_name("gemm_wgmma_bf16_128x256x64_s4_persistent");
  ASSERT(op != NULL);
  const ferry_op_info *info = ferry_op_info_get(op);
  ASSERT(!strcmp(info->instruction, "wgmma.m64n256k16"));
  ASSERT_EQ(info->min_sm, 90);
  ASSERT_EQ(info->threads, 384);
  ASSERT_EQ(info->smem_bytes, 4 * (128 + 256) * 64 * 2 + 8 * 16 * 40 * 4 + 2 * 4 * 8 + 1024);
  ASSERT(info->smem_bytes <= 227 * 1024);
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_BF16, FERRY_SCALAR_BF16, 4096, 4096, 4096);
  const ferry_op *ops[32];
  size_t n = 0;
  ASSERT_OK(ferry_ops_find(&args, 90, NULL, NULL, ops, 32, &n));
  ASSERT_EQ(n, 21); /* the default 18, this one and the two cluster designs */
  ASSERT(ops[0] == ferry_op_by_name("gemm_wgmma_bf16_128x256x64_s4_tma"));
  ASSERT(ops[1] == ferry_op_by_name("gemm_wgmma_bf16_128x256x64_s4_tma_cluster2"));
  ASSERT(ops[2] == ferry_op_by_name("gemm_wgmma_bf16_128x256x64_s4"));
  ASSERT(ops[3] == ferry_op_by_name("gemm_wgmma_bf16_128x128x64_s6_tma"));
  ASSERT(ops[4] == op);
  const ferry_op *square_cluster = ferry_op_by_name("gemm_wgmma_bf16_128x128x64_s6_tma_cluster2");
  size_t square_at = n;
  for (size_t i = 0; i < n; i++)
    if (ops[i] == square_cluster) square_at = i;
  ASSERT(square_at > 4 && square_at < n);
  ASSERT_OK(ferry_ops_find(&args, 80, NULL, NULL, ops, 32, &n));
  for (size_t i = 0; i < n; i++) ASSERT(ops[i] != op);
  /* not for FP8 at 256 wide: its sums are promoted to fp32 each k-tile, and such a tile has no registers for that;
   * the 128-wide persistent design (registered by default) takes FP8 */
  ASSERT(ferry_op_by_name("gemm_wgmma_fp8_128x256x128_s4_persistent") == NULL);
  const ferry_op *fp8 = ferry_op_by_name("gemm_wgmma_fp8_128x128x128_s6_persistent");
  ASSERT(fp8 != NULL);
  const ferry_op *i8 = ferry_op_by_name("gemm_wgmma_i8_128x256x128_s4_persistent");
  const ferry_op *f16 = ferry_op_by_name("gemm_wgmma_f16_128x256x64_s4_persistent");
  ASSERT(i8 != NULL && f16 != NULL);
  if (!test_have_nvrtc()) return;
  char home[300];
  test_cache_home(home, sizeof home, "wgmma_persistent");
  build_jobs_reset();
  add_build_job(op, 90, FERRY_SCALAR_BF16, FERRY_SCALAR_BF16, FERRY_SCALAR_F32, 0, 0, 0);
  add_build_job(op, 90, FERRY_SCALAR_BF16, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 1, 1, 1);
  add_build_job(f16, 90, FERRY_SCALAR_F16, FERRY_SCALAR_F16, FERRY_SCALAR_F32, 0, 1, 0);
  add_build_job(f16, 90, FERRY_SCALAR_F16, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 1, 0, 0);
  add_build_job(i8, 90, FERRY_SCALAR_I8, FERRY_SCALAR_I32, FERRY_SCALAR_I32, 0, 1, 0);
  add_build_job(fp8, 90, FERRY_SCALAR_E4M3, FERRY_SCALAR_BF16, FERRY_SCALAR_F32, 0, 1, 0);
  build_jobs_run_all();
  char arch[32];
  const char *opts[8];
  ferry__op_options(op, 90, arch, opts);
  ASSERT(!strcmp(arch, "--gpu-architecture=sm_90a"));
  test_rm_rf(home);
}

/* The TMA schedule in clusters of two: registered only with FERRY_EXPERIMENTAL_DESIGNS=1 (measured no faster than
 * the TMA designs at 4096³), for sm_90 alone, with the TMA designs' threads and shared memory; compiled by NVRTC for
 * sm_90a in every operand layout (B's share is rows of a K-major box or panels of an MN-major one) and in 8-bit
 * inputs. */
TEST(wgmma_cluster_designs_only_when_asked) {
  unsetenv("FERRY_WGMMA");
  setenv("FERRY_EXPERIMENTAL_DESIGNS", "1", 1);
  const ferry_op *op = ferry_op_by_name("gemm_wgmma_bf16_128x256x64_s4_tma_cluster2");
  const ferry_op *square = ferry_op_by_name("gemm_wgmma_bf16_128x128x64_s6_tma_cluster2");
  const ferry_op *fp8 = ferry_op_by_name("gemm_wgmma_fp8_128x128x128_s6_tma_cluster2");
  const ferry_op *i8 = ferry_op_by_name("gemm_wgmma_i8_128x256x128_s4_tma_cluster2");
  ASSERT(op && square && fp8 && i8);
  ASSERT(ferry_op_by_name("gemm_wgmma_fp8_128x256x128_s4_tma_cluster2") == NULL); /* FP8 sums: 128 wide at most */
  const ferry_op_info *info = ferry_op_info_get(op);
  ASSERT_EQ(info->min_sm, 90);
  ASSERT_EQ(info->threads, 384);
  ASSERT_EQ(info->smem_bytes, ferry_op_info_get(ferry_op_by_name("gemm_wgmma_bf16_128x256x64_s4_tma"))->smem_bytes);
  if (!test_have_nvrtc()) return;
  char home[300];
  test_cache_home(home, sizeof home, "wgmma_cluster");
  build_jobs_reset();
  for (int layout = 0; layout < 4; layout++) {
    add_build_job(op, 90, FERRY_SCALAR_BF16, FERRY_SCALAR_BF16, FERRY_SCALAR_F32, layout & 1, layout >> 1, 0);
    add_build_job(square, 90, FERRY_SCALAR_BF16, FERRY_SCALAR_F32, FERRY_SCALAR_F32, layout & 1, layout >> 1, 1);
  }
  add_build_job(fp8, 90, FERRY_SCALAR_E4M3, FERRY_SCALAR_BF16, FERRY_SCALAR_F32, 0, 1, 0);
  add_build_job(i8, 90, FERRY_SCALAR_I8, FERRY_SCALAR_I32, FERRY_SCALAR_I32, 0, 1, 0);
  build_jobs_run_all();
  unsetenv("FERRY_EXPERIMENTAL_DESIGNS");
  test_rm_rf(home);
}

/* The persistent schedule with TMA copies: registered by default (unless FERRY_WGMMA=0), for sm_90 alone, with the
 * persistent schedule's threads and shared memory; compiled by NVRTC for sm_90a in every operand layout (the boxes
 * differ for K- and MN-major operands) and in 8-bit inputs. */
TEST(wgmma_tma_designs_by_default) {
  unsetenv("FERRY_WGMMA");
  unsetenv("FERRY_EXPERIMENTAL_DESIGNS");
  const ferry_op *op = ferry_op_by_name("gemm_wgmma_bf16_128x256x64_s4_tma");
  const ferry_op *square = ferry_op_by_name("gemm_wgmma_bf16_128x128x64_s6_tma");
  const ferry_op *fp8 = ferry_op_by_name("gemm_wgmma_fp8_128x128x128_s6_tma");
  const ferry_op *i8 = ferry_op_by_name("gemm_wgmma_i8_128x256x128_s4_tma");
  ASSERT(op != NULL && square != NULL && fp8 != NULL && i8 != NULL);
  ASSERT(ferry_op_by_name("gemm_wgmma_fp8_128x256x128_s4_tma") == NULL); /* promoted FP8 sums: 128 wide at most */
  const ferry_op_info *info = ferry_op_info_get(op);
  ASSERT_EQ(info->min_sm, 90);
  ASSERT_EQ(info->threads, 384);
  ASSERT_EQ(info->smem_bytes, 4 * (128 + 256) * 64 * 2 + 8 * 16 * 40 * 4 + 2 * 4 * 8 + 1024); /* as persistent */
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_BF16, FERRY_SCALAR_BF16, 4096, 4096, 4096);
  const ferry_op *ops[32];
  size_t n = 0;
  ASSERT_OK(ferry_ops_find(&args, 90, NULL, NULL, ops, 32, &n));
  ASSERT(ops[0] == op);
  ASSERT_OK(ferry_ops_find(&args, 80, NULL, NULL, ops, 32, &n));
  for (size_t i = 0; i < n; i++) ASSERT(ops[i] != op && ops[i] != square);
  if (!test_have_nvrtc()) return;
  char home[300];
  test_cache_home(home, sizeof home, "wgmma_tma");
  build_jobs_reset();
  for (int majors = 0; majors < 4; majors++)
    add_build_job(op, 90, FERRY_SCALAR_BF16, FERRY_SCALAR_BF16, FERRY_SCALAR_F32, majors & 1, majors >> 1, 0);
  add_build_job(square, 90, FERRY_SCALAR_BF16, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 1, 0, 1);
  add_build_job(fp8, 90, FERRY_SCALAR_E4M3, FERRY_SCALAR_BF16, FERRY_SCALAR_F32, 0, 1, 0);
  add_build_job(i8, 90, FERRY_SCALAR_I8, FERRY_SCALAR_I32, FERRY_SCALAR_I32, 0, 1, 0);
  build_jobs_run_all();
  test_rm_rf(home);
}

/* The m <= 64 wgmma design (one warpgroup, 64×64 tiles, 8 stages), registered by default: first for a decode step
 * on sm_90 (16×8192×8192: 128 tiles; 36.9 µs on the H200 against the 16×64 mma.sync design's 41.9), behind the
 * 128×256 designs at 4096³; compiled for sm_90a in the layouts and input types its source branches on (m64n64k16,
 * and k32 for 8-bit inputs). */
TEST(wgmma_decode_design_by_default) {
  unsetenv("FERRY_WGMMA");
  unsetenv("FERRY_EXPERIMENTAL_DESIGNS");
  const ferry_op *op = ferry_op_by_name("gemm_wgmma_bf16_64x64x64_s8");
  ASSERT(op != NULL);
  const ferry_op_info *info = ferry_op_info_get(op);
  ASSERT(!strcmp(info->instruction, "wgmma.m64n64k16"));
  ASSERT_EQ(info->threads, 128);
  ASSERT_EQ(info->smem_bytes, 8 * (64 + 64) * 64 * 2 + 1024);
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_BF16, FERRY_SCALAR_BF16, 16, 8192, 8192);
  const ferry_op *ops[32];
  size_t n = 0;
  ASSERT_OK(ferry_ops_find(&args, 90, NULL, NULL, ops, 32, &n));
  ASSERT(n > 1 && ops[0] == op);
  test_args(&args, FERRY_SCALAR_BF16, FERRY_SCALAR_BF16, 4096, 4096, 4096);
  ASSERT_OK(ferry_ops_find(&args, 90, NULL, NULL, ops, 32, &n));
  ASSERT(ops[0] != op && ops[1] != op);
  const ferry_op *fp8 = ferry_op_by_name("gemm_wgmma_fp8_64x64x128_s8");
  const ferry_op *i8 = ferry_op_by_name("gemm_wgmma_i8_64x64x128_s8");
  const ferry_op *f16 = ferry_op_by_name("gemm_wgmma_f16_64x64x64_s8");
  ASSERT(fp8 != NULL && i8 != NULL && f16 != NULL);
  if (!test_have_nvrtc()) return;
  char home[300];
  test_cache_home(home, sizeof home, "wgmma_decode");
  build_jobs_reset();
  add_build_job(op, 90, FERRY_SCALAR_BF16, FERRY_SCALAR_BF16, FERRY_SCALAR_F32, 0, 1, 0);
  add_build_job(op, 90, FERRY_SCALAR_BF16, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 1, 0, 1);
  add_build_job(f16, 90, FERRY_SCALAR_F16, FERRY_SCALAR_F16, FERRY_SCALAR_F32, 0, 0, 0);
  add_build_job(fp8, 90, FERRY_SCALAR_E4M3, FERRY_SCALAR_BF16, FERRY_SCALAR_F32, 0, 1, 0);
  add_build_job(i8, 90, FERRY_SCALAR_I8, FERRY_SCALAR_I32, FERRY_SCALAR_I32, 0, 1, 0);
  build_jobs_run_all();
  test_rm_rf(home);
}

TEST(wgmma_design_absent_when_turned_off) {
  setenv("FERRY_WGMMA", "0", 1);
  setenv("FERRY_EXPERIMENTAL_DESIGNS", "1", 1); /* no wgmma at all, in either schedule */
  ASSERT(ferry_op_by_name("gemm_wgmma_bf16_128x256x64_s4_persistent") == NULL);
  ASSERT(ferry_op_by_name("gemm_wgmma_fp8_128x128x128_s6_persistent") == NULL);
  ASSERT(ferry_op_by_name("gemm_wgmma_bf16_128x256x64_s4") == NULL);
  ASSERT(ferry_op_by_name("gemm_wgmma_bf16_128x256x64_s4_tma") == NULL);
  ASSERT(ferry_op_by_name("gemm_mma_bf16_128x256x64_s4_swz") != NULL);
}

TEST(compile_refuses_old_targets_and_unsupported_args) {
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F16, FERRY_SCALAR_F16, 64, 64, 64);
  ferry_artifact *art = NULL;
  const ferry_op *mma = ferry_op_by_name("gemm_mma_f16_64x64x32_s3");
  ASSERT_STATUS(ferry_op_compile_for(mma, &args, 75, &art), FERRY_UNSUPPORTED);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "needs sm_80 or newer; the target is sm_75");
  const ferry_op *bf = ferry_op_by_name("gemm_mma_bf16_64x64x32_s3");
  ASSERT_STATUS(ferry_op_compile_for(bf, &args, 90, &art), FERRY_UNSUPPORTED);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "operand A: expected bf16, got fp16");
  ASSERT_STATUS(ferry_op_compile_for(mma, &args, 90, NULL), FERRY_INVALID_ARGUMENT);
  ASSERT_STATUS(ferry_op_compile_for(NULL, &args, 90, &art), FERRY_INVALID_ARGUMENT);
  ASSERT(art == NULL);
  if (!test_have_nvrtc()) return;
  ASSERT_STATUS(ferry_op_compile_for(mma, &args, 91, &art), FERRY_UNSUPPORTED); /* no such chip */
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "cannot compile for sm_91");
}

TEST(compile_error_reports_the_nvrtc_log) {
  if (!test_have_nvrtc()) return;
  char home[300];
  test_cache_home(home, sizeof home, "bad");
  ferry_op_desc d;
  ferry_op_desc_init(&d);
  d.info.name = "broken";
  d.source = "extern \"C\" __global__ void broken(ferry_gemm_params p) { undeclared_thing(p); }\n";
  d.entry = "broken";
  const ferry_op *op = NULL;
  ASSERT_OK(ferry_op_register(&d, &op));
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 8, 8, 8);
  ferry_artifact *art = NULL;
  ASSERT_STATUS(ferry_op_compile_for(op, &args, 90, &art), FERRY_COMPILE_FAILED);
  ASSERT(art == NULL);
  ASSERT_STR_CONTAINS(ferry_last_error()->call, "nvrtcCompileProgram");
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "NVRTC_ERROR_COMPILATION");
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "undeclared_thing");
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "operator broken for sm_90");
  test_rm_rf(home);
}

TEST(nvrtc_absent_is_a_clear_error) {
  setenv("FERRY_NVRTC", "/nonexistent/libnvrtc.so", 1);
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 8, 8, 8);
  ferry_artifact *art = NULL;
  ASSERT_STATUS(ferry_op_compile_for(ferry_op_by_name("gemm_simt_64x64x16"), &args, 90, &art), FERRY_NO_COMPILER);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "/nonexistent/libnvrtc.so");
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "FERRY_NVRTC");
}

TEST(run_through_fake_driver_lays_out_the_launch) {
  if (!test_have_nvrtc()) return;
  char home[300];
  test_cache_home(home, sizeof home, "run");
  unsetenv("FERRY_ARCH");
  fake_driver_use();
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F16, FERRY_SCALAR_F32, 129, 200, 72);
  args.alpha = 2.0f;
  args.beta = 0.5f;
  const ferry_op *op = ferry_op_by_name("gemm_mma_f16_64x64x32_s3");
  ASSERT_OK(ferry_op_supports(op, &args, NULL, 0));
  ferry_artifact *art = NULL;
  ASSERT_OK(ferry_op_compile(op, &args, &art));
  ASSERT_EQ(fake_live_libraries, 1); /* loaded at compile: the fake device is the target, sm_90 */
  void *stream = (void *)0x5100;
  ASSERT_OK(ferry_op_run(op, &args, stream, art, FERRY_RUN_ASSUME_SUPPORTED));
  ASSERT_EQ(fake_launches, 1);
  ASSERT_EQ(fake_last_launch.grid_x, 3 * 4); /* ceil(129/64) × ceil(200/64) */
  ASSERT_EQ(fake_last_launch.grid_z, 1);
  ASSERT_EQ(fake_last_launch.block, 128);
  ASSERT_EQ(fake_last_launch.smem, 3 * (64 * 40 + 32 * 72) * 2);
  ferry_gemm_params p;
  memcpy(&p, fake_last_launch.params, sizeof p);
  ASSERT(p.a == args.a && p.b == args.b && p.out == args.out);
  ASSERT_EQ(p.m, 129);
  ASSERT_EQ(p.n, 200);
  ASSERT_EQ(p.k, 72);
  ASSERT_EQ(p.lda, 72);
  ASSERT_EQ(p.ldb, 200);
  ASSERT_EQ(p.ldc, 200);
  ASSERT(p.alpha == 2.0f && p.beta == 0.5f);
  ASSERT_EQ(p.kind, args.problem.kind);
  /* the checked path launches the same */
  ASSERT_OK(ferry_op_run(op, &args, stream, art, 0));
  ASSERT_EQ(fake_launches, 2);
  /* an empty problem launches nothing */
  ferry_gemm_args empty;
  test_args(&empty, FERRY_SCALAR_F16, FERRY_SCALAR_F32, 0, 200, 72);
  ASSERT_OK(ferry_op_run(op, &empty, stream, art, 0));
  ASSERT_EQ(fake_launches, 2);
  ferry_artifact_release(art);
  ferry_ops_clear_memo();
  ASSERT_EQ(fake_live_libraries, 0);
  test_rm_rf(home);
}

TEST(run_swizzled_design_lays_out_the_launch) {
  if (!test_have_nvrtc()) return;
  char home[300];
  test_cache_home(home, sizeof home, "runswz");
  unsetenv("FERRY_ARCH");
  fake_driver_use();
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_BF16, FERRY_SCALAR_BF16, 4096, 4096, 4096);
  const ferry_op *op = ferry_op_by_name("gemm_mma_bf16_128x256x64_s3_swz");
  ferry_artifact *art = NULL;
  ASSERT_OK(ferry_op_compile(op, &args, &art));
  ASSERT_OK(ferry_op_run(op, &args, (void *)0x5100, art, 0));
  ASSERT_EQ(fake_last_launch.grid_x, 32 * 16); /* 4096/128 × 4096/256 */
  ASSERT_EQ(fake_last_launch.grid_z, 1);
  ASSERT_EQ(fake_last_launch.block, 256);
  ASSERT_EQ(fake_last_launch.smem, 3 * (128 + 256) * 64 * 2); /* above 48 KB: the limit was raised at load */
  ferry_artifact_release(art);
  op = ferry_op_by_name("gemm_mma_bf16_128x128x64_s3_swz");
  ASSERT_OK(ferry_op_compile(op, &args, &art));
  ASSERT_OK(ferry_op_run(op, &args, (void *)0x5100, art, 0));
  ASSERT_EQ(fake_last_launch.grid_x, 32 * 32);
  ASSERT_EQ(fake_last_launch.block, 128);
  ASSERT_EQ(fake_last_launch.smem, 3 * 256 * 64 * 2);
  ferry_artifact_release(art);
  ferry_ops_clear_memo();
  test_rm_rf(home);
}

/* The persistent schedule's launch: at most a block per multiprocessor (the fake device has an H200's 132), all
 * batches in one row of blocks, 384 threads; fewer tiles than multiprocessors, a block per tile. */
TEST(run_persistent_design_launches_a_block_per_multiprocessor) {
  if (!test_have_nvrtc()) return;
  char home[300];
  test_cache_home(home, sizeof home, "runpersistent");
  unsetenv("FERRY_ARCH");
  unsetenv("FERRY_WGMMA");
  setenv("FERRY_EXPERIMENTAL_DESIGNS", "1", 1);
  fake_driver_use();
  const ferry_op *op = ferry_op_by_name("gemm_wgmma_bf16_128x256x64_s4_persistent");
  ASSERT(op != NULL);
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_BF16, FERRY_SCALAR_BF16, 4096, 4096, 4096);
  ferry_artifact *art = NULL;
  ASSERT_OK(ferry_op_compile(op, &args, &art));
  ASSERT_OK(ferry_op_run(op, &args, (void *)0x5100, art, 0));
  ASSERT_EQ(fake_last_launch.grid_x, 132); /* 512 tiles */
  ASSERT_EQ(fake_last_launch.grid_z, 1);
  ASSERT_EQ(fake_last_launch.block, 384);
  ASSERT_EQ(fake_last_launch.smem, ferry_op_info_get(op)->smem_bytes);
  test_args(&args, FERRY_SCALAR_BF16, FERRY_SCALAR_BF16, 300, 600, 64); /* 3 × 3 tiles */
  ASSERT_OK(ferry_op_run(op, &args, (void *)0x5100, art, 0));
  ASSERT_EQ(fake_last_launch.grid_x, 9);
  ASSERT_EQ(fake_last_launch.grid_z, 1);
  ferry_artifact_release(art);
  /* a kernel given less than the block's share of registers would hang in its hand-over: refused before launch */
  ferry_ops_clear_memo();
  fake_kernel_registers = 160;
  const int launches = fake_launches;
  ASSERT_OK(ferry_op_compile(op, &args, &art));
  ASSERT_STATUS(ferry_op_run(op, &args, (void *)0x5100, art, 0), FERRY_COMPILE_FAILED);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "compiled with 160 registers a thread; its warpgroups' register "
                      "hand-over needs the block's whole share, 168");
  ASSERT_EQ(fake_launches, launches);
  fake_kernel_registers = 168;
  ferry_artifact_release(art);
  ferry_ops_clear_memo();
  test_rm_rf(home);
}

/* A TMA design's launch carries the operands' tensor maps as its second parameter, encoded per launch: 2-byte
 * elements (8-bit operands as pairs along k), the contiguous dimension first, byte strides, boxes of 64 elements
 * by the tile's rows (K-major) or by 64 rows of k (MN-major), 128-byte swizzle, the batch as dimension 2 (one for
 * a broadcast operand); a graph's update re-encodes them for its new operands. */
static void check_map(const fake_tensor_map *t, uintptr_t address, uint64_t d0, uint64_t d1, uint64_t d2,
                      uint64_t s0, uint64_t s1, unsigned box_rows) {
  ASSERT_EQ(t->address, (unsigned long long)address);
  ASSERT_EQ(t->rank, 3);
  ASSERT_EQ(t->data_type, CU_TENSOR_MAP_DATA_TYPE_UINT16);
  ASSERT_EQ(t->swizzle, CU_TENSOR_MAP_SWIZZLE_128B);
  ASSERT_EQ(t->dims[0], d0);
  ASSERT_EQ(t->dims[1], d1);
  ASSERT_EQ(t->dims[2], d2);
  ASSERT_EQ(t->strides[0], s0);
  ASSERT_EQ(t->strides[1], s1);
  ASSERT_EQ(t->box[0], 64);
  ASSERT_EQ(t->box[1], box_rows);
  ASSERT_EQ(t->box[2], 1);
}

TEST(run_tma_design_passes_the_operands_tensor_maps) {
  if (!test_have_nvrtc()) return;
  char home[300];
  test_cache_home(home, sizeof home, "runtma");
  unsetenv("FERRY_ARCH");
  unsetenv("FERRY_WGMMA");
  fake_driver_use();
  const ferry_op *op = ferry_op_by_name("gemm_wgmma_bf16_128x256x64_s4_tma");
  ASSERT(op != NULL);
  /* A 300×72 row-major (K-major: boxes of 128 rows), B 72×600 row-major (N-major: boxes of 64 rows of k) */
  test_matrix a, b, c;
  test_matrix_make(&a, 0x10000000, FERRY_SCALAR_BF16, 0, 300, 72, 0, 80);
  test_matrix_make(&b, 0x20000000, FERRY_SCALAR_BF16, 0, 72, 600, 0, 0);
  test_matrix_make(&c, 0x30000000, FERRY_SCALAR_BF16, 0, 300, 600, 0, 0);
  ferry_gemm_args args;
  ASSERT_OK(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32));
  ferry_artifact *art = NULL;
  ASSERT_OK(ferry_op_compile(op, &args, &art));
  const int encoded = fake_tensor_maps_encoded;
  ASSERT_OK(ferry_op_run(op, &args, (void *)0x5100, art, 0));
  ASSERT_EQ(fake_tensor_maps_encoded, encoded + 2);
  ASSERT_EQ(fake_last_launch.grid_x, 9); /* 3 × 3 tiles */
  check_map(&fake_last_launch.maps[0], 0x10000000, 72, 300, 1, 160, 160, 128);
  check_map(&fake_last_launch.maps[1], 0x20000000, 600, 72, 1, 1200, 1200, 64);
  /* an encoding the driver refuses (B's, the second) is the run's error, named, with nothing launched */
  const int launches = fake_launches;
  ferry__fault_arm("cuTensorMapEncodeTiled", 2, CUDA_ERROR_INVALID_VALUE);
  ASSERT_STATUS(ferry_op_run(op, &args, (void *)0x5100, art, 0), FERRY_DRIVER_ERROR);
  ferry__fault_disarm();
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "encoding the tensor map of operand B");
  ASSERT_STR_CONTAINS(ferry_last_error()->call, "cuTensorMapEncodeTiled");
  ASSERT_EQ(fake_launches, launches);
  ASSERT_OK(ferry_op_run(op, &args, (void *)0x5100, art, 0));
  ASSERT_EQ(fake_launches, launches + 1);
  /* captured in a graph, then updated to operands elsewhere: the node's maps are the new operands' */
  ferry_graph *g = NULL;
  ASSERT_OK(ferry_graph_begin((void *)0x5200, &g));
  ASSERT_OK(ferry_graph_run(g, op, &args, art, 0, NULL));
  ASSERT_OK(ferry_graph_end(g));
  check_map(&fake_exec_node(ferry__test_graph_exec(g), 0)->maps[0], 0x10000000, 72, 300, 1, 160, 160, 128);
  test_matrix_make(&a, 0x40000000, FERRY_SCALAR_BF16, 0, 300, 72, 0, 88);
  test_matrix_make(&b, 0x50000000, FERRY_SCALAR_BF16, 0, 72, 600, 0, 0);
  ASSERT_OK(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32));
  ASSERT_OK(ferry_graph_update(g, 0, &args));
  check_map(&fake_exec_node(ferry__test_graph_exec(g), 0)->maps[0], 0x40000000, 72, 300, 1, 176, 176, 128);
  check_map(&fake_exec_node(ferry__test_graph_exec(g), 0)->maps[1], 0x50000000, 600, 72, 1, 1200, 1200, 64);
  ferry_graph_destroy(g);
  ferry_artifact_release(art);
  /* batches of 3: A column-major (M-major: 64 rows of k), B column-major (K-major: 256 rows), B broadcast */
  test_matrix_make(&a, 0x10000000, FERRY_SCALAR_BF16, 3, 300, 72, 1, 304);
  test_matrix_make(&b, 0x20000000, FERRY_SCALAR_BF16, 0, 72, 600, 1, 0);
  test_matrix_make(&c, 0x30000000, FERRY_SCALAR_BF16, 3, 300, 600, 0, 0);
  ASSERT_OK(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32));
  ASSERT_OK(ferry_op_compile(op, &args, &art));
  ASSERT_OK(ferry_op_run(op, &args, (void *)0x5100, art, 0));
  check_map(&fake_last_launch.maps[0], 0x10000000, 300, 72, 3, 608, 608 * 72, 64);
  check_map(&fake_last_launch.maps[1], 0x20000000, 72, 600, 1, 144, 144, 256);
  ferry_artifact_release(art);
  /* FP8: k counted in pairs (96 values: 48 pairs), strides in bytes */
  const ferry_op *fp8 = ferry_op_by_name("gemm_wgmma_fp8_128x128x128_s6_tma");
  ASSERT(fp8 != NULL);
  test_matrix_make(&a, 0x10000000, FERRY_SCALAR_E4M3, 0, 200, 96, 0, 0);
  test_matrix_make(&b, 0x20000000, FERRY_SCALAR_E4M3, 0, 96, 136, 1, 0);
  test_matrix_make(&c, 0x30000000, FERRY_SCALAR_BF16, 0, 200, 136, 0, 0);
  ASSERT_OK(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32));
  ASSERT_OK(ferry_op_compile(fp8, &args, &art));
  ASSERT_OK(ferry_op_run(fp8, &args, (void *)0x5100, art, 0));
  check_map(&fake_last_launch.maps[0], 0x10000000, 48, 200, 1, 96, 96, 128);
  check_map(&fake_last_launch.maps[1], 0x20000000, 48, 136, 1, 96, 96, 128);
  ferry_artifact_release(art);
  ferry_ops_clear_memo();
  test_rm_rf(home);
}

/* Clusters of two: whole clusters, each over two tiles stacked along m, no more than fit on the device at once (the
 * driver's count, asked once per device); B's K-major box is half the tile's rows, each block loading its half. */
TEST(run_cluster_design_launches_whole_clusters_that_fit) {
  if (!test_have_nvrtc()) return;
  char home[300];
  test_cache_home(home, sizeof home, "runcluster");
  unsetenv("FERRY_ARCH");
  unsetenv("FERRY_WGMMA");
  setenv("FERRY_EXPERIMENTAL_DESIGNS", "1", 1);
  fake_driver_use();
  const ferry_op *op = ferry_op_by_name("gemm_wgmma_bf16_128x256x64_s4_tma_cluster2");
  ASSERT(op != NULL);
  ASSERT_EQ(ferry_op_info_get(op)->threads, 384);
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_BF16, FERRY_SCALAR_BF16, 4096, 4096, 4096);
  ferry_artifact *art = NULL;
  ASSERT_OK(ferry_op_compile(op, &args, &art));
  ASSERT_OK(ferry_op_run(op, &args, (void *)0x5100, art, 0));
  ASSERT_EQ(fake_last_launch.grid_x, 120); /* 256 cluster tiles; 60 clusters fit */
  ASSERT_EQ(fake_last_launch.grid_z, 1);
  ASSERT_EQ(fake_last_launch.block, 384);
  /* 300 × 600: 2 × 3 cluster tiles of 256 × 256, the second row's second tile past m */
  test_matrix a, b, c;
  test_matrix_make(&a, 0x10000000, FERRY_SCALAR_BF16, 0, 300, 72, 0, 80);
  test_matrix_make(&b, 0x20000000, FERRY_SCALAR_BF16, 0, 72, 600, 1, 0); /* column-major: K-major, 128-row boxes */
  test_matrix_make(&c, 0x30000000, FERRY_SCALAR_BF16, 0, 300, 600, 0, 0);
  ASSERT_OK(ferry_gemm_args_init(&args, &a.t, &b.t, &c.t, FERRY_SCALAR_F32));
  ASSERT_OK(ferry_op_compile(op, &args, &art));
  ASSERT_OK(ferry_op_run(op, &args, (void *)0x5100, art, 0));
  ASSERT_EQ(fake_last_launch.grid_x, 12);
  check_map(&fake_last_launch.maps[0], 0x10000000, 72, 300, 1, 160, 160, 128);
  check_map(&fake_last_launch.maps[1], 0x20000000, 72, 600, 1, 144, 144, 128);
  ferry_artifact_release(art);
  /* the count is the driver's, asked on the function's first use on a device: its failure is the run's, named */
  ferry_ops_clear_memo();
  int launches = fake_launches;
  ferry__fault_arm("cuOccupancyMaxActiveClusters", 1, CUDA_ERROR_INVALID_VALUE);
  ASSERT_STATUS(ferry_op_run(op, &args, (void *)0x5100, NULL, 0), FERRY_DRIVER_ERROR);
  ferry__fault_disarm();
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "counting the clusters of operator");
  ASSERT_EQ(fake_launches, launches);
  ASSERT_OK(ferry_op_run(op, &args, (void *)0x5100, NULL, 0));
  ASSERT_EQ(fake_launches, launches + 1);
  /* a device where no cluster fits: refused, nothing launched */
  ferry_ops_clear_memo();
  fake_max_clusters = 0;
  launches = fake_launches;
  ASSERT_STATUS(ferry_op_run(op, &args, (void *)0x5100, NULL, 0), FERRY_UNSUPPORTED);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "no cluster of 2 of its blocks");
  ASSERT_EQ(fake_launches, launches);
  fake_max_clusters = 60;
  ferry_ops_clear_memo();
  unsetenv("FERRY_EXPERIMENTAL_DESIGNS");
  test_rm_rf(home);
}

TEST(run_without_artifact_compiles_once) {
  if (!test_have_nvrtc()) return;
  char home[300];
  test_cache_home(home, sizeof home, "noart");
  unsetenv("FERRY_ARCH");
  fake_driver_use();
  const ferry_op *op = tiny_op("tiny_noart");
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 100, 100, 8);
  for (int i = 0; i < 50; i++) ASSERT_OK(ferry_op_run(op, &args, NULL, NULL, 0));
  for (int i = 0; i < 50; i++) ASSERT_OK(ferry_op_run(op, &args, NULL, NULL, FERRY_RUN_ASSUME_SUPPORTED));
  ASSERT_EQ(fake_launches, 100);
  ASSERT_EQ(fake_last_launch.grid_x, 4 * 7); /* tiles of 32×16 */
  ASSERT_EQ(fake_last_launch.block, 64);
  ferry_cache_stats st;
  ferry_cache_stats_get(&st);
  ASSERT_EQ(st.compiles, 1);
  ferry_ops_clear_memo();
  ASSERT_EQ(fake_live_libraries, 0);
  test_rm_rf(home);
}

TEST(run_checks_artifact_and_support) {
  if (!test_have_nvrtc()) return;
  char home[300];
  test_cache_home(home, sizeof home, "check");
  unsetenv("FERRY_ARCH");
  fake_driver_use();
  const ferry_op *op = tiny_op("tiny_check");
  ferry_gemm_args f32, f16;
  test_args(&f32, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 16, 16, 16);
  test_args(&f16, FERRY_SCALAR_F16, FERRY_SCALAR_F32, 16, 16, 16);
  ferry_artifact *art = NULL;
  ASSERT_OK(ferry_op_compile(op, &f32, &art));
  ASSERT_STATUS(ferry_op_run(op, &f16, NULL, art, 0), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "compiled for problem kind");
  const ferry_op *simt = ferry_op_by_name("gemm_simt_64x64x16");
  ASSERT_STATUS(ferry_op_run(simt, &f32, NULL, art, 0), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "the artifact is of operator tiny_check");
  const ferry_op *bf = ferry_op_by_name("gemm_mma_bf16_64x64x32_s3");
  ASSERT_STATUS(ferry_op_run(bf, &f32, NULL, NULL, 0), FERRY_UNSUPPORTED);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "operand A: expected bf16, got fp32");
  ASSERT_STATUS(ferry_op_run(NULL, &f32, NULL, art, 0), FERRY_INVALID_ARGUMENT);
  ASSERT_STATUS(ferry_op_run(op, NULL, NULL, art, 0), FERRY_INVALID_ARGUMENT);
  ASSERT_EQ(fake_launches, 0);
  ferry_artifact_release(art);
  test_rm_rf(home);
}

TEST(graph_records_runs_and_updates_in_place) {
  if (!test_have_nvrtc()) return;
  char home[300];
  test_cache_home(home, sizeof home, "graph");
  unsetenv("FERRY_ARCH");
  fake_driver_use();
  const ferry_op *op = tiny_op("tiny_graph");
  ferry_gemm_args args[3];
  for (int i = 0; i < 3; i++) {
    test_args(&args[i], FERRY_SCALAR_F32, FERRY_SCALAR_F32, 64, 64, 64);
    ASSERT_OK(ferry_gemm_args_set_data(&args[i], (void *)(uintptr_t)(0x100000 * (i + 1)), NULL, NULL));
  }
  ferry_artifact *art = NULL;
  ASSERT_OK(ferry_op_compile(op, &args[0], &art));
  ferry_graph *g = NULL;
  ASSERT_STATUS(ferry_graph_begin(NULL, &g), FERRY_INVALID_ARGUMENT);
  ASSERT_OK(ferry_graph_begin((void *)0x5200, &g));
  size_t index = 99;
  for (int i = 0; i < 3; i++) {
    ASSERT_OK(ferry_graph_run(g, op, &args[i], art, FERRY_RUN_ASSUME_SUPPORTED, &index));
    ASSERT_EQ(index, (size_t)i);
  }
  ASSERT_STATUS(ferry_graph_replay(g, NULL), FERRY_INVALID_ARGUMENT); /* not instantiated yet */
  ASSERT_OK(ferry_graph_end(g));
  ASSERT_EQ(ferry_graph_run_count(g), 3);
  ASSERT_OK(ferry_graph_replay(g, NULL));
  ASSERT_EQ(fake_replays, 1);
  /* Run 1 gets new operands and a new size; the others keep theirs. */
  ferry_gemm_args moved;
  test_args(&moved, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 100, 64, 64);
  ASSERT_OK(ferry_gemm_args_set_data(&moved, (void *)0x777000, NULL, NULL));
  ASSERT_OK(ferry_graph_update(g, 1, &moved));
  const fake_launch_record *n0 = fake_exec_node(ferry__test_graph_exec(g), 0);
  const fake_launch_record *n1 = fake_exec_node(ferry__test_graph_exec(g), 1);
  ferry_gemm_params p0, p1;
  memcpy(&p0, n0->params, sizeof p0);
  memcpy(&p1, n1->params, sizeof p1);
  ASSERT(p0.a == (const void *)0x100000);
  ASSERT(p1.a == (const void *)0x777000);
  ASSERT_EQ(p1.m, 100);
  ASSERT_EQ(n1->grid_x, 4 * 4); /* ceil(100/32) × ceil(64/16) */
  /* Updates are checked like runs. */
  ferry_gemm_args other;
  test_args(&other, FERRY_SCALAR_F16, FERRY_SCALAR_F32, 64, 64, 64);
  ASSERT_STATUS(ferry_graph_update(g, 1, &other), FERRY_INVALID_ARGUMENT);
  ASSERT_STATUS(ferry_graph_update(g, 7, &moved), FERRY_INVALID_ARGUMENT);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "run 7 does not exist");
  ferry_artifact_release(art); /* the graph holds its own references */
  ferry_graph_destroy(g);
  ferry_graph_destroy(NULL);
  ASSERT_EQ(fake_live_graphs, 0);
  ASSERT_EQ(fake_live_execs, 0);
  ferry_ops_clear_memo();
  ASSERT_EQ(fake_live_libraries, 0);
  /* A graph destroyed while capturing ends the capture. */
  ASSERT_OK(ferry_graph_begin((void *)0x5300, &g));
  ferry_graph_destroy(g);
  ASSERT_EQ(fake_live_graphs, 0);
  test_rm_rf(home);
}

/* A registered operator with its own parameter struct. */
typedef struct my_params { const void *x; float scale; int rows; } my_params;
static void fill_my_params(const ferry_gemm_args *args, void *params, void *user) {
  my_params *p = params;
  p->x = args->a;
  p->scale = *(const float *)user * args->alpha;
  p->rows = (int)args->problem.m;
}

TEST(byo_kernel_end_to_end_on_fake_driver) {
  if (!test_have_nvrtc()) return;
  char home[300];
  test_cache_home(home, sizeof home, "byo");
  unsetenv("FERRY_ARCH");
  fake_driver_use();
  static float scale = 3.0f;
  ferry_op_desc d;
  ferry_op_desc_init(&d);
  d.info.name = "byo_scale";
  d.info.instruction = "simt.custom";
  d.info.tile_m = 128;
  d.info.tile_n = 128;
  d.info.threads = 128;
  d.info.a_types = d.info.b_types = d.info.out_types = FERRY_SCALAR_BIT(FERRY_SCALAR_F32);
  d.source = "struct my_params { const float *x; float scale; int rows; };\n"
             "#ifndef BYO_UNROLL\n#error the option did not arrive\n#endif\n"
             "extern \"C\" __global__ void byo_scale(my_params p) { (void)p; }\n";
  d.entry = "byo_scale";
  const char *opts[] = {"-DBYO_UNROLL=4"};
  d.options = opts;
  d.n_options = 1;
  d.params = fill_my_params;
  d.params_size = sizeof(my_params);
  d.user = &scale;
  const ferry_op *op = NULL;
  ASSERT_OK(ferry_op_register(&d, &op));
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_F32, FERRY_SCALAR_F32, 300, 10, 5);
  args.alpha = 2.0f;
  const ferry_op *ops[16];
  size_t n = 0;
  ASSERT_OK(ferry_ops_find(&args, 0, NULL, NULL, ops, 16, &n));
  ASSERT(n >= 1 && ops[0] == op);
  ferry_artifact *art = NULL;
  ASSERT_OK(ferry_op_compile(op, &args, &art));
  ASSERT_OK(ferry_op_run(op, &args, NULL, art, 0));
  ASSERT_EQ(fake_last_launch.grid_x, 3);
  ASSERT_EQ(fake_last_launch.block, 128);
  my_params p;
  memcpy(&p, fake_last_launch.params, sizeof p);
  ASSERT(p.x == args.a);
  ASSERT(p.scale == 6.0f);
  ASSERT_EQ(p.rows, 300);
  ferry_artifact_release(art);
  test_rm_rf(home);
}

TEST(compile_every_family_with_each_epilogue_for_sm90) {
  if (!test_have_nvrtc()) return;
  char home[300];
  test_cache_home(home, sizeof home, "epilogues");
  unsetenv("FERRY_ARCH");
  fake_driver_use();
  ferry_gemm_args args;
  test_args(&args, FERRY_SCALAR_BF16, FERRY_SCALAR_BF16, 256, 256, 64);
  int64_t shape[1] = {256};
  ferry_tensor bias = {(void *)0x40000000, {FERRY_DEVICE_CUDA, 0}, 1, test_dtype(FERRY_SCALAR_BF16), shape, NULL, 0};
  const char *names[] = {"gemm_mma_bf16_64x64x32_s3", "gemm_mma_bf16_16x64x128_s9_splitk2",
                         "gemm_mma_bf16_128x128x64_s3_swz", "gemm_wgmma_bf16_128x256x64_s4", "gemm_simt_64x64x16"};
  const ferry_bias modes[] = {FERRY_BIAS_ROW, FERRY_BIAS_COL, FERRY_BIAS_NONE};
  for (int a = FERRY_ACTIVATION_RELU; a <= FERRY_ACTIVATION_SILU; a++) {
    ferry_bias mode = modes[a - 1];
    ASSERT_OK(ferry_gemm_args_set_epilogue(&args, mode ? &bias : NULL, mode, (ferry_activation)a));
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
      const ferry_op *op = ferry_op_by_name(names[i]);
      ferry_artifact *art = NULL;
      ASSERT_OK(ferry_op_compile_for(op, &args, 90, &art));
      ASSERT_EQ(ferry_artifact_kind(art), args.problem.kind);
      ASSERT_OK(ferry_op_run(op, &args, (void *)0x5100, art, 0));
      ferry_gemm_params p;
      memcpy(&p, fake_last_launch.params, sizeof p);
      ASSERT(p.bias == args.bias && p.kind == args.problem.kind);
      ferry_artifact_release(art);
    }
  }
  ferry_ops_clear_memo();
  test_rm_rf(home);
}
