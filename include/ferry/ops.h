/* ferry/ops.h — the operator runtime of libferry: GEMM arguments, discovery and support checks, compile once
 * (NVRTC) into artifacts with an in-memory memo and a verified disk cache, launch, CUDA graphs with operand update,
 * and operators brought by the user. It builds on the core header, ferry.h (status codes, errors, devices,
 * tensors), whose conventions hold here too, thread safety included: every function is thread-safe unless its
 * comment says otherwise (a graph, for one, is used by one thread at a time). The same library carries both.
 */
#ifndef FERRY_OPS_H
#define FERRY_OPS_H

#include <ferry.h>
#include <ferry/gemm_params.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------------------------ */
/* Operators: GEMM arguments                                                                                       */
/*                                                                                                                 */
/* The operator runtime discovers, checks, compiles (NVRTC, once) and launches GPU operators, a GEMM family first:  */
/*   out[l] = alpha * A[l] · B[l] + beta * out[l],  A m×k, B k×n, out m×n, for l in [0, L).                       */
/* Typical use:                                                                                                    */
/*   ferry_gemm_args args;  ferry_gemm_args_init(&args, &A, &B, &out, FERRY_SCALAR_F32);  validated once        */
/*   const ferry_op *ops[8]; size_t n;  ferry_ops_find(&args, 0, NULL, NULL, ops, 8, &n);                          */
/*   ferry_artifact *art;  ferry_op_compile(ops[0], &args, &art);                       NVRTC or a cache, once    */
/*   ferry_op_run(ops[0], &args, stream, art, FERRY_RUN_ASSUME_SUPPORTED);                  a launch, nothing else    */
/*   ferry_artifact_release(art);                                                                                  */

/* Element types of GEMM operands and accumulators: the closed set the GEMM kinds and the operators' type masks are
 * made of. A tensor's element type stays a ferry_dtype (DLPack's code, bits, lanes); ferry_gemm_args_init maps
 * FLOAT 16 to FERRY_SCALAR_F16, BFLOAT 16 to FERRY_SCALAR_BF16, FLOAT 32 to FERRY_SCALAR_F32, DLPack's
 * float8_e4m3fn (code 10, 8 bits) to FERRY_SCALAR_E4M3, float8_e5m2 (code 12) to FERRY_SCALAR_E5M2, INT 8 to
 * FERRY_SCALAR_I8 and INT 32 to FERRY_SCALAR_I32. The 8-bit types are GEMM inputs only; int32 is an output and an
 * accumulator (of int8 inputs). */
typedef enum ferry_scalar {
  FERRY_SCALAR_NONE = 0, FERRY_SCALAR_F16 = 1, FERRY_SCALAR_BF16 = 2, FERRY_SCALAR_F32 = 3,
  FERRY_SCALAR_E4M3 = 4, FERRY_SCALAR_E5M2 = 5, FERRY_SCALAR_I8 = 6, FERRY_SCALAR_I32 = 7
} ferry_scalar;
#define FERRY_SCALAR_BIT(s) (1u << (s))
#define FERRY_SCALARS_FLOAT                                                                                      \
  (FERRY_SCALAR_BIT(FERRY_SCALAR_F16) | FERRY_SCALAR_BIT(FERRY_SCALAR_BF16) | FERRY_SCALAR_BIT(FERRY_SCALAR_F32))
#define FERRY_SCALARS_FP8 (FERRY_SCALAR_BIT(FERRY_SCALAR_E4M3) | FERRY_SCALAR_BIT(FERRY_SCALAR_E5M2))

/* The major mode of a matrix operand: which of its two dimensions is contiguous. Row-major: the last (columns;
 * k for A, n for B and out); column-major: the first. The other dimension's stride is the leading dimension. */
typedef enum ferry_major { FERRY_MAJOR_ROW = 0, FERRY_MAJOR_COL = 1 } ferry_major;
#define FERRY_MAJOR_BIT(m) (1u << (m))
#define FERRY_MAJORS_ANY (FERRY_MAJOR_BIT(FERRY_MAJOR_ROW) | FERRY_MAJOR_BIT(FERRY_MAJOR_COL))

/* The packed `kind` of a problem: operand types and majors, the part of a problem a compiled kernel is
 * specialised on (an artifact serves every problem of its kind, whatever the sizes). An epilogue adds its bias
 * mode, activation and scales above them (FERRY_GEMM_KIND_EPILOGUE, FERRY_GEMM_KIND_SCALED). The fields are read
 * back with the FERRY_GEMM_KIND_* accessors below, nowhere by hand. */
#define FERRY_GEMM_KIND(a_type, b_type, out_type, acc_type, a_major, b_major, out_major)                        \
  ((uint32_t)(a_type) | (uint32_t)(b_type) << 3 | (uint32_t)(out_type) << 6 | (uint32_t)(acc_type) << 9 |      \
   (uint32_t)(a_major) << 12 | (uint32_t)(b_major) << 13 | (uint32_t)(out_major) << 14)
#define FERRY_GEMM_KIND_EPILOGUE(bias, activation) ((uint32_t)(bias) << 15 | (uint32_t)(activation) << 17)
#define FERRY_GEMM_KIND_SCALED (1u << 19) /* alpha is multiplied by the scales (ferry_gemm_args_set_scales) */
#define FERRY_GEMM_KIND_OPERANDS 0x7fffu /* the bits of FERRY_GEMM_KIND: types and majors, without the epilogue */
#define FERRY_GEMM_KIND_BITS 20          /* every kind is below 1 << FERRY_GEMM_KIND_BITS */
#define FERRY_GEMM_KIND_A_TYPE(kind) ((uint32_t)(kind) & 7u)           /* ferry_scalar */
#define FERRY_GEMM_KIND_B_TYPE(kind) (((uint32_t)(kind) >> 3) & 7u)
#define FERRY_GEMM_KIND_OUT_TYPE(kind) (((uint32_t)(kind) >> 6) & 7u)
#define FERRY_GEMM_KIND_ACC_TYPE(kind) (((uint32_t)(kind) >> 9) & 7u)
#define FERRY_GEMM_KIND_A_MAJOR(kind) (((uint32_t)(kind) >> 12) & 1u)  /* ferry_major */
#define FERRY_GEMM_KIND_B_MAJOR(kind) (((uint32_t)(kind) >> 13) & 1u)
#define FERRY_GEMM_KIND_OUT_MAJOR(kind) (((uint32_t)(kind) >> 14) & 1u)
#define FERRY_GEMM_KIND_BIAS(kind) (((uint32_t)(kind) >> 15) & 3u)       /* ferry_bias */
#define FERRY_GEMM_KIND_ACTIVATION(kind) (((uint32_t)(kind) >> 17) & 3u) /* ferry_activation */

/* A fused epilogue: out = activation(alpha·A·B + beta·out + bias), in fp32, then converted to out's type.
 * The bias is a vector of out's type: FERRY_BIAS_ROW is a row of n values, one per column (out[i][j] + bias[j], as
 * a linear layer's bias), FERRY_BIAS_COL a column of m values, one per row (out[i][j] + bias[i]); one vector for
 * every batch. Activations: ReLU max(x, 0); GELU with the tanh approximation, 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715
 * x³))) (torch's approximate="tanh"); SiLU x / (1 + e^-x). */
typedef enum ferry_bias { FERRY_BIAS_NONE = 0, FERRY_BIAS_ROW = 1, FERRY_BIAS_COL = 2 } ferry_bias;
typedef enum ferry_activation {
  FERRY_ACTIVATION_NONE = 0, FERRY_ACTIVATION_RELU = 1, FERRY_ACTIVATION_GELU_TANH = 2, FERRY_ACTIVATION_SILU = 3
} ferry_activation;

/* The compact description of a GEMM that ferry_gemm_args_init computes once, so that support checks and launches
 * are integer compares and copies. Read it; do not write it. */
typedef struct ferry_gemm_problem {
  int32_t m, n, k, l;            /* out is m×n, A m×k, B k×n; l batches (1 when out has rank 2) */
  int64_t lda, ldb, ldc;         /* leading dimensions in elements (the stride of the non-contiguous dimension) */
  int64_t batch_a, batch_b, batch_c; /* elements between consecutive batches; 0 for a rank-2 operand broadcast */
  uint32_t kind;                 /* FERRY_GEMM_KIND of the fields below, | FERRY_GEMM_KIND_EPILOGUE */
  uint8_t a_type, b_type, out_type, acc_type; /* ferry_scalar */
  uint8_t a_major, b_major, out_major;        /* ferry_major */
  uint8_t a_align, b_align, out_align;        /* bytes (1, 2, 4, 8 or 16): the largest power of two up to 16 that
                                                 divides the operand's address, leading dimension and batch
                                                 stride in bytes (what vector loads of the operand may assume);
                                                 0 for an address not aligned to its elements, which
                                                 ferry_gemm_args_set_data may take and no operator supports */
  int32_t device;                /* the CUDA device of the operands */
  uint8_t bias, activation;      /* ferry_bias, ferry_activation (ferry_gemm_args_set_epilogue) */
  uint8_t scaled;                /* 1: alpha is multiplied by the scales (ferry_gemm_args_set_scales) */
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
  const void *bias;              /* device address of the epilogue's bias vector; NULL without one */
  const float *scale_a, *scale_b; /* device addresses of A's and B's fp32 scales; NULL without them */
} ferry_gemm_args;

/** Validates A (m×k), B (k×n) and out (m×n) — rank 2, or rank 3 with a leading batch dimension l — and fills
 *  `args` (alpha 1, beta 0). Operands are fp16, bf16 or fp32 (DLPack codes FLOAT 16/32, BFLOAT 16, one lane), on
 *  one CUDA device (FERRY_DEVICE_CUDA or CUDA_MANAGED), row- or column-major (NULL strides: compact row-major).
 *  out's elements must not overlap (leading dimension at least its contiguous extent, batches apart); A and B are
 *  only read, so stride-0 (expanded) views are accepted. A rank-2 A or B beside a rank-3 out, or a batch of 1, is
 *  broadcast over the batch. `accumulator` is FERRY_SCALAR_F32 or FERRY_SCALAR_F16 (which operators accept it is
 *  theirs to say). 8-bit inputs: A and B each float8_e4m3fn or float8_e5m2 (fp32 accumulator; out fp16, bf16 or
 *  fp32), or both int8 (FERRY_SCALAR_I32 accumulator; out int32, exact, or fp16/bf16/fp32 through the fp32
 *  epilogue); A row-major and B column-major (k contiguous in both, as the tensor cores read 8-bit operands);
 *  an int32 output takes no epilogue (alpha 1, beta 0, no bias, activation or scales: the sums go out exact).
 *  Fails with FERRY_INVALID_ARGUMENT naming the operand and the values (NULL pointers, ranks,
 *  mismatched shapes, negative sizes or strides, overlapping layouts, unsupported dtypes or pairings, majors of
 *  8-bit operands, a device that is not CUDA), FERRY_DEVICE_MISMATCH when the operands are on different CUDA
 *  devices, FERRY_OVERFLOW when an extent passes 2^31-1 or an offset passes 2^63. Nothing is dereferenced: the
 *  tensors' memory is not touched. `args` is written only on success. */
FERRY_API ferry_status ferry_gemm_args_init(ferry_gemm_args *args, const ferry_tensor *A, const ferry_tensor *B,
                                            const ferry_tensor *out, ferry_scalar accumulator);

/** Fuses an epilogue into validated `args` (see ferry_bias, ferry_activation): `bias` is a rank-1 tensor of out's
 *  dtype on out's device, of n elements for FERRY_BIAS_ROW or m for FERRY_BIAS_COL, contiguous (stride 1, or NULL
 *  strides); NULL with FERRY_BIAS_NONE. It becomes part of the problem's kind, so it selects the compiled kernel;
 *  FERRY_BIAS_NONE with FERRY_ACTIVATION_NONE takes the epilogue away again. Fails with FERRY_INVALID_ARGUMENT
 *  naming what is wrong (mode or activation out of range, a bias without a mode or a mode without one, its rank,
 *  dtype, length, stride, a NULL data pointer with elements), FERRY_DEVICE_MISMATCH for a bias on another device;
 *  `args` is written only on success. Every built-in operator fuses every epilogue; a registered one only when it
 *  sets ferry_op_info.fuses_epilogue (its source sees FERRY_BIAS and FERRY_ACTIVATION, and the bias in
 *  ferry_gemm_params), and then its supports callback, if any, may still decline. */
FERRY_API ferry_status ferry_gemm_args_set_epilogue(ferry_gemm_args *args, const ferry_tensor *bias,
                                                    ferry_bias bias_mode, ferry_activation activation);

/** Per-tensor scales, as for FP8 or INT8 operands quantised with one scale each: out = activation(alpha·scale_a·
 *  scale_b·A·B + beta·out + bias). Each is a one-element fp32 tensor (any rank, one element) on out's device,
 *  read by the kernel at every run, so scales computed on the GPU need no synchronisation and a CUDA graph picks
 *  up new values. Both or neither: NULL, NULL takes the scales away. They are part of the problem's kind
 *  (FERRY_GEMM_KIND_SCALED), like an epilogue, and only operators that fuse epilogues are given them; an int32
 *  output takes none. Fails with FERRY_INVALID_ARGUMENT naming what is wrong (one without the other, dtype,
 *  element count, NULL data, an int32 output), FERRY_DEVICE_MISMATCH for a scale on another device; `args` is
 *  written only on success. */
FERRY_API ferry_status ferry_gemm_args_set_scales(ferry_gemm_args *args, const ferry_tensor *scale_a,
                                                  const ferry_tensor *scale_b);

/** Points validated `args` at other operands of the same shapes, strides, types and device (a new batch of
 *  inputs for the same GEMM), recomputing only the alignment. NULL keeps that operand. Cheap: no validation of
 *  shapes happens again, so the caller vouches that the new memory has the old layout. An out that would overlap
 *  A or B is refused with FERRY_INVALID_ARGUMENT, as ferry_gemm_args_init refuses it; `args` is then unchanged. */
FERRY_API ferry_status ferry_gemm_args_set_data(ferry_gemm_args *args, const void *a, const void *b, void *out);

/** "fp16", "bf16", "fp32", "e4m3", "e5m2", "int8", "int32", or "?" for another value. Static. */
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
  int32_t fuses_epilogue;        /* 1: given problems with an epilogue (its kernel honours FERRY_BIAS and
                                    FERRY_ACTIVATION); every built-in does; a registered operator opts in */
} ferry_op_info;

/** The operator's description; valid for the life of the process. NULL for a NULL op. */
FERRY_API const ferry_op_info *ferry_op_info_get(const ferry_op *op);

/** Number of registered operators (ferry's own first, then those registered, in order), and the one at `index`
 *  (NULL past the end), also while other threads register. */
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
 *  disk cache's copy of it), never an imported artifact. Compiling needs NVRTC and no GPU. When the operands'
 *  device is present and of the target's capability, the
 *  cubin is loaded too. On success *out holds a new reference the caller releases with ferry_artifact_release;
 *  on failure *out is untouched. Errors: FERRY_UNSUPPORTED (op does not support args, or the target is older than
 *  the op's min_sm or unknown to NVRTC), FERRY_NO_COMPILER, FERRY_COMPILE_FAILED (the NVRTC log, truncated, in
 *  the message), driver errors from loading. A disk cache that cannot be used is skipped, not an error (see
 *  ferry_cache_stats_get). */
FERRY_API ferry_status ferry_op_compile(const ferry_op *op, const ferry_gemm_args *args, ferry_artifact **out);

/** As ferry_op_compile, for an explicit target (90 = sm_90), e.g. to build artifacts for another machine; a
 *  target_sm of 0 or less is FERRY_INVALID_ARGUMENT. */
FERRY_API ferry_status ferry_op_compile_for(const ferry_op *op, const ferry_gemm_args *args, int target_sm,
                                            ferry_artifact **out);

/** Adds a reference and returns `artifact` (NULL: nothing, returns NULL), as ferry_slab_retain does. */
FERRY_API ferry_artifact *ferry_artifact_retain(ferry_artifact *artifact);

/** Drops a reference; the last one unloads the library and frees the cubin. NULL is accepted. Runs already
 *  submitted keep working; do not release an artifact's last reference while a graph still uses it (a graph
 *  holds its own references). */
FERRY_API void ferry_artifact_release(ferry_artifact *artifact);

/** The artifact's operator, target (90 = sm_90) and problem kind (FERRY_GEMM_KIND | FERRY_GEMM_KIND_EPILOGUE). */
FERRY_API const ferry_op *ferry_artifact_op(const ferry_artifact *artifact);
FERRY_API int ferry_artifact_target_sm(const ferry_artifact *artifact);
FERRY_API uint32_t ferry_artifact_kind(const ferry_artifact *artifact);

/** The cubin (ELF) bytes, owned by the artifact and valid while it lives; *out_size gets their count. */
FERRY_API const void *ferry_artifact_cubin(const ferry_artifact *artifact, size_t *out_size);

/** Writes the artifact to `path` in ferry's artifact format (magic, format version, key, lengths and a checksum
 *  of the content — XXH64, which catches damage, not tampering), atomically: a temporary file beside it,
 *  written, flushed and renamed over `path`. The file is created 0644 (less the umask). Errors: FERRY_IO_ERROR
 *  naming the path and the system's reason; FERRY_INVALID_ARGUMENT for a NULL artifact or an empty or NULL path.
 *  Files of an older format are refused by import. */
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
  FERRY_RUN_ASSUME_SUPPORTED = 1u << 0
};

/** Launches `op` on `args` on `stream` (a CUstream of the operands' device; NULL is the legacy default stream).
 *  With an artifact, its kernel runs; without one, the memo's artifact for args' kind and the device's
 *  capability is used, compiled once on first need (never per call). The launch path allocates nothing, formats
 *  nothing and takes no lock; it makes the device's primary context current around the launch when another is.
 *  Works under stream capture (someone else's, e.g. torch.cuda.graph, or ferry_graph_begin's). An empty problem
 *  (m or n zero) launches nothing. Errors: FERRY_UNSUPPORTED with the reason (unless FERRY_RUN_ASSUME_SUPPORTED),
 *  FERRY_INVALID_ARGUMENT for NULLs, an artifact of another operator, kind or capability, driver errors. */
FERRY_API ferry_status ferry_op_run(const ferry_op *op, const ferry_gemm_args *args, void *stream,
                                    ferry_artifact *artifact, uint32_t flags);

/* ------------------------------------------------------------------------------------------------------------ */
/* Operators: CUDA graphs with operand update                                                                     */

/* A captured sequence of runs, instantiated once and replayed; each run's operands can be changed in the
 * instantiated graph without capturing again. Not thread-safe: the functions below take one graph from one thread
 * at a time (different graphs may be used on different threads at once). */
typedef struct ferry_graph ferry_graph;

/** Starts capturing `stream` (thread-local capture mode) into a new graph. Work the caller queues on `stream` is
 *  captured too; runs added with ferry_graph_run are recorded so they can be updated. On success the caller owns
 *  *out (ferry_graph_destroy); on failure nothing is left capturing. */
FERRY_API ferry_status ferry_graph_begin(void *stream, ferry_graph **out);

/** Runs `op` into the capture (as ferry_op_run on the graph's stream) and records which kernel node it made;
 *  *out_index (may be NULL) gets the run's index for ferry_graph_update. The graph keeps a reference to the
 *  artifact used. Compile before capturing: a run that must compile first compiles outside the stream anyway. A
 *  run that fails after its kernel was captured (recording the node) breaks the capture: later runs fail, and
 *  ferry_graph_end discards the capture and fails, since the graph would replay a run it keeps nothing for. */
FERRY_API ferry_status ferry_graph_run(ferry_graph *graph, const ferry_op *op, const ferry_gemm_args *args,
                                       ferry_artifact *artifact, uint32_t flags, size_t *out_index);

/** Ends the capture and instantiates the graph. On failure the graph can only be destroyed. */
FERRY_API ferry_status ferry_graph_end(ferry_graph *graph);

/** Launches the instantiated graph on `stream` (NULL: the stream it was captured on). */
FERRY_API ferry_status ferry_graph_replay(ferry_graph *graph, void *stream);

/** Gives run `index` new arguments — other operands, alpha/beta, sizes — in the instantiated graph, in place
 *  (cuGraphExecKernelNodeSetParams): the next replay uses them. The new args must be supported by the run's
 *  operator and be of the kind of its artifact; a run captured empty (m or n zero) cannot be updated. */
FERRY_API ferry_status ferry_graph_update(ferry_graph *graph, size_t index, const ferry_gemm_args *args);

/** Number of runs recorded with ferry_graph_run. */
FERRY_API size_t ferry_graph_run_count(const ferry_graph *graph);

/** Ends a capture still in progress (discarding it), destroys the graph and its instance, and drops the
 *  artifact references. NULL is accepted. Replays already submitted finish normally. */
FERRY_API void ferry_graph_destroy(ferry_graph *graph);

/* ------------------------------------------------------------------------------------------------------------ */
/* Operators: bring your own kernel                                                                                */

/* The kernel parameter of every built-in GEMM, and of a registered operator that brings no params callback, is
 * ferry_gemm_params (ferry/gemm_params.h, included above): ferry prepends that header's text to every operator's
 * CUDA source, with the problem's kind as macros (FERRY_A_TYPE, FERRY_B_TYPE, FERRY_OUT_TYPE, FERRY_ACC_TYPE:
 * the ferry_scalar codes, FERRY_SCALAR_F16 1 to FERRY_SCALAR_I32 7, defined there too; FERRY_A_ROW, FERRY_B_ROW,
 * FERRY_OUT_ROW: 1 row-major, 0 column-major; FERRY_BIAS and FERRY_ACTIVATION: the epilogue's ferry_bias and
 * ferry_activation; FERRY_SCALED 1 when alpha is to be multiplied by *scale_a and *scale_b), so a kernel declared
 *   extern "C" __global__ void my_gemm(ferry_gemm_params p)
 * can read it. The grid is (ceil(m/tile_m) * ceil(n/tile_n), 1, l) blocks of `threads`, with `smem_bytes` of
 * dynamic shared memory. */

/** A registered operator's own support check: return 1 to accept; else 0 after writing a reason into `reason`
 *  (capacity reason_size, may be 0). Called after the metadata checks passed (an epilogue reaches it only when the
 *  operator sets fuses_epilogue); must be fast and thread-safe. */
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
 *  1, a 64×64×16 tile of 256 threads, one stage, no shared memory, min_sm 75, no fused epilogue, no callbacks. */
FERRY_API void ferry_op_desc_init(ferry_op_desc *desc);

/** Registers an operator; it then appears in ferry_ops_find, compiles, runs and captures like ferry's own. On
 *  success *out (may be NULL) points at it. Fails with FERRY_INVALID_ARGUMENT for a missing or duplicate name,
 *  no source or entry, empty type or major masks, a non-power-of-two alignment, zero tile sizes or threads, or
 *  params_size out of range. The source is compiled only when first needed (its errors come from compile). */
FERRY_API ferry_status ferry_op_register(const ferry_op_desc *desc, const ferry_op **out);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_OPS_H */
