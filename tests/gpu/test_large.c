/* test_large.c — a GB-scale D2H batch on the real driver: from a trimmed pool the batch is cut into sub-parts
 * pinned chunk by chunk, every byte arrives, the same batch again pins nothing, and a trim returns the pinned
 * memory to where it was before. */
#include "gpu_test.h"

enum { LARGE_TENSORS = 40 };

static ferry_pool_stats pool_now(void) {
  ferry_pool_stats s;
  ferry_pool_stats_get(&s);
  return s;
}

/* The bytes of tensor i at `offset` of the source: a pattern that differs per tensor and per position. */
static unsigned char pattern(size_t i, size_t offset) { return (unsigned char)(offset * 31 + i * 7 + (offset >> 12)); }

/* Tensors whose bytes differ anywhere from their pattern. */
static size_t mismatches(const ferry_tensor *out, const size_t *sizes) {
  size_t bad = 0, largest = 0;
  for (size_t i = 0; i < LARGE_TENSORS; i++) largest = sizes[i] > largest ? sizes[i] : largest;
  unsigned char *expected = malloc(largest + 1);
  for (size_t i = 0; i < LARGE_TENSORS; i++) {
    for (size_t k = 0; k < sizes[i]; k++) expected[k] = pattern(i, k);
    bad += sizes[i] && memcmp(out[i].data, expected, sizes[i]) != 0;
  }
  free(expected);
  return bad;
}

TEST(large_first_call_is_cut_and_exact) {
  int dev = gpu_dev;
  /* About 1 GiB in sizes between 1 and 49 MiB, odd ones and a zero-size tensor among them. */
  size_t sizes[LARGE_TENSORS], offsets[LARGE_TENSORS], total = 0;
  for (size_t i = 0; i < LARGE_TENSORS; i++) {
    sizes[i] = i == 17 ? 0 : ((i * 37) % 49 + 1) * ((size_t)1 << 20) + (i % 3) * 4097;
    offsets[i] = total;
    total += (sizes[i] + 255) / 256 * 256;
  }
  unsigned char *host = malloc(total);
  for (size_t i = 0; i < LARGE_TENSORS; i++)
    for (size_t k = 0; k < sizes[i]; k++) host[offsets[i] + k] = pattern(i, k);
  CUdeviceptr base = gpu_alloc(dev, total);
  REQUIRE_CU(ferry__drv.cuMemcpyHtoD(base, host, total));
  free(host);

  ferry_tensor t[LARGE_TENSORS];
  int64_t shapes[LARGE_TENSORS];
  for (size_t i = 0; i < LARGE_TENSORS; i++) {
    shapes[i] = (int64_t)sizes[i];
    t[i] = (ferry_tensor){(void *)(uintptr_t)(base + offsets[i]), {FERRY_DEVICE_CUDA, dev}, 1,
                          {FERRY_DTYPE_UINT, 8, 1}, &shapes[i], NULL, 0};
  }
  REQUIRE_OK(ferry_pool_trim());
  ferry_pool_stats before = pool_now();
  ferry_transfer_options o = gpu_options(dev, FERRY_TRANSFER_BLOCKING);
  ferry_transfer *first = NULL, *again = NULL;

  REQUIRE_OK(ferry_transfer_d2h(t, LARGE_TENSORS, &o, &first));
  ferry_pool_stats pinned = pool_now();
  size_t slabs = ferry_transfer_slab_count(first), pins = (size_t)(pinned.pin_calls - before.pin_calls);
  size_t expected_slabs = total / ferry__pin_chunk_bytes; /* sub-parts of about a chunk each, at least */
  unsigned long long grew = (unsigned long long)(pinned.bytes_pinned - before.bytes_pinned);
  printf("   %.1f MiB in %d tensors from a trimmed pool: %zu slab(s), %zu pin call(s), %.1f MiB pinned\n",
         (double)total / (1 << 20), LARGE_TENSORS, slabs, pins, (double)grew / (1 << 20));
  EXPECT(slabs >= expected_slabs && pins == slabs, "the batch was not cut: %zu slabs, %zu pin calls, %zu expected",
         slabs, pins, expected_slabs);
  EXPECT(grew <= total + total / 20, "%llu bytes pinned for a batch of %zu: more than 1.05x", grew, total);
  size_t bad = mismatches(ferry_transfer_outputs(first), sizes);
  EXPECT(bad == 0, "first call: %zu tensors differ from their source", bad);
  ferry_transfer_release(first);

  REQUIRE_OK(ferry_transfer_d2h(t, LARGE_TENSORS, &o, &again));
  ferry_pool_stats reused = pool_now();
  EXPECT(reused.pin_calls == pinned.pin_calls, "the same batch again pinned %llu more region(s)",
         (unsigned long long)(reused.pin_calls - pinned.pin_calls));
  bad = mismatches(ferry_transfer_outputs(again), sizes);
  EXPECT(bad == 0, "second call: %zu tensors differ from their source", bad);
  ferry_transfer_release(again);

  REQUIRE_OK(ferry_pool_trim());
  ferry_pool_stats trimmed = pool_now();
  EXPECT(trimmed.bytes_pinned == before.bytes_pinned, "after trim %llu bytes stay pinned (%llu before the batch)",
         (unsigned long long)trimmed.bytes_pinned, (unsigned long long)before.bytes_pinned);
  gpu_free(base);
}
