// gather.cu — the device gather kernel: many small or strided tensors into one contiguous buffer.
//
// Each thread block handles one work item of at most 64 KiB of output, so 4096 small tensors are 4096 blocks and
// a large strided tensor is split evenly; a block never searches for its work. Contiguous items copy 16 bytes
// per thread per step when source, destination and size allow it; strided items decompose each element index
// into the tensor's (collapsed) dimensions. The source may be device memory (D2H) or mapped pinned host memory
// read over PCIe (H2D), which is why loads are independent and wide: many requests in flight hide the latency.
//
// Built by nvcc at build time into a fatbin (sm_80, sm_90 and PTX) embedded in libferry. The work items and
// layouts are the host's own structs (gather_types.h).

#include "gather_types.h"

typedef ferry__gather_item gather_item;
typedef ferry__gather_layout gather_layout;

// ---------------------------------------------------------------------------------------------------------------

template <typename T>
__device__ __forceinline__ void copy_words(const char *src, char *dst, uint32_t nbytes) {
  const T *s = reinterpret_cast<const T *>(src);
  T *d = reinterpret_cast<T *>(dst);
  uint32_t n = nbytes / sizeof(T);
  // Four independent loads per thread before the first store: enough requests in flight for PCIe reads.
  uint32_t i = threadIdx.x;
  for (; i + 3 * blockDim.x < n; i += 4 * blockDim.x) {
    T a = s[i], b = s[i + blockDim.x], c = s[i + 2 * blockDim.x], e = s[i + 3 * blockDim.x];
    d[i] = a;
    d[i + blockDim.x] = b;
    d[i + 2 * blockDim.x] = c;
    d[i + 3 * blockDim.x] = e;
  }
  for (; i < n; i += blockDim.x) d[i] = s[i];
}

__device__ __forceinline__ void copy_contiguous(const gather_item &it) {
  const char *src = reinterpret_cast<const char *>(it.src);
  char *dst = reinterpret_cast<char *>(it.dst);
  uint64_t align = it.src | it.dst | it.nbytes;
  if ((align & 15) == 0) {
    copy_words<uint4>(src, dst, it.nbytes);
  } else if ((align & 3) == 0) {
    copy_words<uint32_t>(src, dst, it.nbytes);
  } else {
    for (uint32_t i = threadIdx.x; i < it.nbytes; i += blockDim.x) dst[i] = src[i];
  }
}

template <typename T>
__device__ __forceinline__ void copy_strided(const gather_item &it, const gather_layout &L) {
  const char *src = reinterpret_cast<const char *>(it.src);
  T *dst = reinterpret_cast<T *>(it.dst);
  uint32_t n = it.nbytes / sizeof(T);
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
    uint64_t e = it.first_elem + i;
    int64_t off = 0;
    for (int d = L.ndim - 1; d >= 0; d--) {
      uint64_t extent = (uint64_t)L.shape[d];
      off += (int64_t)(e % extent) * L.stride_bytes[d];
      e /= extent;
    }
    dst[i] = *reinterpret_cast<const T *>(src + off);
  }
}

__device__ __forceinline__ void copy_strided_bytes(const gather_item &it, const gather_layout &L) {
  const char *src = reinterpret_cast<const char *>(it.src);
  char *dst = reinterpret_cast<char *>(it.dst);
  uint32_t eb = (uint32_t)L.elem_bytes & 0xffu;
  uint32_t n = it.nbytes / eb;
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
    uint64_t e = it.first_elem + i;
    int64_t off = 0;
    for (int d = L.ndim - 1; d >= 0; d--) {
      uint64_t extent = (uint64_t)L.shape[d];
      off += (int64_t)(e % extent) * L.stride_bytes[d];
      e /= extent;
    }
    for (uint32_t b = 0; b < eb; b++) dst[(uint64_t)i * eb + b] = src[off + b];
  }
}

extern "C" __global__ void __launch_bounds__(256) ferry_gather_kernel(const gather_item *__restrict__ items,
                                                                      const gather_layout *__restrict__ layouts) {
  const gather_item it = items[blockIdx.x];
  if (it.layout == FERRY_GATHER_CONTIGUOUS) {
    copy_contiguous(it);
    return;
  }
  __shared__ gather_layout L;
  if (threadIdx.x == 0) L = layouts[it.layout];
  __syncthreads();
  // Element-sized loads and stores; the element width decides the word type (addresses are element-aligned).
  // The host sets bit 8 when the base or a stride is not a multiple of the element size: bytes then.
  switch (L.elem_bytes) {
  case 1: copy_strided<uint8_t>(it, L); break;
  case 2: copy_strided<uint16_t>(it, L); break;
  case 4: copy_strided<uint32_t>(it, L); break;
  case 8: copy_strided<uint64_t>(it, L); break;
  case 16: copy_strided<uint4>(it, L); break;
  default: copy_strided_bytes(it, L); break;
  }
}
