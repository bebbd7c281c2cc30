/* transfer.c — a transfer's life: begin (device, streams, order after the producer), add parts (copy each part's
 * descriptors, plan them, take a slab, queue the copies), end (one fence over everything), wait, release. The
 * one-call ferry_transfer_d2h/h2d is begin + adds of ONE_CALL_PART_TENSORS + end. One way through: caller → plan →
 * submit → wait.
 *
 * D2H: large contiguous tensors are DMA'd straight into the part's pinned slab, all in one cuMemcpyBatchAsync;
 * small and strided tensors are gathered by one kernel into device staging that mirrors the slab's prefix, which
 * one more DMA moves. H2D mirrors it: pinned sources the device can read are gathered by the kernel over PCIe,
 * pageable small or strided sources are packed by the CPU into pinned staging, the rest are DMA'd.
 *
 * Each part is planned from copies of its descriptors made when it is added, so a caller (or a producer) may
 * change or free the shape and stride arrays as soon as ferry_transfer_add returns. A D2H part that the pool
 * cannot hold in one free range is cut into sub-parts of about ferry__pin_chunk_bytes that fill the free ranges or
 * regions pinned one sub-part ahead (add_cut): the first call of a GB-scale batch pins while it copies.
 *
 * Nothing is left behind on failure: a failed part poisons the transfer, everything queued so far is fenced, and
 * memory that a queued copy may still touch returns to its pool only through that fence (or after the streams
 * drain).
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* One ferry_transfer_add that copied something, or one sub-part of it. */
typedef struct part {
  size_t first, count;  /* its outputs: [first, first + count) */
  ferry_slab *slab;     /* the outputs' memory: pinned (D2H) or device (H2D) */
  ferry_slab *staging;  /* H2D: pinned staging for packed inputs and the kernel's work list */
  CUdeviceptr scratch;  /* device staging of the gather (D2H) or its work list (H2D), freed (stream-ordered) when
                           the transfer settles */
  int64_t *dims;        /* the shapes and strides of its copied outputs (one allocation) */
} part;

struct ferry_transfer {
  bool h2d;
  bool ended;           /* ferry_transfer_end was called */
  bool settled;         /* the fence is recorded (or the streams drained): every slab knows when it is free */
  bool cutting;         /* D2H: a part was cut, so every later part the pool cannot hold is cut too (should_cut) */
  uint64_t sub_part_room; /* D2H: the most the next sub-part may take (next_room; 0: none cut yet) */
  int device;           /* -1: everything passes through (no driver or no device) */
  ferry_transfer_options opts;
  CUstream stream;      /* the copy stream: gather kernels, H2D copies, the fence */
  CUstream dma_stream;  /* D2H: the DMAs, beside the gather kernels */
  ferry_status failed;  /* FERRY_OK, or the status of the call that failed: the transfer is then dead */
  ferry_error failure;  /* that failure's record, put back on the caller's thread by every later call */
  size_t count, cap;    /* outputs so far, and room */
  ferry_tensor *outputs;
  uint8_t *copied;      /* per output: 0 passed through, COPIED_TO_SLAB, or COPIED_EMPTY (views no slab) */
  part *parts;
  size_t n_parts, cap_parts;
  ferry__fence *fence;  /* recorded when the transfer settles; its error, if any, sticks to it */
  struct kept_dims *kept_dims; /* shapes and strides of outputs in no part: passed through or empty (ticket_dims) */
  atomic_bool staging_released;
  /* H2D: producer events given to ferry_transfer_order_after that the CPU has not waited for yet. Pageable sources
   * are packed by the CPU when their part is added, so before packing it waits for these (and for options'
   * producer_event), as the copy stream does on the device. */
  CUevent *pack_waits;
  size_t n_pack_waits, cap_pack_waits;
};

enum { COPIED_TO_SLAB = 1, COPIED_EMPTY = 2 };

static _Alignas(256) char empty_storage[256]; /* data pointer of empty host outputs: valid, never read */

void ferry_transfer_options_init(ferry_transfer_options *o) {
  if (!o) return;
  memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  o->device = -1;
}

#define VALID_NDIM(n) ((n) > 0 && (n) <= FERRY_MAX_NDIM)

/* ---- the ticket ------------------------------------------------------------------------------------------ */

/* Per input, adding a part needs its descriptor copied (with the largest shape and strides), a plan entry, the
 * copy arrays and flags, and the ticket an output and a flag: a count past what this many bytes per input allow
 * cannot be an array in memory, and sizing for it would wrap. */
#define BYTES_PER_INPUT                                                                                       \
  (2 * sizeof(ferry_tensor) + 2 * FERRY_MAX_NDIM * sizeof(int64_t) + sizeof(ferry__plan_entry) +            \
   3 * sizeof(CUdeviceptr) + 3)
#define MAX_INPUTS ((SIZE_MAX / 4) / BYTES_PER_INPUT)

static ferry_status grow_outputs(ferry_transfer *t, size_t more) {
  if (more > MAX_INPUTS - t->count)
    return FERRY_ERR(FERRY_OVERFLOW, "%zu more tensors: no array holds that many tensor descriptors", more);
  size_t need = t->count + more;
  if (need <= t->cap) return FERRY_OK;
  size_t cap = t->cap ? t->cap : 16;
  while (cap < need) cap *= 2;
  ferry_tensor *outputs = realloc(t->outputs, cap * sizeof *outputs);
  if (!outputs) return FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "allocating the outputs of %zu tensors", need);
  t->outputs = outputs;
  uint8_t *copied = realloc(t->copied, cap);
  if (!copied) return FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "allocating the outputs of %zu tensors", need);
  t->copied = copied;
  t->cap = cap;
  return FERRY_OK;
}

static ferry_status new_part(ferry_transfer *t, part **out) {
  if (t->n_parts == t->cap_parts) {
    size_t cap = t->cap_parts ? t->cap_parts * 2 : 4;
    part *parts = realloc(t->parts, cap * sizeof *parts);
    if (!parts) return FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "allocating the record of part %zu", t->n_parts + 1);
    t->parts = parts;
    t->cap_parts = cap;
  }
  part *p = &t->parts[t->n_parts++];
  memset(p, 0, sizeof *p);
  *out = p;
  return FERRY_OK;
}

/* The part whose outputs include output `index`, or NULL (passed through, or in no part). */
static const part *part_of(const ferry_transfer *t, size_t index) {
  size_t lo = 0, hi = t->n_parts;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    const part *p = &t->parts[mid];
    if (index < p->first) hi = mid;
    else if (index >= p->first + p->count) lo = mid + 1;
    else return p;
  }
  return NULL;
}

/* The transfer is dead: every later call returns this failure, with its record put back on the caller's thread. */
static ferry_status poison(ferry_transfer *t, ferry_status st) {
  t->failed = st;
  t->failure = *ferry_last_error();
  return st;
}

static ferry_status repeat_failure(const ferry_transfer *t) {
  ferry__error_restore(&t->failure);
  return t->failed;
}

/* ---- submission ------------------------------------------------------------------------------------------ */

/* Makes `stream` (and `stream2`, when not NULL) wait until the inputs are ready: after producer_event, else after
 * an event recorded now on producer_stream (the caller's current stream; NULL is the legacy default stream). */
static ferry_status order_after(int device, void *producer_event, void *producer_stream, CUstream stream,
                                CUstream stream2) {
  ferry_status st = FERRY_OK;
  CUevent ev = NULL;
  if (producer_event) {
    FERRY_TRY_CU(("waiting for producer_event %p", producer_event), cuStreamWaitEvent, stream,
                 (CUevent)producer_event, 0);
    if (stream2)
      FERRY_TRY_CU(("waiting for producer_event %p", producer_event), cuStreamWaitEvent, stream2,
                   (CUevent)producer_event, 0);
    return FERRY_OK;
  }
  CUstream producer = producer_stream ? (CUstream)producer_stream : CU_STREAM_LEGACY;
  if (producer == stream && !stream2) return FERRY_OK; /* same stream: already in order */
  FERRY_TRY(ferry__event_get(device, &ev));
  FERRY_TRY_CU(("recording the producer's readiness on stream %p", (void *)producer), cuEventRecord, ev, producer);
  if (producer != stream)
    FERRY_TRY_CU(("ordering the copy stream after the producer"), cuStreamWaitEvent, stream, ev, 0);
  if (stream2) FERRY_TRY_CU(("ordering the second copy stream after the producer"), cuStreamWaitEvent, stream2, ev, 0);
cleanup:
  /* A wait captures the event's state when it is enqueued, so the event can be reused at once. */
  if (ev) ferry__event_put(device, ev);
  return st;
}

/* Makes `into` wait for everything queued on `from` so far. */
static ferry_status join_streams(int device, CUstream from, CUstream into) {
  ferry_status st = FERRY_OK;
  CUevent ev = NULL;
  FERRY_TRY(ferry__event_get(device, &ev));
  FERRY_TRY_CU(("marking the end of the second copy stream's work"), cuEventRecord, ev, from);
  FERRY_TRY_CU(("joining the second copy stream into the copy stream"), cuStreamWaitEvent, into, ev, 0);
cleanup:
  if (ev) ferry__event_put(device, ev);
  return st;
}

/* Scratch for submitting one part, carved from the calling thread's scratch block. */
typedef struct part_scratch {
  ferry_tensor *inputs;  /* the part's descriptors, copied: the plan reads only these */
  int64_t *dims;         /* their shapes and strides */
  ferry__plan_entry *entries;
  uint8_t *is_ours;
  uint8_t *pinned;
  CUdeviceptr *dsts, *srcs;
  size_t *sizes;
} part_scratch;

/* The calling thread's scratch block, kept from one add to the next and grown when a part needs more: a large
 * batch's plan then does not fault in fresh pages on every call (a fresh 600 KB block per 4096-tensor call cost the
 * one-call D2H ~0.15 ms on the H200). Blocks past SCRATCH_KEEP are freed after their call. Freed at thread exit. */
#define SCRATCH_KEEP ((size_t)16 << 20)
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static _Thread_local char *scratch_block;
static _Thread_local size_t scratch_cap;

static void make_scratch_key(void) { (void)pthread_key_create(&scratch_key, free); }

static char *scratch_get(size_t bytes) {
  if (bytes <= scratch_cap) return scratch_block;
  pthread_once(&scratch_once, make_scratch_key);
  char *p = realloc(scratch_block, bytes);
  if (!p) return NULL;
  scratch_block = p;
  scratch_cap = bytes;
  (void)pthread_setspecific(scratch_key, p);
  return p;
}

static void scratch_put(void) {
  if (scratch_cap <= SCRATCH_KEEP) return;
  free(scratch_block);
  scratch_block = NULL;
  scratch_cap = 0;
  (void)pthread_setspecific(scratch_key, NULL);
}

static ferry_status scratch_new(const ferry_tensor *in, size_t count, part_scratch *sc) {
  size_t dims = 0;
  /* Only a valid rank gets room: a tensor of another rank is passed through (or the plan rejects it, before it
   * reads its shape), and a garbage ndim must not size the allocation. */
  for (size_t i = 0; i < count; i++) dims += (size_t)(VALID_NDIM(in[i].ndim) ? in[i].ndim : 0) * 2;
  size_t bytes = count * (sizeof(ferry_tensor) + sizeof(ferry__plan_entry) + 3 * sizeof(CUdeviceptr) + 2) +
                 dims * sizeof(int64_t);
  char *p = scratch_get(bytes ? bytes : 1);
  if (!p) return FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "allocating the plan of %zu tensors", count);
  sc->inputs = (ferry_tensor *)p;
  p += count * sizeof(ferry_tensor);
  sc->entries = (ferry__plan_entry *)p;
  p += count * sizeof(ferry__plan_entry);
  sc->dsts = (CUdeviceptr *)p;
  p += count * sizeof(CUdeviceptr);
  sc->srcs = (CUdeviceptr *)p;
  p += count * sizeof(CUdeviceptr);
  sc->sizes = (size_t *)p;
  p += count * sizeof(size_t);
  sc->dims = (int64_t *)p;
  p += dims * sizeof(int64_t);
  sc->is_ours = (uint8_t *)p;
  p += count;
  sc->pinned = (uint8_t *)p;
  return FERRY_OK;
}

/* Copies the descriptors of the tensors on the transfer's source side, shape and strides included: from here on
 * the part is planned and submitted from these copies alone, whatever happens to the caller's arrays. */
/* Whether a tensor on `d` is on the side this transfer copies from: host memory for H2D, a CUDA device for D2H (the
 * transfer's own device, copy_inputs adds; any, for the checks made without one). */
static bool on_source_side(const ferry_transfer *t, ferry_device d) {
  return t->h2d ? d.device_type == FERRY_DEVICE_CPU || d.device_type == FERRY_DEVICE_CUDA_HOST
                : d.device_type == FERRY_DEVICE_CUDA || d.device_type == FERRY_DEVICE_CUDA_MANAGED;
}

static void copy_inputs(const ferry_transfer *t, const ferry_tensor *in, size_t count, part_scratch *sc) {
  int64_t *dims = sc->dims;
  for (size_t i = 0; i < count; i++) {
    ferry_tensor c = in[i];
    sc->is_ours[i] = on_source_side(t, c.device) && (t->h2d || c.device.device_id == t->device);
    if (sc->is_ours[i] && VALID_NDIM(c.ndim) && c.shape) {
      size_t nd = (size_t)c.ndim;
      memcpy(dims, c.shape, nd * sizeof *dims);
      c.shape = dims;
      if (c.strides) {
        memcpy(dims + nd, c.strides, nd * sizeof *dims);
        c.strides = dims + nd;
      }
      dims += 2 * nd;
    }
    sc->inputs[i] = c;
  }
}

/* Submits the DMA-routed entries: one cuMemcpyBatchAsync when the driver has it, else a loop. */
static ferry_status submit_dma(const ferry__plan_input *pin, const ferry__plan_entry *e, char *dst_base,
                               CUstream stream, uint32_t flags, part_scratch *sc, bool h2d) {
  size_t count = pin->count;
  ferry_status st = FERRY_OK;
  size_t n = 0;
  for (size_t i = 0; i < count; i++) {
    if (e[i].route != FERRY__DMA) continue;
    /* Pageable H2D sources go alone through cuMemcpyHtoDAsync, which stages them through the driver. */
    if (h2d && !e[i].src_pinned) {
      FERRY_TRY_CU(("copying tensor %zu (%llu bytes) from pageable memory", pin->first_index + i,
                    (unsigned long long)e[i].nbytes),
                   cuMemcpyHtoDAsync, (CUdeviceptr)(uintptr_t)(dst_base + e[i].offset), e[i].src, e[i].nbytes,
                   stream);
      continue;
    }
    sc->dsts[n] = (CUdeviceptr)(uintptr_t)(dst_base + e[i].offset);
    sc->srcs[n] = (CUdeviceptr)(uintptr_t)e[i].src;
    sc->sizes[n] = e[i].nbytes;
    n++;
  }
  if (n == 0) return FERRY_OK;
  bool batch = n > 1 && !(flags & FERRY_TRANSFER_NO_BATCH_API) &&
               (ferry__drv.cuMemcpyBatchAsync_v13 || ferry__drv.cuMemcpyBatchAsync_v12);
  if (batch) {
    CUmemcpyAttributes attr;
    memset(&attr, 0, sizeof attr);
    attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    size_t attr_index = 0;
    if (ferry__drv.cuMemcpyBatchAsync_v13) {
      FERRY_TRY_CU(("submitting %zu copies in one batch", n), cuMemcpyBatchAsync_v13, sc->dsts, sc->srcs, sc->sizes,
                   n, &attr, &attr_index, 1, stream);
    } else {
      size_t fail_index = SIZE_MAX;
      FERRY_TRY_CU(("submitting %zu copies in one batch", n), cuMemcpyBatchAsync_v12, sc->dsts, sc->srcs, sc->sizes,
                   n, &attr, &attr_index, 1, &fail_index, stream);
    }
    return FERRY_OK;
  }
  for (size_t k = 0; k < n; k++)
    FERRY_TRY_CU(("copying %zu bytes (copy %zu of %zu)", sc->sizes[k], k + 1, n), cuMemcpyAsync, sc->dsts[k],
                 sc->srcs[k], sc->sizes[k], stream);
cleanup:
  return st;
}

/* Launches the gather kernel over `n_items` items whose work list is already on the device. */
static ferry_status launch_gather(CUfunction fn, CUstream stream, CUdeviceptr items, CUdeviceptr layouts,
                                  size_t n_items) {
  ferry_status st = FERRY_OK;
  void *params[] = {&items, &layouts};
  if (n_items > 0x7fffffffu) return FERRY_ERR(FERRY_UNSUPPORTED, "%zu gather items exceed one grid", n_items);
  FERRY_TRY_CU(("launching the gather kernel (%zu blocks)", n_items), cuLaunchKernel, fn, (unsigned)n_items, 1, 1,
               256, 1, 1, 0, stream, params, NULL);
cleanup:
  return st;
}

/* Uploads a work list from pinned memory (`host`) to `dev` and launches the kernel over it (H2D: one launch). */
static ferry_status upload_and_gather(int device, CUstream stream, char *host, CUdeviceptr dev, size_t n_items,
                                      size_t n_layouts) {
  ferry_status st = FERRY_OK;
  CUfunction fn;
  FERRY_TRY(ferry__gather_function(device, &fn));
  size_t bytes = n_items * sizeof(ferry__gather_item) + n_layouts * sizeof(ferry__gather_layout);
  FERRY_TRY_CU(("uploading the gather work list (%zu items)", n_items), cuMemcpyHtoDAsync, dev, host, bytes, stream);
  FERRY_TRY(launch_gather(fn, stream, dev, dev + n_items * sizeof(ferry__gather_item), n_items));
cleanup:
  return st;
}

/* ---- the D2H gather pipeline ------------------------------------------------------------------------------- */

uint64_t ferry__pipeline_chunk_min = (uint64_t)1 << 20;
#define PIPELINE_MAX_CHUNKS 8
/* Layout slots beyond the plan's count: a strided tensor cut by a chunk boundary repeats its layout. */
#define PIPELINE_EXTRA_LAYOUTS (2 * PIPELINE_MAX_CHUNKS + 2)

/* Gathers the small and strided tensors into device staging in chunks on `copy`, and copies each chunk to the
 * slab on `dma` as soon as its kernel is done: the DMA of chunk k overlaps the kernel of chunk k+1, and the host
 * lays out chunk k+1's work while the device runs chunk k. `list_host` (pinned) and `list_dev` hold the work list:
 * all items first, then all layouts. */
static ferry_status d2h_gather(const ferry__plan_input *pin, const ferry__plan_entry *e, const ferry__plan *plan,
                               char *slab_base, char *list_host, CUdeviceptr list_dev, CUdeviceptr staging,
                               int device, CUstream copy, CUstream dma) {
  ferry_status st = FERRY_OK;
  CUevent ev = NULL;
  CUfunction fn;
  FERRY_TRY(ferry__gather_function(device, &fn));
  ferry__gather_item *items = (ferry__gather_item *)list_host;
  ferry__gather_layout *layouts = (ferry__gather_layout *)(list_host + plan->n_items * sizeof *items);
  CUdeviceptr items_dev = list_dev, layouts_dev = list_dev + plan->n_items * sizeof *items;
  size_t layouts_cap = plan->n_layouts + PIPELINE_EXTRA_LAYOUTS;
  uint64_t chunk = plan->gather_bytes / PIPELINE_MAX_CHUNKS;
  if (chunk < ferry__pipeline_chunk_min) chunk = ferry__pipeline_chunk_min;
  ferry__item_cursor cur = {0, 0};
  size_t item_base = 0, layout_base = 0;
  uint64_t lo = 0;
  for (;;) {
    size_t ni, nl;
    uint64_t end;
    FERRY_TRY(ferry__plan_gather_items_chunk(pin, e, &cur, chunk, (uint64_t)staging, items + item_base,
                                             layouts + layout_base, &ni, &nl, &end));
    if (ni == 0) break;
    if (item_base + ni > plan->n_items || layout_base + nl > layouts_cap)
      return FERRY_ERR(FERRY_INTERNAL, "the gather pipeline produced more work items than planned");
    FERRY_TRY_CU(("uploading gather work items %zu..%zu", item_base, item_base + ni), cuMemcpyHtoDAsync,
                 items_dev + item_base * sizeof *items, items + item_base, ni * sizeof *items, copy);
    if (nl)
      FERRY_TRY_CU(("uploading gather layouts"), cuMemcpyHtoDAsync, layouts_dev + layout_base * sizeof *layouts,
                   layouts + layout_base, nl * sizeof *layouts, copy);
    FERRY_TRY(launch_gather(fn, copy, items_dev + item_base * sizeof *items,
                            layouts_dev + layout_base * sizeof *layouts, ni));
    FERRY_TRY(ferry__event_get(device, &ev));
    FERRY_TRY_CU(("marking a gathered chunk"), cuEventRecord, ev, copy);
    FERRY_TRY_CU(("ordering a chunk's copy after its gather"), cuStreamWaitEvent, dma, ev, 0);
    ferry__event_put(device, ev);
    ev = NULL;
    FERRY_TRY_CU(("copying gathered bytes %llu..%llu to the host", (unsigned long long)lo, (unsigned long long)end),
                 cuMemcpyAsync, (CUdeviceptr)(uintptr_t)(slab_base + lo), staging + lo, (size_t)(end - lo), dma);
    lo = end;
    item_base += ni;
    layout_base += nl;
  }
cleanup:
  if (ev) ferry__event_put(device, ev);
  return st;
}

/* H2D from pageable memory: the CPU packs the small and strided sources into pinned `staging` (after waiting
 * for the producer, since it reads them now) and one DMA moves the packed range into the device slab. */
static ferry_status pack_and_copy(ferry_transfer *t, const ferry__plan_input *pin, const ferry__plan_entry *e,
                                  const ferry__plan *plan, char *staging, char *slab_base, CUstream stream) {
  ferry_status st = FERRY_OK;
  size_t pack_bytes = (size_t)(plan->pack_end - plan->gather_bytes);
  void *producer_event = t->opts.producer_event;
  if (producer_event)
    FERRY_TRY_CU(("waiting for producer_event before packing"), cuEventSynchronize, (CUevent)producer_event);
  for (size_t k = 0; k < t->n_pack_waits; k++)
    FERRY_TRY_CU(("waiting for the producer_event of ferry_transfer_order_after before packing"), cuEventSynchronize,
                 t->pack_waits[k]);
  t->n_pack_waits = 0; /* done: later parts need not wait for them again */
  ferry__gather_item *items = malloc(plan->n_pack_items * sizeof *items +
                                     plan->n_pack_layouts * sizeof(ferry__gather_layout) + 1);
  if (!items)
    return FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "allocating the pack list (%zu items)", plan->n_pack_items);
  ferry__gather_layout *layouts = (ferry__gather_layout *)(items + plan->n_pack_items);
  size_t ni, nl;
  uint64_t dst = (uint64_t)(uintptr_t)staging - plan->gather_bytes;
  st = ferry__plan_gather_items(pin, e, FERRY__PACK, dst, items, layouts, &ni, &nl);
  for (size_t k = 0; st == FERRY_OK && k < ni; k++) ferry__gather_item_run_host(&items[k], layouts);
  free(items);
  if (st != FERRY_OK) return st;
  FERRY_TRY_CU(("copying %zu packed bytes to the device", pack_bytes), cuMemcpyHtoDAsync,
               (CUdeviceptr)(uintptr_t)(slab_base + plan->gather_bytes), staging, pack_bytes, stream);
cleanup:
  return st;
}

static size_t worklist_bytes(size_t items, size_t layouts) {
  return items * sizeof(ferry__gather_item) + layouts * sizeof(ferry__gather_layout);
}

/* Finds whether each host tensor is pinned memory that the device can address at the same pointer: every byte its
 * elements occupy must lie in one registered range, since the device reads the source through its mapping, which
 * ends where the registration does (a tensor running past it is read as pageable, packed by the CPU). Consecutive
 * tensors in one allocation (views of one buffer) cost one driver query. Queries that fail (pageable memory) are
 * answers, not errors: FERRY_CU records nothing. A tensor the plan will refuse is left pageable; the plan's own
 * check, next, says why. */
static void find_pinned(const ferry_tensor *in, size_t count, const uint8_t *is_ours, uint8_t *pinned) {
  uint64_t lo = 0, hi = 0;
  for (size_t i = 0; i < count; i++) {
    pinned[i] = 0;
    uint64_t nbytes, first, end;
    if (!is_ours[i] || !in[i].data || ferry__plan_check_tensor(&in[i], i, &nbytes) != FERRY_OK || nbytes == 0 ||
        ferry__tensor_span(&in[i], nbytes, &first, &end) != FERRY__SPAN_OK)
      continue;
    if (first >= lo && end <= hi) {
      pinned[i] = 1;
      continue;
    }
    CUdeviceptr dp = 0, start = 0;
    size_t size = 0;
    if (FERRY_CU(cuPointerGetAttribute, &dp, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, (CUdeviceptr)first) !=
            CUDA_SUCCESS ||
        dp != (CUdeviceptr)first)
      continue; /* pageable, or mapped at another address: treated as pageable */
    if (FERRY_CU(cuPointerGetAttribute, &start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, (CUdeviceptr)first) !=
            CUDA_SUCCESS ||
        FERRY_CU(cuPointerGetAttribute, &size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, (CUdeviceptr)first) != CUDA_SUCCESS)
      continue; /* its extent cannot be checked against the range: read as pageable */
    lo = (uint64_t)start;
    hi = lo + size;
    pinned[i] = end <= hi;
  }
}

/* Queues the copies of one planned part: D2H into a new pinned slab (DMAs on the second stream, the gather on
 * the copy stream), H2D into a new device slab. Records what it takes in `p` as it takes it, so that the caller
 * can fence and release it whatever happens. */
static ferry_status submit_part(ferry_transfer *t, const ferry__plan_input *pin, const ferry__plan *plan,
                                part_scratch *sc, bool exact_growth, part *p) {
  ferry_status st = FERRY_OK;
  size_t work;
  if (!t->h2d) {
    /* The pinned slab carries the gather work list in its tail, past the outputs. */
    work = worklist_bytes(plan->n_items, plan->n_items ? plan->n_layouts + PIPELINE_EXTRA_LAYOUTS : 0);
    FERRY_TRY(ferry__pool_take((size_t)plan->total + work, t->device, exact_growth, &p->slab));
    char *slab_base = p->slab->data;
    /* Large tensors need no kernel: their DMAs go first, on the second stream, beside the gather. */
    FERRY_TRY(submit_dma(pin, sc->entries, slab_base, t->dma_stream, t->opts.flags, sc, false));
    if (plan->n_items) {
      FERRY_TRY(ferry__devmem_alloc(t->device, (size_t)plan->gather_bytes + work, t->stream, &p->scratch));
      FERRY_TRY(d2h_gather(pin, sc->entries, plan, slab_base, slab_base + plan->total,
                           p->scratch + plan->gather_bytes, p->scratch, t->device, t->stream, t->dma_stream));
    }
    return FERRY_OK;
  }
  size_t pack_bytes = (size_t)(plan->pack_end - plan->gather_bytes);
  work = worklist_bytes(plan->n_items, plan->n_layouts);
  if (pack_bytes || work) FERRY_TRY(ferry__pool_take(pack_bytes + work, t->device, false, &p->staging));
  FERRY_TRY(ferry__devmem_slab(t->device, (size_t)plan->total, t->stream, &p->slab));
  char *slab_base = p->slab->data;
  if (plan->n_items) {
    /* Pinned sources the device can read: the kernel gathers them over PCIe straight into the device slab. The
     * work list's device copy is the part's scratch, freed (stream-ordered) when the transfer settles. */
    FERRY_TRY(ferry__devmem_alloc(t->device, work, t->stream, &p->scratch));
    char *list_host = (char *)p->staging->data + pack_bytes;
    ferry__gather_item *items = (ferry__gather_item *)list_host;
    ferry__gather_layout *layouts = (ferry__gather_layout *)(list_host + plan->n_items * sizeof(ferry__gather_item));
    size_t ni, nl;
    FERRY_TRY(ferry__plan_gather_items(pin, sc->entries, FERRY__GATHER, (uint64_t)(uintptr_t)slab_base, items,
                                       layouts, &ni, &nl));
    FERRY_TRY(upload_and_gather(t->device, t->stream, list_host, p->scratch, ni, nl));
  }
  if (plan->n_pack)
    FERRY_TRY(pack_and_copy(t, pin, sc->entries, plan, p->staging->data, slab_base, t->stream));
  FERRY_TRY(submit_dma(pin, sc->entries, slab_base, t->stream, t->opts.flags, sc, true));
cleanup:
  return st;
}

/* Points output i at its place in the part's slab, compact row-major, on the destination side; `dims` has room for
 * its shape and strides. */
static void set_output(ferry_transfer *t, size_t i, const ferry_tensor *in, const ferry__plan_entry *e, char *base,
                       int64_t *dims) {
  ferry_tensor *o = &t->outputs[i];
  *o = *in;
  int32_t nd = in->ndim > 0 ? in->ndim : 0;
  o->shape = nd ? dims : NULL;
  o->strides = nd ? dims + nd : NULL;
  if (nd) {
    memcpy(o->shape, in->shape, (size_t)nd * sizeof(int64_t));
    ferry__compact_strides(nd, o->shape, o->strides);
  }
  o->device = t->h2d ? (ferry_device){FERRY_DEVICE_CUDA, t->device} : (ferry_device){FERRY_DEVICE_CPU, 0};
  o->byte_offset = 0;
  bool empty = e->route == FERRY__EMPTY;
  o->data = empty ? (t->h2d ? NULL : empty_storage) : base + e->offset;
  t->copied[i] = empty ? COPIED_EMPTY : COPIED_TO_SLAB;
}

/* A block of shapes and strides of outputs outside any part (passed through, or empty), owned by the ticket. */
typedef struct kept_dims {
  struct kept_dims *next;
  int64_t dims[];
} kept_dims;

/* Room for `n` dimensions that lives as long as the ticket, or NULL (the error recorded). */
static int64_t *ticket_dims(ferry_transfer *t, size_t n, size_t outputs) {
  kept_dims *k = malloc(sizeof *k + n * sizeof(int64_t));
  if (!k) {
    (void)FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "allocating the shapes of %zu outputs", outputs);
    return NULL;
  }
  k->next = t->kept_dims;
  t->kept_dims = k;
  return k->dims;
}

/* Points the passed-through outputs among [first, first + count) at copies of their shapes and strides that the
 * ticket owns: the caller may free its arrays once the call returns (ferry.h), outputs included. */
static ferry_status keep_passthrough_dims(ferry_transfer *t, size_t first, size_t count) {
  size_t n = 0;
  for (size_t i = first; i < first + count; i++)
    if (!t->copied[i] && VALID_NDIM(t->outputs[i].ndim) && t->outputs[i].shape) n += 2 * (size_t)t->outputs[i].ndim;
  if (n == 0) return FERRY_OK;
  int64_t *d = ticket_dims(t, n, count);
  if (!d) return FERRY_OUT_OF_HOST_MEMORY;
  for (size_t i = first; i < first + count; i++) {
    ferry_tensor *o = &t->outputs[i];
    if (t->copied[i] || !VALID_NDIM(o->ndim) || !o->shape) continue;
    size_t nd = (size_t)o->ndim;
    memcpy(d, o->shape, nd * sizeof *d);
    if (o->strides) memcpy(d + nd, o->strides, nd * sizeof *d);
    o->shape = d;
    o->strides = o->strides ? d + nd : NULL;
    d += 2 * nd;
  }
  return FERRY_OK;
}

/* Appends `count` pass-through outputs: the inputs' descriptors, their shapes and strides copied. */
static ferry_status append_passthrough(ferry_transfer *t, const ferry_tensor *in, size_t count) {
  memcpy(t->outputs + t->count, in, count * sizeof *in);
  memset(t->copied + t->count, 0, count);
  ferry_status st = keep_passthrough_dims(t, t->count, count);
  if (st == FERRY_OK) t->count += count;
  return st;
}

/* Fences everything queued so far: the second stream is joined into the copy stream, the parts' gather staging
 * is freed after it (stream-ordered), and one event on the copy stream then guards every slab. If the driver
 * cannot record the fence (or make the context current), the streams are drained instead — stream calls need no
 * current context — so no slab can be reused under a running copy. */
static ferry_status settle(ferry_transfer *t) {
  t->settled = true;
  if (t->device < 0 || t->n_parts == 0) return FERRY_OK;
  ferry_status st = ferry__ctx_enter(t->device);
  bool entered = st == FERRY_OK;
  if (entered && t->dma_stream) st = join_streams(t->device, t->dma_stream, t->stream);
  /* The frees must follow the DMAs that read the scratch: after the join, or after draining them. */
  if (st != FERRY_OK && t->dma_stream) (void)FERRY_CU(cuStreamSynchronize, t->dma_stream);
  for (size_t k = 0; k < t->n_parts; k++) {
    CUdeviceptr scratch = t->parts[k].scratch;
    t->parts[k].scratch = 0;
    if (!scratch) continue;
    CUresult r = FERRY_CU(cuMemFreeAsync, scratch, t->stream);
    if (r == CUDA_SUCCESS) continue;
    if (st == FERRY_OK) st = ferry__cu_error(r, "cuMemFreeAsync", __FILE__, __LINE__, "releasing the gather staging");
    (void)FERRY_CU(cuMemFreeAsync, scratch, t->stream); /* once more: the failure may have been transient */
  }
  if (st == FERRY_OK) st = ferry__fence_record(t->device, t->stream, &t->fence);
  if (st != FERRY_OK) (void)FERRY_CU(cuStreamSynchronize, t->stream);
  for (size_t k = 0; k < t->n_parts; k++) {
    if (t->parts[k].slab) t->parts[k].slab->fence = ferry__fence_ref(t->fence);
    if (t->parts[k].staging) t->parts[k].staging->fence = ferry__fence_ref(t->fence);
  }
  if (entered) ferry__ctx_leave();
  return st;
}

/* A part failed: fence what is queued (keeping the part's error as the one the caller reads) and kill the
 * transfer. */
static ferry_status fail(ferry_transfer *t, ferry_status st) {
  ferry_error saved = *ferry_last_error();
  if (!t->settled) (void)settle(t);
  ferry__error_restore(&saved);
  return poison(t, st);
}

/* ---- the public calls ------------------------------------------------------------------------------------- */

static ferry_status begin(const ferry_transfer_options *user_opts, bool h2d, size_t expected,
                          ferry_transfer **out) {
  ferry_status st = FERRY_OK;
  ferry_transfer_options o;
  ferry_transfer_options_init(&o);
  if (user_opts) {
    if (user_opts->struct_size < sizeof o)
      return FERRY_ERR(FERRY_INVALID_ARGUMENT, "options.struct_size is %u, expected %zu: call "
                       "ferry_transfer_options_init first", (unsigned)user_opts->struct_size, sizeof o);
    o = *user_opts;
  }
  if (!out) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "out_transfer is NULL");
  if (o.stream && o.device < 0)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "stream %p was given without a device: pass the device the stream "
                     "belongs to", o.stream);
  ferry_transfer *t = calloc(1, sizeof *t);
  if (!t) return FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "allocating a transfer");
  t->h2d = h2d;
  t->opts = o;
  t->device = -1;
  bool entered = false;
  if (expected) FERRY_TRY(grow_outputs(t, expected));

  /* No driver or no device: everything passes through, as documented. */
  ferry_error saved = *ferry_last_error();
  st = ferry__driver_load();
  if (st == FERRY_NO_DRIVER || st == FERRY_NO_DEVICE) {
    ferry__error_restore(&saved); /* not an error for a transfer */
    *out = t;
    return FERRY_OK;
  }
  if (st != FERRY_OK) goto cleanup;
  FERRY_TRY(ferry_device_resolve(o.device, &t->device));
  FERRY_TRY(ferry__ctx_enter(t->device));
  entered = true;
  if (o.stream) {
    t->stream = (CUstream)o.stream;
    FERRY_TRY(ferry__stream_check_device(t->stream, t->device));
  } else {
    FERRY_TRY(ferry__thread_stream(t->device, &t->stream));
  }
  if (!h2d) FERRY_TRY(ferry__thread_dma_stream(t->device, &t->dma_stream));
  FERRY_TRY(order_after(t->device, o.producer_event, o.producer_stream, t->stream, t->dma_stream));
  ferry__ctx_leave();
  *out = t;
  return FERRY_OK;
cleanup:
  if (entered) ferry__ctx_leave();
  free(t->outputs);
  free(t->copied);
  free(t);
  return st;
}

ferry_status ferry_transfer_begin_d2h(const ferry_transfer_options *options, ferry_transfer **out_transfer) {
  return begin(options, false, 0, out_transfer);
}

ferry_status ferry_transfer_begin_h2d(const ferry_transfer_options *options, ferry_transfer **out_transfer) {
  return begin(options, true, 0, out_transfer);
}

ferry_status ferry_transfer_order_after(ferry_transfer *t, void *producer_event, void *producer_stream) {
  ferry_status st = FERRY_OK;
  if (!t) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_transfer_order_after: transfer is NULL");
  if (t->failed) return repeat_failure(t);
  if (t->ended) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_transfer_order_after: the transfer has ended");
  if (t->device < 0) return FERRY_OK;
  if (t->h2d && producer_event && t->n_pack_waits == t->cap_pack_waits) { /* room first: nothing to undo after */
    size_t cap = t->cap_pack_waits ? 2 * t->cap_pack_waits : 4;
    CUevent *waits = realloc(t->pack_waits, cap * sizeof *waits);
    if (!waits) {
      st = FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "recording producer_event %p", producer_event);
      goto cleanup;
    }
    t->pack_waits = waits;
    t->cap_pack_waits = cap;
  }
  FERRY_TRY(ferry__ctx_enter(t->device));
  st = order_after(t->device, producer_event, producer_stream, t->stream, t->dma_stream);
  ferry__ctx_leave();
  if (st == FERRY_OK && t->h2d && producer_event) t->pack_waits[t->n_pack_waits++] = (CUevent)producer_event;
cleanup:
  if (st != FERRY_OK) return fail(t, st); /* unordered parts must never follow: the failure kills the transfer */
  return FERRY_OK;
}

static bool should_cut(const ferry_transfer *t, const ferry__plan *plan, const ferry_tensor *in, size_t count);

/* Lays out the outputs of an add: ours in the part's slab at `base` (NULL when they are all empty), their shapes
 * and strides in `dims`; the others passed through. */
static ferry_status lay_out(ferry_transfer *t, const ferry_tensor *in, size_t count, const part_scratch *sc,
                           char *base, int64_t *dims) {
  bool passed = false;
  for (size_t i = 0; i < count; i++) {
    if (sc->entries[i].route == FERRY__PASS) {
      t->outputs[t->count + i] = in[i];
      t->copied[t->count + i] = 0;
      passed = true;
      continue;
    }
    set_output(t, t->count + i, &sc->inputs[i], &sc->entries[i], base, dims);
    dims += 2 * (sc->inputs[i].ndim > 0 ? sc->inputs[i].ndim : 0);
  }
  ferry_status st = passed ? keep_passthrough_dims(t, t->count, count) : FERRY_OK; /* no second pass when none */
  if (st == FERRY_OK) t->count += count;
  return st;
}

/* Plans and queues one part: the outputs [t->count, t->count + count). Kills the transfer on failure. With
 * `cut_instead` (a D2H part whole), a part that should_cut says is too large for the pool queues nothing and sets
 * *cut_instead: the caller adds it in sub-parts, each pinned with `exact_growth`. */
static ferry_status add_part(ferry_transfer *t, const ferry_tensor *in, size_t count, bool exact_growth,
                             bool *cut_instead) {
  ferry_status st = FERRY_OK;
  part_scratch sc = {0};
  part *p = NULL;
  bool entered = false;
  FERRY_TRY(scratch_new(in, count, &sc));
  copy_inputs(t, in, count, &sc);
  FERRY_TRY(ferry__ctx_enter(t->device));
  entered = true;
  if (t->h2d) find_pinned(sc.inputs, count, sc.is_ours, sc.pinned);
  ferry__plan_input pin = {sc.inputs, count, sc.is_ours, t->h2d ? sc.pinned : NULL, t->h2d,
                           !(t->opts.flags & FERRY_TRANSFER_NO_GATHER) && ferry__gather_available(),
                           t->opts.gather_max_bytes, t->count};
  ferry__plan plan;
  FERRY_TRY(ferry__plan_make(&pin, sc.entries, &plan));
  if (plan.n_copied == 0) { /* nothing of ours: every output is its input */
    st = append_passthrough(t, in, count);
    goto cleanup;
  }
  if (cut_instead && should_cut(t, &plan, sc.inputs, count)) {
    *cut_instead = true;
    goto cleanup;
  }
  size_t out_dims = 0;
  for (size_t i = 0; i < count; i++)
    if (sc.entries[i].route != FERRY__PASS) out_dims += 2 * (size_t)(sc.inputs[i].ndim > 0 ? sc.inputs[i].ndim : 0);
  if (plan.total == 0) { /* every tensor of ours is empty: outputs that view no slab, and no part */
    int64_t *dims = out_dims ? ticket_dims(t, out_dims, count) : NULL;
    st = out_dims && !dims ? FERRY_OUT_OF_HOST_MEMORY : lay_out(t, in, count, &sc, NULL, dims);
    goto cleanup;
  }
  FERRY_TRY(new_part(t, &p));
  p->first = t->count;
  p->count = count;
  if (out_dims && !(p->dims = malloc(out_dims * sizeof *p->dims))) {
    st = FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "allocating the shapes of %zu outputs", count);
    goto cleanup;
  }
  FERRY_TRY(submit_part(t, &pin, &plan, &sc, exact_growth, p));

  st = lay_out(t, in, count, &sc, p->slab->data, p->dims); /* while the copies run */
cleanup:
  if (entered) ferry__ctx_leave();
  scratch_put();
  if (st != FERRY_OK) return fail(t, st);
  return FERRY_OK;
}

uint64_t ferry__pin_chunk_bytes = (uint64_t)256 << 20;

/* What one tensor may take in a D2H slab, over-estimated (alignment, its share of the gather work list), for
 * cutting a part. The part was planned already, so the descriptors of the tensors it copies are valid and
 * ferry_tensor_nbytes succeeds; a tensor passed through takes no room, and its descriptor is not ferry's to check
 * (ferry_tensor_nbytes would record an error for a bad one behind the call's success). */
static uint64_t slab_estimate(const ferry_transfer *t, const ferry_tensor *in) {
  uint64_t bytes = 0;
  if (on_source_side(t, in->device) && (t->h2d || in->device.device_id == t->device))
    (void)ferry_tensor_nbytes(in, &bytes);
  return bytes + 512;
}

/* The smallest free range worth a sub-part of its own, and the smallest part outside a cut transfer that is
 * weighed for cutting at all. */
static uint64_t worthwhile_bytes(void) { return ferry__pin_chunk_bytes / 8; }

/* Whether a free range of `bytes` is a large tensor's: a range much larger than a chunk was pinned for a tensor
 * larger than a chunk. Tensors no larger than a chunk leave it to that tensor when other ranges can take them, or
 * when a region of their own is cheaper than the large one's would be: the large tensor, met later in the batch,
 * finds it again. */
static bool large_tensors_range(uint64_t bytes) { return bytes > ferry__pin_chunk_bytes + worthwhile_bytes(); }

/* A planned D2H part that no free range of the pool holds is cut when it is larger than a chunk, when an earlier
 * part of its transfer was cut, when a free range worth a sub-part is left for it to fill, or when the pool's
 * growth rule would pin more than a chunk for it; not past the machine's memory (one part then fails at once,
 * naming its size, rather than chunks pinned until the system runs out). The last three keep a batch that a
 * Python call hands over in parts from growing the pool by a quarter for a part beside free ranges: its parts fill
 * the free ranges instead, or pin what they need. A part that fits is cut only to leave a large tensor's range
 * free (large_tensors_range). A part under an eighth of a chunk outside a cut transfer keeps the growth rule (it is
 * the common case, and costs two comparisons). */
static bool should_cut(const ferry_transfer *t, const ferry__plan *plan, const ferry_tensor *in, size_t count) {
  uint64_t total = plan->total, best, below;
  bool large = total > ferry__pin_chunk_bytes;
  if (!large && !t->cutting && total < worthwhile_bytes()) return false; /* a small part, as most are */
  if (total > ferry__pinnable_limit()) return false;
  if (ferry__pool_fit(total, &best, &below)) { /* cut only to fill smaller ranges of a worthwhile size instead */
    if (below < worthwhile_bytes() || !large_tensors_range(best)) return false;
    for (size_t i = 0; i < count; i++)
      if (slab_estimate(t, &in[i]) > ferry__pin_chunk_bytes) return false; /* a large tensor: the range is its own */
    return true;
  }
  return large || t->cutting || below >= worthwhile_bytes() || ferry__pool_growth(total) > ferry__pin_chunk_bytes;
}

/* The next sub-part of a cut part: its first `count` tensors and what they may take (`bytes`). It fills the room
 * next_room gives (at most a chunk; a tensor larger than that alone) and goes in a free range of the pool that
 * holds it, unless that range is a large tensor's (large_tensors_range). Else it shrinks to fill the largest free
 * range smaller than it, if that holds its first tensor and is worth a sub-part (an eighth of a chunk): a batch seen
 * before then pins little however its parts were split. Otherwise a region is pinned for it (`pin`); a large
 * tensor's range is taken only when no other range is free at all. */
typedef struct sub_part {
  size_t count;
  uint64_t bytes;
  bool pin;
} sub_part;

static sub_part fill(const ferry_transfer *t, const ferry_tensor *in, size_t count, uint64_t room) {
  sub_part sp = {1, slab_estimate(t, &in[0]), false};
  while (sp.count < count) {
    uint64_t b = slab_estimate(t, &in[sp.count]);
    if (sp.bytes + b > room) break;
    sp.bytes += b;
    sp.count++;
  }
  return sp;
}

/* What the next sub-part of the transfer may take: a ramp from the smallest range worth a sub-part, doubling to a
 * chunk. The first copies then wait for 32 MiB to be pinned, not 256 (a 0.3 GB state dict's first call waited
 * ~11 ms on the H200 host before its first copy), and every call of one batch cuts its sub-parts at the same
 * tensors, so a later call's sub-parts fill the regions the first call pinned for them exactly. */
static uint64_t next_room(ferry_transfer *t) {
  if (!t->sub_part_room) t->sub_part_room = worthwhile_bytes();
  uint64_t room = t->sub_part_room;
  if (room < ferry__pin_chunk_bytes)
    t->sub_part_room = room * 2 < ferry__pin_chunk_bytes ? room * 2 : ferry__pin_chunk_bytes;
  return room;
}

static sub_part next_sub_part(ferry_transfer *t, const ferry_tensor *in, size_t count) {
  uint64_t best, below;
  sub_part sp = fill(t, in, count, next_room(t));
  bool fits = ferry__pool_fit(sp.bytes, &best, &below);
  bool shrink = below >= slab_estimate(t, &in[0]) && below >= worthwhile_bytes();
  bool large_range = fits && sp.bytes <= ferry__pin_chunk_bytes && large_tensors_range(best);
  if (fits && !large_range) return sp;
  if (shrink) return fill(t, in, count, below);
  if (large_range && below == 0) return sp; /* nothing else is free: a reserved or grown range, not a tensor's */
  sp.pin = true;
  return sp;
}

/* Adds a D2H part that should_cut found too large for the pool, in sub-parts (next_sub_part). A sub-part that needs
 * a region of its own gets one pinned ahead: while this sub-part's region is registered and its copies are queued,
 * the next one's is faulted in on other threads (pin_ahead.c). Kills the transfer on failure. */
static ferry_status add_cut(ferry_transfer *t, const ferry_tensor *in, size_t count) {
  ferry_status st = FERRY_OK;
  /* This sub-part's region and the next one's; they trade places, never move (a fault thread points into one). */
  ferry__pin_ahead regions[2] = {{0}};
  ferry__pin_ahead *mine = &regions[0], *ahead = &regions[1];
  sub_part sp = next_sub_part(t, in, count);
  for (size_t done = 0;;) {
    if (sp.pin) {
      ferry__pin_ahead *swap = mine;
      mine = ahead;
      ahead = swap;
      if (!mine->base) FERRY_TRY(ferry__pin_ahead_start(sp.bytes, mine));
      ferry__pin_ahead_wait(mine); /* its fault first, with every thread: its copies wait for it */
    }
    bool last = done + sp.count == count;
    sub_part following = {0};
    if (!last && sp.pin) { /* this one takes a region of its own: what the next one finds free is known now */
      following = next_sub_part(t, in + done + sp.count, count - done - sp.count);
      if (following.pin) FERRY_TRY(ferry__pin_ahead_start(following.bytes, ahead));
    }
    if (mine->base) {
      FERRY_TRY(ferry__ctx_enter(t->device));
      st = ferry__pin_ahead_finish(mine);
      ferry__ctx_leave();
      if (st != FERRY_OK) goto cleanup;
    }
    st = add_part(t, in + done, sp.count, true, NULL);
    if (st != FERRY_OK) break; /* add_part killed the transfer */
    if (last) break;
    done += sp.count;
    sp = sp.pin ? following : next_sub_part(t, in + done, count - done);
  }
cleanup:
  ferry__pin_ahead_cancel(&regions[0]);
  ferry__pin_ahead_cancel(&regions[1]);
  if (st != FERRY_OK && !t->failed) return fail(t, st);
  return st;
}

/* Without a device everything passes through, after the checks a device would have made of the tensors it copies:
 * a program that runs without a GPU does not fail on one for a bad descriptor. */
static ferry_status check_without_a_device(const ferry_transfer *t, const ferry_tensor *in, size_t count) {
  for (size_t i = 0; i < count; i++) {
    uint64_t bytes;
    if (!on_source_side(t, in[i].device)) continue;
    ferry_status st = ferry__plan_check_tensor(&in[i], t->count + i, &bytes);
    if (st != FERRY_OK) return st;
  }
  return FERRY_OK;
}

ferry_status ferry_transfer_add(ferry_transfer *t, const ferry_tensor *in, size_t count) {
  ferry_status st = FERRY_OK;
  if (!t) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_transfer_add: transfer is NULL");
  if (t->failed) return repeat_failure(t);
  if (t->ended) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_transfer_add: the transfer has ended");
  if (count && !in) return fail(t, FERRY_ERR(FERRY_INVALID_ARGUMENT, "inputs is NULL with count %zu", count));
  if (count == 0) return FERRY_OK;
  st = grow_outputs(t, count);
  if (st != FERRY_OK) return fail(t, st);
  if (t->device < 0) {
    st = check_without_a_device(t, in, count);
    if (st == FERRY_OK) st = append_passthrough(t, in, count);
    return st == FERRY_OK ? FERRY_OK : fail(t, st);
  }
  bool cut = false;
  st = add_part(t, in, count, false, t->h2d ? NULL : &cut);
  if (st == FERRY_OK && cut) {
    t->cutting = true;
    st = add_cut(t, in, count);
  }
  return st;
}

ferry_status ferry_transfer_end(ferry_transfer *t) {
  if (!t) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_transfer_end: transfer is NULL");
  if (t->failed) return repeat_failure(t);
  if (t->ended) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_transfer_end: the transfer has already ended");
  t->ended = true;
  ferry_status st = settle(t);
  if (st != FERRY_OK) return poison(t, st);
  if (t->opts.flags & FERRY_TRANSFER_BLOCKING) return ferry_transfer_wait(t);
  return FERRY_OK;
}

/* A batch of many tensors is added in parts, so that the first part's copies run while the rest are planned:
 * planning costs ~60 ns a tensor (its descriptors copied, then routed), which one part would spend in full before
 * its first copy (0.25 ms at 4096 tensors). Cut by count, so every call of one batch takes the same slabs; a part
 * costs ~30-50 us of driver calls, so parts are not smaller. */
#define ONE_CALL_PART_TENSORS 1024

static ferry_status transfer_all(const ferry_tensor *in, size_t count, const ferry_transfer_options *options,
                                 ferry_transfer **out, bool h2d) {
  if (!out) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "out_transfer is NULL");
  if (count && !in) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "inputs is NULL with count %zu", count);
  if (count > MAX_INPUTS)
    return FERRY_ERR(FERRY_OVERFLOW, "count %zu: no array holds that many tensor descriptors", count);
  ferry_transfer *t = NULL;
  ferry_status st = begin(options, h2d, count, &t);
  if (st != FERRY_OK) return st;
  for (size_t done = 0; st == FERRY_OK && done < count; done += ONE_CALL_PART_TENSORS)
    st = ferry_transfer_add(t, in + done, count - done < ONE_CALL_PART_TENSORS ? count - done : ONE_CALL_PART_TENSORS);
  if (st == FERRY_OK) st = ferry_transfer_end(t);
  if (st != FERRY_OK) {
    /* No ticket (and so no output) is handed back as if complete; what the copies touch is fenced. */
    ferry_error saved = *ferry_last_error();
    ferry_transfer_release(t);
    ferry__error_restore(&saved);
    return st;
  }
  *out = t;
  return FERRY_OK;
}

ferry_status ferry_transfer_d2h(const ferry_tensor *inputs, size_t count, const ferry_transfer_options *options,
                                ferry_transfer **out_transfer) {
  return transfer_all(inputs, count, options, out_transfer, false);
}

ferry_status ferry_transfer_h2d(const ferry_tensor *inputs, size_t count, const ferry_transfer_options *options,
                                ferry_transfer **out_transfer) {
  return transfer_all(inputs, count, options, out_transfer, true);
}

/* ---- the ticket's life ----------------------------------------------------------------------------------- */

static ferry_status check_waitable(const ferry_transfer *t, const char *call) {
  if (!t) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "%s: transfer is NULL", call);
  if (t->failed) return repeat_failure(t);
  if (!t->ended)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "%s: the transfer has not ended (call ferry_transfer_end first)", call);
  return FERRY_OK;
}

ferry_status ferry_transfer_wait(ferry_transfer *t) {
  /* A dead transfer is still waited for: what was queued before it failed may be running (and reading memory the
   * caller is about to free once this returns). */
  if (t && t->failed) (void)ferry__fence_wait(t->fence);
  ferry_status st = check_waitable(t, "ferry_transfer_wait");
  if (st != FERRY_OK) return st;
  /* Once the fence has settled this costs no driver call, and a failure is reported (and recorded on this
   * thread) by every wait, not only the first. */
  st = ferry__fence_wait(t->fence);
  if (st == FERRY_OK && t->h2d && !atomic_exchange(&t->staging_released, true)) {
    for (size_t k = 0; k < t->n_parts; k++) { /* staging is not needed once the copies are done */
      ferry_slab_release(t->parts[k].staging);
      t->parts[k].staging = NULL;
    }
  }
  return st;
}

ferry_status ferry_transfer_query(ferry_transfer *t) {
  ferry_status st = check_waitable(t, "ferry_transfer_query");
  if (st != FERRY_OK) return st;
  if (!ferry__fence_done(t->fence)) return FERRY_NOT_READY;
  return ferry_transfer_wait(t); /* settled: collects the result without blocking */
}

size_t ferry_transfer_count(const ferry_transfer *t) { return t ? t->count : 0; }
const ferry_tensor *ferry_transfer_outputs(const ferry_transfer *t) { return t ? t->outputs : NULL; }
int ferry_transfer_output_copied(const ferry_transfer *t, size_t i) { return t && i < t->count && t->copied[i] != 0; }
int ferry_transfer_device(const ferry_transfer *t) { return t ? t->device : -1; }

size_t ferry_transfer_slab_count(const ferry_transfer *t) { return t ? t->n_parts : 0; }

ferry_slab *ferry_transfer_slab_at(const ferry_transfer *t, size_t index) {
  return t && index < t->n_parts ? t->parts[index].slab : NULL;
}

ferry_slab *ferry_transfer_slab(const ferry_transfer *t) { return ferry_transfer_slab_at(t, 0); }

ferry_slab *ferry_transfer_output_slab(const ferry_transfer *t, size_t index) {
  if (!t || index >= t->count || t->copied[index] != COPIED_TO_SLAB) return NULL;
  const part *p = part_of(t, index);
  return p ? p->slab : NULL;
}

void ferry_transfer_release(ferry_transfer *t) {
  if (!t) return;
  if (!t->settled) { /* released without ferry_transfer_end: still no slab may return under a running copy */
    ferry_error saved = *ferry_last_error();
    (void)settle(t);
    ferry__error_restore(&saved);
  }
  for (size_t k = 0; k < t->n_parts; k++) {
    ferry_slab_release(t->parts[k].slab);
    ferry_slab_release(t->parts[k].staging);
    free(t->parts[k].dims);
  }
  ferry__fence_unref(t->fence);
  for (kept_dims *k = t->kept_dims, *next; k; k = next) {
    next = k->next;
    free(k);
  }
  free(t->parts);
  free(t->pack_waits);
  free(t->outputs);
  free(t->copied);
  free(t);
}
