/* registry.c — the operators: ferry's own GEMM designs, operators registered by users, and discovery.
 *
 * An operator is a kernel design with its constraints; it is specialised at compile time to a problem's kind
 * (types and majors), so one operator covers all the layouts its metadata accepts. The registry only grows:
 * operators live for the process, so the pointers handed out never dangle. Built-ins are registered on first use.
 */
#include "ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t builtins_once = PTHREAD_ONCE_INIT;
static ferry_op **ops;
static size_t n_ops, cap_ops;

/* ---- designs ----------------------------------------------------------------------------------------------- */

uint32_t ferry__design_smem(const ferry_op *op, uint32_t kind) {
  const ferry__design *d = &op->design;
  if (ferry__family_is_wgmma(op->family)) {
    /* gemm_wgmma.cu (SMEM_BYTES there): stages of swizzled panels, and the epilogue's 16 rows of fp32 per warp
     * (whole rows of BN + 8 pitch in the stages' space; the persistent schedule: 32 columns of 40 pitch in a space
     * of its own, and a full and an empty mbarrier per stage), plus 1024 bytes to align the swizzle atoms */
    uint32_t pipe = (uint32_t)d->stages * (uint32_t)(d->bm + d->bn) * (uint32_t)d->bk * 2u;
    uint32_t warps = (uint32_t)(d->bm / 64 * 4);
    if (ferry__family_is_persistent(op->family))
      return pipe + warps * 16u * 40u * 4u + 16u * (uint32_t)d->stages + 1024u;
    uint32_t epi = warps * 16u * (uint32_t)(d->bn + 8) * 4u;
    return (pipe > epi ? pipe : epi) + 1024u;
  }
  if (op->family == FERRY__MMA_SW) {
    /* gemm_mma_sw.cu: swizzled tiles without padding, whatever the majors; the epilogue reuses the stages for
     * 16 rows of fp32 per warp with a pitch of the warp's columns + 8 (SMEM_BYTES there) */
    uint32_t pipe = (uint32_t)d->stages * (uint32_t)(d->bm + d->bn) * (uint32_t)d->bk * 2u;
    uint32_t epi = (uint32_t)(d->warps_m * d->warps_n) * 16u * (uint32_t)(d->bn / d->warps_n + 8) * 4u;
    return pipe > epi ? pipe : epi;
  }
  if (op->family != FERRY__MMA) return op->info.smem_bytes;
  int a_row = FERRY_GEMM_KIND_A_MAJOR(kind) == FERRY_MAJOR_ROW;
  int b_row = FERRY_GEMM_KIND_B_MAJOR(kind) == FERRY_MAJOR_ROW;
  /* gemm_mma.cu: tiles in the operands' orientation, rows padded by 8 elements, 2 bytes each (8-bit operands
   * travel as pairs: the same bytes) */
  uint32_t a = a_row ? (uint32_t)(d->bm * (d->bk + 8)) : (uint32_t)(d->bk * (d->bm + 8));
  uint32_t b = b_row ? (uint32_t)(d->bk * (d->bn + 8)) : (uint32_t)(d->bn * (d->bk + 8));
  return (uint32_t)d->stages * (a + b) * 2u;
}

/* The digest of ferry's shared kernel headers, made once by register_builtins before the first built-in. */
static uint8_t builtin_headers[32];

/* What an artifact was made from (an imported or cached one must match it): the operator's text, macros, entry and
 * options and, for a built-in operator, the shared headers its source holds too (source.c) — so that moving code
 * from a kernel file into a shared header, or changing one, is not mistaken for the same source. A registered
 * operator's digest is what it always was (ferry/gemm_params.h, the public parameter layout, is all it is given), so
 * artifacts exported for it keep importing. */
static void op_digest(ferry_op *op) {
  ferry__sha256 s;
  ferry__sha256_init(&s);
  ferry__sha256_update(&s, op->defines, strlen(op->defines) + 1);
  ferry__sha256_update(&s, op->kernel_text, op->kernel_size);
  ferry__sha256_update(&s, "", 1);
  ferry__sha256_update(&s, op->entry, strlen(op->entry) + 1);
  for (int i = 0; i < op->n_options; i++) ferry__sha256_update(&s, op->options[i], strlen(op->options[i]) + 1);
  if (op->family != FERRY__CUSTOM) ferry__sha256_update(&s, builtin_headers, sizeof builtin_headers);
  ferry__sha256_final(&s, op->digest);
}

pthread_mutex_t ferry__ops_memo_lock = PTHREAD_MUTEX_INITIALIZER;

static ferry_op *op_alloc(void) { return calloc(1, sizeof(ferry_op)); }

/* Frees a built-in operator that could not be registered (what it owns: its name and its macros). */
static void builtin_free(ferry_op *op) {
  free((char *)op->info.name);
  free(op->defines);
  free(op);
}

/* Appends under the registry lock; fails only for lack of memory. */
static int append(ferry_op *op) {
  if (n_ops == cap_ops) {
    size_t cap = cap_ops ? cap_ops * 2 : 32;
    ferry_op **grown = realloc(ops, cap * sizeof *grown);
    if (!grown) return 0;
    ops = grown;
    cap_ops = cap;
  }
  ops[n_ops++] = op;
  return 1;
}

/* The inputs a built-in tensor-core operator takes: fp16, bf16, either FP8 format, or int8. */
typedef enum builtin_inputs { INPUTS_F16, INPUTS_BF16, INPUTS_FP8, INPUTS_I8 } builtin_inputs;

/* A built-in tensor-core operator: `family` picks the kernel (gemm_mma.cu, gemm_mma_sw.cu or gemm_wgmma.cu, whose
 * multiplying warpgroups are warps_m×warps_n/4, and whose persistent schedule adds a copying one), `speed` its rank
 * among designs (ferry__design). 8-bit inputs travel through the same kernels as pairs of elements along k
 * (gemm_mma.cu says how), so the design's bk pairs are 2·bk of them. */
static void add_mma(ferry__family family, builtin_inputs inputs, int bm, int bn, int bk, int warps_m, int warps_n,
                    int warps_k, int stages, int vec, double speed) {
  ferry_op *op = op_alloc();
  char name[96], defines[288], split[24] = "";
  if (!op) return;
  static const char *const type_names[] = {"f16", "bf16", "fp8", "i8"};
  const char *t = type_names[inputs];
  const int narrow = inputs == INPUTS_FP8 || inputs == INPUTS_I8, tile_k = narrow ? 2 * bk : bk;
  const int wgmma = ferry__family_is_wgmma(family), persistent = ferry__family_is_persistent(family);
  const int tma = ferry__family_is_tma(family), cluster = ferry__family_cluster(family);
  char schedule[32];
  if (cluster > 1) snprintf(schedule, sizeof schedule, "_tma_cluster%d", cluster);
  else snprintf(schedule, sizeof schedule, "%s", tma ? "_tma" : persistent ? "_persistent" : "");
  if (wgmma)
    snprintf(name, sizeof name, "gemm_wgmma_%s_%dx%dx%d_s%d%s", t, bm, bn, tile_k, stages, schedule);
  else if (family == FERRY__MMA_SW)
    snprintf(name, sizeof name, "gemm_mma_%s_%dx%dx%d_s%d_swz", t, bm, bn, tile_k, stages);
  else {
    if (warps_k > 1) snprintf(split, sizeof split, "_splitk%d", warps_k);
    if (vec == 8) snprintf(name, sizeof name, "gemm_mma_%s_%dx%dx%d_s%d%s", t, bm, bn, tile_k, stages, split);
    else snprintf(name, sizeof name, "gemm_mma_%s_%dx%dx%d_s%d%s_align%d", t, bm, bn, tile_k, stages, split, 2 * vec);
  }
  char cluster_define[40] = "";
  if (cluster > 1) snprintf(cluster_define, sizeof cluster_define, "#define FERRY_CLUSTER %d\n", cluster);
  if (wgmma)
    snprintf(defines, sizeof defines, "#define FERRY_BM %d\n#define FERRY_BN %d\n#define FERRY_BK %d\n"
             "#define FERRY_STAGES %d\n#define FERRY_PERSISTENT %d\n%s%s", bm, bn, bk, stages, persistent,
             tma ? "#define FERRY_TMA 1\n" : "", cluster_define);
  else if (family == FERRY__MMA_SW)
    snprintf(defines, sizeof defines, "#define FERRY_BM %d\n#define FERRY_BN %d\n#define FERRY_BK %d\n"
             "#define FERRY_WARPS_M %d\n#define FERRY_WARPS_N %d\n#define FERRY_STAGES %d\n",
             bm, bn, bk, warps_m, warps_n, stages);
  else
    snprintf(defines, sizeof defines, "#define FERRY_BM %d\n#define FERRY_BN %d\n#define FERRY_BK %d\n"
             "#define FERRY_WARPS_M %d\n#define FERRY_WARPS_N %d\n#define FERRY_WARPS_K %d\n#define FERRY_STAGES %d\n"
             "#define FERRY_VEC %d\n", bm, bn, bk, warps_m, warps_n, warps_k, stages, vec);
  op->family = family;
  op->design = (ferry__design){bm, bn, bk, warps_m, warps_n, warps_k, stages, vec, speed};
  op->info.name = strdup(name);
  op->defines = strdup(defines);
  if (wgmma && narrow)
    op->info.instruction = bn == 64 ? "wgmma.m64n64k32" : bn == 128 ? "wgmma.m64n128k32" : "wgmma.m64n256k32";
  else if (wgmma)
    op->info.instruction = bn == 64 ? "wgmma.m64n64k16" : bn == 128 ? "wgmma.m64n128k16" : "wgmma.m64n256k16";
  else op->info.instruction = narrow ? "mma.sync.m16n8k32" : "mma.sync.m16n8k16";
  op->info.tile_m = bm;
  op->info.tile_n = bn;
  op->info.tile_k = tile_k;
  op->info.stages = stages;
  op->info.threads = warps_m * warps_n * warps_k * 32 + (persistent ? 128 : 0);
  /* wgmma; FP8 mma.sync (sm_89); cp.async, bf16 and int8 mma.sync (sm_80) */
  op->info.min_sm = wgmma ? 90 : inputs == INPUTS_FP8 ? 89 : 80;
  op->info.a_majors = op->info.b_majors = op->info.out_majors = FERRY_MAJORS_ANY;
  op->info.div_m = op->info.div_n = op->info.div_k = 1;
  if (inputs == INPUTS_F16 || inputs == INPUTS_BF16) {
    const int in_type = inputs == INPUTS_F16 ? FERRY_SCALAR_F16 : FERRY_SCALAR_BF16;
    op->info.a_types = op->info.b_types = FERRY_SCALAR_BIT(in_type);
    op->info.out_types = FERRY_SCALARS_FLOAT;
    op->info.acc_types = FERRY_SCALAR_BIT(FERRY_SCALAR_F32) |
                         (inputs == INPUTS_F16 && !wgmma ? FERRY_SCALAR_BIT(FERRY_SCALAR_F16) : 0);
  } else {
    /* k contiguous in both operands, whole 16-byte chunks of it: the pairs never split */
    op->info.a_types = op->info.b_types =
        inputs == INPUTS_FP8 ? FERRY_SCALARS_FP8 : FERRY_SCALAR_BIT(FERRY_SCALAR_I8);
    op->info.out_types = FERRY_SCALARS_FLOAT | (inputs == INPUTS_I8 ? FERRY_SCALAR_BIT(FERRY_SCALAR_I32) : 0);
    op->info.acc_types = FERRY_SCALAR_BIT(inputs == INPUTS_FP8 ? FERRY_SCALAR_F32 : FERRY_SCALAR_I32);
    op->info.a_majors = FERRY_MAJOR_BIT(FERRY_MAJOR_ROW);
    op->info.b_majors = FERRY_MAJOR_BIT(FERRY_MAJOR_COL);
    op->info.div_k = 16;
  }
  op->info.a_align = op->info.b_align = (uint32_t)(2 * vec);
  op->info.out_align = 1;
  op->info.builtin = 1;
  op->info.fuses_epilogue = 1;
  if (wgmma) {
    op->kernel_text = (const char *)ferry__kernel_gemm_wgmma;
    op->kernel_size = ferry__kernel_gemm_wgmma_size;
    op->entry = "ferry_gemm_wgmma";
  } else if (family == FERRY__MMA_SW) {
    op->kernel_text = (const char *)ferry__kernel_gemm_mma_sw;
    op->kernel_size = ferry__kernel_gemm_mma_sw_size;
    op->entry = "ferry_gemm_mma_sw";
  } else {
    op->kernel_text = (const char *)ferry__kernel_gemm_mma;
    op->kernel_size = ferry__kernel_gemm_mma_size;
    op->entry = "ferry_gemm_mma";
  }
  op->params_size = sizeof(ferry_gemm_params);
  for (uint32_t majors = 0; majors < 4; majors++) { /* the largest over the four A/B major combinations */
    uint32_t bytes = ferry__design_smem(op, FERRY_GEMM_KIND(0, 0, 0, 0, majors & 1u, majors >> 1, 0));
    if (bytes > op->info.smem_bytes) op->info.smem_bytes = bytes;
  }
  /* Out of memory at start-up: the operator is simply absent. */
  if (!op->info.name || !op->defines) {
    builtin_free(op);
    return;
  }
  op_digest(op);
  if (!append(op)) builtin_free(op);
}

static void add_simt(void) {
  ferry_op *op = op_alloc();
  if (!op) return;
  op->family = FERRY__SIMT;
  op->design = (ferry__design){64, 64, 16, 0, 0, 1, 1, 1, 0.0};
  op->info.name = strdup("gemm_simt_64x64x16");
  op->info.instruction = "simt.fma";
  op->info.tile_m = 64;
  op->info.tile_n = 64;
  op->info.tile_k = 16;
  op->info.stages = 1;
  op->info.threads = 256;
  op->info.smem_bytes = 0; /* static shared memory only */
  op->info.min_sm = 75;
  op->info.a_types = op->info.b_types = op->info.out_types = FERRY_SCALARS_FLOAT;
  op->info.acc_types = FERRY_SCALAR_BIT(FERRY_SCALAR_F32);
  op->info.a_majors = op->info.b_majors = op->info.out_majors = FERRY_MAJORS_ANY;
  op->info.a_align = op->info.b_align = op->info.out_align = 1;
  op->info.div_m = op->info.div_n = op->info.div_k = 1;
  op->info.builtin = 1;
  op->info.fuses_epilogue = 1;
  op->defines = strdup("");
  op->kernel_text = (const char *)ferry__kernel_gemm_simt;
  op->kernel_size = ferry__kernel_gemm_simt_size;
  op->entry = "ferry_gemm_simt";
  op->params_size = sizeof(ferry_gemm_params);
  if (!op->info.name || !op->defines) {
    builtin_free(op);
    return;
  }
  op_digest(op);
  if (!append(op)) builtin_free(op);
}

/* The built-in designs (gemm_designs.def): every design for fp16 and bf16 operands, the wgmma ones after the others,
 * then the 8-bit operators, then the SIMT fallback. */
static const struct builtin_design {
  ferry__family family;
  int bm, bn, bk, warps_m, warps_n, warps_k, stages, vec;
  double speed;
  int experimental;
} builtin_designs[] = {
#define FERRY_GEMM_DESIGN(family, bm, bn, bk, warps_m, warps_n, warps_k, stages, vec, speed, experimental) \
  {FERRY__##family, bm, bn, bk, warps_m, warps_n, warps_k, stages, vec, speed, experimental},
#include "gemm_designs.def"
#undef FERRY_GEMM_DESIGN
};

static void register_builtins(void) {
  pthread_mutex_lock(&registry_lock);
  ferry__builtin_headers_digest(builtin_headers);
  /* FERRY_WGMMA=0 leaves the wgmma designs out (for comparing, or for a driver that cannot load sm_90a code);
   * FERRY_EXPERIMENTAL_DESIGNS=1 brings in the designs that are off by default (gemm_designs.def says which). */
  const char *env = getenv("FERRY_WGMMA"), *env_experimental = getenv("FERRY_EXPERIMENTAL_DESIGNS");
  int wgmma = !env || strcmp(env, "0") != 0;
  int experimental = env_experimental && strcmp(env_experimental, "1") == 0;
  const size_t n_designs = sizeof builtin_designs / sizeof builtin_designs[0];
  /* pass 0: every fp16/bf16 design but wgmma; pass 1: wgmma; pass 2: the 8-bit ones (gemm_mma.cu's 16-byte-load
   * designs and wgmma: what the pairs along k serve unchanged) */
  for (int pass = 0; pass < 3; pass++)
    for (int i = 0; i < 2; i++)
      for (size_t k = 0; k < n_designs; k++) {
        const struct builtin_design *d = &builtin_designs[k];
        const int is_wgmma = ferry__family_is_wgmma(d->family);
        if ((is_wgmma && !wgmma) || (d->experimental && !experimental)) continue;
        if (pass < 2 && is_wgmma != pass) continue;
        if (pass == 2 && !is_wgmma && (d->family != FERRY__MMA || d->vec != 8)) continue;
        builtin_inputs inputs = pass < 2 ? (i ? INPUTS_BF16 : INPUTS_F16) : (i ? INPUTS_I8 : INPUTS_FP8);
        /* FP8 wgmma sums are promoted to fp32 each k-tile, which takes registers a 256-wide tile does not have */
        if (inputs == INPUTS_FP8 && is_wgmma && d->bn > 128) continue;
        add_mma(d->family, inputs, d->bm, d->bn, d->bk, d->warps_m, d->warps_n, d->warps_k, d->stages, d->vec,
                d->speed);
      }
  add_simt();
  pthread_mutex_unlock(&registry_lock);
}

void ferry__registry_init(void) { pthread_once(&builtins_once, register_builtins); }

/* ---- lookup ------------------------------------------------------------------------------------------------ */

const ferry_op_info *ferry_op_info_get(const ferry_op *op) { return op ? &op->info : NULL; }

size_t ferry_ops_count(void) {
  ferry__registry_init();
  pthread_mutex_lock(&registry_lock);
  size_t n = n_ops;
  pthread_mutex_unlock(&registry_lock);
  return n;
}

const ferry_op *ferry_ops_get(size_t index) {
  ferry__registry_init();
  pthread_mutex_lock(&registry_lock);
  const ferry_op *op = index < n_ops ? ops[index] : NULL;
  pthread_mutex_unlock(&registry_lock);
  return op;
}

void ferry__ops_each_under_memo_lock(void (*fn)(ferry_op *op)) {
  ferry__registry_init();
  pthread_mutex_lock(&registry_lock);
  pthread_mutex_lock(&ferry__ops_memo_lock);
  for (size_t i = 0; i < n_ops; i++) fn(ops[i]);
  pthread_mutex_unlock(&ferry__ops_memo_lock);
  pthread_mutex_unlock(&registry_lock);
}

const ferry_op *ferry_op_by_name(const char *name) {
  const ferry_op *found = NULL;
  if (!name) return NULL;
  ferry__registry_init();
  pthread_mutex_lock(&registry_lock);
  for (size_t i = 0; i < n_ops && !found; i++)
    if (strcmp(ops[i]->info.name, name) == 0) found = ops[i];
  pthread_mutex_unlock(&registry_lock);
  return found;
}

/* ---- discovery --------------------------------------------------------------------------------------------- */

typedef struct candidate {
  const ferry_op *op;
  int rank;         /* 0 tensor-core built-ins, 1 registered, 2 any-alignment tensor-core, 3 SIMT */
  double cost;      /* a rough time estimate for the problem on the target */
  size_t order;     /* registration order: ties keep it */
} candidate;

/* Multiprocessors of the usual chip of a target (the device may be absent: find works on a forced target). */
static int sms_of(int sm) {
  switch (sm) {
  case 90: return 132;
  case 80: return 108;
  case 86: return 84;
  case 89: return 128;
  case 100: return 148;
  default: return 100;
  }
}

static uint32_t smem_limit_of(int sm) {
  switch (sm) {
  case 80: case 87: return 163u * 1024u;
  case 90: case 100: case 103: return 227u * 1024u;
  default: return 99u * 1024u; /* sm_86, sm_89, sm_120 and what is not known here */
  }
}

/* Waves of blocks × the time of one wave, which grows with the blocks sharing a multiprocessor and with each
 * block's tile (its multiply-adds plus the loads of its A and B panels). */
static double cost_of(const ferry_op *op, const ferry_gemm_problem *p, int sm) {
  int mma = ferry__family_is_mma(op->family);
  double speed = mma ? op->design.speed : 1.0;
  double tiles = (double)((p->m + op->info.tile_m - 1) / op->info.tile_m) *
                 (double)((p->n + op->info.tile_n - 1) / op->info.tile_n) * (double)p->l;
  int per_sm = mma ? (op->info.threads >= 256 ? 1 : op->info.tile_m >= 128 ? 2 : 4) : 1;
  /* no more blocks share a multiprocessor than its shared memory holds */
  if (op->info.smem_bytes && (uint32_t)per_sm * op->info.smem_bytes > smem_limit_of(sm))
    per_sm = (int)(smem_limit_of(sm) / op->info.smem_bytes) > 0 ? (int)(smem_limit_of(sm) / op->info.smem_bytes) : 1;
  double slots = (double)sms_of(sm) * per_sm;
  double waves = tiles > 0 ? (double)(long long)((tiles + slots - 1) / slots) : 0;
  double sharing = tiles / sms_of(sm) < per_sm ? (tiles / sms_of(sm) < 1 ? 1 : tiles / sms_of(sm)) : per_sm;
  double tile_cost = (double)op->info.tile_m * op->info.tile_n + 64.0 * (op->info.tile_m + op->info.tile_n);
  return waves * sharing * tile_cost / speed;
}

/* Dynamic shared memory one block may have on the usual chip of a target: designs above it cannot launch there. */

static int rank_of(const ferry_op *op) {
  if (ferry__family_is_mma(op->family))
    return op->design.vec == 8 ? 0 : 2;
  if (op->family == FERRY__CUSTOM) return 1;
  return 3;
}

static int cmp_candidate(const void *x, const void *y) {
  const candidate *a = x, *b = y;
  if (a->rank != b->rank) return a->rank - b->rank;
  if (a->cost != b->cost) return a->cost < b->cost ? -1 : 1;
  return a->order < b->order ? -1 : a->order > b->order;
}

ferry_status ferry_ops_find(const ferry_gemm_args *args, int target_sm, ferry_op_filter_fn filter,
                            void *filter_user, const ferry_op **out_ops, size_t capacity, size_t *out_count) {
  ferry_status st = FERRY_OK;
  candidate *c = NULL;
  if (!args || args->struct_size != sizeof *args)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_ops_find: args is NULL or was not initialised by "
                     "ferry_gemm_args_init");
  if (!out_count || (capacity && !out_ops))
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_ops_find: out_count is NULL, or out_ops is NULL with capacity "
                     "%zu", capacity);
  if (target_sm == 0) FERRY_TRY(ferry_target_sm(args->problem.device, &target_sm));
  if (target_sm < 0) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_ops_find: target_sm %d is negative", target_sm);
  ferry__registry_init();
  /* The operators as registered now, copied under the lock; the checks run after it, since a registered
   * operator's supports callback and the filter are the caller's code, which may call back into the registry.
   * Operators are never freed, so the pointers stay valid. */
  pthread_mutex_lock(&registry_lock);
  size_t n = n_ops, found = 0;
  c = malloc((n ? n : 1) * sizeof *c);
  for (size_t i = 0; c && i < n; i++) c[i].op = ops[i];
  pthread_mutex_unlock(&registry_lock);
  if (!c) return FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "ferry_ops_find: no memory for %zu candidates", n);
  for (size_t i = 0; i < n; i++) {
    const ferry_op *op = c[i].op;
    if (op->info.min_sm > target_sm || (op->info.builtin && op->info.smem_bytes > smem_limit_of(target_sm)) ||
        (ferry__family_is_wgmma(op->family) && target_sm != 90) || !ferry__supports_fast(op, args))
      continue; /* sm_90a code runs on sm_90 alone */
    if (filter && !filter(&op->info, filter_user)) continue;
    c[found++] = (candidate){op, rank_of(op), cost_of(op, &args->problem, target_sm), i};
  }
  qsort(c, found, sizeof *c, cmp_candidate);
  for (size_t i = 0; i < found && i < capacity; i++) out_ops[i] = c[i].op;
  *out_count = found;
cleanup:
  free(c);
  return st;
}

/* ---- registration ------------------------------------------------------------------------------------------ */

void ferry_op_desc_init(ferry_op_desc *desc) {
  if (!desc) return;
  memset(desc, 0, sizeof *desc);
  desc->struct_size = sizeof *desc;
  ferry_op_info *i = &desc->info;
  i->instruction = "custom";
  i->tile_m = i->tile_n = 64;
  i->tile_k = 16;
  i->stages = 1;
  i->threads = 256;
  i->min_sm = 75;
  i->a_types = i->b_types = i->out_types = FERRY_SCALARS_FLOAT;
  i->acc_types = FERRY_SCALAR_BIT(FERRY_SCALAR_F32);
  i->a_majors = i->b_majors = i->out_majors = FERRY_MAJORS_ANY;
  i->a_align = i->b_align = i->out_align = 1;
  i->div_m = i->div_n = i->div_k = 1;
}

static int pow2_upto16(uint32_t v) { return v >= 1 && v <= 16 && (v & (v - 1)) == 0; }

static void op_free(ferry_op *op) {
  if (!op) return;
  free((char *)op->info.name);
  free((char *)op->info.instruction);
  free((char *)op->kernel_text);
  free((char *)op->entry);
  free(op->defines);
  for (int i = 0; i < op->n_options; i++) free(op->options[i]);
  free(op->options);
  free(op);
}

ferry_status ferry_op_register(const ferry_op_desc *desc, const ferry_op **out) {
  ferry_status st = FERRY_OK;
  ferry_op *op = NULL;
  if (!desc || desc->struct_size != sizeof *desc)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_op_register: desc is NULL or not set up by ferry_op_desc_init");
  const ferry_op_info *in = &desc->info;
  const char *name = in->name;
  if (!name || !*name || strlen(name) >= 64)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_op_register: the name must be 1 to 63 characters");
  if (!desc->source || !*desc->source || !desc->entry || !*desc->entry)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "operator %s: source and entry are required", name);
  if (!(in->a_types & FERRY_SCALARS_FLOAT) || !(in->b_types & FERRY_SCALARS_FLOAT) ||
      !(in->out_types & FERRY_SCALARS_FLOAT) ||
      !(in->acc_types & (FERRY_SCALAR_BIT(FERRY_SCALAR_F32) | FERRY_SCALAR_BIT(FERRY_SCALAR_F16))))
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "operator %s: every type mask must accept at least one type (a 0x%x, "
                     "b 0x%x, out 0x%x, acc 0x%x)", name, in->a_types, in->b_types, in->out_types, in->acc_types);
  if (!(in->a_majors & FERRY_MAJORS_ANY) || !(in->b_majors & FERRY_MAJORS_ANY) || !(in->out_majors & FERRY_MAJORS_ANY))
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "operator %s: every major mask must accept a major mode", name);
  if (!pow2_upto16(in->a_align) || !pow2_upto16(in->b_align) || !pow2_upto16(in->out_align))
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "operator %s: alignments (%u, %u, %u) must be powers of two from 1 to "
                     "16 bytes", name, in->a_align, in->b_align, in->out_align);
  if (in->div_m < 1 || in->div_n < 1 || in->div_k < 1 || in->tile_m < 1 || in->tile_n < 1 || in->tile_k < 1 ||
      in->stages < 1 || in->threads < 1 || in->threads > 1024)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "operator %s: tile (%d×%d×%d), stages (%d), threads (%d, at most 1024) "
                     "and divisibility (%u, %u, %u) must be positive", name, (int)in->tile_m, (int)in->tile_n,
                     (int)in->tile_k, (int)in->stages, (int)in->threads, in->div_m, in->div_n, in->div_k);
  if (desc->params && (desc->params_size < 1 || desc->params_size > FERRY_OP_PARAMS_MAX))
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "operator %s: params_size %u must be 1..%d", name, desc->params_size,
                     FERRY_OP_PARAMS_MAX);
  if (desc->n_options < 0 || (desc->n_options > 0 && !desc->options) || desc->n_options > 64)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "operator %s: %d options (at most 64, with an array)", name,
                     (int)desc->n_options);
  for (int i = 0; i < desc->n_options; i++)
    if (!desc->options[i]) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "operator %s: option %d is NULL", name, i);
  op = op_alloc();
  if (!op) return FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "registering operator %s", name);
  op->info = *in;
  op->info.builtin = 0;
  op->family = FERRY__CUSTOM;
  op->info.name = strdup(name);
  op->info.instruction = strdup(in->instruction ? in->instruction : "custom");
  op->kernel_text = strdup(desc->source);
  op->kernel_size = strlen(desc->source);
  op->entry = strdup(desc->entry);
  op->defines = strdup("");
  op->options = desc->n_options ? calloc((size_t)desc->n_options, sizeof *op->options) : NULL;
  int ok = op->info.name && op->info.instruction && op->kernel_text && op->entry && op->defines &&
           (!desc->n_options || op->options);
  for (int i = 0; ok && i < desc->n_options; i++) {
    ok = (op->options[i] = strdup(desc->options[i])) != NULL;
    op->n_options = i + 1;
  }
  if (!ok) {
    st = FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "registering operator %s: copying its description", name);
    goto cleanup;
  }
  op->supports = desc->supports;
  op->params = desc->params;
  op->params_size = desc->params ? desc->params_size : (uint32_t)sizeof(ferry_gemm_params);
  op->user = desc->user;
  op_digest(op);
  ferry__registry_init();
  pthread_mutex_lock(&registry_lock);
  int duplicate = 0;
  for (size_t i = 0; i < n_ops; i++) duplicate |= strcmp(ops[i]->info.name, name) == 0;
  int appended = !duplicate && append(op);
  pthread_mutex_unlock(&registry_lock);
  if (duplicate) {
    st = FERRY_ERR(FERRY_INVALID_ARGUMENT, "an operator named %s is already registered", name);
    goto cleanup;
  }
  if (!appended) {
    st = FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "registering operator %s: the registry cannot grow", name);
    goto cleanup;
  }
  if (out) *out = op;
  op = NULL;
cleanup:
  op_free(op);
  return st;
}

/* fork.c: the registry's lock, then the operators' memo lock, held across fork() so a child inherits neither held. */
void ferry__registry_fork_lock(int lock) {
  if (lock) {
    pthread_mutex_lock(&registry_lock);
    pthread_mutex_lock(&ferry__ops_memo_lock);
  } else {
    pthread_mutex_unlock(&ferry__ops_memo_lock);
    pthread_mutex_unlock(&registry_lock);
  }
}
