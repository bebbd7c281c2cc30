/* pinned.c — the pinned host pool: regions pinned once, carved into one slab per batch, reused safely.
 *
 * Each region is one pinned mapping. Free space is a list of ranges, best-fit, split on take and coalesced on
 * give, so a request uses what it asks for (rounded to 64 KiB) instead of a power-of-two class. A slab whose
 * last reference goes while a copy into it may still run is parked with its event and only returns to the free
 * list once the event has completed: memory is never handed out under a running copy.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define GRANULE ((size_t)64 << 10)     /* slabs of this size or more are multiples of it */
#define HUGE_PAGE ((size_t)2 << 20)    /* regions are aligned and sized in transparent huge pages */
/* Small requests share one region rather than pinning each; no larger, since a batch's small first part takes it
 * alone (16 MiB held 6% of a 0.3 GB state dict empty). */
#define MIN_REGION ((size_t)4 << 20)
#define GROWTH_DIVISOR 4 /* a new region is at least a quarter of what is pinned already (region_size_for) */
#define GROWTH_CAP ((size_t)1 << 30) /* ... but that share is at most 1 GiB */

typedef struct ferry__region {
  char *base;
  size_t size;
  size_t used; /* bytes of slabs (live or pending) carved from it */
  struct ferry__region *next;
} region;

typedef struct free_range {
  region *r;
  size_t offset, size;
  struct free_range *next; /* sorted by (region, offset) */
} free_range;

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
/* One thread pins at a time for ferry__pool_take: when many threads miss at once (16 workers starting together),
 * the others wait for its region instead of each pinning their own, which split the pool into many small regions
 * that no later large request fits. */
static pthread_cond_t grown = PTHREAD_COND_INITIALIZER;
static bool growing;
static region *regions;
static free_range *free_list;
static ferry_slab *pending; /* refcount zero, fence not yet known complete */
static ferry_pool_stats stats;

double ferry__seconds_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

/* What a slab of `bytes` takes from a free range. A small one takes whole FERRY_SLAB_ALIGN units (all an output's
 * alignment needs), not a granule: a transfer added one small tensor at a time takes a slab per part. */
static size_t slab_size(size_t bytes) {
  if (bytes < GRANULE) return round_up(bytes ? bytes : 1, FERRY_SLAB_ALIGN);
  return round_up(bytes, GRANULE);
}

/* ---- pinning ---------------------------------------------------------------------------------------------- */

/* Pinned memory is physical memory: a request past the machine's RAM can only fail, and under memory overcommit
 * it would fail late (the prefault would wake the OOM killer) or, for sizes near SIZE_MAX, wrap when rounded up.
 * So it fails here, at once, naming the size. */
static _Atomic uint64_t phys_bytes; /* the machine's memory, looked up once (sysconf is a system call) */
uint64_t ferry__pinnable_limit(void) {
  uint64_t phys = atomic_load_explicit(&phys_bytes, memory_order_relaxed);
  if (!phys) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    phys = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : (uint64_t)1 << 62;
    atomic_store_explicit(&phys_bytes, phys, memory_order_relaxed);
  }
  return phys;
}

static ferry_status check_pinnable(size_t bytes) {
  uint64_t phys = ferry__pinnable_limit();
  if ((uint64_t)bytes <= phys) return FERRY_OK;
  return FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "pinning %zu bytes (%zu MiB) cannot succeed: this machine has %llu MiB "
                   "of memory", bytes, bytes >> 20, (unsigned long long)(phys >> 20));
}

ferry_status ferry__pin_map(size_t bytes, char **out_base, size_t *out_size) {
  ferry_status st = check_pinnable(bytes);
  if (st != FERRY_OK) return st;
  size_t size = round_up(bytes ? bytes : 1, HUGE_PAGE);
  uint64_t available = ferry__host_available();
  if ((uint64_t)size > available)
    return FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "pinning %zu MiB would take more than the %llu MiB of memory available "
                     "now", size >> 20, (unsigned long long)(available >> 20));
  /* Map one huge page more than needed, then cut the ends so the range starts on a huge-page boundary. */
  size_t span = size + HUGE_PAGE;
  char *raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED)
    return FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "mapping %zu MiB of host memory to pin failed", size >> 20);
  char *base = (char *)round_up((uintptr_t)raw, HUGE_PAGE);
  if (base > raw) munmap(raw, (size_t)(base - raw));
  if (raw + span > base + size) munmap(base + size, (size_t)(raw + span - (base + size)));
  (void)madvise(base, size, MADV_HUGEPAGE); /* a hint: without THP the prefault still works, page by page */
  /* Not inherited by a forked child: the kernel would copy pinned pages into it at the fork (the whole pool, per
   * child), and a child cannot use them with CUDA anyway (fork.c). Before the prefault, so no page is copied. */
  (void)madvise(base, size, MADV_DONTFORK);
  *out_base = base;
  *out_size = size;
  return FERRY_OK;
}

ferry_status ferry__pin_register(char *base, size_t size) {
  CUresult r = FERRY_CU(cuMemHostRegister, base, size, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
  if (r == CUDA_SUCCESS) return FERRY_OK;
  munmap(base, size);
  return ferry__cu_error(r, "cuMemHostRegister", __FILE__, __LINE__, "pinning %zu MiB of host memory", size >> 20);
}

ferry_status ferry__pin(size_t bytes, void **out_ptr, size_t *out_bytes) {
  ferry_status st = FERRY_OK;
  char *base;
  size_t size;
  FERRY_TRY(ferry__pin_map(bytes, &base, &size));
  ferry__prefault(base, size);
  FERRY_TRY(ferry__pin_register(base, size));
  *out_ptr = base;
  *out_bytes = size;
cleanup:
  return st;
}

void ferry__unpin(void *ptr, size_t bytes) {
  CUresult r = FERRY_CU(cuMemHostUnregister, ptr);
  /* If the driver still holds the registration, the range stays mapped (and leaks): unmapped, its addresses would
   * be handed to the next mmap — typically the pool's next region — which the driver then refuses to register
   * (CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED), failing every later pin there. */
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED) return;
  munmap(ptr, bytes);
}

/* ---- free ranges (pool_lock held) ------------------------------------------------------------------------ */

static void range_insert(region *r, size_t offset, size_t size) {
  free_range *prev = NULL, *next = free_list;
  while (next && (next->r < r || (next->r == r && next->offset < offset))) {
    prev = next;
    next = next->next;
  }
  free_range **link = prev ? &prev->next : &free_list;
  if (prev && prev->r == r && prev->offset + prev->size == offset) {
    prev->size += size;
    if (next && next->r == r && prev->offset + prev->size == next->offset) {
      prev->size += next->size;
      prev->next = next->next;
      free(next);
    }
    return;
  }
  if (next && next->r == r && offset + size == next->offset) {
    next->offset = offset;
    next->size += size;
    return;
  }
  free_range *fr = malloc(sizeof *fr);
  if (!fr) return; /* the range is lost to reuse until trim; memory stays pinned and accounted */
  fr->r = r;
  fr->offset = offset;
  fr->size = size;
  fr->next = next;
  *link = fr;
}

/* Best fit among free ranges; NULL when none is large enough. */
static free_range *range_best(size_t size, free_range ***out_link) {
  free_range *best = NULL, **best_link = NULL;
  for (free_range **l = &free_list; *l; l = &(*l)->next)
    if ((*l)->size >= size && (!best || (*l)->size < best->size)) {
      best = *l;
      best_link = l;
    }
  *out_link = best_link;
  return best;
}

static void give_range(ferry_slab *s) {
  range_insert(s->region, s->offset, s->size);
  s->region->used -= s->size;
  stats.bytes_in_use -= s->size;
}

/* Moves parked slabs whose copies have finished back to the free list. */
static void reap_pending(void) {
  for (ferry_slab **l = &pending; *l;) {
    ferry_slab *s = *l;
    if (!ferry__slab_idle(s)) {
      l = &s->next_pending;
      continue;
    }
    /* Done, or failed: either way no copy or recorded use is running into it any more. */
    *l = s->next_pending;
    ferry__slab_drop_fences(s);
    give_range(s);
    free(s);
  }
}

static bool add_region(char *base, size_t size, double seconds) {
  region *r = malloc(sizeof *r);
  if (!r) return false;
  r->base = base;
  r->size = size;
  r->used = 0;
  r->next = regions;
  regions = r;
  range_insert(r, 0, size);
  stats.bytes_pinned += size;
  if (stats.bytes_pinned > stats.bytes_peak_pinned) stats.bytes_peak_pinned = stats.bytes_pinned;
  stats.regions++;
  stats.pin_calls++;
  stats.pin_seconds += seconds;
  return true;
}

/* The size of the region to pin when no free range holds `size` bytes: at least the request and MIN_REGION, and
 * at least a quarter of what is pinned already. Pinning exactly the request, each missing thread its own region,
 * fragmented the pool under many threads with mixed sizes (free space split across regions, so a new size record
 * pinned yet another region: a 45 s soak on the H200 grew 7.4% in its second half with the in-use peak unchanged).
 * With growth serialised (ferry__pool_take) and geometric, the simulated 30 s soak of ferry_stress plateaus and
 * pins less: 296 MiB in 13 regions, against 336 MiB in 19 regions and still growing. */
static size_t region_size_for(size_t size) {
  pthread_mutex_lock(&pool_lock);
  size_t share = (size_t)(stats.bytes_pinned / GROWTH_DIVISOR);
  pthread_mutex_unlock(&pool_lock);
  if (share > GROWTH_CAP) share = GROWTH_CAP; /* a large pool does not pin gigabytes for a small request */
  size_t want = size > MIN_REGION ? size : MIN_REGION;
  return want > share ? want : round_up(share, HUGE_PAGE);
}

size_t ferry__pool_growth(uint64_t bytes) { return region_size_for(slab_size(bytes)); }

/* Pins a region of at least `size` bytes, without the lock held (pinning takes milliseconds). */
static ferry_status grow(size_t size) {
  void *base;
  size_t got;
  double t0 = ferry__seconds_now();
  ferry_status st = ferry__pin(size, &base, &got);
  if (st != FERRY_OK) return st;
  return ferry__pool_adopt(base, got, ferry__seconds_now() - t0);
}

/* Carves a slab of `size` bytes from free range `fr` (whose link is `link`) into `s`; pool_lock held. */
static void carve_locked(ferry_slab *s, free_range *fr, free_range **link, size_t size, int device, int missed) {
  memset(s, 0, sizeof *s);
  atomic_init(&s->refs, 1);
  s->kind = FERRY__SLAB_PINNED;
  s->device = device;
  s->region = fr->r;
  s->offset = fr->offset;
  s->size = size;
  s->data = fr->r->base + fr->offset;
  fr->offset += size;
  fr->size -= size;
  if (fr->size == 0) {
    *link = fr->next;
    free(fr);
  }
  s->region->used += size;
  stats.bytes_in_use += size;
  if (stats.bytes_in_use > stats.bytes_peak_in_use) stats.bytes_peak_in_use = stats.bytes_in_use;
  if (missed) stats.misses++; else stats.hits++;
}

ferry_status ferry__pool_adopt(char *base, size_t size, double seconds) {
  pthread_mutex_lock(&pool_lock);
  bool added = add_region(base, size, seconds);
  pthread_cond_broadcast(&grown); /* a thread waiting for another's growth may find room here */
  pthread_mutex_unlock(&pool_lock);
  if (added) return FERRY_OK;
  ferry__unpin(base, size);
  return FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "recording a pinned region");
}

ferry_status ferry__pool_take(size_t bytes, int device, bool exact_growth, ferry_slab **out) {
  ferry_status st0 = check_pinnable(bytes);
  if (st0 != FERRY_OK) return st0;
  size_t size = slab_size(bytes);
  ferry_slab *s = malloc(sizeof *s);
  if (!s) return FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "allocating a slab record");
  int missed = 0, grown_here = 0;
  for (;;) {
    pthread_mutex_lock(&pool_lock);
    if (pending) reap_pending();
    free_range **link;
    free_range *fr = range_best(size, &link);
    if (!fr && growing) {
      /* Another thread is pinning a region: wait for it and look again rather than pin one more. */
      missed = 1;
      pthread_cond_wait(&grown, &pool_lock);
      pthread_mutex_unlock(&pool_lock);
      continue;
    }
    if (fr) {
      carve_locked(s, fr, link, size, device, missed);
      pthread_mutex_unlock(&pool_lock);
      ferry__slab_register(s);
      *out = s;
      return FERRY_OK;
    }
    if (grown_here == 3) { /* a region that does not hold what it was pinned for: never loop forever */
      pthread_mutex_unlock(&pool_lock);
      free(s);
      return FERRY_ERR(FERRY_INTERNAL, "the pinned pool grew three times for %zu bytes and found no room", size);
    }
    grown_here++;
    growing = true;
    pthread_mutex_unlock(&pool_lock);
    missed = 1;
    /* The grower takes its slab from the new region under the lock that adds it: no other thread, and no trim, can
     * take the space first (a thread pinning again and again while others took each region starved under load). */
    void *base;
    size_t got;
    double t0 = ferry__seconds_now();
    ferry_status st = ferry__pin(exact_growth ? size : region_size_for(size), &base, &got);
    pthread_mutex_lock(&pool_lock);
    growing = false;
    bool added = st == FERRY_OK && add_region(base, got, ferry__seconds_now() - t0);
    if (added) {
      fr = range_best(size, &link); /* the new region is large enough: there is a range now */
      if (fr) carve_locked(s, fr, link, size, device, missed);
    }
    pthread_cond_broadcast(&grown);
    pthread_mutex_unlock(&pool_lock);
    if (st == FERRY_OK && !added) {
      ferry__unpin(base, got);
      st = FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "recording a pinned region");
    }
    if (st != FERRY_OK) {
      free(s);
      return st;
    }
    if (fr) {
      ferry__slab_register(s);
      *out = s;
      return FERRY_OK;
    }
  }
}

bool ferry__pool_fit(uint64_t bytes, uint64_t *best_fit, uint64_t *largest_below) {
  uint64_t want = slab_size(bytes), below = 0, best = 0;
  pthread_mutex_lock(&pool_lock);
  if (pending) reap_pending();
  for (free_range *fr = free_list; fr; fr = fr->next) {
    if (fr->size >= want) {
      if (!best || fr->size < best) best = fr->size;
    } else if (fr->size > below) {
      below = fr->size;
    }
  }
  pthread_mutex_unlock(&pool_lock);
  if (best_fit) *best_fit = best;
  if (largest_below) *largest_below = below;
  return best != 0;
}

void ferry__pool_give(ferry_slab *s) {
  pthread_mutex_lock(&pool_lock);
  if (!ferry__slab_idle(s)) {
    s->next_pending = pending;
    pending = s;
    pthread_mutex_unlock(&pool_lock);
    return;
  }
  ferry__slab_drop_fences(s);
  give_range(s);
  pthread_mutex_unlock(&pool_lock);
  free(s);
}

/* ---- public ---------------------------------------------------------------------------------------------- */

static ferry_status with_primary_ctx(ferry_status (*fn)(size_t), size_t arg) {
  ferry_status st = ferry__driver_load();
  if (st != FERRY_OK) return st;
  int device;
  FERRY_TRY(ferry_device_resolve(-1, &device));
  FERRY_TRY(ferry__ctx_enter(device));
  st = fn(arg);
  ferry__ctx_leave();
cleanup:
  return st;
}

static ferry_status reserve_locked_out(size_t bytes) {
  ferry_status st = check_pinnable(bytes);
  if (st != FERRY_OK) return st;
  size_t size = round_up(bytes, GRANULE);
  pthread_mutex_lock(&pool_lock);
  if (pending) reap_pending();
  free_range **link;
  free_range *fr = range_best(size, &link);
  pthread_mutex_unlock(&pool_lock);
  return fr ? FERRY_OK : grow(size);
}

ferry_status ferry_pool_reserve(size_t bytes) {
  if (bytes == 0) return FERRY_OK;
  return with_primary_ctx(reserve_locked_out, bytes);
}

static ferry_status trim(size_t unused) {
  FERRY_UNUSED(unused);
  region *doomed = NULL;
  pthread_mutex_lock(&pool_lock);
  if (pending) reap_pending();
  for (region **l = &regions; *l;) {
    region *r = *l;
    if (r->used != 0) {
      l = &r->next;
      continue;
    }
    *l = r->next;
    for (free_range **f = &free_list; *f;) {
      if ((*f)->r == r) {
        free_range *dead = *f;
        *f = dead->next;
        free(dead);
      } else {
        f = &(*f)->next;
      }
    }
    stats.bytes_pinned -= r->size;
    stats.regions--;
    r->next = doomed;
    doomed = r;
  }
  pthread_mutex_unlock(&pool_lock);
  while (doomed) {
    region *r = doomed;
    doomed = r->next;
    ferry__unpin(r->base, r->size);
    free(r);
  }
  ferry__events_trim();
  return FERRY_OK;
}

ferry_status ferry_pool_trim(void) {
  /* Nothing pinned: no driver needed. Read under the lock: another thread may be adding a region right now. */
  pthread_mutex_lock(&pool_lock);
  bool pinned_any = regions != NULL;
  pthread_mutex_unlock(&pool_lock);
  if (!pinned_any) return FERRY_OK;
  return with_primary_ctx(trim, 0);
}

void ferry_pool_stats_get(ferry_pool_stats *out) {
  if (!out) return;
  pthread_mutex_lock(&pool_lock);
  /* Slabs released while their copies ran are returned lazily, at the next take; collect those whose copies have
   * finished now, so the counters say what is in use at this moment (seen on the H200: a failed transfer's slab
   * still counted after the device had drained, until the next transfer). */
  if (pending) reap_pending();
  *out = stats;
  pthread_mutex_unlock(&pool_lock);
}

/* fork.c: held across fork() so a child never inherits the lock held by a thread it does not have. */
void ferry__pool_fork_lock(int lock) { lock ? pthread_mutex_lock(&pool_lock) : pthread_mutex_unlock(&pool_lock); }

void ferry__pool_fork_child(void) {
  for (region *r = regions; r; r = r->next)
    (void)mmap(r->base, r->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
}
