/* ferry.h — the core of libferry's public API: version, status codes and errors, devices, tensors, transfers and
 * the pinned pool. The operator runtime (GEMMs compiled once, artifacts, graphs) is an add-on in ferry/ops.h.
 *
 * ferry moves batches of GPU tensors to pinned host memory (D2H) and back (H2D) on a dedicated, cached copy
 * stream, at the speed of the copy engines. It loads the CUDA driver with dlopen at first use: this header needs
 * no CUDA header, and a program built against it runs (passing tensors through unchanged) on a machine without a
 * GPU.
 *
 * Conventions, for every function below and in ferry/ops.h:
 *   - A fallible call returns ferry_status: FERRY_OK (0) on success, a negative code on failure. Results are
 *     written through `out` parameters, and only on success.
 *   - On failure, ferry_last_error() describes what went wrong, on the calling thread.
 *   - Streams, events and contexts cross the API as opaque pointers: pass a CUstream as `void *`.
 *   - Destroy and release functions accept NULL; retain functions return their argument.
 *   - Names: functions are ferry_<object>_<action> (ferry_transfer_wait); one that reads a record into the caller's
 *     struct, or returns a pointer to one, ends in _get (ferry_pool_stats_get, ferry_op_info_get). Enum
 *     constants carry their type's name (FERRY_DEVICE_CUDA, FERRY_DTYPE_FLOAT, FERRY_TRANSFER_BLOCKING), except
 *     the status codes (FERRY_OK, FERRY_INVALID_ARGUMENT...).
 *   - Every function is thread-safe unless its comment says otherwise: calls may run on any threads at once, on
 *     the same ticket, slab or operator too. A struct the caller owns (options, arguments) is the caller's to
 *     share or not.
 *   - The library never prints and never exits.
 */
#ifndef FERRY_H
#define FERRY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define FERRY_API __declspec(dllexport)
#elif defined(__GNUC__)
#define FERRY_API __attribute__((visibility("default")))
#else
#define FERRY_API
#endif

/* The project() version of CMakeLists.txt (a CPU test holds the two equal). */
#define FERRY_VERSION_MAJOR 0
#define FERRY_VERSION_MINOR 3
#define FERRY_VERSION_PATCH 0

/** Returns the library's version as "MAJOR.MINOR.PATCH". The string is static. */
FERRY_API const char *ferry_version(void);

/* ------------------------------------------------------------------------------------------------------------ */
/* Status codes and errors                                                                                        */

/* One table: the enum, ferry_status_name() and ferry_status_str() are all generated from it. */
#define FERRY_STATUS_MAP(X)                                                                                      \
  X(OK, 0, "success")                                                                                            \
  X(INVALID_ARGUMENT, -1, "invalid argument")                                                                    \
  X(NO_DRIVER, -2, "the CUDA driver (libcuda.so.1) could not be loaded")                                         \
  X(NO_DEVICE, -3, "no CUDA device is available")                                                                \
  X(DEVICE_UNAVAILABLE, -4, "the requested CUDA device index does not exist")                                   \
  X(DEVICE_MISMATCH, -5, "a stream or tensor belongs to another device than the one requested")                \
  X(OUT_OF_HOST_MEMORY, -6, "out of host memory (pageable or pinned)")                                           \
  X(OUT_OF_DEVICE_MEMORY, -7, "out of device memory")                                                            \
  X(DRIVER_ERROR, -8, "a CUDA driver call failed")                                                               \
  X(NOT_READY, -9, "the work has not finished yet")                                                              \
  X(UNSUPPORTED, -10, "the operation is not supported here")                                                     \
  X(OVERFLOW, -11, "a size, shape or stride computation overflows")                                              \
  X(INTERNAL, -12, "internal error in ferry")                                                                   \
  X(COMPILE_FAILED, -13, "compiling a kernel at run time failed (the compiler's log is in the message)")         \
  X(NO_COMPILER, -14, "the run-time compiler NVRTC (libnvrtc.so) could not be loaded")                           \
  X(BAD_ARTIFACT, -15, "an artifact file is damaged, truncated, of another format or for another operator")     \
  X(IO_ERROR, -16, "reading or writing a file failed")

typedef enum ferry_status {
#define FERRY_STATUS_ENUM_GEN(name, code, text) FERRY_##name = code,
  FERRY_STATUS_MAP(FERRY_STATUS_ENUM_GEN)
#undef FERRY_STATUS_ENUM_GEN
} ferry_status;

/** The enum's name without prefix ("INVALID_ARGUMENT"); "UNKNOWN" for a value not in the table. Static. */
FERRY_API const char *ferry_status_name(ferry_status status);

/** A one-line description of the status ("invalid argument"). Static. */
FERRY_API const char *ferry_status_str(ferry_status status);

/* The last error of the calling thread. Every failing call overwrites it; successful calls leave it alone. */
typedef struct ferry_error {
  ferry_status status;   /* what the failing call returned */
  int cu_result;         /* raw CUresult of the driver call that failed, 0 when no driver call failed */
  const char *cu_name;   /* its name ("CUDA_ERROR_OUT_OF_MEMORY"), "" when none; static */
  const char *call;      /* the driver or library call that failed ("cuMemHostRegister"), "" when none; static */
  const char *file;      /* source file and line inside ferry where the error was raised; static */
  int line;
  char message[512];     /* a sentence a user can act on, naming the values involved */
} ferry_error;

/** The calling thread's last error. The pointer stays valid for the thread's life; the record is overwritten by
 *  the thread's next failing call. Never NULL: before any error, status is FERRY_OK and message is "". */
FERRY_API const ferry_error *ferry_last_error(void);

/** Shorthand for ferry_last_error()->message. */
FERRY_API const char *ferry_last_error_message(void);

/** Resets the calling thread's last error to FERRY_OK. */
FERRY_API void ferry_clear_error(void);

/* ------------------------------------------------------------------------------------------------------------ */
/* Runtime and devices                                                                                            */

/** Loads the CUDA driver (once per process; later calls return the first result at once).
 *  Returns FERRY_OK, FERRY_NO_DRIVER when libcuda.so.1 cannot be opened or initialised, or FERRY_NO_DEVICE when
 *  it loads but sees no device. Every other call that needs the driver calls this itself.
 *  Fork: in a child forked (without exec) after ferry initialised the driver, every call that needs the driver
 *  returns FERRY_UNSUPPORTED saying so; after ferry loaded NVRTC, so does every compile that needs NVRTC. Calls
 *  that need neither work in the child, and none waits on a lock another thread held at the fork. Use spawn or
 *  forkserver for workers that need the GPU. */
FERRY_API ferry_status ferry_init(void);

/** Number of CUDA devices; 0 when there is no driver or no device (never an error). */
FERRY_API int ferry_device_count(void);

/** Resolves the device a call should use: `requested` if >= 0, else the LOCAL_RANK environment variable, else 0.
 *  Fails with FERRY_INVALID_ARGUMENT when LOCAL_RANK is not a non-negative integer (checked first, with or
 *  without a driver), FERRY_NO_DRIVER / FERRY_NO_DEVICE when there is no GPU, FERRY_DEVICE_UNAVAILABLE (naming
 *  the index and the count) when it is past the device count. */
FERRY_API ferry_status ferry_device_resolve(int requested, int *out_device);

typedef struct ferry_device_info {
  char name[256];
  int ordinal;
  int cc_major, cc_minor;
  int multiprocessors;
  int async_engines;       /* copy engines: 2 or more lets D2H and H2D run at once */
  size_t total_memory;
  int driver_version;      /* e.g. 13000 */
} ferry_device_info;

/** Fills `out` with the device's properties. The caller owns `out`. */
FERRY_API ferry_status ferry_device_info_get(int device, ferry_device_info *out);

/** The calling thread's dedicated copy stream for `device` (a CUstream, non-blocking), created on first use and
 *  cached for the thread's life; ferry destroys it when the thread exits. Do not destroy it yourself. */
FERRY_API ferry_status ferry_copy_stream(int device, void **out_stream);

/* ------------------------------------------------------------------------------------------------------------ */
/* Tensors                                                                                                         */

/* Device types use DLPack's numbers, so DLPack producers' values pass straight through. */
typedef enum ferry_device_type {
  FERRY_DEVICE_CPU = 1,          /* kDLCPU: host memory, pageable or pinned */
  FERRY_DEVICE_CUDA = 2,         /* kDLCUDA */
  FERRY_DEVICE_CUDA_HOST = 3,    /* kDLCUDAHost: pinned host memory */
  FERRY_DEVICE_CUDA_MANAGED = 13 /* kDLCUDAManaged */
} ferry_device_type;

typedef enum ferry_dtype_code {
  FERRY_DTYPE_INT = 0, FERRY_DTYPE_UINT = 1, FERRY_DTYPE_FLOAT = 2, FERRY_DTYPE_BFLOAT = 4,
  FERRY_DTYPE_COMPLEX = 5, FERRY_DTYPE_BOOL = 6
} ferry_dtype_code;

typedef struct ferry_device { int32_t device_type; int32_t device_id; } ferry_device;
typedef struct ferry_dtype { uint8_t code; uint8_t bits; uint16_t lanes; } ferry_dtype;

/* A strided view of memory, laid out exactly like DLPack's DLTensor: a `DLTensor *` may be passed where a
 * `ferry_tensor *` is expected. `strides` counts elements and may be NULL for a compact row-major tensor.
 * ferry never frees anything a tensor points to that the caller gave it. */
typedef struct ferry_tensor {
  void *data;
  ferry_device device;
  int32_t ndim;
  ferry_dtype dtype;
  int64_t *shape;
  int64_t *strides;
  uint64_t byte_offset;
} ferry_tensor;

/** Bytes the tensor's elements occupy when packed (product of shape × element size).
 *  Fails with FERRY_INVALID_ARGUMENT on a negative dimension, ndim past FERRY_MAX_NDIM, a NULL shape with ndim
 *  > 0 or a zero-width dtype, FERRY_UNSUPPORTED on a dtype that is not a whole number of bytes (bits x lanes not
 *  a multiple of 8), and FERRY_OVERFLOW when the product exceeds 2^62 bytes. */
FERRY_API ferry_status ferry_tensor_nbytes(const ferry_tensor *tensor, uint64_t *out_bytes);

#define FERRY_MAX_NDIM 16

/* ------------------------------------------------------------------------------------------------------------ */
/* Transfers                                                                                                       */

typedef struct ferry_transfer ferry_transfer; /* a submitted batch: the ticket */
typedef struct ferry_slab ferry_slab;         /* the one buffer a batch's outputs view */

enum ferry_transfer_flags {
  /** Wait for the copies before the submitting call returns (the SPDL contract). If the copies fail, the call
   *  returns their error and no ticket, like any other failure. Without it, the call returns after submission
   *  and the caller waits with ferry_transfer_wait. */
  FERRY_TRANSFER_BLOCKING = 1u << 0,
  /** Do not use the device gather kernel: every tensor is its own DMA (strided tensors then fail with
   *  FERRY_UNSUPPORTED). For measuring and for drivers where the kernel cannot load. */
  FERRY_TRANSFER_NO_GATHER = 1u << 1,
  /** Submit per-tensor copies in a loop instead of one cuMemcpyBatchAsync (the primitive reference). */
  FERRY_TRANSFER_NO_BATCH_API = 1u << 2
};

typedef struct ferry_transfer_options {
  uint32_t struct_size;      /* sizeof(ferry_transfer_options): set by ferry_transfer_options_init */
  uint32_t flags;            /* ferry_transfer_flags */
  int device;                /* the source (D2H) or target (H2D) device; -1 resolves as ferry_device_resolve */
  void *stream;              /* CUstream to copy on, which must belong to `device`; NULL: the thread's copy stream */
  void *producer_event;      /* CUevent marking when the inputs are ready; NULL: see producer_stream */
  void *producer_stream;     /* when producer_event is NULL, an event is recorded on this CUstream (the caller's
                                current stream) and the copy stream waits on it; NULL means the legacy default
                                stream */
  uint64_t gather_max_bytes; /* contiguous tensors up to this size go through the gather kernel when there are
                                several of them; 0 picks the default (1 MiB) */
} ferry_transfer_options;

/** Fills `options` with the defaults: blocking off, device -1, thread's copy stream, legacy default producer. */
FERRY_API void ferry_transfer_options_init(ferry_transfer_options *options);

/** Submits a device-to-host transfer of `count` tensors.
 *
 *  Tensors on `options->device` (FERRY_DEVICE_CUDA) are copied into one pinned host slab; their outputs are
 *  compact row-major FERRY_DEVICE_CPU tensors viewing it. Every other tensor (host memory, another device) is
 *  passed through: its output is the input descriptor (its data the input's; its shape and strides copied, as
 *  every output's, into the ticket). Zero-size tensors give empty outputs. When there is no driver or no device,
 *  every tensor passes through and the call succeeds, after the checks a device would make of the CUDA tensors
 *  (INVALID_ARGUMENT, OVERFLOW or UNSUPPORTED for a descriptor a device would refuse).
 *
 *  ferry reads each input descriptor (shape and strides included) once, during the call, and plans from its own
 *  copy: the arrays may change or be freed as soon as the call returns. The tensors' data must stay valid and
 *  unchanged until the transfer completes.
 *
 *  Ownership: on success *out_transfer is a new ticket the caller releases with ferry_transfer_release. On
 *  failure *out_transfer is untouched, nothing the call allocated is left in use (a region it pinned stays in the
 *  pool for later transfers, as after a success) and no memory that a queued copy may still touch is reused
 *  before that copy has finished.
 *
 *  Same as ferry_transfer_begin_d2h, one ferry_transfer_add of all the tensors, and ferry_transfer_end (releasing
 *  the ticket when any of them fails). */
FERRY_API ferry_status ferry_transfer_d2h(const ferry_tensor *inputs, size_t count,
                                          const ferry_transfer_options *options, ferry_transfer **out_transfer);

/** Submits a host-to-device transfer: host tensors (FERRY_DEVICE_CPU or CUDA_HOST, pinned or pageable) are copied
 *  into one device slab on `options->device`; outputs are compact FERRY_DEVICE_CUDA tensors viewing it. Tensors
 *  already on a device pass through. Ownership as ferry_transfer_d2h. The device slab is freed (stream-ordered,
 *  after the work queued on the legacy default stream at release time) when its last reference goes. */
FERRY_API ferry_status ferry_transfer_h2d(const ferry_tensor *inputs, size_t count,
                                          const ferry_transfer_options *options, ferry_transfer **out_transfer);

/* A transfer built in parts. The copies of each part start as soon as it is added, so a caller that reads its
 * tensors bit by bit (walking a large nested batch) overlaps that work with the copies:
 *
 *   ferry_transfer *t;
 *   ferry_transfer_begin_d2h(&opts, &t);          device, stream, order after the producer
 *   ferry_transfer_add(t, part1, n1);             planned and queued at once; outputs [0, n1) laid out
 *   ferry_transfer_add(t, part2, n2);             outputs [n1, n1 + n2)
 *   ferry_transfer_end(t);                        one completion for everything (waits when BLOCKING)
 *   ferry_transfer_wait(t); ... ferry_transfer_release(t);
 *
 * Each part gets its own slab from the pool (ferry_transfer_output_slab says which; a large D2H part may be cut
 * into several, see ferry_transfer_slab_count). A failed call kills the
 * transfer: every later add, end, wait and query returns that failure again, and the ticket can only be released
 * (which keeps every slab out of the pool until the copies queued before the failure have finished). A ticket is
 * used by one thread at a time while it is being built; the copies run on the stream chosen at begin (by default
 * the beginning thread's copy stream, which lives as long as that thread). */

/** Starts a device-to-host transfer with no tensors yet: resolves the device and the stream and orders the copies
 *  of every later part after the producer (options as for ferry_transfer_d2h; FERRY_TRANSFER_BLOCKING makes
 *  ferry_transfer_end wait). On success *out_transfer is a new ticket (release it with ferry_transfer_release). */
FERRY_API ferry_status ferry_transfer_begin_d2h(const ferry_transfer_options *options, ferry_transfer **out_transfer);

/** As ferry_transfer_begin_d2h, for a host-to-device transfer. */
FERRY_API ferry_status ferry_transfer_begin_h2d(const ferry_transfer_options *options, ferry_transfer **out_transfer);

/** Adds `count` tensors and queues their copies at once. Their outputs follow the earlier parts' outputs, in
 *  order; they are laid out when the call returns (ferry_transfer_outputs), but their data may be read only after
 *  the transfer is done. The descriptors are read during the call, as by ferry_transfer_d2h. Fails (killing the
 *  transfer) as ferry_transfer_d2h/h2d would for these tensors, or with FERRY_INVALID_ARGUMENT once ended. An
 *  error about one tensor names its index among all the transfer's tensors (its output's index), not this call's. */
FERRY_API ferry_status ferry_transfer_add(ferry_transfer *transfer, const ferry_tensor *inputs, size_t count);

/** Orders the copies of parts added from now on after `producer_event`, or when it is NULL after the work queued
 *  so far on `producer_stream` (NULL: the legacy default stream): for a batch whose later tensors come from
 *  another producer than the one given at begin. In an H2D transfer the CPU packs small pageable sources when
 *  their part is added, after waiting on the host for `producer_event` (as for the one given at begin), so that
 *  event must stay valid, and not be recorded again, until those parts are added; a `producer_stream` orders the
 *  device's copies only. */
FERRY_API ferry_status ferry_transfer_order_after(ferry_transfer *transfer, void *producer_event,
                                                  void *producer_stream);

/** Ends the transfer: no more parts. Records one completion for all the copies; with FERRY_TRANSFER_BLOCKING it
 *  also waits for them and returns their error, if any (the ticket still needs releasing). */
FERRY_API ferry_status ferry_transfer_end(ferry_transfer *transfer);

/** Blocks until the transfer's copies are done. Returns FERRY_OK, or the error the copies ended with — the same
 *  error on every call, also when a query saw it first. Several threads may wait on (or query) one ended ticket at
 *  the same time; release it only once all of them have returned. FERRY_INVALID_ARGUMENT before ferry_transfer_end.
 *  On a transfer killed by a failed call, it waits until no copy queued before the failure runs any more, then
 *  returns that failure: the inputs may be freed once it returns. */
FERRY_API ferry_status ferry_transfer_wait(ferry_transfer *transfer);

/** FERRY_OK when the copies are done, FERRY_NOT_READY while they run (not recorded as an error), or their error,
 *  which every later wait and query returns too. */
FERRY_API ferry_status ferry_transfer_query(ferry_transfer *transfer);

/** Number of outputs (the tensors added so far). */
FERRY_API size_t ferry_transfer_count(const ferry_transfer *transfer);

/** The outputs, one per input, in input order. The array and the shapes and strides it points to are owned by
 *  the ticket; the array is valid until the next ferry_transfer_add or ferry_transfer_release, the shapes and
 *  strides until ferry_transfer_release. Their data may be read only after the transfer is done. */
FERRY_API const ferry_tensor *ferry_transfer_outputs(const ferry_transfer *transfer);

/** 1 when output `index` was copied by ferry, 0 when it is an input passed through. */
FERRY_API int ferry_transfer_output_copied(const ferry_transfer *transfer, size_t index);

/** The device the transfer resolved to, -1 when everything passed through because there is no device. */
FERRY_API int ferry_transfer_device(const ferry_transfer *transfer);

/** The slabs the copied outputs view, one per part that copied something: ferry_transfer_slab_count of them
 *  (0 when nothing was copied), the one at `index` (NULL past the end), and ferry_transfer_slab, the first. A
 *  one-call transfer has a part for each 1024 tensors (so that the first part copies while the rest is planned),
 *  and a D2H part the pool cannot hold as it is (larger than 256 MiB, or one the pool would grow by more than that
 *  for, or one only a range pinned for a larger tensor holds) is cut into parts of about 256 MiB (at tensor
 *  boundaries) that fill the pool's free ranges or regions pinned one part ahead of the copies, so that pinning a
 *  fresh pool overlaps them (docs/guide.md, the pinned pool, has the rules).
 *  Borrowed from the ticket: call ferry_slab_retain to keep the memory beyond ferry_transfer_release. */
FERRY_API size_t ferry_transfer_slab_count(const ferry_transfer *transfer);
FERRY_API ferry_slab *ferry_transfer_slab_at(const ferry_transfer *transfer, size_t index);
FERRY_API ferry_slab *ferry_transfer_slab(const ferry_transfer *transfer);

/** The slab output `index` views, NULL when it was passed through, is empty or does not exist. Borrowed. */
FERRY_API ferry_slab *ferry_transfer_output_slab(const ferry_transfer *transfer, size_t index);

/** Releases the ticket. The slabs live on while retained; if the copies still run, the memory is not reused
 *  until they finish (the pool checks the ticket's event before handing it out again). A ticket released before
 *  ferry_transfer_end is ended first. NULL is accepted. */
FERRY_API void ferry_transfer_release(ferry_transfer *transfer);

/** Adds a reference to the slab and returns it (NULL: nothing, returns NULL). */
FERRY_API ferry_slab *ferry_slab_retain(ferry_slab *slab);

/** Drops a reference; the last one returns pinned memory to the pool or frees device memory. NULL is accepted.
 *  Safe from any thread, with or without a CUDA context current. */
FERRY_API void ferry_slab_release(ferry_slab *slab);

/** Makes the slab's memory wait for work on `stream` before it is reused: when the slab's last reference goes,
 *  ferry marks the point `stream` (a CUstream; NULL: the legacy default stream) has then reached, and hands the
 *  memory out again only after the work queued there up to that point has finished — what torch's
 *  Tensor.record_stream does for its own allocator. Use it when work you queue on a stream of your own reads or
 *  writes an output and you may drop the output before that work runs (a non-blocking .to("cuda") of a D2H
 *  output, a kernel on a side stream reading an H2D output). Up to 8 streams per slab (FERRY_UNSUPPORTED beyond);
 *  the stream must be in a device's primary context (FERRY_DEVICE_MISMATCH). A stream being captured into a CUDA
 *  graph when the slab's last reference goes is not waited for: keep memory that a graph reads alive for as long
 *  as the graph may be replayed. Thread-safe. */
FERRY_API ferry_status ferry_slab_record_stream(ferry_slab *slab, void *stream);

/** The live slab that holds `address` (a D2H output's host address, an H2D output's device address), or NULL.
 *  Borrowed: valid while something keeps the slab alive, such as the output that holds the address. */
FERRY_API ferry_slab *ferry_slab_find(const void *address);

/** The slab's base address and size in bytes. */
FERRY_API void *ferry_slab_data(const ferry_slab *slab);
FERRY_API size_t ferry_slab_size(const ferry_slab *slab);

/* ------------------------------------------------------------------------------------------------------------ */
/* The pinned host pool                                                                                            */
/*                                                                                                                 */
/* Fork: the pool's memory is not inherited by a forked child (MADV_DONTFORK), so a fork never copies it. In the   */
/* child, an output that views a pinned slab cannot be read (its pages are reserved but inaccessible): copy what a */
/* child needs out of ferry's outputs before forking. The parent's outputs are unaffected.                         */

typedef struct ferry_pool_stats {
  uint64_t bytes_pinned;      /* pinned by the pool now, free or in use */
  uint64_t bytes_in_use;      /* held by live slabs, and by released slabs whose copies still run */
  uint64_t bytes_peak_in_use; /* highest bytes_in_use seen */
  uint64_t bytes_peak_pinned; /* highest bytes_pinned seen */
  uint64_t regions;           /* pinned regions (each one pin call) */
  uint64_t pin_calls;         /* regions pinned since start */
  double pin_seconds;         /* wall time spent pinning (fault-in + register) since start */
  uint64_t hits;              /* slab requests served from already-pinned memory */
  uint64_t misses;            /* slab requests that had to pin new memory */
} ferry_pool_stats;

/** Ensures at least `bytes` of pinned memory are free in the pool, pinning a new region if needed, so a later
 *  transfer of that size starts without pinning (0 bytes: nothing to do, FERRY_OK anywhere). Returns
 *  FERRY_NO_DRIVER / FERRY_NO_DEVICE without a GPU, and FERRY_OUT_OF_HOST_MEMORY, before touching any page, when
 *  the region would be larger than the machine's memory or than the memory available now (MemAvailable, or what a
 *  cgroup v2 memory limit leaves); transfers that need a new region fail the same way. */
FERRY_API ferry_status ferry_pool_reserve(size_t bytes);

/** Unpins and frees every pinned region no slab uses. Slabs in use are untouched. */
FERRY_API ferry_status ferry_pool_trim(void);

/** Copies the pool's counters into `out` (caller-owned), after returning released slabs whose copies have finished.
 *  Works without a GPU (all zero). */
FERRY_API void ferry_pool_stats_get(ferry_pool_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_H */
