/* cublas.c — dlopen of cuBLAS for the benchmarks (see cublas.h). */
#include "cublas.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *open_library(char *why, int why_size) {
  const char *env = getenv("FERRY_CUBLAS");
  const char *candidates[] = {env, "libcublas.so.13", "libcublas.so.12", "/usr/local/cuda/lib64/libcublas.so.13",
                              "/usr/local/cuda/lib64/libcublas.so.12", "/usr/local/cuda/lib64/libcublas.so"};
  for (size_t i = 0; i < sizeof candidates / sizeof candidates[0]; i++) {
    if (!candidates[i] || !*candidates[i]) continue;
    void *lib = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
    if (lib) return lib;
  }
  snprintf(why, (size_t)why_size, "cuBLAS could not be opened (%s); set FERRY_CUBLAS to libcublas.so's path",
           dlerror());
  return NULL;
}

int bench_cublas_open(bench_cublas *cb, char *why, int why_size) {
  memset(cb, 0, sizeof *cb);
  cb->lib = open_library(why, why_size);
  if (!cb->lib) return -1;
  struct { void **slot; const char *name; } syms[] = {
      {(void **)&cb->create, "cublasCreate_v2"},        {(void **)&cb->destroy, "cublasDestroy_v2"},
      {(void **)&cb->get_version, "cublasGetVersion_v2"}, {(void **)&cb->set_stream, "cublasSetStream_v2"},
      {(void **)&cb->sgemm, "cublasSgemm_v2"},           {(void **)&cb->gemm_ex, "cublasGemmEx"}};
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    *syms[i].slot = dlsym(cb->lib, syms[i].name);
    if (!*syms[i].slot) {
      snprintf(why, (size_t)why_size, "cuBLAS lacks %s", syms[i].name);
      return -1;
    }
  }
  int rc = cb->create(&cb->handle);
  if (rc != 0) {
    snprintf(why, (size_t)why_size, "cublasCreate_v2 failed with status %d (no current CUDA context?)", rc);
    cb->handle = NULL;
    return -1;
  }
  cb->get_version(cb->handle, &cb->version);
  return 0;
}

void bench_cublas_close(bench_cublas *cb) {
  if (cb->handle) cb->destroy(cb->handle);
  cb->handle = NULL;
}
