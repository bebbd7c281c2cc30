/* Large batches through the fake driver. Chunked pinning: a D2H batch larger than any free range of the pool is cut
 * into sub-parts that ramp from an eighth of ferry__pin_chunk_bytes up to it, each in a slab pinned to its size,
 * and each sub-part's copies are queued before the next region is pinned; the same batch again pins nothing; a batch the pool can hold stays one
 * slab; a failed pin in a later chunk kills the transfer without leaking. Sizes are scaled down (4 MiB chunks). The
 * memory a pin may take: past the machine's memory, MemAvailable or a cgroup limit, it fails before any page is
 * touched. */
#include "fake_driver.h"
#include "test.h"

#include <unistd.h>

#define MIB ((int64_t)1 << 20)
#define HUGE_PAGE ((uint64_t)2 << 20) /* the granularity of a pinned region (pinned.c) */
enum { MAX_T = 8 };
static unsigned char *src[MAX_T];
static int64_t shapes[MAX_T];

/* `n` 1-D uint8 device tensors of the given sizes with distinct bytes. */
static void make(ferry_tensor *t, const int64_t *sizes, int n, unsigned seed) {
  for (int i = 0; i < n; i++) {
    free(src[i]);
    src[i] = malloc((size_t)sizes[i]);
    for (int64_t k = 0; k < sizes[i]; k++) src[i][k] = (unsigned char)(k * 13 + i * 101 + seed);
    shapes[i] = sizes[i];
    t[i] = (ferry_tensor){src[i], {FERRY_DEVICE_CUDA, 0}, 1, {FERRY_DTYPE_UINT, 8, 1}, &shapes[i], NULL, 0};
  }
}

static ferry_transfer_options blocking_on_device_0(void) {
  ferry_transfer_options o;
  ferry_transfer_options_init(&o);
  o.device = 0;
  o.flags = FERRY_TRANSFER_BLOCKING;
  return o;
}

static ferry_transfer *d2h(const ferry_tensor *t, int n) {
  ferry_transfer_options o = blocking_on_device_0();
  ferry_transfer *tr = NULL;
  ASSERT_OK(ferry_transfer_d2h(t, (size_t)n, &o, &tr));
  return tr;
}

/* The same D2H added as two parts, the first of `first` tensors (as a Python call splits a batch at a release
 * point). */
static ferry_transfer *d2h_in_two_parts(const ferry_tensor *t, int n, int first) {
  ferry_transfer_options o = blocking_on_device_0();
  ferry_transfer *tr = NULL;
  ASSERT_OK(ferry_transfer_begin_d2h(&o, &tr));
  ASSERT_OK(ferry_transfer_add(tr, t, (size_t)first));
  ASSERT_OK(ferry_transfer_add(tr, t + first, (size_t)(n - first)));
  ASSERT_OK(ferry_transfer_end(tr));
  return tr;
}

static void check_exact(ferry_transfer *tr, int n) {
  const ferry_tensor *o = ferry_transfer_outputs(tr);
  for (int i = 0; i < n; i++)
    if (memcmp(o[i].data, src[i], (size_t)shapes[i]) != 0) FAIL_AT("output %d differs from its source", i);
}

static ferry_pool_stats stats(void) {
  ferry_pool_stats s;
  ferry_pool_stats_get(&s);
  return s;
}

/* `t` staged again in two parts (the first of `first` tensors), byte-exact, without the pool pinning anything
 * more; the transfer is returned for the caller's own checks. */
static ferry_transfer *again_in_two_parts_pinning_nothing(const ferry_tensor *t, int n, int first) {
  ferry_pool_stats before = stats();
  ferry_transfer *tr = d2h_in_two_parts(t, n, first);
  check_exact(tr, n);
  ASSERT_EQ(stats().pin_calls, before.pin_calls);
  ASSERT_EQ(stats().bytes_pinned, before.bytes_pinned);
  return tr;
}

static uint64_t round_up(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

static void setup(void) {
  fake_driver_use();
  ASSERT_OK(ferry_init());
  ferry__pin_chunk_bytes = (uint64_t)4 * MIB;
}

static const int64_t EIGHT[MAX_T] = {3 * MIB / 2, 3 * MIB / 2, 3 * MIB / 2, 3 * MIB / 2,
                                     3 * MIB / 2, 3 * MIB / 2, 3 * MIB / 2, 3 * MIB / 2};

TEST(chunks_a_large_d2h_on_a_fresh_pool_is_pinned_chunk_by_chunk_while_it_copies) {
  setup();
  ferry_tensor t[MAX_T];
  make(t, EIGHT, 8, 1);
  ferry_transfer *tr = d2h(t, 8);
  check_exact(tr, 8);
  /* 12 MiB of 1.5 MiB tensors, sub-parts of at most 0.5, 1, 2, 4, 4... MiB (a tensor larger alone): [0] [1] [2]
   * [3 4] [5 6] [7], each its own slab and its own region. */
  static const size_t slab_of[8] = {0, 1, 2, 3, 3, 4, 4, 5};
  ASSERT_EQ(ferry_transfer_slab_count(tr), 6);
  for (size_t i = 0; i < 8; i++) ASSERT(ferry_transfer_output_slab(tr, i) == ferry_transfer_slab_at(tr, slab_of[i]));
  ferry_pool_stats s = stats();
  ASSERT_EQ(s.pin_calls, 6);
  uint64_t exact = 0;
  for (size_t k = 0; k < 6; k++) exact += round_up(ferry_slab_size(ferry_transfer_slab_at(tr, k)), HUGE_PAGE);
  ASSERT_EQ(s.bytes_pinned, exact); /* each region pinned to its slab, not by the pool's growth rule */
  /* The first region is pinned before any copy; every later one after the previous sub-part's copies were queued. */
  ASSERT_EQ(fake_register_calls, 6);
  ASSERT_EQ(fake_copies_before_register[0], 0);
  for (int k = 1; k < 6; k++) ASSERT(fake_copies_before_register[k] > fake_copies_before_register[k - 1]);
  ferry_transfer_release(tr);
  ASSERT_EQ(stats().bytes_in_use, 0);
}

/* A successful call leaves the thread's last error alone: sizing the sub-parts of a cut batch must not check the
 * descriptors of tensors it passes through (a host tensor with a 0-bit dtype here), which are not ferry's. */
TEST(chunks_a_cut_batch_with_a_passed_through_tensor_leaves_no_error_behind) {
  setup();
  ferry_tensor t[MAX_T + 1];
  make(t, EIGHT, 8, 1);
  static char host[3];
  static int64_t three = 3;
  t[8] = (ferry_tensor){host, {FERRY_DEVICE_CPU, 0}, 1, {FERRY_DTYPE_UINT, 0, 1}, &three, NULL, 0};
  ferry_clear_error();
  ferry_transfer *tr = d2h(t, 9);
  ASSERT(ferry_transfer_slab_count(tr) > 1); /* it was cut */
  ASSERT_EQ(ferry_last_error()->status, FERRY_OK);
  ASSERT(ferry_transfer_outputs(tr)[8].data == host);
  ferry_transfer_release(tr);
}

TEST(chunks_the_same_batch_again_reuses_the_chunks_and_pins_nothing) {
  setup();
  ferry_tensor t[MAX_T];
  make(t, EIGHT, 8, 2);
  ferry_transfer_release(d2h(t, 8));
  ferry_pool_stats before = stats();
  make(t, EIGHT, 8, 3);
  ferry_transfer *tr = d2h(t, 8);
  check_exact(tr, 8);
  ferry_pool_stats after = stats();
  ASSERT_EQ(after.pin_calls, before.pin_calls);
  ASSERT_EQ(after.bytes_pinned, before.bytes_pinned);
  ASSERT_EQ(after.hits - before.hits, 6); /* its sub-parts cut as the first call's, each in its own region */
  ferry_transfer_release(tr);
}

TEST(chunks_the_same_batch_split_otherwise_fills_the_free_ranges_and_pins_nothing) {
  setup();
  ferry_tensor t[MAX_T];
  make(t, EIGHT, 8, 8);
  ferry_transfer_release(d2h(t, 8)); /* regions of 2, 2, 2, 4, 4 and 2 MiB, for 1, 1, 1, 2, 2 and 1 tensors */
  ASSERT_EQ(stats().pin_calls, 6);
  /* Parts of 3 and 5 tensors: cut, they fill the free ranges ([1][1][1] and [2][2][1]) instead of pinning. */
  ferry_transfer *tr = again_in_two_parts_pinning_nothing(t, 8, 3);
  ASSERT_EQ(ferry_transfer_slab_count(tr), 6);
  ferry_transfer_release(tr);
  ASSERT_EQ(atomic_load(&ferry__pin_ahead_outstanding), 0);
}

TEST(chunks_the_large_free_ranges_stay_for_the_large_tensors) {
  setup();
  const int64_t sizes[MAX_T] = {6 * MIB, MIB, MIB, MIB, MIB, MIB, MIB, 6 * MIB}; /* tied embeddings, layers, a head */
  ferry_tensor t[MAX_T];
  make(t, sizes, 8, 9);
  ferry_transfer_release(d2h(t, 8)); /* [6] [1 1 1] [1 1 1] [6]: two 8 MiB and two 4 MiB regions */
  ASSERT_EQ(stats().pin_calls, 4);
  /* Parts of 2 and 6: the first takes an 8 MiB range whole; the small tensors of the second fill the 4 MiB ranges
   * instead of the other 8 MiB one, which stays for the last tensor. */
  ferry_transfer_release(again_in_two_parts_pinning_nothing(t, 8, 2));
}

TEST(chunks_small_tensors_that_fit_only_a_large_tensors_range_fill_the_smaller_ranges_instead) {
  setup();
  const int64_t first[5] = {6 * MIB, 3 * MIB / 2, 3 * MIB / 2, 3 * MIB / 2, 3 * MIB / 2};
  ferry_tensor t[MAX_T];
  make(t, first, 5, 10);
  ferry_transfer_release(d2h(t, 5)); /* [6] [1.5 1.5] [1.5 1.5]: an 8 MiB region and two of 4 MiB */
  ASSERT_EQ(stats().pin_calls, 3);
  /* The small tensors come first, 4.5 MiB in one part: only the 8 MiB range holds it whole, but it fills the
   * 4 MiB ranges, and the large tensor, in the next part, finds its range again. */
  const int64_t again[5] = {3 * MIB / 2, 3 * MIB / 2, 3 * MIB / 2, 3 * MIB / 2, 6 * MIB};
  make(t, again, 5, 11);
  ferry_transfer_release(again_in_two_parts_pinning_nothing(t, 5, 3));
}

TEST(chunks_a_batch_the_pool_holds_in_one_free_range_is_one_slab) {
  setup();
  ASSERT_OK(ferry_pool_reserve((size_t)16 * MIB));
  ferry_tensor t[MAX_T];
  make(t, EIGHT, 8, 4);
  ferry_transfer *tr = d2h(t, 8);
  check_exact(tr, 8);
  ASSERT_EQ(ferry_transfer_slab_count(tr), 1);
  ASSERT_EQ(stats().pin_calls, 1);
  ferry_transfer_release(tr);
}

/* A part smaller than a chunk that no free range holds fills a free range worth a sub-part before it pins: a
 * Python call's middle parts (tens of MiB) would otherwise each pin a new region, a quarter of the pool, beside a
 * range left free by the part before (two outputs of a state dict alive held 1.117x their bytes, 1.059x now). */
TEST(chunks_a_part_fills_a_free_range_smaller_than_it_before_pinning) {
  setup();
  ASSERT_OK(ferry_pool_reserve((size_t)2 * MIB)); /* one free range of 2 MiB */
  ferry_tensor t[MAX_T];
  make(t, EIGHT, 2, 12); /* 3 MiB: under a chunk, more than the range */
  ferry_transfer *tr = d2h(t, 2);
  check_exact(tr, 2);
  ASSERT_EQ(ferry_transfer_slab_count(tr), 2); /* [1.5] in the reserved range, [1.5] in a region of its own */
  ferry_pool_stats s = stats();
  ASSERT_EQ(s.pin_calls, 2);
  ASSERT_EQ(s.bytes_pinned, 2 * MIB + round_up(3 * MIB / 2, HUGE_PAGE));
  ferry_transfer_release(tr);
}

TEST(chunks_a_batch_within_one_chunk_is_one_slab) {
  setup();
  ferry_tensor t[MAX_T];
  make(t, EIGHT, 2, 5);
  ferry_transfer *tr = d2h(t, 2);
  check_exact(tr, 2);
  ASSERT_EQ(ferry_transfer_slab_count(tr), 1);
  ferry_transfer_release(tr);
}

TEST(chunks_a_tensor_larger_than_a_chunk_gets_a_sub_part_of_its_own) {
  setup();
  const int64_t sizes[4] = {MIB, 6 * MIB, MIB, MIB};
  ferry_tensor t[MAX_T];
  make(t, sizes, 4, 6);
  ferry_transfer *tr = d2h(t, 4);
  check_exact(tr, 4);
  /* Sub-parts of at most 0.5, 1, 2 and 4 MiB, the first tensor of each taken whatever its size: [1] [6] [1] [1]. */
  ASSERT_EQ(ferry_transfer_slab_count(tr), 4);
  for (size_t i = 0; i < 4; i++) ASSERT(ferry_transfer_output_slab(tr, i) == ferry_transfer_slab_at(tr, i));
  ASSERT(ferry_slab_size(ferry_transfer_output_slab(tr, 1)) >= (size_t)(6 * MIB));
  ferry_transfer_release(tr);
}

TEST(chunks_a_failed_pin_in_a_later_chunk_kills_the_transfer_and_leaks_nothing) {
  setup();
  ferry_tensor t[MAX_T];
  make(t, EIGHT, 8, 7);
  ferry_transfer_options o = blocking_on_device_0();
  ferry_transfer *tr = NULL;
  ferry__fault_arm("cuMemHostRegister", 3, CUDA_ERROR_OUT_OF_MEMORY);
  ferry_status st = ferry_transfer_d2h(t, 8, &o, &tr);
  ferry__fault_disarm();
  ASSERT(st != FERRY_OK && tr == NULL);
  ASSERT_STR_CONTAINS(ferry_last_error()->call, "cuMemHostRegister");
  ASSERT_EQ(stats().bytes_in_use, 0);
  ASSERT_EQ(atomic_load(&ferry__pin_ahead_outstanding), 0); /* the 4th region, faulted in ahead, is unmapped */
  ASSERT_EQ(fake_live_devmem, 0);
  /* The pool is not poisoned: the same batch goes through, exact. */
  tr = d2h(t, 8);
  check_exact(tr, 8);
  ferry_transfer_release(tr);
  ASSERT_EQ(stats().bytes_in_use, 0);
}

TEST(chunks_a_batch_larger_than_the_machines_memory_fails_at_once_and_pins_nothing) {
  setup();
  /* 64 tensors of 1 GiB each (descriptors only: the failure comes before any byte is read). */
  static int64_t gib = (int64_t)1 << 30;
  static unsigned char byte;
  ferry_tensor t[64];
  for (int i = 0; i < 64; i++)
    t[i] = (ferry_tensor){&byte, {FERRY_DEVICE_CUDA, 0}, 1, {FERRY_DTYPE_UINT, 8, 1}, &gib, NULL, 0};
  ferry_transfer_options o;
  ferry_transfer_options_init(&o);
  o.device = 0;
  ferry_transfer *tr = NULL;
  if ((uint64_t)64 << 30 <= ferry__pinnable_limit()) SKIP("this machine has more than 64 GiB of memory");
  ASSERT_STATUS(ferry_transfer_d2h(t, 64, &o, &tr), FERRY_OUT_OF_HOST_MEMORY);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "cannot succeed");
  ASSERT(tr == NULL);
  ASSERT_EQ(stats().pin_calls, 0);
  ASSERT_EQ(fake_copy_calls, 0);
}

/* Writes `text` to a fresh file under $TMPDIR named `name` and returns its path (static storage). */
static const char *write_file(const char *dir, const char *name, const char *text) {
  static char path[4][512];
  static int next;
  char *p = path[next++ % 4];
  snprintf(p, 512, "%s/%s", dir, name);
  FILE *f = fopen(p, "w");
  ASSERT(f != NULL);
  fputs(text, f);
  fclose(f);
  return p;
}

static void remove_temp_dir(const char *dir) {
  const char *names[] = {"meminfo", "memory.max", "memory.current"};
  char path[512];
  for (int i = 0; i < 3; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    unlink(path);
  }
  rmdir(dir);
}

static const char *temp_dir(void) {
  static char dir[256];
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/ferry-hostmem-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  ASSERT(mkdtemp(dir) != NULL);
  return dir;
}

TEST(pinning_more_than_the_memory_available_fails_before_touching_a_page) {
  setup();
  ferry__pin_chunk_bytes = (uint64_t)256 * MIB; /* as shipped: the part takes the growth rule's 4 MiB region */
  const char *dir = temp_dir();
  ferry__cgroup_dir = dir; /* no limit files there */
  ferry__meminfo_path = write_file(dir, "meminfo", "MemTotal:  1048576 kB\nMemAvailable:    2048 kB\n");
  ASSERT_STATUS(ferry_pool_reserve((size_t)16 * MIB), FERRY_OUT_OF_HOST_MEMORY);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "the 2 MiB of memory available now");
  ferry_tensor t[MAX_T];
  make(t, EIGHT, 1, 8);
  ferry_transfer_options o;
  ferry_transfer_options_init(&o);
  o.device = 0;
  o.flags = FERRY_TRANSFER_BLOCKING;
  ferry_transfer *tr = NULL;
  ASSERT_STATUS(ferry_transfer_d2h(t, 1, &o, &tr), FERRY_OUT_OF_HOST_MEMORY); /* a 4 MiB region would not fit */
  ASSERT(tr == NULL);
  ASSERT_EQ(stats().pin_calls, 0);
  ASSERT_EQ(fake_register_calls, 0);
  ferry__meminfo_path = write_file(dir, "meminfo", "MemAvailable: 1048576 kB\n");
  tr = d2h(t, 1);
  check_exact(tr, 1);
  ferry_transfer_release(tr);
  remove_temp_dir(dir);
}

TEST(pinning_more_than_a_cgroup_limit_leaves_fails_before_touching_a_page) {
  setup();
  const char *dir = temp_dir();
  ferry__meminfo_path = write_file(dir, "meminfo", "MemAvailable: 1048576 kB\n");
  ferry__cgroup_dir = dir;
  write_file(dir, "memory.max", "20971520\n");    /* 20 MiB, of which */
  write_file(dir, "memory.current", "8388608\n"); /* 8 MiB are used */
  ASSERT_STATUS(ferry_pool_reserve((size_t)16 * MIB), FERRY_OUT_OF_HOST_MEMORY);
  ASSERT_STR_CONTAINS(ferry_last_error_message(), "the 12 MiB of memory available now");
  ASSERT_EQ(stats().pin_calls, 0);
  write_file(dir, "memory.max", "max\n");
  ASSERT_OK(ferry_pool_reserve((size_t)16 * MIB));
  ASSERT_EQ(stats().pin_calls, 1);
  remove_temp_dir(dir);
}

/* Llama 3.2 1B's state dict (bf16: 145 tensors, 2.47 GB) scaled by 1/LLAMA_SCALE, chunks too; with `tied`, the
 * embedding again at the end, as transfer_tensor_d2h copies a tied embedding (146 tensors). */
enum { LLAMA_T = 146, LLAMA_SCALE = 16 };
static int64_t llama_sizes[LLAMA_T];

static int llama_make(ferry_tensor *t, bool tied, uint64_t *total) {
  static const int64_t layer[9] = {2048 * 2048 * 2, 512 * 2048 * 2, 512 * 2048 * 2, 2048 * 2048 * 2,
                                   8192 * 2048 * 2, 8192 * 2048 * 2, 8192 * 2048 * 2, 2048 * 2, 2048 * 2};
  static unsigned char *shared; /* every tensor reads the same bytes: this test is about where outputs go */
  int n = 0;
  llama_sizes[n++] = (int64_t)128256 * 2048 * 2 / LLAMA_SCALE;
  for (int l = 0; l < 16; l++)
    for (int k = 0; k < 9; k++) llama_sizes[n++] = layer[k] / LLAMA_SCALE;
  if (tied) llama_sizes[n++] = llama_sizes[0];
  if (!shared) shared = calloc(1, (size_t)llama_sizes[0]);
  ASSERT(shared != NULL);
  *total = 0;
  for (int i = 0; i < n; i++) {
    t[i] = (ferry_tensor){shared, {FERRY_DEVICE_CUDA, 0}, 1, {FERRY_DTYPE_UINT, 8, 1}, &llama_sizes[i], NULL, 0};
    *total += (uint64_t)llama_sizes[i];
  }
  ferry__pin_chunk_bytes = (uint64_t)256 * MIB / LLAMA_SCALE;
  return n;
}

/* A Python call hands a batch over in parts cut where its GIL slices fall, so two calls of one state dict are cut
 * differently. Neither the first call nor the later ones may grow the pool by its growth rule (a quarter of what
 * is pinned) for such a part, nor let small tensors take the range of a large one met later: eight calls, each cut
 * at random, keep the pool within 1.15x the batch. */
static void stage_in_random_parts(bool tied) {
  setup();
  ferry_tensor t[LLAMA_T];
  uint64_t total;
  int n = llama_make(t, tied, &total);
  srand(7);
  for (int call = 0; call < 8; call++) {
    ferry_transfer_options o = blocking_on_device_0();
    ferry_transfer *tr = NULL;
    ASSERT_OK(ferry_transfer_begin_d2h(&o, &tr));
    for (int done = 0; done < n;) {
      int k = 1 + rand() % 40;
      if (done + k > n) k = n - done;
      ASSERT_OK(ferry_transfer_add(tr, t + done, (size_t)k));
      done += k;
    }
    ASSERT_OK(ferry_transfer_end(tr));
    double held = (double)stats().bytes_pinned / (double)total;
    printf("  call %d: pinned %.3fx the batch in %llu regions\n", call, held, (unsigned long long)stats().regions);
    ASSERT(held <= (call == 0 ? 1.10 : 1.15));
    ferry_transfer_release(tr);
  }
  ASSERT_EQ(stats().bytes_in_use, 0);
}

TEST(chunks_a_state_dict_handed_over_in_random_parts_keeps_the_pool_near_its_size) { stage_in_random_parts(false); }

TEST(chunks_a_tied_embedding_met_again_at_the_end_finds_its_range_in_random_parts) { stage_in_random_parts(true); }
