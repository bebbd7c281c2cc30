/* ops.h — private: what the operator runtime's files share (src/ops/). Nothing here is part of the API.
 *
 * The pieces, one file each:
 *   args.c      ferry_gemm_args: validation once, the compact problem descriptor
 *   registry.c  ferry's own operators (their designs and constraints), registration of others, discovery
 *   supports.c  the support check: integer compares, a reason formatted only on failure
 *   target.c    the compile target (FERRY_ARCH or the device) and each device's capability
 *   source.c    an operator's full CUDA source and NVRTC options for one kind and target, and the cache key
 *   compile.c   compile once: memo, disk cache, NVRTC
 *   cache.c     the disk cache: a private directory, verified files, atomic writes
 *   artifact.c  artifacts: the file format, export/import, loading into the driver, per-device functions
 *   run.c       the launch path
 *   graph.c     capture, replay and in-place update of captured runs
 *   sha256.c    SHA-256 for compile keys and operator digests
 *   xxh64.c     XXH64 for the artifact files' content check
 */
#ifndef FERRY_OPS_INTERNAL_H
#define FERRY_OPS_INTERNAL_H

#include "ferry/ops.h"
#include "internal.h"
#include "rtc.h"

/* ---- SHA-256 (sha256.c) ---------------------------------------------------------------------------------- */

typedef struct ferry__sha256 {
  uint32_t h[8];
  uint64_t bytes;
  uint8_t buf[64];
  size_t fill;
} ferry__sha256;

void ferry__sha256_init(ferry__sha256 *s);
void ferry__sha256_update(ferry__sha256 *s, const void *data, size_t n);
void ferry__sha256_final(ferry__sha256 *s, uint8_t out[32]);
void ferry__sha256_of(const void *data, size_t n, uint8_t out[32]);
void ferry__hex(const uint8_t *bytes, size_t n, char *out); /* out holds 2n+1 */

/* ---- XXH64 (xxh64.c) ------------------------------------------------------------------------------------- */

/* XXH64 of n bytes with `seed`, as the xxHash specification defines it (the published test values hold). */
uint64_t ferry__xxh64(const void *data, size_t n, uint64_t seed);

/* ---- operators (registry.c) ------------------------------------------------------------------------------ */

/* FERRY__MMA: src/kernels/gemm_mma.cu (padded tiles); FERRY__MMA_SW: src/kernels/gemm_mma_sw.cu (swizzled tiles,
 * BK 64, double-buffered fragments, staged epilogue); FERRY__WGMMA: src/kernels/gemm_wgmma.cu (sm_90a only,
 * compiled for the "a" target; registered unless FERRY_WGMMA=0, see registry.c); FERRY__WGMMA_PERSISTENT: the same
 * file's persistent, warp-specialised schedule (FERRY_PERSISTENT), launched with at most one block per
 * multiprocessor (run.c); FERRY__WGMMA_TMA: that schedule with TMA copies (FERRY_TMA), its tensor maps encoded
 * per launch (tma.c); FERRY__WGMMA_TMA_CLUSTER: that one in clusters of two blocks sharing B's tiles
 * (FERRY_CLUSTER), launched with at most as many clusters as can run at once. */
typedef enum ferry__family {
  FERRY__SIMT = 1, FERRY__MMA = 2, FERRY__CUSTOM = 3, FERRY__MMA_SW = 4, FERRY__WGMMA = 5,
  FERRY__WGMMA_PERSISTENT = 6, FERRY__WGMMA_TMA = 7, FERRY__WGMMA_TMA_CLUSTER = 8
} ferry__family;

/* gemm_wgmma.cu's TMA copies. */
static inline int ferry__family_is_tma(ferry__family f) {
  return f == FERRY__WGMMA_TMA || f == FERRY__WGMMA_TMA_CLUSTER;
}
/* Blocks per cluster (the kernel's own __cluster_dims__). */
static inline int ferry__family_cluster(ferry__family f) { return f == FERRY__WGMMA_TMA_CLUSTER ? 2 : 1; }
/* gemm_wgmma.cu, in either schedule: sm_90a code. */
static inline int ferry__family_is_wgmma(ferry__family f) {
  return f == FERRY__WGMMA || f == FERRY__WGMMA_PERSISTENT || ferry__family_is_tma(f);
}
/* gemm_wgmma.cu's persistent schedule (a copying warpgroup, one block per multiprocessor at most). */
static inline int ferry__family_is_persistent(ferry__family f) {
  return f == FERRY__WGMMA_PERSISTENT || ferry__family_is_tma(f);
}
/* A tensor-core design of ferry's own (ranked by its speed). */
static inline int ferry__family_is_mma(ferry__family f) {
  return f == FERRY__MMA || f == FERRY__MMA_SW || ferry__family_is_wgmma(f);
}

/* A built-in design: tile, warps, pipeline depth and the global-load width in elements (8: 16-byte cp.async; 1:
 * element loads that accept any alignment). Mirrors the FERRY_* macros of src/kernels/gemm_mma.cu and
 * gemm_mma_sw.cu. `speed` ranks designs in ferry_ops_find: the main loop's rate relative to gemm_mma 128×128×32 s4
 * (1.0), measured on the H200 where a figure exists, predicted otherwise (registry.c says which). */
typedef struct ferry__design {
  int bm, bn, bk, warps_m, warps_n, warps_k, stages, vec;
  double speed;
} ferry__design;

/* One lock for every operator's memo inserts and body digest (short sections; runs read the memo without it). One
 * rather than one per operator, so that fork() holds two locks for the operators however many are registered
 * (ferry__registry_fork_lock). */
extern pthread_mutex_t ferry__ops_memo_lock;
/* Calls fn on every registered operator, holding the registry's lock and then the memo lock (fork's order) once for
 * the whole walk, so that a clear of every memo is one short section rather than one per operator. */
void ferry__ops_each_under_memo_lock(void (*fn)(ferry_op *op));

#define FERRY__TMA_MAPS_BYTES 256u /* two CUtensorMap of 128 bytes: gemm_common.cuh's tma_maps */
#define FERRY__MEMO_SLOTS 1024 /* artifacts memoised per operator (kinds with epilogues × targets); a power of 2 */

struct ferry_op {
  ferry_op_info info;
  ferry__family family;
  ferry__design design;
  const char *kernel_text;       /* the operator's CUDA source (embedded text, or the registered copy) */
  size_t kernel_size;
  const char *entry;
  char *defines;                 /* the design as #define lines (built-ins); "" for registered operators */
  char **options;                /* extra NVRTC options, n_options of them */
  int n_options;
  ferry_op_supports_fn supports; /* registered operators only */
  ferry_op_params_fn params;
  uint32_t params_size;          /* bytes of the kernel's parameter */
  void *user;
  uint8_t digest[32];            /* SHA-256 of the text, defines, options and entry: what an artifact was made from */
  _Atomic(ferry_artifact *) memo[FERRY__MEMO_SLOTS];
  unsigned memo_used;             /* filled memo slots, under ferry__ops_memo_lock: a clear skips an empty memo */
  uint8_t body_digest[32];       /* SHA-256 of the source after its per-kind head (source.c), made on first need */
  atomic_int body_digest_ready;  /* 1 once body_digest is written (release); zero-initialised with the operator */
};

/* Registers ferry's own operators once; every public entry point that looks at the registry calls it. */
void ferry__registry_init(void);

/* Dynamic shared memory a built-in design needs for `kind` (the majors decide the tile layouts). */
uint32_t ferry__design_smem(const ferry_op *op, uint32_t kind);

/* ---- support checks (supports.c) ------------------------------------------------------------------------- */

/* 1 when op's metadata (and a registered operator's callback, given a buffer) accepts the problem. */
int ferry__supports_fast(const ferry_op *op, const ferry_gemm_args *args);

/* Writes the first reason op does not support args (or "" when it does) and returns 0 / 1 as above. */
int ferry__supports_reason(const ferry_op *op, const ferry_gemm_args *args, char *reason, size_t size);

/* Checks struct_size and NULLs of the public entry points; records FERRY_INVALID_ARGUMENT naming `fn`. */
ferry_status ferry__check_op_args(const char *fn, const ferry_op *op, const ferry_gemm_args *args);

/* Bytes of one element of scalar type s (a ferry_scalar). */
int ferry__scalar_bytes(int s);

/* ---- targets (target.c) ---------------------------------------------------------------------------------- */

/* The capability of `device` (90 for sm_90), read once per device into ferry__device_sm_cache (0: not yet read).
 * The driver must be loaded. */
extern _Atomic int ferry__device_sm_cache[FERRY_MAX_DEVICES];
ferry_status ferry__device_sm(int device, int *out_sm);

/* The multiprocessors of `device`, read once per device into ferry__device_sms_cache (0: not yet read): how many
 * blocks a persistent kernel is launched with. */
extern _Atomic int ferry__device_sms_cache[FERRY_MAX_DEVICES];
ferry_status ferry__device_sms(int device, int *out_sms);

/* "sm_90", "sm_90a", "compute_90", "90", "9.0" -> 90 ("10.0", "sm_100" -> 100); 0 when unreadable: FERRY_ARCH's
 * forms (target.c), which the extension's target arguments take too. */
int ferry__parse_arch(const char *text);

/* Loads the driver without disturbing the calling thread's last error; 1 when a device is usable. */
int ferry__driver_quiet(void);

/* ---- sources and keys (source.c) ------------------------------------------------------------------------- */

/* The full source for `kind` (macros, parameter struct, shared helpers, kernel), malloc'd; the caller frees. */
ferry_status ferry__op_source(const ferry_op *op, uint32_t kind, int sm, char **out, size_t *out_size);

/* The NVRTC options for `sm`, in a caller array of at least 4 + op->n_options entries; `arch` (32 bytes) holds
 * the architecture option's text. Returns the count. */
int ferry__op_options(const ferry_op *op, int sm, char arch[32], const char **opts);

/* The cache key of (op, kind, sm): SHA-256 of the source's head for that kind and target, the SHA-256 of the rest
 * of the source (made once per operator), the options, and NVRTC's and the driver's versions. Equal keys mean
 * equal sources, options and toolchains. */
void ferry__compile_key(const ferry_op *op, uint32_t kind, int sm, const char *const *opts, int n_opts,
                        int nvrtc_version, int driver_version, uint8_t key[32]);

/* The SHA-256 of the source after the head, computed afresh (ferry__compile_key uses a memoised copy); for the
 * tests and the benchmark's account of a process's first lookup of an operator. */
void ferry__op_body_digest(const ferry_op *op, uint8_t out[32]);

/* The SHA-256 of the headers a built-in operator's source holds besides its own kernel (ferry/gemm_params.h and the
 * headers only ferry's kernels are given), for the operator digests of registry.c. */
void ferry__builtin_headers_digest(uint8_t out[32]);

/* The embedded kernel texts (generated by CMake from src/kernels/). */
extern const unsigned char ferry__kernel_gemm_params[], ferry__kernel_gemm_kind[], ferry__kernel_gemm_common[],
    ferry__kernel_gemm_output[], ferry__kernel_gemm_simt[], ferry__kernel_gemm_mma[], ferry__kernel_gemm_mma_sw[],
    ferry__kernel_gemm_wgmma[];
extern const size_t ferry__kernel_gemm_params_size, ferry__kernel_gemm_kind_size, ferry__kernel_gemm_common_size,
    ferry__kernel_gemm_output_size, ferry__kernel_gemm_simt_size, ferry__kernel_gemm_mma_size,
    ferry__kernel_gemm_mma_sw_size, ferry__kernel_gemm_wgmma_size;

/* ---- artifacts (artifact.c) ------------------------------------------------------------------------------ */

struct ferry_artifact {
  atomic_int refs;
  const ferry_op *op;
  uint32_t kind;
  int32_t sm;
  uint8_t key[32];               /* the compile key (as recorded in the file, for an import) */
  unsigned char *cubin;          /* inside cubin_block */
  size_t cubin_size;
  void *cubin_block;             /* the allocation holding the cubin (NVRTC's copy, or the file it was read in) */
  /* the launch layout, fixed at creation: grid = (ceil(m/tile_m)*ceil(n/tile_n), 1, l), block = threads; a
   * persistent kernel gets (min(its tiles × l, the device's multiprocessors), 1, 1) and loops over the tiles (in
   * clusters: min(its cluster tiles × l, max_clusters) clusters) */
  uint32_t tile_m, tile_n, threads, smem;
  int persistent;
  int tma;                       /* a second kernel parameter: the operands' tensor maps (tma.c), per launch */
  int cluster;                   /* blocks per cluster: a persistent grid of that many times max_clusters at most */
  int max_clusters[FERRY_MAX_DEVICES]; /* clusters that fit on the device at once; set before fn[device] is */
  pthread_mutex_t lock;          /* loading: the library and per-device functions */
  CUlibrary library;
  CUkernel kernel;
  _Atomic(CUfunction) fn[FERRY_MAX_DEVICES];
};

/* A new artifact (one reference) owning `block` (malloc'd; freed on failure too), in which the cubin lies at
 * `cubin` — the start of the block, or further in when the block is a whole artifact file. */
ferry_status ferry__artifact_new(const ferry_op *op, uint32_t kind, int sm, const uint8_t key[32], void *block,
                                 unsigned char *cubin, size_t cubin_size, ferry_artifact **out);

/* Loads the library into the driver when a device is present (context-independent; no context needed). */
ferry_status ferry__artifact_load(ferry_artifact *art);

/* The kernel's function in `device`'s primary context, made once (loading the library if needed, raising the
 * dynamic shared-memory limit). The slow path of a run; takes the artifact's lock. */
ferry_status ferry__artifact_function(ferry_artifact *art, int device, CUfunction *out);

/* The artifact file format, shared by the disk cache and export/import. */
#define FERRY__ART_MAGIC "FERRYART"
#define FERRY__ART_VERSION 3u /* 3: 20-bit kinds (types of 3 bits); 2 had 15-bit ones, 1 a SHA-256 check */
#define FERRY__ART_HEADER 128u           /* bytes before the payload */
#define FERRY__ART_META 128u             /* payload: meta record, then the cubin */
#define FERRY__ART_MAX (64u << 20)       /* larger files are refused unread */

typedef struct ferry__art_meta {
  char op_name[64];
  uint8_t op_digest[32];
  uint32_t kind;
  int32_t sm;
  uint64_t cubin_size;
} ferry__art_meta;

/* The content check of a file image whose header announces `payload` bytes (present): XXH64 of the payload,
 * seeded with XXH64 of the header before the check's own field. */
uint64_t ferry__art_checksum(const unsigned char *file, uint64_t payload);

/* Encodes header + payload for `art` into a malloc'd buffer. */
ferry_status ferry__art_encode(const ferry_artifact *art, unsigned char **out, size_t *out_size);

/* Verifies a whole file image; on success fills `meta`, the key and where the cubin is. On failure writes why into
 * `why` and returns 0. `expect_key` (may be NULL) must equal the recorded key. */
int ferry__art_verify(const unsigned char *file, size_t size, const uint8_t *expect_key, ferry__art_meta *meta,
                      uint8_t key[32], size_t *cubin_offset, char *why, size_t why_size);

/* Reads a whole regular file (no symlinks, at most FERRY__ART_MAX bytes) into a malloc'd buffer with one pread of
 * the size fstat reports (more only if the kernel returns less). `name` is opened relative to `dirfd` (AT_FDCWD:
 * a path of its own), whose path `dir` (NULL for AT_FDCWD) is only for messages; every check after the open is
 * made on the open file. A `private_file` must also be owned by the user and have no other name (st_nlink <= 1).
 * Returns FERRY_OK, or FERRY_IO_ERROR with the path and the reason in the message; `missing` (may be NULL) is set
 * to 1 when the file simply does not exist (no error recorded then). */
ferry_status ferry__read_file_at(int dirfd, const char *dir, const char *name, int private_file, unsigned char **out,
                                 size_t *out_size, int *missing);
ferry_status ferry__read_file(const char *path, int private_file, unsigned char **out, size_t *out_size,
                              int *missing);

/* Writes `data` to `name` in the directory open as `dirfd` (path `dir`, for messages) atomically: a temporary file
 * (O_EXCL, O_NOFOLLOW, `mode`) beside it, written, fsync'd, renamed over `name`, the directory fsync'd. Nothing is
 * left behind on failure. ferry__write_atomic does the same for a path, in the directory that holds it. */
ferry_status ferry__write_atomic_at(int dirfd, const char *dir, const char *name, const void *data, size_t size,
                                    int mode);
ferry_status ferry__write_atomic(const char *path, const void *data, size_t size, int mode);

/* ---- memo (compile.c) ------------------------------------------------------------------------------------ */

/* The memoised artifact of (op, kind, sm), borrowed (no reference taken), or NULL. Lock-free; a caller that keeps
 * the artifact takes its reference under ferry__ops_memo_lock, where ferry_ops_clear_memo drops the memo's. */
ferry_artifact *ferry__memo_lookup(const ferry_op *op, uint32_t kind, int sm);

/* ---- disk cache (cache.c) -------------------------------------------------------------------------------- */

/* The cached cubin for `key` made from `op`/`kind`/`sm`, verified: returns 1 with *block the file's malloc'd
 * image (the caller owns it) and *cubin pointing into it; else 0 (a bad file is removed and counted). Never an
 * error: a cache that cannot be used is a miss. */
int ferry__cache_load(const ferry_op *op, uint32_t kind, int sm, const uint8_t key[32], void **block,
                      unsigned char **cubin, size_t *cubin_size);

/* Stores an artifact's file under its key; failures are counted, never reported. */
void ferry__cache_store(const ferry_artifact *art);

/* Opens the cache directory (created 0700 if missing) and checks on the descriptor that it is the user's own and
 * not writable by others: returns the descriptor (the caller closes it), with the path in `out`, or -1 with a note
 * in the stats when the cache cannot be used. */
int ferry__cache_dir_open(char *out, size_t size);

void ferry__stats_add_compile(double seconds);
void ferry__stats_memo(int hit);

/* ---- launching (run.c) ----------------------------------------------------------------------------------- */

/* Everything one launch needs, filled on the caller's stack. */
typedef struct ferry__launch {
  CUfunction fn;
  unsigned grid_x, grid_z, threads, smem;
  void *param_ptrs[2]; /* params, then (a TMA kernel's) maps */
  _Alignas(16) unsigned char params[FERRY_OP_PARAMS_MAX];
  _Alignas(64) unsigned char maps[FERRY__TMA_MAPS_BYTES];
} ferry__launch;

/* The tensor maps (two CUtensorMap: A's, then B's) of a TMA kernel's launch for args, into `maps`
 * (FERRY__TMA_MAPS_BYTES, 64-byte aligned): each operand's box is the design's tile (tma.c). */
ferry_status ferry__tma_encode(const ferry_artifact *art, const ferry_gemm_args *args, void *maps);

/* The artifact to use for a run (`art` itself, or the memo's, compiled on first need), checked against args
 * unless `flags` has FERRY_RUN_ASSUME_SUPPORTED. */
ferry_status ferry__run_artifact(const ferry_op *op, const ferry_gemm_args *args, ferry_artifact *art,
                                 uint32_t flags, ferry_artifact **out);

/* Fills `l` for args with `art`'s kernel on args' device (making the function on first use). Returns FERRY_OK;
 * l->grid_x is 0 when there is nothing to launch. */
ferry_status ferry__launch_prepare(ferry_artifact *art, const ferry_gemm_args *args, ferry__launch *l);

/* Submits a prepared launch on `stream`, with the device's primary context current around it if needed. */
ferry_status ferry__launch_submit(const ferry__launch *l, int device, CUstream stream);

/* For the CPU tests: the instantiated graph (NULL before ferry_graph_end), to inspect what an update wrote. */
CUgraphExec ferry__test_graph_exec(const ferry_graph *graph);

#endif
