/* internal.h — private: declarations shared by ferry's source files. Nothing here is part of the API.
 *
 * Naming: ferry__ for internal functions and types with external linkage, static for everything else.
 */
#ifndef FERRY_INTERNAL_H
#define FERRY_INTERNAL_H

#include "driver.h"
#include "ferry.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#define FERRY_MAX_DEVICES 64
#define FERRY_UNUSED(x) ((void)(x))

/* ---- errors (status.c) ----------------------------------------------------------------------------------- */

/* Records a library error on the calling thread and returns `status`. `fmt` is printf-style. */
ferry_status ferry__error(ferry_status status, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Records a failed driver call: maps `r` to a status, keeps the raw code, its name and the call's name. `what`
 * (printf-style, may be NULL) says what ferry was doing, so the message reads "pinning 96 MiB: cuMemHostRegister
 * failed with CUDA_ERROR_OUT_OF_MEMORY (out of memory)". */
ferry_status ferry__cu_error(CUresult r, const char *call, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Records an error whose failing call is not a driver call — a system call ("open", "rename"), dlopen, a library
 * entry — with `call` (static) in the record's call field; cu_result stays 0. Returns `status`. */
ferry_status ferry__call_error(ferry_status status, const char *call, const char *file, int line, const char *fmt,
                               ...) __attribute__((format(printf, 5, 6)));

/* As ferry__call_error, for a library with result codes of its own (NVRTC): `result_name` (static, e.g.
 * "NVRTC_ERROR_COMPILATION") goes in the record's cu_name field, cu_result stays 0. */
ferry_status ferry__lib_error(ferry_status status, const char *call, const char *result_name, const char *file,
                              int line, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* Puts back a record saved with `ferry_error saved = *ferry_last_error();`: for the library's own probes and
 * cleanups, which may fail on their way but must not replace the error the caller is about to read. */
void ferry__error_restore(const ferry_error *saved);

#define FERRY_ERR(status, ...) ferry__error((status), __FILE__, __LINE__, __VA_ARGS__)

/* Calls the driver; on failure records the error, sets `st` and jumps to the function's `cleanup` label. Every
 * function that uses it declares `ferry_status st = FERRY_OK;` and a `cleanup:` label. */
#define FERRY_TRY_CU(what_fmt_and_args, name, ...)                                                            \
  do {                                                                                                        \
    CUresult ferry_r_ = FERRY__CU_CALL(#name, name, __VA_ARGS__); /* #name: see FERRY_CU */                   \
    if (ferry_r_ != CUDA_SUCCESS) {                                                                           \
      st = ferry__cu_error(ferry_r_, #name, __FILE__, __LINE__, FERRY_UNPAREN what_fmt_and_args);             \
      goto cleanup;                                                                                           \
    }                                                                                                         \
  } while (0)
#define FERRY_UNPAREN(...) __VA_ARGS__

/* Jumps to cleanup with `st` set when a ferry call fails (the callee already recorded the error). */
#define FERRY_TRY(expr)                                                                                       \
  do {                                                                                                        \
    st = (expr);                                                                                              \
    if (st != FERRY_OK) goto cleanup;                                                                         \
  } while (0)

/* ---- fork (fork.c) ----------------------------------------------------------------------------------------- */

/* Armed by driver.c once the driver is initialised: in a child forked after that, ferry__fork_child is 1,
 * ferry__driver_load() refuses with ferry__fork_refuse() (FERRY_UNSUPPORTED and why), and FERRY_CU stops every
 * driver call (CUDA_ERROR_NOT_INITIALIZED) before it reaches the driver. Armed by rtc.c once NVRTC is loaded (or
 * by the driver's arming): in a child forked after that, ferry__fork_no_rtc is 1 and ferry__rtc_load() refuses. */
extern volatile int ferry__fork_child;
extern volatile int ferry__fork_no_rtc;
void ferry__fork_guard_install(void);
void ferry__fork_guard_install_rtc(void);
ferry_status ferry__fork_refuse(void);
/* Lock (1) or unlock (0) a file's locks around fork(), for the atfork handlers; fork.c gives the order. */
void ferry__registry_fork_lock(int lock); /* the registry's lock, then the operators' memo lock */
void ferry__driver_fork_lock(int lock);
void ferry__rtc_fork_lock(int lock);
void ferry__device_fork_lock(int lock);
void ferry__devmem_fork_lock(int lock);
void ferry__gather_fork_lock(int lock);
void ferry__pool_fork_lock(int lock);
void ferry__events_fork_lock(int lock);
void ferry__cache_fork_lock(int lock);
void ferry__slab_fork_lock(int lock); /* the live-slab registry's and the recorded streams' (leaves: last) */
/* In the child, with the pool's lock held: reserves the pool's regions (not inherited: MADV_DONTFORK) as
 * inaccessible address space, so what viewed them faults instead of reading whatever is mapped there later. */
void ferry__pool_fork_child(void);

/* ---- devices and contexts (device.c) --------------------------------------------------------------------- */

/* Makes `device`'s primary context current on this thread (retaining it once per process). Pair every successful
 * call with ferry__ctx_leave(). */
ferry_status ferry__ctx_enter(int device);
void ferry__ctx_leave(void);
CUcontext ferry__device_ctx(int device); /* NULL until retained */

/* ---- streams and events (stream.c) ----------------------------------------------------------------------- */

ferry_status ferry__thread_stream(int device, CUstream *out); /* context of `device` must be current */
/* The thread's second stream for `device`: DMAs that must run beside the gather kernel (context current). */
ferry_status ferry__thread_dma_stream(int device, CUstream *out);

/* Checks that `stream` belongs to `device` (context current). */
ferry_status ferry__stream_check_device(CUstream stream, int device);

/* Events without timing, from a per-device free list. Context of `device` must be current for get. */
ferry_status ferry__event_get(int device, CUevent *out);
void ferry__event_put(int device, CUevent ev); /* needs no context */
void ferry__events_trim(void);

/* A recorded event shared by everything that must not be reused before it completes (a ticket and its slabs).
 * Reference-counted; the last reference returns the event to the pool (fence.c). */
typedef struct ferry__fence {
  CUevent ev;
  int device;
  atomic_int refs;
  atomic_int done;          /* 1 once seen complete or failed; later checks skip the driver */
  _Atomic uint64_t failure; /* 0, or the first error a query or wait saw: CUresult << 1 | 1 if from the wait */
} ferry__fence;

/* Records a new fence on `stream` (context of `device` current). */
ferry_status ferry__fence_record(int device, CUstream stream, ferry__fence **out);
ferry__fence *ferry__fence_ref(ferry__fence *f);
void ferry__fence_unref(ferry__fence *f);
/* 1 when complete or failed (nothing runs any more), 0 while running. An error seen here sticks to the fence:
 * ferry__fence_wait reports it. Needs no current context; records no error. */
int ferry__fence_done(ferry__fence *f);
/* Blocks until complete. Returns FERRY_OK, or the error the copies ended with — the same error every time,
 * whichever query or wait first saw it — recorded with the driver call that reported it. */
ferry_status ferry__fence_wait(ferry__fence *f);

/* ---- the pinned pool (pinned.c) -------------------------------------------------------------------------- */

typedef enum ferry__slab_kind { FERRY__SLAB_PINNED = 1, FERRY__SLAB_DEVICE = 2 } ferry__slab_kind;

#define FERRY_SLAB_MAX_USES 8 /* streams a slab can be told to wait for (ferry_slab_record_stream) */

struct ferry_slab {
  atomic_int refs;
  ferry__slab_kind kind;
  int device;       /* the device whose copies fill or read it: the owner of DEVICE memory */
  void *data;       /* host address (PINNED) or device address (DEVICE) */
  size_t size;
  ferry__fence *fence; /* completion of the copies into/out of this slab; NULL when none ran */
  /* Streams whose work may use the memory after the copies (ferry_slab_record_stream; guarded by slab.c's lock),
   * and the fences recorded on them when the last reference went: the memory is reused after those too. */
  struct { CUstream stream; int device; } uses[FERRY_SLAB_MAX_USES];
  int n_uses;
  ferry__fence *use_fences[FERRY_SLAB_MAX_USES];
  int n_use_fences;
  /* PINNED: where the range lives in the pool */
  struct ferry__region *region;
  size_t offset;
  struct ferry_slab *next_pending;
};

/* ---- slabs (slab.c) ---------------------------------------------------------------------------------------- */

/* A new slab (refcount 1) enters the registry ferry_slab_find reads; ferry__slab_forget takes it out when it dies. */
void ferry__slab_register(ferry_slab *slab);
/* 1 when no copy and no recorded use can still touch the slab's memory. Needs no current context. */
int ferry__slab_idle(ferry_slab *slab);
/* Drops the fences of a slab about to be reused or freed. */
void ferry__slab_drop_fences(ferry_slab *slab);

/* Takes a slab of at least `bytes` from the pinned pool for copies of `device`, pinning a new region if no free
 * range fits: of the slab's size with `exact_growth`, else by the pool's growth rule (region_size_for). The caller's
 * context must be current (cuMemHostRegister needs one). */
ferry_status ferry__pool_take(size_t bytes, int device, bool exact_growth, ferry_slab **out);
/* Whether a slab of `bytes` fits a free range of the pool now (released slabs whose copies have finished count as
 * free); the smallest free range that holds it (`best_fit`, the one ferry__pool_take would use) and the largest
 * one too small for it (`largest_below`); either may be NULL. */
bool ferry__pool_fit(uint64_t bytes, uint64_t *best_fit, uint64_t *largest_below);
/* The size of the region the growth rule would pin for a slab of `bytes` that no free range holds. */
size_t ferry__pool_growth(uint64_t bytes);
/* The machine's physical memory: no pinned request larger than this can succeed. */
uint64_t ferry__pinnable_limit(void);
/* Returns a pinned slab whose refcount reached zero. */
void ferry__pool_give(ferry_slab *slab);

/* Pins `bytes` of fresh memory (THP-backed, faulted in by several threads, then registered). Used by the pool;
 * exposed for the benchmarks' raw reference. It is map, prefault, register: ferry__pin_map refuses a size past the
 * machine's or the available memory and maps `bytes` rounded up to huge pages; ferry__pin_register unmaps the range
 * when the driver refuses it. */
ferry_status ferry__pin(size_t bytes, void **out_ptr, size_t *out_bytes);
ferry_status ferry__pin_map(size_t bytes, char **out_base, size_t *out_size);
ferry_status ferry__pin_register(char *base, size_t size);
void ferry__unpin(void *ptr, size_t bytes);
/* Adds a region pinned by the caller to the pool (its free ranges); `seconds` is what pinning it took. On failure
 * the region is unpinned. */
ferry_status ferry__pool_adopt(char *base, size_t size, double seconds);
/* CLOCK_MONOTONIC in seconds, for the pool's pin_seconds. */
double ferry__seconds_now(void);

/* A region mapped now and faulted in on a thread of its own (pin_ahead.c), so that a batch cut into sub-parts
 * faults the next sub-part's region while it registers and fills this one. start maps it and starts the fault;
 * wait waits for the fault; finish waits, registers the region (context current) and adds it to the pool; cancel
 * waits and unmaps. Exactly one of finish and cancel follows a successful start; on failure neither does. */
typedef struct ferry__pin_ahead {
  char *base; /* NULL: none started */
  size_t size;
  pthread_t thread;
  bool threaded;        /* the fault runs on `thread` (else it ran inside start) */
  double fault_seconds; /* what the fault took, for the pool's pin_seconds */
} ferry__pin_ahead;
ferry_status ferry__pin_ahead_start(size_t bytes, ferry__pin_ahead *ahead);
void ferry__pin_ahead_wait(ferry__pin_ahead *ahead);
ferry_status ferry__pin_ahead_finish(ferry__pin_ahead *ahead);
void ferry__pin_ahead_cancel(ferry__pin_ahead *ahead);
extern atomic_int ferry__pin_ahead_outstanding; /* started, neither finished nor cancelled yet (tests: none leaks) */

/* Host memory a new pinned region may take now (hostmem.c): MemAvailable, capped by a cgroup v2 limit; UINT64_MAX
 * when neither can be read. The paths are variables so tests can point them at files of their own. */
uint64_t ferry__host_available(void);
extern const char *ferry__meminfo_path, *ferry__cgroup_dir;

/* Faults in [ptr, ptr+bytes) with up to `threads` threads (prefault.c). */
void ferry__prefault(void *ptr, size_t bytes);

/* ---- device memory (devmem.c) ---------------------------------------------------------------------------- */

/* Stream-ordered device allocation from ferry's per-device memory pool (kept, not released to the OS between
 * transfers). Context current. */
ferry_status ferry__devmem_alloc(int device, size_t bytes, CUstream stream, CUdeviceptr *out);
ferry_status ferry__devmem_slab(int device, size_t bytes, CUstream stream, ferry_slab **out);
/* Frees a device slab whose last reference went (stream-ordered after everything that may still use it). */
void ferry__devmem_slab_free(ferry_slab *slab);
/* ferry's memory pool of `device`, NULL until the first allocation (for tests that read its usage). */
CUmemoryPool ferry__devmem_pool(int device);

/* ---- gather kernel (kernels.c, kernels/gather.cu) -------------------------------------------------------- */

/* ferry__gather_item, ferry__gather_layout and their limits: kernels/gather_types.h, which gather.cu reads too. */
#include "kernels/gather_types.h"

/* Loads the gather kernel for `device` (context current), once. FERRY_UNSUPPORTED when the build has no kernel. */
ferry_status ferry__gather_function(int device, CUfunction *out);
int ferry__gather_available(void);
extern const unsigned char ferry__gather_fatbin[];
extern const size_t ferry__gather_fatbin_size;

/* ---- planning (plan.c): pure, no driver calls ------------------------------------------------------------ */

typedef enum ferry__route {
  FERRY__PASS = 0,   /* not ours: output = input */
  FERRY__EMPTY,      /* zero-size: empty output */
  FERRY__DMA,        /* contiguous, large: its own DMA straight into the slab */
  FERRY__GATHER,     /* small or strided: gather kernel into the staging region, then one DMA */
  FERRY__PACK        /* H2D from pageable memory, small or strided: packed by the CPU into pinned staging */
} ferry__route;

typedef struct ferry__plan_entry {
  uint8_t route;
  uint8_t src_pinned;   /* H2D: source is pinned host memory the device can read */
  uint8_t compact;      /* compact row-major (computed once; the layout and item passes reuse it) */
  uint64_t nbytes;      /* packed bytes */
  uint64_t offset;      /* offset of the packed output in the slab */
  const char *src;      /* data + byte_offset */
} ferry__plan_entry;

typedef struct ferry__plan {
  uint64_t total;        /* slab bytes: gathered region, then packed region, then DMA region */
  uint64_t gather_bytes; /* [0, gather_bytes): filled by the gather kernel */
  uint64_t pack_end;     /* [gather_bytes, pack_end): packed by the CPU (H2D) */
  size_t n_dma, n_gather, n_pack, n_copied;
  size_t n_items, n_layouts;           /* gather kernel work */
  size_t n_pack_items, n_pack_layouts; /* CPU pack work (same item format) */
} ferry__plan;

#define FERRY_SLAB_ALIGN 256u /* every output starts on a 256-byte boundary, as cudaMalloc would place it */

/* True when the tensor's strides describe a compact row-major layout (NULL strides, or equal to them; dimensions
 * of size 1 may have any stride). */
bool ferry__tensor_is_compact(const ferry_tensor *t);

/* Collapses the tensor into a gather layout (merging dimensions that are contiguous with each other; elements
 * wider than 255 bytes become an innermost dimension of bytes). For a tensor ferry__plan_make accepted. Fails with
 * FERRY_UNSUPPORTED if more than FERRY_GATHER_MAX_DIMS dimensions remain. */
ferry_status ferry__gather_layout_of(const ferry_tensor *t, ferry__gather_layout *out);

/* Number of gather items `nbytes` of output take when cut in whole units of `unit` bytes (1 for a contiguous
 * range; a strided tensor's element width): one per FERRY_GATHER_CHUNK bytes rounded down to whole units. */
size_t ferry__gather_items_for(uint64_t nbytes, uint64_t unit);

/* Routes the tensors and lays out the slab. `is_ours[i]` says whether tensor i is on the transfer's source side;
 * `pinned[i]` (H2D only) whether its memory is pinned. `entries` has `count` slots. */
typedef struct ferry__plan_input {
  const ferry_tensor *tensors;
  size_t count;
  const uint8_t *is_ours;
  const uint8_t *pinned;     /* NULL for D2H */
  bool h2d;
  bool gather_ok;            /* the kernel is available and not disabled */
  uint64_t gather_max_bytes;
  size_t first_index;        /* the first tensor's index among all its transfer's tensors: errors name that index */
} ferry__plan_input;

ferry_status ferry__plan_make(const ferry__plan_input *in, ferry__plan_entry *entries, ferry__plan *out);

/* The checks ferry__plan_make makes of one tensor it would copy (size, dtype, data, extent; `index` names it in
 * the message), *out_bytes its size; also what a transfer without a device checks of the tensors it passes
 * through that a device would have copied. */
ferry_status ferry__plan_check_tensor(const ferry_tensor *t, size_t index, uint64_t *out_bytes);

/* The bytes [*first, *end) that the elements of a checked, non-empty tensor of `nbytes` bytes occupy (its strides
 * may reach below its first element), or how its descriptor breaks the address space. Records no error. */
typedef enum ferry__span {
  FERRY__SPAN_OK, FERRY__SPAN_BASE_WRAPS, FERRY__SPAN_END_WRAPS, FERRY__SPAN_TOO_WIDE, FERRY__SPAN_BELOW_ZERO
} ferry__span;
ferry__span ferry__tensor_span(const ferry_tensor *t, uint64_t nbytes, uint64_t *first, uint64_t *end);

/* Fills the work items and layouts for every entry routed `route` (FERRY__GATHER or FERRY__PACK): each item's
 * destination is dst_base + the entry's slab offset. Sources are the tensors' own addresses (device pointers, or
 * pinned host pointers, which the device reads under unified addressing). */
ferry_status ferry__plan_gather_items(const ferry__plan_input *in, const ferry__plan_entry *entries, uint8_t route,
                                      uint64_t dst_base, ferry__gather_item *items, ferry__gather_layout *layouts,
                                      size_t *out_items, size_t *out_layouts);

/* Chunked generation, for the pipelined D2H gather: continues from `cursor` (zeroed before the first call) over
 * the entries routed FERRY__GATHER, writing items until at least `chunk_bytes` of output are covered (whole items;
 * the last chunk ends with the last entry). Layout indices are local to this call's `layouts`. Returns FERRY_OK
 * with *out_items == 0 when every entry is done. */
typedef struct ferry__item_cursor {
  size_t entry;  /* next entry to look at */
  uint64_t done; /* bytes of that entry already covered by items */
} ferry__item_cursor;
ferry_status ferry__plan_gather_items_chunk(const ferry__plan_input *in, const ferry__plan_entry *entries,
                                            ferry__item_cursor *cursor, uint64_t chunk_bytes, uint64_t dst_base,
                                            ferry__gather_item *items, ferry__gather_layout *layouts,
                                            size_t *out_items, size_t *out_layouts, uint64_t *out_end);

/* The D2H gather is cut into chunks of at least this many bytes of output (and at most 8 chunks), so the DMA of
 * one chunk runs while the kernel gathers the next. A variable so tests can force many chunks on small batches. */
extern uint64_t ferry__pipeline_chunk_min;

/* A D2H part larger than this that no free range of the pool can hold is submitted in sub-parts of about this
 * size, each in a slab of its own (transfer.c, add_cut). A variable so tests can cut small batches. */
extern uint64_t ferry__pin_chunk_bytes;

/* CPU version of what one gather item does (used to pack pageable H2D inputs, and by tests as the reference). */
void ferry__gather_item_run_host(const ferry__gather_item *item, const ferry__gather_layout *layouts);

/* Writes compact row-major strides for `shape` into `strides`. Returns false when they do not fit int64 (only an
 * empty tensor can have such a shape: a non-empty one is bounded by its size); the overflowing ones are then
 * INT64_MAX. */
bool ferry__compact_strides(int32_t ndim, const int64_t *shape, int64_t *strides);

#endif
