/* ferry_py.h — private: declarations shared by the files of the CPython extension ferry._ferry.
 *
 * The extension is a thin layer over the public C API (ferry.h): it walks a nested Python batch, reads tensors
 * through DLPack without allocating, hands one flat array to ferry_transfer_d2h/h2d, builds the output tensors
 * while the copies run, and rebuilds the batch. Nothing here is part of any API.
 *
 * Files, one job each:
 *   module.c    module definition, device_count, version, the method table
 *   errors.c    ferry_status -> Python exception (one table, one function)
 *   args.c      device / stream / producer_event arguments
 *   typeinfo.c  what a Python type is to ferry (container kind, tensor protocol, framework), cached per type
 *   dlpack_in.c reading an input tensor (exchange API, or __dlpack__ capsules)
 *   outputs.c   the shared output block (DLPack tensors viewing one slab) and the framework conversions
 *   exporter.c  ferry.SlabTensor, the exporter handed to non-torch frameworks' from_dlpack
 *   batch.c     traversal of a nested batch into a tape, and the rebuild from it
 *   pace.c      bounded GIL holds: release points at most every slice while the GIL is held for long work
 *   gc_defer.c  the cyclic garbage collector off while a transfer makes its outputs (GIL held, no Python code)
 *   transfer.c  one transfer from arguments to rebuilt batch, pipelined in parts; transfer_tensor_d2h/h2d
 *   handle.c    ferry.Transfer, the asynchronous handle
 *   pool.c      the pinned pool functions
 *   testing.c   private test hooks (a simulated driver), compiled only with FERRY_PYTHON_TEST_HOOKS
 *   ops_*.c     ferry.ops, the operator half: GEMM arguments, operators, artifacts, the fast launcher, graphs
 *               (their shared declarations are in ops_py.h)
 *
 * Naming: ferry_py_ for functions shared between files, static for the rest. The GIL is held in every function
 * unless its comment says otherwise.
 */
#ifndef FERRY_PY_H
#define FERRY_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlpack/dlpack.h>
#include <ferry.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* ferry_tensor is declared to be laid out exactly like DLTensor; the extension relies on it. */
_Static_assert(sizeof(ferry_tensor) == sizeof(DLTensor), "ferry_tensor must match DLTensor");
_Static_assert(offsetof(ferry_tensor, shape) == offsetof(DLTensor, shape), "ferry_tensor must match DLTensor");
_Static_assert(offsetof(ferry_tensor, byte_offset) == offsetof(DLTensor, byte_offset), "ferry_tensor must match");

/* ---- errors.c ------------------------------------------------------------------------------------------- */

extern PyObject *ferry_py_FerryError; /* ferry.FerryError(RuntimeError) */

int ferry_py_errors_init(PyObject *module);

/* Raises the exception for `status`, with ferry_last_error()'s message and details as attributes. Returns NULL,
 * so callers can `return ferry_py_raise(st);`. */
PyObject *ferry_py_raise(ferry_status status);

/* ---- args.c ------------------------------------------------------------------------------------------------ */

#define FERRY_PY_DEVICE_UNSET (-1)   /* device=None: LOCAL_RANK, else 0 */
#define FERRY_PY_DEVICE_CURRENT (-2) /* "cuda" without an index: the framework's current device */

typedef struct ferry_py_args {
  PyObject *batch;          /* borrowed */
  PyObject *device_obj;     /* borrowed, for messages */
  PyObject *stream_obj;     /* borrowed */
  int device;               /* index, FERRY_PY_DEVICE_UNSET or FERRY_PY_DEVICE_CURRENT */
  void *stream;             /* CUstream, NULL when not given */
  int stream_device;        /* device the stream object says it belongs to, -1 when it does not say */
  void *producer_event;     /* CUevent, NULL when not given */
} ferry_py_args;

/* Parses (batch, /, *, device=None, stream=None, producer_event=None) from a vectorcall. `name` is the function's
 * name for messages. Returns 0, or -1 with TypeError/ValueError set. Checks syntax only: no driver call. */
int ferry_py_args_parse(const char *name, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                        ferry_py_args *out);

/* A stream argument as parse_stream reads it (None: *out NULL; an int handle; __cuda_stream__; torch .cuda_stream;
 * CuPy .ptr; a framework's handle 0 becomes CUDA's legacy default stream, 0x1). *out_device: the device the
 * object says the stream is on, -1 when it does not say. Returns 0, or -1 with TypeError/ValueError set. */
int ferry_py_stream_from_object(PyObject *obj, void **out, int *out_device);

/* Turns FERRY_PY_DEVICE_CURRENT/UNSET into an index (the driver is loaded by then) and checks it. Returns 0, or
 * -1 with RuntimeError/ValueError set. */
int ferry_py_args_resolve_device(ferry_py_args *a, int *out_device);

/* ---- typeinfo.c ----------------------------------------------------------------------------------------- */

typedef enum ferry_py_kind {
  FERRY_PY_OTHER = 0,     /* a leaf that is not a tensor: passes through */
  FERRY_PY_LIST,          /* exactly list */
  FERRY_PY_TUPLE,         /* exactly tuple */
  FERRY_PY_DICT,          /* exactly dict */
  FERRY_PY_LIST_SUB,      /* list subclass: cls(list) */
  FERRY_PY_TUPLE_SUB,     /* tuple subclass that is not a namedtuple: cls(list) */
  FERRY_PY_NAMEDTUPLE,    /* cls(*items) */
  FERRY_PY_DEFAULTDICT,   /* cls(default_factory, dict) */
  FERRY_PY_MAPPING,       /* dict subclass or collections.abc.Mapping: cls(dict) */
  FERRY_PY_DATACLASS,     /* dataclass instance: cls.__new__(cls), state copied, fields set */
  FERRY_PY_TENSOR_EXCHANGE, /* type has __dlpack_c_exchange_api__ (torch) */
  FERRY_PY_TENSOR_PROTOCOL  /* type has __dlpack__ and __dlpack_device__ */
} ferry_py_kind;

typedef enum ferry_py_family {
  FERRY_PY_FAMILY_OTHER = 0, FERRY_PY_FAMILY_TORCH, FERRY_PY_FAMILY_NUMPY, FERRY_PY_FAMILY_CUPY,
  FERRY_PY_FAMILY_JAX, FERRY_PY_FAMILY_FERRY
} ferry_py_family;

typedef struct ferry_py_typeinfo {
  uint8_t kind;                 /* ferry_py_kind */
  uint8_t family;               /* ferry_py_family, for tensors */
  const DLPackExchangeAPI *api; /* FERRY_PY_TENSOR_EXCHANGE: the framework's table (static in the framework) */
  PyObject *fields;             /* FERRY_PY_DATACLASS: tuple of field names; borrowed from the cache */
} ferry_py_typeinfo;

/* What `type` is to ferry, cached per type. The pointer is valid until the next call (the cache may be reset);
 * copy what you need and take a reference to `fields` before calling again. NULL with an exception set on error. */
const ferry_py_typeinfo *ferry_py_typeinfo_of(PyTypeObject *type);
void ferry_py_typeinfo_clear(void);

/* ---- math_bits.c ------------------------------------------------------------------------------------------- */

enum { FERRY_PY_MATH_CONJ = 1, FERRY_PY_MATH_NEG = 2 };

/* A torch tensor's lazy bits that its DLPack export drops: FERRY_PY_MATH_NEG, and FERRY_PY_MATH_CONJ when
 * `ask_conj` (only complex tensors have it). May run Python code (a subclass's __torch_function__). -1 with an
 * exception set. */
int ferry_py_math_bits(PyObject *obj, bool ask_conj);
/* Steals `out` (NULL passes through) and returns it with `bits` set again: a view of the same memory. */
PyObject *ferry_py_math_bits_flip(PyObject *out, int bits);
/* 0, or -1 with a ValueError naming function `fn`'s operand `name` when torch tensor `obj` is a negative view: a
 * kernel reads an operand's memory. */
int ferry_py_math_bits_refuse(PyObject *obj, const char *fn, const char *name);

/* ---- dlpack_in.c ------------------------------------------------------------------------------------------- */

/* At import: the interned names and constant arguments of the __dlpack__ calls. 0, or -1 with an exception. */
int ferry_py_dlpack_in_init(void);

typedef struct ferry_py_outputs ferry_py_outputs;

/* One source-side input tensor, from the moment it is read until the copies out of it are done. */
typedef struct ferry_py_leaf {
  PyObject *obj;                         /* the input object (borrowed from the tape, which holds it) */
  uint8_t family;                        /* ferry_py_family of its type */
  const DLPackExchangeAPI *api;          /* exchange path: the framework's table; NULL on the capsule path */
  DLManagedTensorVersioned *managed;     /* capsule path, DLPack >= 1.0: we call its deleter when done */
  DLManagedTensor *managed_legacy;       /* capsule path, pre-1.0 producers */
  PyObject *output;                      /* the built output (strong), NULL until built */
  ferry_py_outputs *block;               /* the outputs block of its part (borrowed from the job), once added */
  uint32_t local;                        /* its index in that block */
  uint32_t dims_at;                      /* where its shape and strides are in the tape's dims (NO_DIMS: none) */
  uint8_t math_bits;                     /* torch's lazy bits the export dropped (math_bits.c), set on the output */
} ferry_py_leaf;

/* What reading an input needs to know about the transfer. */
typedef struct ferry_py_read_ctx {
  bool h2d;
  bool pass_all;              /* no CUDA: every tensor passes through, none is read */
  int device;                 /* resolved device */
  void *copy_stream;          /* the stream the copies run on: for producers' __dlpack__(stream=...) */
  bool have_copy_stream;
  bool producer_event_given;  /* then producers are not asked to synchronise (stream=-1) */
  const DLPackExchangeAPI *producer_api; /* first exchange-path framework seen: its current stream orders us */
} ferry_py_read_ctx;

/* Reads `obj` (a tensor whose type info is `ti`). Returns 1 and fills `tensor` and `leaf` when the tensor is on
 * the transfer's source side, 0 when it is not (it passes through; nothing held), -1 with an exception set.
 * `tensor`'s shape and strides are the producer's, valid only until Python code runs again: the caller copies
 * them at once. */
int ferry_py_read_tensor(ferry_py_read_ctx *ctx, PyObject *obj, const ferry_py_typeinfo *ti, ferry_tensor *tensor,
                         ferry_py_leaf *leaf);

/* Reads a ferry.ops operand wherever it lives (exchange API, else __dlpack__ with `cuda_stream` as the stream
 * argument of a CUDA producer). Returns 0 and fills `tensor` and `leaf` (on the exchange path `tensor`'s shape and
 * strides are the producer's, valid only until Python code runs again: copy them), or -1 with an exception set. */
int ferry_py_read_operand(PyObject *obj, const ferry_py_typeinfo *ti, PyObject *cuda_stream, ferry_tensor *tensor,
                          ferry_py_leaf *leaf);

/* Releases what reading held (the producer's managed tensor). Call once the copies out of it are done or were
 * never submitted. Leaves `output` alone. */
void ferry_py_leaf_release_input(ferry_py_leaf *leaf);

/* ---- outputs.c --------------------------------------------------------------------------------------------- */

/* The outputs of one part of a transfer: one DLPack tensor per copied input, all viewing the part's slab.
 * Reference-counted (atomically: frameworks may drop their tensors on any thread, without the GIL); the last
 * reference releases the slab, which is when its memory goes back to the pool. */

/* Copies the descriptors of outputs [first, first + count) out of `ticket` and retains the slabs they view. The
 * caller owns one reference. Touches nothing Python's, so it runs with the GIL released (a block of a thousand
 * outputs faults in ~100 KB). NULL when out of memory, with no exception set. */
ferry_py_outputs *ferry_py_outputs_new(ferry_transfer *ticket, size_t first, size_t count);
void ferry_py_outputs_unref(ferry_py_outputs *o); /* any thread, no GIL needed; NULL accepted */
void ferry_py_outputs_ref(ferry_py_outputs *o);
int ferry_py_outputs_copied(const ferry_py_outputs *o, size_t index);
const DLTensor *ferry_py_outputs_tensor(const ferry_py_outputs *o, size_t index);

/* A new DLManagedTensorVersioned (or legacy DLManagedTensor) viewing output `index`; it holds a reference to the
 * block that its deleter drops. NULL with MemoryError set. */
DLManagedTensorVersioned *ferry_py_outputs_export(ferry_py_outputs *o, size_t index);
DLManagedTensor *ferry_py_outputs_export_legacy(ferry_py_outputs *o, size_t index);

/* Builds the output object for leaf `index` through the framework's exchange API (torch): no copy, no sync.
 * Returns a new reference or NULL with an exception set. */
PyObject *ferry_py_output_exchange(ferry_py_outputs *o, size_t index, const DLPackExchangeAPI *api);

/* Builds the output object for a capsule-path leaf after the copies are done: a ferry.SlabTensor handed to the
 * framework's from_dlpack (see the output rule in transfer.c). New reference or NULL with an exception set. */
PyObject *ferry_py_output_wrap(ferry_py_outputs *o, size_t index, uint8_t family, bool h2d);

void ferry_py_outputs_clear_cache(void);

/* false: device-side (H2D) outputs of non-torch inputs stay ferry.SlabTensor, whatever frameworks are importable.
 * Only the simulated driver (testing.c) clears it: its "device memory" is host memory that a real framework (CuPy,
 * JAX) would hand to the real driver. */
extern bool ferry_py_device_outputs_to_frameworks;

/* ---- exporter.c -------------------------------------------------------------------------------------------- */

extern PyTypeObject ferry_py_SlabTensor_Type;

/* A new ferry.SlabTensor for output `index` of `o` (takes its own reference to `o`). */
PyObject *ferry_py_slab_tensor_new(ferry_py_outputs *o, size_t index);

/* ---- batch.c ----------------------------------------------------------------------------------------------- */

/* The batch flattened in preorder: a container node is followed by its children. Every node holds strong
 * references to its object and key, so the rebuild never reads the caller's containers again (another thread
 * may change them while the GIL is released during the copies). */
typedef struct ferry_py_node {
  PyObject *obj;   /* the object at this place in the batch (strong) */
  PyObject *key;   /* dict key or dataclass field name under which it sits in its parent (strong), else NULL */
  uint32_t count;  /* containers: number of direct children; FERRY_PY_SHARED: the node it repeats */
  int32_t leaf;    /* index of its source-side tensor in the leaves array, -1 for everything else */
  uint8_t kind;    /* ferry_py_kind of a container, FERRY_PY_OTHER for a leaf, FERRY_PY_SHARED for a repeat */
  uint8_t flags;   /* FERRY_PY_NODE_* */
} ferry_py_node;

#define FERRY_PY_SHARED 0xff          /* a node kind: an object met before in the walk (count: its first node) */
#define FERRY_PY_NODE_WALKING 1       /* its children are being walked (meeting it again is a cycle) */
#define FERRY_PY_NODE_REPEATED 2      /* a later FERRY_PY_SHARED node repeats it: the rebuild keeps its result */

typedef struct ferry_py_addrmap ferry_py_addrmap; /* batch.c: a table from an address to indices */

typedef struct ferry_py_batch {
  ferry_py_node *nodes;
  size_t n_nodes, cap_nodes;
  ferry_py_leaf *leaves;   /* source-side tensors, in batch order */
  ferry_tensor *tensors;   /* their descriptors, in ferry's own memory (parallel to leaves) */
  size_t n_leaves, cap_leaves;
  int64_t *dims;           /* the leaves' shapes and strides (each leaf's dims_at) */
  size_t n_dims, cap_dims;
  size_t pending;          /* leaves [pending, n_leaves) are walked but not yet given to ferry */
  uint64_t pending_bytes;  /* the bytes those leaves hold, from their shapes and dtypes as read */
  ferry_py_addrmap *seen;  /* containers walked, by object, to their first node */
  ferry_py_addrmap *views; /* leaves, by the address of their first byte, to their index */
  uint32_t grown_holding;  /* times the tape grew with the GIL held (diagnostics: between items it need not) */
} ferry_py_batch;

#define FERRY_PY_MAX_DEPTH 1000 /* deeper batches raise RecursionError */

typedef struct ferry_py_pace ferry_py_pace;

/* Walks `root` into `b` (zero-initialised by the caller), reading source-side tensors through `ctx` and copying
 * their descriptors into `b` as they are read. A container met twice (a shared sub-batch) is walked once and
 * comes back shared, as copy.deepcopy keeps it. `pace` (may be NULL) is ticked after every node. `leaf_walked`
 * (may be NULL) is called with `arg` after every leaf added, and may give ferry the leaves walked so far
 * (ferry_py_batch_take_pending); 0 or -1 with an exception set, which ends the walk. Returns 0, or
 * -1 with an exception set (RecursionError for depth, ValueError for a cycle, RuntimeError for a dict changed
 * during the walk); `b` must be cleared either way. */
int ferry_py_batch_walk(ferry_py_batch *b, PyObject *root, ferry_py_read_ctx *ctx, ferry_py_pace *pace,
                        int (*leaf_walked)(void *arg), void *arg);

/* The leaves walked since the last call, as descriptors for ferry_transfer_add (valid until the walk goes on):
 * sets *first and *count and marks them taken. */
const ferry_tensor *ferry_py_batch_take_pending(ferry_py_batch *b, size_t *first, size_t *count);

/* Rebuilds the batch from the tape with each leaf's `output` in place of its tensor. Containers in which nothing
 * was copied, and every other object, are returned as the same objects. `pace` as for the walk. New reference or
 * NULL. */
PyObject *ferry_py_batch_rebuild(ferry_py_batch *b, ferry_py_pace *pace);

/* Whether rebuilding runs no Python code: every copied leaf has its output, every container is exactly a list,
 * tuple or dict, and every key an exact str or int. Then the batch may be rebuilt before the copies are done. */
bool ferry_py_batch_rebuild_is_plain(const ferry_py_batch *b);

/* Whether the tape's memory is large enough (a megabyte) that freeing it, or a plan of its size, is worth doing
 * with the GIL released. */
bool ferry_py_batch_large(const ferry_py_batch *b);

/* Drops every reference the tape holds and calls the producers' deleters, ticking `pace` (may be NULL) quietly;
 * then frees the tape's memory, with the GIL released when `pace` has release points and the tape is large, and
 * adds the tape's statistics to the pace's. */
void ferry_py_batch_clear(ferry_py_batch *b, ferry_py_pace *pace);

/* ---- gc_defer.c -------------------------------------------------------------------------------------------- */

extern bool ferry_py_gc_deferral; /* test hook _gc_deferral: false leaves the collector alone */

/* Turns the collector off for a region of a transfer call that makes outputs, GIL held (nested regions of a thread
 * share one deferral). Returns 1 when it deferred (pass that to the end call), 0 when not. */
int ferry_py_gc_defer_begin(void);
void ferry_py_gc_defer_end(int began);
/* Around every release of the GIL inside a region (pace.c's unlock/relock and release points): the collector back
 * as the application has it while other threads run, and off again once the GIL is back. No-ops outside one. */
void ferry_py_gc_lend(void);
void ferry_py_gc_reclaim(void);
/* A call into Python code made inside a region (a consumer's from_dlpack, a container's constructor): it is the
 * application's code, and may release the GIL, so the collector is lent for its duration. */
#define FERRY_PY_GC_LENT(call)                                                                                      \
  __extension__({                                                                                                   \
    ferry_py_gc_lend();                                                                                             \
    PyObject *lent_result_ = (call);                                                                                \
    ferry_py_gc_reclaim();                                                                                          \
    lent_result_;                                                                                                   \
  })

/* ---- pace.c ------------------------------------------------------------------------------------------------ *
 *
 * Long GIL-holding work (walking a batch, building its outputs, rebuilding it) ticks a pace after every item. At
 * most every `slice_ns` of holding, a tick makes a release point: the GIL is released, so a thread waiting for it
 * gets it. See pace.c for how a waiting thread is made to get it in time. */

struct ferry_py_pace {
  int64_t slice_ns;          /* release at most this long after the hold began; 0: no release points */
  int64_t since;             /* when the current hold began (CLOCK_MONOTONIC ns) */
  unsigned ticks;
  bool measure;              /* record the holds below (diagnostics) */
  int64_t max_hold_ns;       /* the longest hold seen */
  uint32_t holds;            /* number of holds ended */
  uint32_t hold_hist[8];     /* holds by length: < 25, 50, 100, 200, 400, 800, 1600 us, and longer */
  uint32_t tape_grown_holding; /* the cleared tapes' grown_holding */
  bool interrupted;          /* a release point raised a signal handler's exception (Ctrl-C) */
};

/* Starts a pace (GIL held): the current hold begins now. `slice_ns` 0 turns release points off. */
void ferry_py_pace_init(ferry_py_pace *p, int64_t slice_ns, bool measure);

/* Ends the current hold (for the statistics), e.g. before a long GIL-free wait. */
void ferry_py_pace_pause(ferry_py_pace *p);
/* Starts a new hold after ferry_py_pace_pause, once the GIL is held again. */
void ferry_py_pace_resume(ferry_py_pace *p);

/* Releases the GIL for work that needs none, ending the current hold (and lending the collector, gc_defer.c); `p`
 * may be NULL. The pair is the one way ferry's own GIL-free work (driver calls, waits, large frees) steps out. */
PyThreadState *ferry_py_pace_unlock(ferry_py_pace *p);
/* Takes the GIL back after ferry_py_pace_unlock and starts a new hold. */
void ferry_py_pace_relock(ferry_py_pace *p, PyThreadState *ts);

int ferry_py_pace_check(ferry_py_pace *p);

/* After every item of GIL-holding work: a release point when the slice is over. 0 or -1 with an exception set.
 * The clock is read every 4th tick (a read costs ~20 ns; an item ~50-500 ns). */
static inline int ferry_py_pace_tick(ferry_py_pace *p) {
  if (!p || !p->slice_ns || (++p->ticks & 3)) return 0;
  return ferry_py_pace_check(p);
}

/* The same in work that must run to its end once begun (dropping what a finished call held): no signal is
 * checked, so nothing can fail. */
void ferry_py_pace_check_quiet(ferry_py_pace *p);
static inline void ferry_py_pace_tick_quiet(ferry_py_pace *p) {
  if (p && p->slice_ns && !(++p->ticks & 3)) ferry_py_pace_check_quiet(p);
}

/* While ferry holds the GIL for long work beside other Python threads, CPython's switch interval (5 ms by
 * default) decides how soon a thread waiting for the GIL asks for it; ferry shortens it to its slice for the
 * duration and puts it back after (see pace.c). Returns 1 when it shortened it (pass that to the end call), 0
 * when it did not (no other Python thread, or turned off), -1 with an exception set. */
int ferry_py_gil_share_begin(void);
void ferry_py_gil_share_end(int began);
/* At import: a child forked while a thread shared the GIL gets the application's switch interval back. */
int ferry_py_pace_module_init(void);
/* With sharing on, steps aside for ferry_py_gil_start_yield_ns before the first hold of a call (0: not). */
void ferry_py_gil_start_yield(int sharing);

/* The pacing settings: the slice (0: no release points) and the switch interval used while sharing (0: leave
 * CPython's alone), in nanoseconds. Private switches for the benchmarks change them (test-hook builds only). */
extern int64_t ferry_py_gil_slice_ns, ferry_py_gil_switch_ns, ferry_py_gil_start_yield_ns;

/* Whether another Python thread exists that could want the GIL. */
bool ferry_py_other_python_threads(void);

/* ---- transfer.c -------------------------------------------------------------------------------------------- */

/* Phase stamps of one job (CLOCK_MONOTONIC ns, the clock of time.perf_counter_ns on Linux), taken only while
 * the private switch _ferry._phase_timing(True) is on: a diagnostic for the benchmarks. 0 = not reached. */
enum {
  FERRY_PY_PHASE_START,     /* the call began */
  FERRY_PY_PHASE_FIRST,     /* the first part was submitted: the copies run from here */
  FERRY_PY_PHASE_WALKED,    /* the batch is walked, every part submitted, the transfer ended, the torch outputs
                               built and (when that runs no Python code) the batch rebuilt */
  FERRY_PY_PHASE_WAITED,    /* the copies are done (the GIL was released meanwhile) */
  FERRY_PY_PHASE_FINISHED,  /* the other outputs are built and the batch rebuilt */
  FERRY_PY_PHASE_COUNT
};

/* A part goes early (before the walk's end or a full part) only while its tensors are smaller than this on
 * average: then the copies are short and the walk is what the call waits for. Large tensors (a state dict's) copy
 * for far longer than they take to walk, so up to a full part of them is one part, cut into sub-parts by the C
 * core as the pool needs, and holds no more pinned memory than its bytes. Also ferry.torch.Stager's rule, through
 * the module constant _EARLY_PART_MAX_MEAN_BYTES. */
#define FERRY_PY_EARLY_PART_MAX_MEAN_BYTES ((uint64_t)1 << 20)

/* One transfer, from submission to the rebuilt batch. Owned by the caller (a C stack frame or a ferry.Transfer). */
typedef struct ferry_py_job {
  bool h2d;
  int state;                  /* FERRY_PY_JOB_* */
  PyObject *batch;            /* the input batch (strong) */
  PyObject *result;           /* the rebuilt batch once finished (strong) */
  ferry_py_batch tape;
  ferry_py_read_ctx ctx;
  const struct ferry_py_args *args; /* the call's arguments, while the job starts (NULL after) */
  ferry_transfer_options opts;/* made when the first part is submitted */
  const DLPackExchangeAPI *ordered_after; /* the framework whose current stream the copies were ordered after */
  ferry_transfer *ticket;     /* NULL until the first part is submitted */
  ferry_py_outputs **blocks;  /* the parts' output blocks (one reference each) */
  size_t n_blocks, cap_blocks;
  ferry_py_pace pace;
  int64_t phases[FERRY_PY_PHASE_COUNT];
} ferry_py_job;

enum { FERRY_PY_JOB_EMPTY = 0, FERRY_PY_JOB_SUBMITTED, FERRY_PY_JOB_FINISHED };

/* Validates the arguments and walks the batch, submitting it in parts as it goes (the copies of the first tensors
 * run while the rest are walked) and building the exchange-path (torch) outputs of each part while its copies
 * run; then ends the transfer. No GIL hold is longer than a slice (pace.c). On return the job is SUBMITTED, or
 * FINISHED (nothing to copy, or no CUDA: result is the batch itself). Returns 0, or -1 with an exception set and
 * the job cleared. */
int ferry_py_job_start(ferry_py_job *job, bool h2d, const char *name, PyObject *const *args, Py_ssize_t nargs,
                       PyObject *kwnames);

/* Waits for the copies (GIL released), builds the remaining outputs and rebuilds the batch into job->result.
 * Returns 0, or -1 with an exception set (the job is then cleared). Runs Python code (consumers' from_dlpack,
 * container constructors); not reentrant for one job (ferry.Transfer guards it). */
int ferry_py_job_finish(ferry_py_job *job);

/* 1 when the copies are done, failed (wait reports it), or nothing was submitted; 0 while they run. Never
 * blocks. */
int ferry_py_job_query(ferry_py_job *job);

/* Releases everything the job holds; a submitted job's copies are waited for first, so that no copy still reads
 * an input or writes an output that has been freed. `release_gil`: wait with the GIL released (false from a
 * garbage collector's tp_clear). */
void ferry_py_job_clear(ferry_py_job *job, bool release_gil);

PyObject *ferry_py_transfer_d2h(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *ferry_py_transfer_h2d(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);

/* Private switches for the benchmarks and tests (underscored in ferry._ferry, test-hook builds only):
 *   _phase_timing(flag)       stamp the phases (and GIL holds) of every job from now on; returns the old flag
 *   _last_phases()            the last job this thread finished: phase stamps (ns or None) and GIL hold stats
 *   _gil_pacing(slice_us=None, switch_us=None)  the pacing settings; returns the previous (slice_us, switch_us)
 *   _gc_deferral(flag)        whether transfers turn the collector off while they run (gc_defer.c); the old flag */
PyObject *ferry_py_phase_timing(PyObject *self, PyObject *flag);
PyObject *ferry_py_last_phases(PyObject *self, PyObject *unused);
PyObject *ferry_py_gil_pacing(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *ferry_py_gil_start_yield_us(PyObject *self, PyObject *arg);
PyObject *ferry_py_gc_deferral_hook(PyObject *self, PyObject *flag);

/* ---- handle.c ---------------------------------------------------------------------------------------------- */

extern PyTypeObject ferry_py_Transfer_Type;
PyObject *ferry_py_transfer_d2h_async(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *ferry_py_transfer_h2d_async(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);

/* ---- pool.c ------------------------------------------------------------------------------------------------ */

PyObject *ferry_py_pool_reserve(PyObject *self, PyObject *arg);
PyObject *ferry_py_pool_trim(PyObject *self, PyObject *unused);
PyObject *ferry_py_pool_stats(PyObject *self, PyObject *unused);
PyObject *ferry_py_record_stream(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* ---- module.c ---------------------------------------------------------------------------------------------- */

/* Readies `type` and adds it to module `m` as `name` (the module gets a new reference to the type). 0 or -1. */
int ferry_py_add_type(PyObject *m, PyTypeObject *type, const char *name);

/* ---- ops_module.c ------------------------------------------------------------------------------------------ */

/* Adds ferry.ops's types and its function table (the submodule object _ferry._ops) to the module. */
int ferry_py_ops_init(PyObject *module);

/* ---- testing.c (FERRY_PYTHON_TEST_HOOKS only) ----------------------------------------------------------- */

#ifdef FERRY_PYTHON_TEST_HOOKS
int ferry_py_testing_init(PyObject *module);
#endif

#endif /* FERRY_PY_H */
