/* ferry.h — the whole public surface of libferry.
 *
 * ferry moves batches of GPU tensors to pinned host memory (D2H) and back (H2D) on a dedicated, cached copy
 * stream, at the speed of the copy engines. It loads the CUDA driver with dlopen at first use: this header needs
 * no CUDA header, and a program built against it runs (passing tensors through unchanged) on a machine without a
 * GPU.
 *
 * Conventions, for every function below:
 *   - A fallible call returns ferry_status: FERRY_OK (0) on success, a negative code on failure. Results are
 *     written through `out` parameters, and only on success.
 *   - On failure, ferry_last_error() describes what went wrong, on the calling thread.
 *   - Streams, events and contexts cross the API as opaque pointers: pass a CUstream as `void *`.
 *   - Destroy and release functions accept NULL.
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

#define FERRY_VERSION_MAJOR 0
#define FERRY_VERSION_MINOR 1
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
 *  Fails with FERRY_INVALID_ARGUMENT on a negative dimension, ndim past FERRY_MAX_NDIM or a zero-width dtype,
 *  and FERRY_OVERFLOW when the product does not fit in 64 bits. */
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
 *  passed through: its output is the input descriptor itself. Zero-size tensors give empty outputs. When there is
 *  no driver or no device, every tensor passes through and the call succeeds.
 *
 *  ferry reads each input descriptor (shape and strides included) once, during the call, and plans from its own
 *  copy: the arrays may change or be freed as soon as the call returns. The tensors' data must stay valid and
 *  unchanged until the transfer completes.
 *
 *  Ownership: on success *out_transfer is a new ticket the caller releases with ferry_transfer_release. On
 *  failure nothing was allocated or left pinned, *out_transfer is untouched and no memory that a queued copy may
 *  still touch is reused before that copy has finished.
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
 * Each part gets its own slab from the pool (ferry_transfer_output_slab says which). A failed call kills the
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
 *  transfer) as ferry_transfer_d2h/h2d would for these tensors, or with FERRY_INVALID_ARGUMENT once ended. */
FERRY_API ferry_status ferry_transfer_add(ferry_transfer *transfer, const ferry_tensor *inputs, size_t count);

/** Orders the copies of parts added from now on after `producer_event`, or when it is NULL after the work queued
 *  so far on `producer_stream` (NULL: the legacy default stream): for a batch whose later tensors come from
 *  another producer than the one given at begin. */
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
 *  (0 when nothing was copied; at most 1 for ferry_transfer_d2h/h2d), the one at `index` (NULL past the end), and
 *  ferry_transfer_slab, the first (for a one-call transfer, the slab of every copied output). Borrowed from the
 *  ticket: call ferry_slab_retain to keep the memory beyond ferry_transfer_release. */
FERRY_API size_t ferry_transfer_slab_count(const ferry_transfer *transfer);
FERRY_API ferry_slab *ferry_transfer_slab_at(const ferry_transfer *transfer, size_t index);
FERRY_API ferry_slab *ferry_transfer_slab(const ferry_transfer *transfer);

/** The slab output `index` views, NULL when it was passed through, is empty or does not exist. Borrowed. */
FERRY_API ferry_slab *ferry_transfer_output_slab(const ferry_transfer *transfer, size_t index);

/** Releases the ticket. The slabs live on while retained; if the copies still run, the memory is not reused
 *  until they finish (the pool checks the ticket's event before handing it out again). A ticket released before
 *  ferry_transfer_end is ended first. NULL is accepted. */
FERRY_API void ferry_transfer_release(ferry_transfer *transfer);

/** Adds a reference to the slab. */
FERRY_API void ferry_slab_retain(ferry_slab *slab);

/** Drops a reference; the last one returns pinned memory to the pool or frees device memory. NULL is accepted.
 *  Safe from any thread, with or without a CUDA context current. */
FERRY_API void ferry_slab_release(ferry_slab *slab);

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
 *  transfer of that size starts without pinning. Returns FERRY_NO_DRIVER / FERRY_NO_DEVICE without a GPU. */
FERRY_API ferry_status ferry_pool_reserve(size_t bytes);

/** Unpins and frees every pinned region no slab uses. Slabs in use are untouched. */
FERRY_API ferry_status ferry_pool_trim(void);

/** Copies the pool's counters into `out` (caller-owned), after returning released slabs whose copies have finished.
 *  Works without a GPU (all zero). */
FERRY_API void ferry_pool_stats_get(ferry_pool_stats *out);

/* ------------------------------------------------------------------------------------------------------------ */
/* Operators: GEMM arguments                                                                                       */
/*                                                                                                                 */
/* The operator runtime discovers, checks, compiles (NVRTC, once) and launches GPU operators, a GEMM family first:  */
/*   out[l] = alpha * A[l] · B[l] + beta * out[l],  A m×k, B k×n, out m×n, for l in [0, L).                       */
/* Typical use:                                                                                                    */
/*   ferry_gemm_args args;  ferry_gemm_args_init(&args, &A, &B, &out, FERRY_F32);      validated once            */
/*   const ferry_op *ops[8]; size_t n;  ferry_ops_find(&args, 0, NULL, NULL, ops, 8, &n);                          */
/*   ferry_artifact *art;  ferry_op_compile(ops[0], &args, &art);                       NVRTC or a cache, once    */
/*   ferry_op_run(ops[0], &args, stream, art, FERRY_ASSUME_SUPPORTED);                  a launch, nothing else    */
/*   ferry_artifact_release(art);                                                                                  */

/* Element types of GEMM operands and accumulators. */
typedef enum ferry_scalar { FERRY_SCALAR_NONE = 0, FERRY_F16 = 1, FERRY_BF16 = 2, FERRY_F32 = 3 } ferry_scalar;
#define FERRY_SCALAR_BIT(s) (1u << (s))
#define FERRY_SCALARS_FLOAT (FERRY_SCALAR_BIT(FERRY_F16) | FERRY_SCALAR_BIT(FERRY_BF16) | FERRY_SCALAR_BIT(FERRY_F32))

/* The major mode of a matrix operand: which of its two dimensions is contiguous. Row-major: the last (columns;
 * k for A, n for B and out); column-major: the first. The other dimension's stride is the leading dimension. */
typedef enum ferry_major { FERRY_ROW_MAJOR = 0, FERRY_COL_MAJOR = 1 } ferry_major;
#define FERRY_MAJOR_BIT(m) (1u << (m))
#define FERRY_MAJORS_ANY (FERRY_MAJOR_BIT(FERRY_ROW_MAJOR) | FERRY_MAJOR_BIT(FERRY_COL_MAJOR))

/* The packed `kind` of a problem: operand types and majors, the part of a problem a compiled kernel is
 * specialised on (an artifact serves every problem of its kind, whatever the sizes). */
#define FERRY_GEMM_KIND(a_type, b_type, out_type, acc_type, a_major, b_major, out_major)                        \
  ((uint32_t)(a_type) | (uint32_t)(b_type) << 2 | (uint32_t)(out_type) << 4 | (uint32_t)(acc_type) << 6 |      \
   (uint32_t)(a_major) << 8 | (uint32_t)(b_major) << 9 | (uint32_t)(out_major) << 10)

/* The compact description of a GEMM that ferry_gemm_args_init computes once, so that support checks and launches
 * are integer compares and copies. Read it; do not write it. */
typedef struct ferry_gemm_problem {
  int32_t m, n, k, l;            /* out is m×n, A m×k, B k×n; l batches (1 when out has rank 2) */
  int64_t lda, ldb, ldc;         /* leading dimensions in elements (the stride of the non-contiguous dimension) */
  int64_t batch_a, batch_b, batch_c; /* elements between consecutive batches; 0 for a rank-2 operand broadcast */
  uint32_t kind;                 /* FERRY_GEMM_KIND of the fields below */
  uint8_t a_type, b_type, out_type, acc_type; /* ferry_scalar */
  uint8_t a_major, b_major, out_major;        /* ferry_major */
  uint8_t a_align, b_align, out_align;        /* bytes (1, 2, 4, 8 or 16): the largest power of two up to 16 that
                                                 divides the operand's address, leading dimension and batch
                                                 stride in bytes (what vector loads of the operand may assume) */
  int32_t device;                /* the CUDA device of the operands */
} ferry_gemm_problem;

/* GEMM arguments: the operands' device addresses, alpha/beta, and the validated problem. The caller owns the
 * struct (it may live on the stack) and the memory it points to; ferry keeps no pointer to it after a call. */
typedef struct ferry_gemm_args {
  uint32_t struct_size;          /* sizeof(ferry_gemm_args); set by ferry_gemm_args_init, checked by every call */
  float alpha, beta;             /* out = alpha*A·B + beta*out; init sets 1 and 0; change them at will. With
                                    beta == 0 the output is never read (it may hold NaN or garbage). */
  const void *a, *b;             /* device addresses of element [0,0(,0)] of A and B (data + byte_offset) */
  void *out;
  ferry_gemm_problem problem;    /* computed by ferry_gemm_args_init */
} ferry_gemm_args;

/** Validates A (m×k), B (k×n) and out (m×n) — rank 2, or rank 3 with a leading batch dimension l — and fills
 *  `args` (alpha 1, beta 0). Operands are fp16, bf16 or fp32 (DLPack codes FLOAT 16/32, BFLOAT 16, one lane), on
 *  one CUDA device (FERRY_DEVICE_CUDA or CUDA_MANAGED), row- or column-major (NULL strides: compact row-major).
 *  out's elements must not overlap (leading dimension at least its contiguous extent, batches apart); A and B are
 *  only read, so stride-0 (expanded) views are accepted. A rank-2 A or B beside a rank-3 out, or a batch of 1, is
 *  broadcast over the batch. `accumulator` is FERRY_F32 or FERRY_F16 (which operators accept it is theirs to say).
 *  Fails with FERRY_INVALID_ARGUMENT naming the operand and the values (NULL pointers, ranks, mismatched shapes,
 *  negative sizes or strides, overlapping layouts, unsupported dtypes, devices), FERRY_OVERFLOW when an extent
 *  passes 2^31-1 or an offset passes 2^63. Nothing is dereferenced: the tensors' memory is not touched.
 *  `args` is written only on success. */
FERRY_API ferry_status ferry_gemm_args_init(ferry_gemm_args *args, const ferry_tensor *A, const ferry_tensor *B,
                                            const ferry_tensor *out, ferry_scalar accumulator);

/** Points validated `args` at other operands of the same shapes, strides, types and device (a new batch of
 *  inputs for the same GEMM), recomputing only the alignment. NULL keeps that operand. Cheap: no validation of
 *  shapes happens again, so the caller vouches that the new memory has the old layout. */
FERRY_API ferry_status ferry_gemm_args_set_data(ferry_gemm_args *args, const void *a, const void *b, void *out);

/** "fp16", "bf16", "fp32", or "?" for another value. Static. */
FERRY_API const char *ferry_scalar_name(ferry_scalar scalar);

/* ------------------------------------------------------------------------------------------------------------ */
/* Operators: targets, discovery and support checks                                                               */

/** The compute capability to compile for, as major*10+minor (90 for sm_90): the FERRY_ARCH environment variable
 *  when set ("sm_90", "90", "9.0"; an "a" suffix as in "sm_90a" is accepted and means the same chip), else the
 *  capability of `device` (-1 resolves as ferry_device_resolve). Works without a GPU when FERRY_ARCH is set.
 *  Fails with FERRY_INVALID_ARGUMENT for an unreadable FERRY_ARCH, or the device's error (FERRY_NO_DRIVER...). */
FERRY_API ferry_status ferry_target_sm(int device, int *out_sm);

/** Capability check: FERRY_OK when the target (ferry_target_sm(-1)) is at least `min_sm` (80 = sm_80); else
 *  FERRY_UNSUPPORTED with a reason in `reason` (when not NULL; always NUL-terminated when reason_size > 0) and
 *  the last error, e.g. "this needs sm_80 or newer; cuda:0 (NVIDIA T4) is sm_75", or why there is no target. */
FERRY_API ferry_status ferry_target_supports(int min_sm, char *reason, size_t reason_size);

/* An operator: one kernel design (tile shape, pipeline, instruction) with its operand constraints. Operators are
 * registered for the life of the process and never freed; pointers to them stay valid. */
typedef struct ferry_op ferry_op;

/* What an operator is and what it accepts. Strings are static or owned by the operator. */
typedef struct ferry_op_info {
  const char *name;              /* unique, e.g. "gemm_mma_f16_128x128x32_s4" */
  const char *instruction;       /* "mma.sync.m16n8k16", "simt.fma", or what a registered operator declares */
  int32_t tile_m, tile_n, tile_k; /* output tile per thread block, and k per pipeline stage */
  int32_t stages;                /* shared-memory pipeline depth */
  int32_t threads;               /* threads per block */
  uint32_t smem_bytes;           /* dynamic shared memory per block (the largest over the kinds it compiles) */
  int32_t min_sm;                /* oldest target it compiles for (80 = sm_80) */
  uint32_t a_types, b_types, out_types, acc_types; /* FERRY_SCALAR_BIT masks of accepted types */
  uint32_t a_majors, b_majors, out_majors;         /* FERRY_MAJOR_BIT masks of accepted majors */
  uint32_t a_align, b_align, out_align;            /* required problem alignment in bytes (1: any) */
  uint32_t div_m, div_n, div_k;  /* m, n, k must be multiples of these (1: any) */
  int32_t builtin;               /* 1 for ferry's own operators, 0 for registered ones */
} ferry_op_info;

/** The operator's description; valid for the life of the process. NULL for a NULL op. */
FERRY_API const ferry_op_info *ferry_op_get_info(const ferry_op *op);

/** Number of registered operators (ferry's own first, then those registered, in order), and the one at `index`
 *  (NULL past the end). Thread-safe against concurrent registration. */
FERRY_API size_t ferry_ops_count(void);
FERRY_API const ferry_op *ferry_ops_get(size_t index);

/** The operator registered under `name`, or NULL. */
FERRY_API const ferry_op *ferry_op_by_name(const char *name);

/** A discovery filter: return nonzero to keep the operator. */
typedef int (*ferry_op_filter_fn)(const ferry_op_info *info, void *user);

/** Every registered operator that supports `args` on `target_sm` (0: ferry_target_sm of the operands' device),
 *  kept by `filter` (NULL keeps all), best first for this problem: tensor-core designs before SIMT, then the tile
 *  that fills the chip with the fewest idle blocks. Writes up to `capacity` operators to `out_ops` (may be NULL
 *  when capacity is 0) and the number found, which may be larger, to *out_count. Finding none is not an error. */
FERRY_API ferry_status ferry_ops_find(const ferry_gemm_args *args, int target_sm, ferry_op_filter_fn filter,
                                      void *filter_user, const ferry_op **out_ops, size_t capacity,
                                      size_t *out_count);

/** FERRY_OK when `op` supports `args` (types, majors, alignment, divisibility, limits, and a registered
 *  operator's own check); else FERRY_UNSUPPORTED with the first reason, e.g. "operand A: expected bf16, got
 *  fp16", written to `reason` (when not NULL and reason_size > 0) and to the last error. A handful of integer
 *  compares: no allocation, and text is formatted only on failure. Targets are checked by find and compile. */
FERRY_API ferry_status ferry_op_supports(const ferry_op *op, const ferry_gemm_args *args, char *reason,
                                         size_t reason_size);

/* ------------------------------------------------------------------------------------------------------------ */
/* Operators: compile once, artifacts, the caches                                                                 */

/* A compiled operator: a cubin for one target and one problem kind, loaded into the driver (a context-
 * independent CUlibrary) when a device is there, with its launch layout laid out once. Reference-counted. */
typedef struct ferry_artifact ferry_artifact;

/** Compiles `op` for `args`'s kind and the target of ferry_target_sm(args' device) — or returns the artifact
 *  already made: from the in-memory memo, else from the verified disk cache, else by NVRTC (and then stored).
 *  What it returns is always NVRTC's output for this operator's source, options, target and toolchain (or the
 *  disk cache's copy of it), never an imported artifact. Compiling needs NVRTC and no GPU. When the operands' device is present and of the target's capability, the
 *  cubin is loaded too. On success *out holds a new reference the caller releases with ferry_artifact_release;
 *  on failure *out is untouched. Errors: FERRY_UNSUPPORTED (op does not support args, or the target is older than
 *  the op's min_sm or unknown to NVRTC), FERRY_NO_COMPILER, FERRY_COMPILE_FAILED (the NVRTC log, truncated, in
 *  the message), driver errors from loading. A disk cache that cannot be used is skipped, not an error (see
 *  ferry_cache_stats_get). Thread-safe. */
FERRY_API ferry_status ferry_op_compile(const ferry_op *op, const ferry_gemm_args *args, ferry_artifact **out);

/** As ferry_op_compile, for an explicit target (90 = sm_90), e.g. to build artifacts for another machine. */
FERRY_API ferry_status ferry_op_compile_for(const ferry_op *op, const ferry_gemm_args *args, int target_sm,
                                            ferry_artifact **out);

/** Adds a reference and returns `artifact`. */
FERRY_API ferry_artifact *ferry_artifact_retain(ferry_artifact *artifact);

/** Drops a reference; the last one unloads the library and frees the cubin. NULL is accepted. Runs already
 *  submitted keep working; do not release an artifact's last reference while a graph still uses it (a graph
 *  holds its own references). */
FERRY_API void ferry_artifact_release(ferry_artifact *artifact);

/** The artifact's operator, target (90 = sm_90) and problem kind (FERRY_GEMM_KIND). */
FERRY_API const ferry_op *ferry_artifact_op(const ferry_artifact *artifact);
FERRY_API int ferry_artifact_target_sm(const ferry_artifact *artifact);
FERRY_API uint32_t ferry_artifact_kind(const ferry_artifact *artifact);

/** The cubin (ELF) bytes, owned by the artifact and valid while it lives; *out_size gets their count. */
FERRY_API const void *ferry_artifact_cubin(const ferry_artifact *artifact, size_t *out_size);

/** Writes the artifact to `path` in ferry's artifact format (magic, format version, key, lengths and a checksum
 *  of the content — XXH64, which catches damage, not tampering), atomically: a temporary file beside it,
 *  written, flushed and renamed over `path`. The file is created 0644 (less the umask). Errors: FERRY_IO_ERROR
 *  naming the path and the system's reason. Files of an older format are refused by import. */
FERRY_API ferry_status ferry_artifact_export(const ferry_artifact *artifact, const char *path);

/** Reads an artifact written by ferry_artifact_export, verifying everything (format, version, lengths, checksum,
 *  a cubin inside) and that an operator of the recorded name is registered with the same source. The checks find
 *  damage, not tampering: an imported artifact is trusted GPU code, which the caller vouches for as it would for a
 *  shared library it loads (nothing proves who made the file or that its cubin was compiled from that source).
 *  It is not memoised: use it by passing it to ferry_op_run or ferry_graph_run; ferry_op_compile and runs
 *  without an artifact never return or use it. On success *out is a new reference (release it); on failure
 *  nothing is loaded: FERRY_BAD_ARTIFACT says what did not verify, FERRY_IO_ERROR why the file could not be read.
 *  No NVRTC is needed. */
FERRY_API ferry_status ferry_artifact_import(const char *path, ferry_artifact **out);

/* Counters of the compile caches, for the process. The disk cache lives in $XDG_CACHE_HOME/ferry (else
 * ~/.cache/ferry), created 0700; it is not used (and disk_note says why) when FERRY_DISK_CACHE=0, when the
 * directory is a symbolic link, is not owned by the user, or is writable by group or others. */
typedef struct ferry_cache_stats {
  uint64_t memo_hits, memo_misses;     /* compile requests answered from memory / not */
  uint64_t disk_hits, disk_misses;     /* memo misses answered from disk / not */
  uint64_t disk_writes, disk_write_failures;
  uint64_t disk_rejected;              /* cache files that failed verification, removed and rebuilt */
  uint64_t compiles;                   /* NVRTC compilations */
  double compile_seconds;              /* their total wall time */
  int32_t disk_enabled;                /* 1 when the last lookup could use the disk cache */
  char disk_dir[512];                  /* the directory of the last lookup */
  char disk_note[256];                 /* why the disk cache was skipped, or the last file rejected and why */
} ferry_cache_stats;

/** Copies the counters into `out` (caller-owned). */
FERRY_API void ferry_cache_stats_get(ferry_cache_stats *out);

/** Drops the in-memory memo (the references it holds; artifacts held by callers stay valid), so the next compile
 *  reads the disk cache. Must not run concurrently with ferry_op_run calls that pass no artifact. */
FERRY_API void ferry_ops_clear_memo(void);

/* ------------------------------------------------------------------------------------------------------------ */
/* Operators: run                                                                                                  */

enum ferry_run_flags {
  /** Skip the support check (the caller vouches that `op` supports `args` and that the artifact is of args'
   *  kind): the launch is then a parameter copy and one cuLaunchKernel. */
  FERRY_ASSUME_SUPPORTED = 1u << 0
};

/** Launches `op` on `args` on `stream` (a CUstream of the operands' device; NULL is the legacy default stream).
 *  With an artifact, its kernel runs; without one, the memo's artifact for args' kind and the device's
 *  capability is used, compiled once on first need (never per call). The launch path allocates nothing, formats
 *  nothing and takes no lock; it makes the device's primary context current around the launch when another is.
 *  Works under stream capture (someone else's, e.g. torch.cuda.graph, or ferry_graph_begin's). An empty problem
 *  (m or n zero) launches nothing. Errors: FERRY_UNSUPPORTED with the reason (unless FERRY_ASSUME_SUPPORTED),
 *  FERRY_INVALID_ARGUMENT for NULLs, an artifact of another operator, kind or capability, driver errors. */
FERRY_API ferry_status ferry_op_run(const ferry_op *op, const ferry_gemm_args *args, void *stream,
                                    ferry_artifact *artifact, uint32_t flags);

/* ------------------------------------------------------------------------------------------------------------ */
/* Operators: CUDA graphs with operand update                                                                     */

/* A captured sequence of runs, instantiated once and replayed; each run's operands can be changed in the
 * instantiated graph without capturing again. */
typedef struct ferry_graph ferry_graph;

/** Starts capturing `stream` (thread-local capture mode) into a new graph. Work the caller queues on `stream` is
 *  captured too; runs added with ferry_graph_run are recorded so they can be updated. On success the caller owns
 *  *out (ferry_graph_destroy); on failure nothing is left capturing. */
FERRY_API ferry_status ferry_graph_begin(void *stream, ferry_graph **out);

/** Runs `op` into the capture (as ferry_op_run on the graph's stream) and records which kernel node it made;
 *  *out_index (may be NULL) gets the run's index for ferry_graph_update. The graph keeps a reference to the
 *  artifact used. Compile before capturing: a run that must compile first compiles outside the stream anyway. */
FERRY_API ferry_status ferry_graph_run(ferry_graph *graph, const ferry_op *op, const ferry_gemm_args *args,
                                       ferry_artifact *artifact, uint32_t flags, size_t *out_index);

/** Ends the capture and instantiates the graph. On failure the graph can only be destroyed. */
FERRY_API ferry_status ferry_graph_end(ferry_graph *graph);

/** Launches the instantiated graph on `stream` (NULL: the stream it was captured on). */
FERRY_API ferry_status ferry_graph_replay(ferry_graph *graph, void *stream);

/** Gives run `index` new arguments — other operands, alpha/beta, sizes — in the instantiated graph, in place
 *  (cuGraphExecKernelNodeSetParams): the next replay uses them. The new args must be supported by the run's
 *  operator and be of the kind of its artifact; a run captured empty (m or n zero) cannot be updated. Not
 *  concurrent with a replay being submitted from another thread. */
FERRY_API ferry_status ferry_graph_update(ferry_graph *graph, size_t index, const ferry_gemm_args *args);

/** Number of runs recorded with ferry_graph_run. */
FERRY_API size_t ferry_graph_run_count(const ferry_graph *graph);

/** Ends a capture still in progress (discarding it), destroys the graph and its instance, and drops the
 *  artifact references. NULL is accepted. Replays already submitted finish normally. */
FERRY_API void ferry_graph_destroy(ferry_graph *graph);

/* ------------------------------------------------------------------------------------------------------------ */
/* Operators: bring your own kernel                                                                                */

/* The kernel parameter of every built-in GEMM, and of a registered operator that brings no params callback:
 * ferry prepends the same struct (named ferry_gemm_params, 104 bytes) to every operator's CUDA source, with the
 * problem's kind as macros (FERRY_A_TYPE, FERRY_B_TYPE, FERRY_OUT_TYPE, FERRY_ACC_TYPE: 1 fp16, 2 bf16, 3 fp32;
 * FERRY_A_ROW, FERRY_B_ROW, FERRY_OUT_ROW: 1 row-major, 0 column-major), so a kernel declared
 *   extern "C" __global__ void my_gemm(ferry_gemm_params p)
 * can read it. The grid is (ceil(m/tile_m) * ceil(n/tile_n), 1, l) blocks of `threads`, with `smem_bytes` of
 * dynamic shared memory. Element (i, j) of batch z of A is at a + z*batch_a + (row-major ? i*lda + j : i + j*lda),
 * in elements; likewise B (k×n) and out (m×n). */
typedef struct ferry_gemm_params {
  const void *a, *b;
  void *out;
  int64_t lda, ldb, ldc;
  int64_t batch_a, batch_b, batch_c;
  int32_t m, n, k, l;
  float alpha, beta;
  uint32_t kind;                 /* FERRY_GEMM_KIND of the problem */
  uint32_t reserved;             /* 0 */
} ferry_gemm_params;

/** A registered operator's own support check: return 1 to accept; else 0 after writing a reason into `reason`
 *  (capacity reason_size, may be 0). Called after the metadata checks passed; must be fast and thread-safe. */
typedef int (*ferry_op_supports_fn)(const ferry_gemm_args *args, char *reason, size_t reason_size, void *user);

/** Fills the kernel's one parameter (params_size bytes at `params`, aligned to 16) from `args`, for kernels that
 *  take something else than ferry_gemm_params. Called on every launch: no allocation, no blocking. */
typedef void (*ferry_op_params_fn)(const ferry_gemm_args *args, void *params, void *user);

#define FERRY_OP_PARAMS_MAX 256

/* How to register an operator. Strings and arrays are copied; the callbacks and `user` must outlive the process's
 * use of the operator (operators are never unregistered). */
typedef struct ferry_op_desc {
  uint32_t struct_size;          /* sizeof(ferry_op_desc); set by ferry_op_desc_init */
  ferry_op_info info;            /* name (required, unique), design and constraints; `builtin` is ignored */
  const char *source;            /* CUDA C source (no host headers); ferry prepends ferry_gemm_params and macros */
  const char *entry;             /* the extern "C" __global__ function to launch */
  const char *const *options;    /* extra NVRTC options (e.g. "-DTILE=64"), n_options of them; may be NULL */
  int32_t n_options;
  ferry_op_supports_fn supports; /* optional, after the metadata checks */
  ferry_op_params_fn params;     /* optional; NULL: the kernel takes ferry_gemm_params */
  uint32_t params_size;          /* bytes `params` writes, 1..FERRY_OP_PARAMS_MAX (ignored without params) */
  void *user;                    /* passed to the callbacks */
} ferry_op_desc;

/** Fills `desc` with defaults: every float type and major accepted, fp32 accumulation, alignment and divisibility
 *  1, a 64×64×16 tile of 256 threads, one stage, no shared memory, min_sm 75, no callbacks. */
FERRY_API void ferry_op_desc_init(ferry_op_desc *desc);

/** Registers an operator; it then appears in ferry_ops_find, compiles, runs and captures like ferry's own. On
 *  success *out (may be NULL) points at it. Fails with FERRY_INVALID_ARGUMENT for a missing or duplicate name,
 *  no source or entry, empty type or major masks, a non-power-of-two alignment, zero tile sizes or threads, or
 *  params_size out of range. The source is compiled only when first needed (its errors come from compile). */
FERRY_API ferry_status ferry_op_register(const ferry_op_desc *desc, const ferry_op **out);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_H */
