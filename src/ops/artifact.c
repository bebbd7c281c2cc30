/* artifact.c — compiled artifacts: creation and reference counting, loading into the driver (once per process
 * as a context-independent library, once per device as a function), and the file format shared by the disk
 * cache and export/import.
 *
 * The file is a fixed 128-byte header (magic, format version, header size, the compile key, the payload's length
 * and a checksum) followed by the payload: a 128-byte record naming the operator (name, source digest, kind,
 * target) and the cubin. The checksum is XXH64 of the payload, seeded with XXH64 of the header fields before it,
 * so a damaged key or length is caught as well as a damaged cubin. A reader trusts nothing it has not verified:
 * every length against the file's, the checksum against the content, the record against what it expects, and the
 * cubin's ELF magic, before any byte reaches the driver.
 *
 * The checksum is there for damage (torn or truncated writes, flipped bits, files of another format), not for an
 * attacker: see xxh64.c for why a cryptographic hash would add nothing. Files of another format version (the
 * record's kind, for one, is read by this version's layout) fail the version check and are rebuilt (cache) or
 * refused (import), never read as this version.
 *
 * So an imported artifact is GPU code the caller vouches for, like a shared library it loads: nothing proves who
 * made it or that its cubin is what its recorded key claims. It is handed to the caller only and never enters the
 * compile memo, so ferry_op_compile and runs without an artifact keep returning what NVRTC made from the
 * operator's source (or the user's own disk cache's copy of it).
 */
#include "ops.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- lifetime ---------------------------------------------------------------------------------------------- */

ferry_status ferry__artifact_new(const ferry_op *op, uint32_t kind, int sm, const uint8_t key[32], void *block,
                                 unsigned char *cubin, size_t cubin_size, ferry_artifact **out) {
  ferry_artifact *a = calloc(1, sizeof *a);
  if (!a) {
    free(block);
    return FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "allocating an artifact of operator %s", op->info.name);
  }
  atomic_init(&a->refs, 1);
  a->op = op;
  a->kind = kind;
  a->sm = sm;
  if (key) memcpy(a->key, key, 32);
  a->cubin = cubin;
  a->cubin_size = cubin_size;
  a->cubin_block = block;
  a->tile_m = (uint32_t)op->info.tile_m;
  a->tile_n = (uint32_t)op->info.tile_n;
  a->threads = (uint32_t)op->info.threads;
  a->smem = ferry__design_smem(op, kind);
  a->persistent = ferry__family_is_persistent(op->family);
  a->tma = ferry__family_is_tma(op->family);
  a->cluster = ferry__family_cluster(op->family);
  pthread_mutex_init(&a->lock, NULL);
  *out = a;
  return FERRY_OK;
}

ferry_artifact *ferry_artifact_retain(ferry_artifact *artifact) {
  if (artifact) atomic_fetch_add_explicit(&artifact->refs, 1, memory_order_relaxed);
  return artifact;
}

void ferry_artifact_release(ferry_artifact *artifact) {
  if (!artifact || atomic_fetch_sub_explicit(&artifact->refs, 1, memory_order_acq_rel) != 1) return;
  /* Unloading waits for nothing: the driver keeps a library alive while launched work still needs it. */
  if (artifact->library) (void)FERRY_CU(cuLibraryUnload, artifact->library);
  pthread_mutex_destroy(&artifact->lock);
  free(artifact->cubin_block);
  free(artifact);
}

const ferry_op *ferry_artifact_op(const ferry_artifact *artifact) { return artifact ? artifact->op : NULL; }
int ferry_artifact_target_sm(const ferry_artifact *artifact) { return artifact ? artifact->sm : 0; }
uint32_t ferry_artifact_kind(const ferry_artifact *artifact) { return artifact ? artifact->kind : 0; }

const void *ferry_artifact_cubin(const ferry_artifact *artifact, size_t *out_size) {
  if (out_size) *out_size = artifact ? artifact->cubin_size : 0;
  return artifact ? artifact->cubin : NULL;
}

/* ---- loading ----------------------------------------------------------------------------------------------- */

/* Under art->lock. */
static ferry_status load_locked(ferry_artifact *art) {
  ferry_status st = FERRY_OK;
  CUlibrary lib = NULL;
  CUkernel kernel = NULL;
  if (art->library) return FERRY_OK;
  FERRY_TRY_CU(("loading operator %s (sm_%d, %zu-byte cubin)", art->op->info.name, art->sm, art->cubin_size),
               cuLibraryLoadData, &lib, art->cubin, NULL, NULL, 0, NULL, NULL, 0);
  FERRY_TRY_CU(("finding kernel %s of operator %s", art->op->entry, art->op->info.name), cuLibraryGetKernel,
               &kernel, lib, art->op->entry);
  art->library = lib;
  art->kernel = kernel;
  lib = NULL;
cleanup:
  if (lib) (void)FERRY_CU(cuLibraryUnload, lib);
  return st;
}

ferry_status ferry__artifact_load(ferry_artifact *art) {
  pthread_mutex_lock(&art->lock);
  ferry_status st = load_locked(art);
  pthread_mutex_unlock(&art->lock);
  return st;
}

/* A cubin for sm_XY runs on sm_XZ with Z >= Y (same major, same or newer minor), nowhere else. */
static int runs_on(int cubin_sm, int device_sm) {
  return cubin_sm / 10 == device_sm / 10 && device_sm % 10 >= cubin_sm % 10;
}

/* A persistent kernel hands registers between its warpgroups (setmaxnreg), which assumes the block was launched
 * with its whole share of the register file; given fewer, setmaxnreg.inc would wait forever. */
static ferry_status check_register_share(const ferry_artifact *art, CUfunction f, int device) {
  ferry_status st = FERRY_OK;
  int regs = 0, share = 65536 / (int)art->threads / 8 * 8;
  FERRY_TRY_CU(("reading operator %s's register count on cuda:%d", art->op->info.name, device), cuFuncGetAttribute,
               &regs, CU_FUNC_ATTRIBUTE_NUM_REGS, f);
  if (regs < share)
    st = FERRY_ERR(FERRY_COMPILE_FAILED, "operator %s's kernel was compiled with %d registers a thread; its "
                   "warpgroups' register hand-over needs the block's whole share, %d", art->op->info.name, regs,
                   share);
cleanup:
  return st;
}

/* How many of a cluster kernel's clusters run at once on `device` (a persistent grid of more would run its last
 * clusters after the others, doubling the time): they must fit within one GPC each, so fewer than SMs / cluster. */
static ferry_status count_clusters(ferry_artifact *art, CUfunction f, int device) {
  ferry_status st = FERRY_OK;
  int sms = 0, n = 0;
  FERRY_TRY(ferry__device_sms(device, &sms));
  CUlaunchConfig config;
  memset(&config, 0, sizeof config);
  config.gridDimX = (unsigned)(sms - sms % art->cluster);
  config.gridDimY = config.gridDimZ = 1;
  config.blockDimX = art->threads;
  config.blockDimY = config.blockDimZ = 1;
  config.sharedMemBytes = art->smem;
  FERRY_TRY_CU(("counting the clusters of operator %s that fit on cuda:%d", art->op->info.name, device),
               cuOccupancyMaxActiveClusters, &n, f, &config);
  if (n < 1)
    st = FERRY_ERR(FERRY_UNSUPPORTED, "operator %s: no cluster of %d of its blocks (%u bytes of shared memory "
                   "each) fits on cuda:%d", art->op->info.name, art->cluster, art->smem, device);
  art->max_clusters[device] = n;
cleanup:
  return st;
}

ferry_status ferry__artifact_function(ferry_artifact *art, int device, CUfunction *out) {
  ferry_status st = FERRY_OK;
  int entered = 0, sm = 0;
  /* Before the lock: a child forked while another thread loaded this artifact refuses here, never waiting for a
   * lock that thread will not release in it (fork.c). */
  st = ferry__driver_load();
  if (st != FERRY_OK) return st;
  pthread_mutex_lock(&art->lock);
  CUfunction f = atomic_load_explicit(&art->fn[device], memory_order_acquire);
  if (f) goto cleanup;
  FERRY_TRY(ferry__device_sm(device, &sm));
  if (!runs_on(art->sm, sm)) {
    st = FERRY_ERR(FERRY_INVALID_ARGUMENT, "the artifact of operator %s was compiled for sm_%d; cuda:%d is sm_%d "
                   "(compile it for that device)", art->op->info.name, art->sm, device, sm);
    goto cleanup;
  }
  FERRY_TRY(load_locked(art));
  FERRY_TRY(ferry__ctx_enter(device));
  entered = 1;
  FERRY_TRY_CU(("getting operator %s's kernel on cuda:%d", art->op->info.name, device), cuKernelGetFunction, &f,
               art->kernel);
  if (art->persistent) FERRY_TRY(check_register_share(art, f, device));
  if (art->smem > 48u * 1024u)
    FERRY_TRY_CU(("allowing operator %s %u bytes of shared memory on cuda:%d", art->op->info.name, art->smem,
                  device), cuFuncSetAttribute, f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)art->smem);
  if (art->cluster > 1) FERRY_TRY(count_clusters(art, f, device));
  atomic_store_explicit(&art->fn[device], f, memory_order_release);
cleanup:
  if (entered) ferry__ctx_leave();
  pthread_mutex_unlock(&art->lock);
  if (st == FERRY_OK) *out = f;
  return st;
}

/* ---- the file format --------------------------------------------------------------------------------------- */

static void put32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}
static uint64_t get64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* A cubin is an ELF64 file: anything shorter than its header is not one (and must not be read as one). */
#define ELF64_HEADER_BYTES 64u

/* Offsets in the header and in the meta record. */
enum { H_MAGIC = 0, H_VERSION = 8, H_HEADER = 12, H_KEY = 16, H_PAYLOAD = 48, H_CHECK = 56, H_END = 64 };
enum { M_NAME = 0, M_DIGEST = 64, M_KIND = 96, M_SM = 100, M_CUBIN = 104, M_END = 112 };

uint64_t ferry__art_checksum(const unsigned char *file, uint64_t payload) {
  return ferry__xxh64(file + FERRY__ART_HEADER, (size_t)payload, ferry__xxh64(file, H_CHECK, 0));
}

ferry_status ferry__art_encode(const ferry_artifact *art, unsigned char **out, size_t *out_size) {
  size_t payload = FERRY__ART_META + art->cubin_size;
  size_t total = FERRY__ART_HEADER + payload;
  unsigned char *f = calloc(1, total);
  if (!f) return FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "encoding an artifact of %zu bytes", total);
  unsigned char *m = f + FERRY__ART_HEADER;
  snprintf((char *)m + M_NAME, 64, "%s", art->op->info.name);
  memcpy(m + M_DIGEST, art->op->digest, 32);
  put32(m + M_KIND, art->kind);
  put32(m + M_SM, (uint32_t)art->sm);
  put64(m + M_CUBIN, art->cubin_size);
  memcpy(m + FERRY__ART_META, art->cubin, art->cubin_size);
  memcpy(f + H_MAGIC, FERRY__ART_MAGIC, 8);
  put32(f + H_VERSION, FERRY__ART_VERSION);
  put32(f + H_HEADER, FERRY__ART_HEADER);
  memcpy(f + H_KEY, art->key, 32);
  put64(f + H_PAYLOAD, payload);
  put64(f + H_CHECK, ferry__art_checksum(f, payload));
  *out = f;
  *out_size = total;
  return FERRY_OK;
}

static int all_zero(const unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i]) return 0;
  return 1;
}

/* A kind whose fields are all valid codes (input types 1..6, output 1..3 or 7, accumulator fp32, fp16 or int32,
 * bias mode 0..2, activation 0..3, no stray bits). */
static int kind_valid(uint32_t kind) {
  uint32_t a = FERRY_GEMM_KIND_A_TYPE(kind), b = FERRY_GEMM_KIND_B_TYPE(kind);
  uint32_t o = FERRY_GEMM_KIND_OUT_TYPE(kind), acc = FERRY_GEMM_KIND_ACC_TYPE(kind);
  return a && a != FERRY_SCALAR_I32 && b && b != FERRY_SCALAR_I32 &&
         (o == FERRY_SCALAR_I32 || (o >= FERRY_SCALAR_F16 && o <= FERRY_SCALAR_F32)) &&
         (acc == FERRY_SCALAR_F32 || acc == FERRY_SCALAR_F16 || acc == FERRY_SCALAR_I32) &&
         FERRY_GEMM_KIND_BIAS(kind) != 3u &&
         (kind & ~(FERRY_GEMM_KIND_OPERANDS | FERRY_GEMM_KIND_EPILOGUE(3u, 3u) | FERRY_GEMM_KIND_SCALED)) == 0;
}

int ferry__art_verify(const unsigned char *file, size_t size, const uint8_t *expect_key, ferry__art_meta *meta,
                      uint8_t key[32], size_t *cubin_offset, char *why, size_t why_size) {
  if (size < FERRY__ART_HEADER) {
    snprintf(why, why_size, "truncated: %zu bytes, shorter than the %u-byte header", size, FERRY__ART_HEADER);
    return 0;
  }
  if (memcmp(file + H_MAGIC, FERRY__ART_MAGIC, 8) != 0) {
    snprintf(why, why_size, "not a ferry artifact (bad magic)");
    return 0;
  }
  uint32_t version = get32(file + H_VERSION);
  if (version != FERRY__ART_VERSION) {
    snprintf(why, why_size, "format version %u; this ferry reads version %u", version, FERRY__ART_VERSION);
    return 0;
  }
  if (get32(file + H_HEADER) != FERRY__ART_HEADER || !all_zero(file + H_END, FERRY__ART_HEADER - H_END)) {
    snprintf(why, why_size, "malformed header (size %u)", get32(file + H_HEADER));
    return 0;
  }
  uint64_t payload = get64(file + H_PAYLOAD);
  if (payload != size - FERRY__ART_HEADER) {
    snprintf(why, why_size, "truncated or extended: the header announces %llu payload bytes, the file holds %zu",
             (unsigned long long)payload, size - FERRY__ART_HEADER);
    return 0;
  }
  if (payload < FERRY__ART_META + ELF64_HEADER_BYTES) {
    snprintf(why, why_size, "no cubin: a payload of %llu bytes has no room for an ELF header",
             (unsigned long long)payload);
    return 0;
  }
  const unsigned char *m = file + FERRY__ART_HEADER;
  if (ferry__art_checksum(file, payload) != get64(file + H_CHECK)) {
    snprintf(why, why_size, "damaged: the content does not match its checksum");
    return 0;
  }
  if (expect_key && memcmp(expect_key, file + H_KEY, 32) != 0) {
    snprintf(why, why_size, "it holds another compile's key");
    return 0;
  }
  uint64_t cubin = get64(m + M_CUBIN);
  if (memchr(m + M_NAME, '\0', 64) == NULL || m[M_NAME] == '\0' || cubin != payload - FERRY__ART_META ||
      !all_zero(m + M_END, FERRY__ART_META - M_END) || !kind_valid(get32(m + M_KIND))) {
    snprintf(why, why_size, "malformed operator record");
    return 0;
  }
  if (memcmp(m + FERRY__ART_META, "\x7f" "ELF", 4) != 0) {
    snprintf(why, why_size, "the payload is not a cubin (no ELF magic)");
    return 0;
  }
  memcpy(meta->op_name, m + M_NAME, 64);
  memcpy(meta->op_digest, m + M_DIGEST, 32);
  meta->kind = get32(m + M_KIND);
  meta->sm = (int32_t)get32(m + M_SM);
  meta->cubin_size = cubin;
  memcpy(key, file + H_KEY, 32);
  *cubin_offset = FERRY__ART_HEADER + FERRY__ART_META;
  return 1;
}

/* ---- files ------------------------------------------------------------------------------------------------- */

/* "dir/name" for messages, or `name` itself when it is a path of its own (dir NULL). */
static const char *shown(const char *dir, const char *name, char *buf, size_t size) {
  if (!dir) return name;
  snprintf(buf, size, "%s/%s", dir, name);
  return buf;
}

ferry_status ferry__read_file_at(int dirfd, const char *dir, const char *name, int private_file, unsigned char **out,
                                 size_t *out_size, int *missing) {
  ferry_status st = FERRY_OK;
  unsigned char *buf = NULL;
  struct stat sb;
  char where[4200];
  const char *path = shown(dir, name, where, sizeof where);
  if (missing) *missing = 0;
  /* O_NONBLOCK: opening a FIFO (or a device) placed where a file should be must not wait for a writer; it is
   * refused below as not a regular file. Reads of a regular file ignore the flag. Everything after the open is
   * asked of the open file (fstat, pread), never of the path again. */
  int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT && missing) {
      *missing = 1;
      return FERRY_IO_ERROR;
    }
    return ferry__call_error(FERRY_IO_ERROR, "open", __FILE__, __LINE__, "cannot open %s: %s%s", path,
                             strerror(errno), errno == ELOOP ? " (a symbolic link; refused)" : "");
  }
  if (fstat(fd, &sb) != 0) {
    st = ferry__call_error(FERRY_IO_ERROR, "fstat", __FILE__, __LINE__, "cannot stat %s: %s", path, strerror(errno));
    goto cleanup;
  }
  /* A private file is the user's own and has no other name: a hard link planted into the directory would let
   * whoever can write the file elsewhere change what is loaded from here. (No name at all is fine: a concurrent
   * writer's rename replaced the entry after this open, and the file read is still whole.) */
  const char *refused = !S_ISREG(sb.st_mode)                    ? "not a regular file"
                        : sb.st_size > (off_t)FERRY__ART_MAX    ? "larger than any artifact (64 MiB)"
                        : private_file && sb.st_uid != geteuid() ? "owned by another user"
                        : private_file && sb.st_nlink > 1        ? "it has another name (a hard link)"
                                                                 : NULL;
  if (refused) {
    st = ferry__call_error(FERRY_IO_ERROR, "fstat", __FILE__, __LINE__, "refusing %s: %s", path, refused);
    goto cleanup;
  }
  size_t size = (size_t)sb.st_size, got = 0;
  buf = malloc(size ? size : 1);
  if (!buf) {
    st = FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "reading %s (%zu bytes)", path, size);
    goto cleanup;
  }
  while (got < size) {
    ssize_t r = pread(fd, buf + got, size - got, (off_t)got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      st = ferry__call_error(FERRY_IO_ERROR, "read", __FILE__, __LINE__, "reading %s: %s", path,
                             r < 0 ? strerror(errno) : "the file shrank while being read");
      goto cleanup;
    }
    got += (size_t)r;
  }
  *out = buf;
  *out_size = size;
  buf = NULL;
cleanup:
  free(buf);
  close(fd);
  return st;
}

ferry_status ferry__read_file(const char *path, int private_file, unsigned char **out, size_t *out_size,
                              int *missing) {
  return ferry__read_file_at(AT_FDCWD, NULL, path, private_file, out, out_size, missing);
}

static _Atomic unsigned tmp_counter;

ferry_status ferry__write_atomic_at(int dirfd, const char *dir, const char *name, const void *data, size_t size,
                                    int mode) {
  ferry_status st = FERRY_OK;
  char tmp[300], where[4200];
  if (strchr(name, '/') || strlen(name) + 40 >= sizeof tmp)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "not a file name in the directory: %.80s", name);
  /* The temporary file lives beside the target, so the rename is within one file system and atomic. */
  snprintf(tmp, sizeof tmp, ".%s.tmp.%ld.%u", name, (long)getpid(), atomic_fetch_add(&tmp_counter, 1));
  int fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0)
    return ferry__call_error(FERRY_IO_ERROR, "open", __FILE__, __LINE__, "cannot create %s: %s",
                             shown(dir, tmp, where, sizeof where), strerror(errno));
  const unsigned char *p = data;
  size_t done = 0;
  while (done < size) {
    ssize_t w = write(fd, p + done, size - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      st = ferry__call_error(FERRY_IO_ERROR, "write", __FILE__, __LINE__, "writing %s: %s",
                             shown(dir, tmp, where, sizeof where), w < 0 ? strerror(errno) : "no progress");
      goto cleanup;
    }
    done += (size_t)w;
  }
  if (fsync(fd) != 0) {
    st = ferry__call_error(FERRY_IO_ERROR, "fsync", __FILE__, __LINE__, "flushing %s: %s",
                           shown(dir, tmp, where, sizeof where), strerror(errno));
    goto cleanup;
  }
  if (close(fd) != 0) {
    fd = -1;
    st = ferry__call_error(FERRY_IO_ERROR, "close", __FILE__, __LINE__, "closing %s: %s",
                           shown(dir, tmp, where, sizeof where), strerror(errno));
    goto cleanup;
  }
  fd = -1;
  if (renameat(dirfd, tmp, dirfd, name) != 0) {
    st = ferry__call_error(FERRY_IO_ERROR, "rename", __FILE__, __LINE__, "renaming %s to %s: %s", tmp,
                           shown(dir, name, where, sizeof where), strerror(errno));
    goto cleanup;
  }
  /* Make the rename itself durable; a failure here loses nothing already visible, so it is not reported. */
  (void)fsync(dirfd);
cleanup:
  if (fd >= 0) close(fd);
  if (st != FERRY_OK) unlinkat(dirfd, tmp, 0);
  return st;
}

ferry_status ferry__write_atomic(const char *path, const void *data, size_t size, int mode) {
  char dir[4096];
  const char *slash = strrchr(path, '/');
  size_t dir_len = slash ? (size_t)(slash - path) : 0;
  if (dir_len >= sizeof dir) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "path too long: %.80s...", path);
  if (slash) {
    memcpy(dir, path, dir_len);
    dir[dir_len] = '\0';
    if (dir_len == 0) snprintf(dir, sizeof dir, "/");
  } else {
    snprintf(dir, sizeof dir, ".");
  }
  int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirfd < 0)
    return ferry__call_error(FERRY_IO_ERROR, "open", __FILE__, __LINE__, "cannot open the directory of %s: %s", path,
                             strerror(errno));
  ferry_status st = ferry__write_atomic_at(dirfd, dir, slash ? slash + 1 : path, data, size, mode);
  close(dirfd);
  return st;
}

/* ---- export and import ------------------------------------------------------------------------------------- */

ferry_status ferry_artifact_export(const ferry_artifact *artifact, const char *path) {
  ferry_status st = FERRY_OK;
  unsigned char *file = NULL;
  size_t size = 0;
  if (!artifact || !path || !*path)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_artifact_export: artifact or path is NULL or empty");
  FERRY_TRY(ferry__art_encode(artifact, &file, &size));
  FERRY_TRY(ferry__write_atomic(path, file, size, 0644));
cleanup:
  free(file);
  return st;
}

ferry_status ferry_artifact_import(const char *path, ferry_artifact **out) {
  ferry_status st = FERRY_OK;
  unsigned char *file = NULL;
  size_t size = 0, offset = 0;
  ferry__art_meta meta;
  uint8_t key[32];
  char why[200];
  ferry_artifact *art = NULL;
  if (!path || !out) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_artifact_import: path or out is NULL");
  FERRY_TRY(ferry__read_file(path, 0, &file, &size, NULL));
  if (!ferry__art_verify(file, size, NULL, &meta, key, &offset, why, sizeof why)) {
    st = FERRY_ERR(FERRY_BAD_ARTIFACT, "%s is not a usable artifact: %s", path, why);
    goto cleanup;
  }
  const ferry_op *op = ferry_op_by_name(meta.op_name);
  if (!op) {
    st = FERRY_ERR(FERRY_BAD_ARTIFACT, "%s holds operator %s, which is not registered in this process", path,
                   meta.op_name);
    goto cleanup;
  }
  if (memcmp(op->digest, meta.op_digest, 32) != 0) {
    st = FERRY_ERR(FERRY_BAD_ARTIFACT, "%s was compiled from another version of operator %s's source", path,
                   meta.op_name);
    goto cleanup;
  }
  /* The artifact keeps the file's image: the cubin is used where it lies, not copied. */
  st = ferry__artifact_new(op, meta.kind, meta.sm, key, file, file + offset, (size_t)meta.cubin_size, &art);
  file = NULL; /* owned (or freed) by ferry__artifact_new */
  if (st != FERRY_OK) goto cleanup;
  /* Not memoised: the file's recorded key is a claim nothing here can check (the checksum finds damage, not
   * tampering), so what compile returns stays what NVRTC made from the source; runs use the import by name. */
  *out = art;
  art = NULL;
cleanup:
  ferry_artifact_release(art);
  free(file);
  return st;
}
