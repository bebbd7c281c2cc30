/* transfer.c — submits a batch: resolve device and stream, order after the producer, plan, copy, hand back a
 * ticket. One way through: caller → plan → submit → wait.
 *
 * D2H: large contiguous tensors are DMA'd straight into the pinned slab, all in one cuMemcpyBatchAsync; small
 * and strided tensors are gathered by one kernel into device staging that mirrors the slab's prefix, which one
 * more DMA moves. H2D mirrors it: pinned sources the device can read are gathered by the kernel over PCIe,
 * pageable small or strided sources are packed by the CPU into pinned staging, the rest are DMA'd.
 *
 * Nothing is left behind on failure: every resource taken is released, and memory that a copy already queued may
 * still touch is released only through its fence (or after the stream drains).
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

struct ferry_transfer {
  size_t count;
  int device; /* -1: nothing to do (no driver/device) */
  ferry_tensor *outputs;
  uint8_t *copied;
  ferry_slab *slab;    /* the outputs' memory: pinned (D2H) or device (H2D) */
  _Atomic(ferry_slab *) staging; /* H2D: pinned staging for packed inputs and the kernel's work list; released
                                    by the first wait that sees the copies done */
  ferry__fence *fence; /* NULL when nothing was submitted; its error, if any, sticks to it */
};

static _Alignas(256) char empty_storage[256]; /* data pointer of empty host outputs: valid, never read */

void ferry_transfer_options_init(ferry_transfer_options *o) {
  if (!o) return;
  memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  o->device = -1;
}

/* ---- the ticket ------------------------------------------------------------------------------------------ */

/* One allocation holds the ticket, its outputs, their shapes and strides, and the submit-time scratch. */
typedef struct scratch {
  ferry__plan_entry *entries;
  uint8_t *is_ours;
  uint8_t *pinned;
  CUdeviceptr *dsts, *srcs;
  size_t *sizes;
} scratch;

#define VALID_NDIM(n) ((n) > 0 && (n) <= FERRY_MAX_NDIM)
/* Per input, the ticket needs its output, two rank-sized arrays and the plan scratch: a count past this cannot be
 * an array in memory, and sizing the ticket for it would wrap. */
#define TICKET_BYTES_PER_INPUT                                                                      \
  (sizeof(ferry_tensor) + 2 * FERRY_MAX_NDIM * sizeof(int64_t) + sizeof(ferry__plan_entry) +        \
   3 * sizeof(CUdeviceptr) + 3)

static ferry_transfer *ticket_new(const ferry_tensor *in, size_t count, scratch *sc) {
  size_t dims = 0;
  /* Only a valid rank gets room: an output with another rank is passed through (or the plan rejects it), and a
   * garbage ndim must not size the allocation. */
  for (size_t i = 0; i < count; i++) dims += (size_t)(VALID_NDIM(in[i].ndim) ? in[i].ndim : 0) * 2;
  size_t bytes = sizeof(ferry_transfer) + count * sizeof(ferry_tensor) + dims * sizeof(int64_t) +
                 count * (sizeof(ferry__plan_entry) + 3 * sizeof(CUdeviceptr)) + count * 3;
  char *p = calloc(1, bytes);
  if (!p) return NULL;
  ferry_transfer *t = (ferry_transfer *)p;
  p += sizeof *t;
  t->outputs = (ferry_tensor *)p;
  p += count * sizeof(ferry_tensor);
  int64_t *dim_store = (int64_t *)p;
  p += dims * sizeof(int64_t);
  sc->entries = (ferry__plan_entry *)p;
  p += count * sizeof(ferry__plan_entry);
  sc->dsts = (CUdeviceptr *)p;
  p += count * sizeof(CUdeviceptr);
  sc->srcs = (CUdeviceptr *)p;
  p += count * sizeof(CUdeviceptr);
  sc->sizes = (size_t *)p;
  p += count * sizeof(size_t);
  t->copied = (uint8_t *)p;
  p += count;
  sc->is_ours = (uint8_t *)p;
  p += count;
  sc->pinned = (uint8_t *)p;
  t->count = count;
  t->device = -1;
  /* Outputs start as the inputs (pass-through); copied ones get their own shape and strides below. */
  for (size_t i = 0; i < count; i++) {
    t->outputs[i] = in[i];
    int32_t nd = VALID_NDIM(in[i].ndim) ? in[i].ndim : 0;
    if (nd) {
      t->outputs[i].shape = dim_store;
      t->outputs[i].strides = dim_store + nd;
      dim_store += 2 * nd;
    }
  }
  return t;
}

/* Points output i at its place in the slab, compact row-major, on the destination side. */
static void set_output(ferry_transfer *t, size_t i, const ferry_tensor *in, const ferry__plan_entry *e,
                       ferry_device where, char *base) {
  ferry_tensor *o = &t->outputs[i];
  int32_t nd = in->ndim > 0 ? in->ndim : 0;
  if (nd) {
    memcpy(o->shape, in->shape, (size_t)nd * sizeof(int64_t));
    ferry__compact_strides(nd, o->shape, o->strides);
  }
  o->device = where;
  o->byte_offset = 0;
  if (e->route == FERRY__EMPTY)
    o->data = where.device_type == FERRY_DEVICE_CUDA ? NULL : empty_storage;
  else
    o->data = base + e->offset;
  t->copied[i] = 1;
}

/* Restores pass-through descriptors (the inputs' own shape and strides pointers) for outputs not copied. */
static void set_passthrough(ferry_transfer *t, const ferry_tensor *in) {
  for (size_t i = 0; i < t->count; i++)
    if (!t->copied[i]) t->outputs[i] = in[i];
}

/* ---- submission ------------------------------------------------------------------------------------------ */

/* Makes `stream` (and `stream2`, when not NULL) wait until the inputs are ready: after producer_event, else after
 * an event recorded now on producer_stream (the caller's current stream; NULL is the legacy default stream). */
static ferry_status order_after_producer(const ferry_transfer_options *o, int device, CUstream stream,
                                         CUstream stream2) {
  ferry_status st = FERRY_OK;
  CUevent ev = NULL;
  if (o->producer_event) {
    FERRY_TRY_CU(("waiting for producer_event %p", o->producer_event), cuStreamWaitEvent, stream,
                 (CUevent)o->producer_event, 0);
    if (stream2)
      FERRY_TRY_CU(("waiting for producer_event %p", o->producer_event), cuStreamWaitEvent, stream2,
                   (CUevent)o->producer_event, 0);
    return FERRY_OK;
  }
  CUstream producer = o->producer_stream ? (CUstream)o->producer_stream : CU_STREAM_LEGACY;
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

/* Submits the DMA-routed entries: one cuMemcpyBatchAsync when the driver has it, else a loop. */
static ferry_status submit_dma(const ferry__plan_entry *e, size_t count, char *dst_base, CUstream stream,
                               uint32_t flags, scratch *sc, bool h2d) {
  ferry_status st = FERRY_OK;
  size_t n = 0;
  for (size_t i = 0; i < count; i++) {
    if (e[i].route != FERRY__DMA) continue;
    /* Pageable H2D sources go alone through cuMemcpyHtoDAsync, which stages them through the driver. */
    if (h2d && !e[i].src_pinned) {
      FERRY_TRY_CU(("copying tensor %zu (%llu bytes) from pageable memory", i, (unsigned long long)e[i].nbytes),
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
static ferry_status pack_and_copy(const ferry__plan_input *pin, const ferry__plan_entry *e, const ferry__plan *plan,
                                  const ferry_transfer_options *o, char *staging, char *slab_base, CUstream stream) {
  ferry_status st = FERRY_OK;
  size_t pack_bytes = (size_t)(plan->pack_end - plan->gather_bytes);
  if (o->producer_event)
    FERRY_TRY_CU(("waiting for producer_event before packing"), cuEventSynchronize, (CUevent)o->producer_event);
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

/* Finds whether each host tensor is pinned memory that the device can address at the same pointer. Consecutive
 * tensors in one allocation (views of one buffer) cost one driver query. */
static void find_pinned(const ferry_tensor *in, size_t count, const uint8_t *is_ours, uint8_t *pinned) {
  uintptr_t lo = 0, hi = 0;
  for (size_t i = 0; i < count; i++) {
    pinned[i] = 0;
    if (!is_ours[i] || !in[i].data) continue;
    uintptr_t p = (uintptr_t)in[i].data + in[i].byte_offset;
    if (p >= lo && p < hi) {
      pinned[i] = 1;
      continue;
    }
    if (in[i].device.device_type == FERRY_DEVICE_CPU || in[i].device.device_type == FERRY_DEVICE_CUDA_HOST) {
      CUdeviceptr dp = 0;
      if (FERRY_CU(cuPointerGetAttribute, &dp, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, (CUdeviceptr)p) != CUDA_SUCCESS ||
          dp != (CUdeviceptr)p)
        continue; /* pageable, or mapped at another address: treated as pageable */
      pinned[i] = 1;
      CUdeviceptr start = 0;
      size_t size = 0;
      if (FERRY_CU(cuPointerGetAttribute, &start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, (CUdeviceptr)p) ==
              CUDA_SUCCESS &&
          FERRY_CU(cuPointerGetAttribute, &size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, (CUdeviceptr)p) == CUDA_SUCCESS) {
        lo = (uintptr_t)start;
        hi = lo + size;
      }
    }
  }
  ferry_clear_error(); /* failed queries on pageable memory are expected, not errors */
}

static ferry_status pass_through_all(const ferry_tensor *in, size_t count, ferry_transfer **out) {
  scratch sc;
  ferry_transfer *t = ticket_new(in, count, &sc);
  if (!t) return FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "allocating a ticket for %zu tensors", count);
  set_passthrough(t, in);
  *out = t;
  return FERRY_OK;
}

static ferry_status submit(const ferry_tensor *in, size_t count, const ferry_transfer_options *user_opts,
                           ferry_transfer **out, bool h2d) {
  ferry_status st = FERRY_OK;
  ferry_transfer_options o;
  /* Everything the cleanup path looks at is declared and initialised before the first jump to it. */
  ferry_transfer *t = NULL;
  bool entered = false, queued = false;
  CUstream stream = NULL, dma_stream = NULL;
  CUdeviceptr scratch_dev = 0;
  size_t work = 0;
  ferry_slab *slab = NULL, *staging = NULL;
  int device = -1;
  scratch sc;
  ferry_transfer_options_init(&o);
  if (user_opts) {
    if (user_opts->struct_size < sizeof o)
      return FERRY_ERR(FERRY_INVALID_ARGUMENT, "options.struct_size is %u, expected %zu: call "
                       "ferry_transfer_options_init first", (unsigned)user_opts->struct_size, sizeof o);
    o = *user_opts;
  }
  if (!out) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "out_transfer is NULL");
  if (count && !in) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "inputs is NULL with count %zu", count);
  if (count > (SIZE_MAX - sizeof(ferry_transfer)) / TICKET_BYTES_PER_INPUT)
    return FERRY_ERR(FERRY_OVERFLOW, "count %zu: no array holds that many tensor descriptors", count);
  if (o.stream && o.device < 0)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "stream %p was given without a device: pass the device the stream "
                     "belongs to", o.stream);

  /* No driver or no device: everything passes through, as documented. */
  ferry_status load = (ferry_status)ferry__driver_load();
  if (load == FERRY_NO_DRIVER || load == FERRY_NO_DEVICE) {
    ferry_clear_error();
    return pass_through_all(in, count, out);
  }
  if (load != FERRY_OK) return load;
  FERRY_TRY(ferry_device_resolve(o.device, &device));
  t = ticket_new(in, count, &sc);
  if (!t) return FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "allocating a ticket for %zu tensors", count);

  for (size_t i = 0; i < count; i++) {
    int32_t dt = in[i].device.device_type;
    sc.is_ours[i] = h2d ? (dt == FERRY_DEVICE_CPU || dt == FERRY_DEVICE_CUDA_HOST)
                        : ((dt == FERRY_DEVICE_CUDA || dt == FERRY_DEVICE_CUDA_MANAGED) &&
                           in[i].device.device_id == device);
  }
  FERRY_TRY(ferry__ctx_enter(device));
  entered = true;
  if (h2d) find_pinned(in, count, sc.is_ours, sc.pinned);
  ferry__plan_input pin = {in, count, sc.is_ours, h2d ? sc.pinned : NULL, h2d,
                           !(o.flags & FERRY_TRANSFER_NO_GATHER) && ferry__gather_available(), o.gather_max_bytes};
  ferry__plan plan;
  FERRY_TRY(ferry__plan_make(&pin, sc.entries, &plan));
  t->device = device;
  if (plan.n_copied == 0) { /* nothing of ours: every output is its input */
    set_passthrough(t, in);
    ferry__ctx_leave();
    *out = t;
    return FERRY_OK;
  }

  if (o.stream) {
    stream = (CUstream)o.stream;
    FERRY_TRY(ferry__stream_check_device(stream, device));
  } else {
    FERRY_TRY(ferry__thread_stream(device, &stream));
  }
  if (!h2d) FERRY_TRY(ferry__thread_dma_stream(device, &dma_stream));

  size_t pack_bytes = (size_t)(plan.pack_end - plan.gather_bytes);
  char *slab_base;
  if (!h2d) {
    /* The pinned slab carries the gather work list in its tail, past the outputs. */
    work = worklist_bytes(plan.n_items, plan.n_items ? plan.n_layouts + PIPELINE_EXTRA_LAYOUTS : 0);
    FERRY_TRY(ferry__pool_take((size_t)plan.total + work, &slab));
  } else {
    work = worklist_bytes(plan.n_items, plan.n_layouts);
    if (pack_bytes || work) FERRY_TRY(ferry__pool_take(pack_bytes + work, &staging));
  }
  FERRY_TRY(order_after_producer(&o, device, stream, dma_stream));
  queued = true; /* from here on, queued work may touch what we hold */
  if (h2d) FERRY_TRY(ferry__devmem_slab(device, (size_t)plan.total, stream, &slab));
  slab_base = slab->data;

  if (!h2d) {
    /* Large tensors need no kernel: their DMAs go first, on the second stream, beside the gather. */
    FERRY_TRY(submit_dma(sc.entries, count, slab_base, dma_stream, o.flags, &sc, false));
    if (plan.n_items) {
      FERRY_TRY(ferry__devmem_alloc(device, (size_t)plan.gather_bytes + work, stream, &scratch_dev));
      FERRY_TRY(d2h_gather(&pin, sc.entries, &plan, slab_base, slab_base + plan.total,
                           scratch_dev + plan.gather_bytes, scratch_dev, device, stream, dma_stream));
    }
    /* Everything is ordered back onto the copy stream: the fence and the scratch's release follow it all. */
    FERRY_TRY(join_streams(device, dma_stream, stream));
    if (scratch_dev) {
      FERRY_TRY_CU(("releasing the gather scratch"), cuMemFreeAsync, scratch_dev, stream);
      scratch_dev = 0;
    }
  } else {
    if (plan.n_items) {
      /* Pinned sources the device can read: the kernel gathers them over PCIe straight into the device slab. */
      FERRY_TRY(ferry__devmem_alloc(device, work, stream, &scratch_dev));
      char *list_host = (char *)staging->data + pack_bytes;
      ferry__gather_item *items = (ferry__gather_item *)list_host;
      ferry__gather_layout *layouts = (ferry__gather_layout *)(list_host + plan.n_items * sizeof(ferry__gather_item));
      size_t ni, nl;
      FERRY_TRY(ferry__plan_gather_items(&pin, sc.entries, FERRY__GATHER, (uint64_t)(uintptr_t)slab_base, items,
                                         layouts, &ni, &nl));
      FERRY_TRY(upload_and_gather(device, stream, list_host, scratch_dev, ni, nl));
      /* Stream-ordered: freed after the kernel. On failure the cleanup path tries once more. */
      FERRY_TRY_CU(("releasing the gather work list"), cuMemFreeAsync, scratch_dev, stream);
      scratch_dev = 0;
    }
    if (plan.n_pack) FERRY_TRY(pack_and_copy(&pin, sc.entries, &plan, &o, staging->data, slab_base, stream));
    FERRY_TRY(submit_dma(sc.entries, count, slab_base, stream, o.flags, &sc, true));
  }
  FERRY_TRY(ferry__fence_record(device, stream, &t->fence));

  /* The copies run; build the outputs meanwhile. */
  ferry_device where = h2d ? (ferry_device){FERRY_DEVICE_CUDA, device} : (ferry_device){FERRY_DEVICE_CPU, 0};
  for (size_t i = 0; i < count; i++)
    if (sc.entries[i].route != FERRY__PASS) set_output(t, i, &in[i], &sc.entries[i], where, slab_base);
  set_passthrough(t, in);
  slab->fence = ferry__fence_ref(t->fence);
  t->slab = slab;
  if (staging) {
    staging->fence = ferry__fence_ref(t->fence);
    atomic_store(&t->staging, staging);
  }
  ferry__ctx_leave();
  if (o.flags & FERRY_TRANSFER_BLOCKING) {
    st = ferry_transfer_wait(t);
    if (st != FERRY_OK) {
      /* The copies failed: no ticket (and so no output) is handed back as if complete. The slabs' fence has
       * completed, so releasing returns their memory at once. */
      ferry_error saved = *ferry_last_error();
      ferry_transfer_release(t);
      ferry__error_restore(&saved);
      return st;
    }
  }
  *out = t;
  return FERRY_OK;

cleanup:
  if (queued) {
    /* Copies may run into or out of what we hold: let the pools see them finish before reuse. The second
     * stream is joined first, so the scratch is freed (stream-ordered) only after the DMAs that read it. */
    ferry__fence *f = NULL;
    ferry_error saved = *ferry_last_error();
    if (dma_stream && join_streams(device, dma_stream, stream) != FERRY_OK)
      (void)FERRY_CU(cuStreamSynchronize, dma_stream);
    if (scratch_dev) (void)FERRY_CU(cuMemFreeAsync, scratch_dev, stream);
    if (ferry__fence_record(device, stream, &f) != FERRY_OK) {
      (void)FERRY_CU(cuStreamSynchronize, stream);
      f = NULL;
    }
    if (slab) slab->fence = ferry__fence_ref(f);
    if (staging) staging->fence = ferry__fence_ref(f);
    ferry__fence_unref(f);
    ferry__error_restore(&saved);
  }
  ferry_slab_release(slab);
  ferry_slab_release(staging);
  if (entered) ferry__ctx_leave();
  free(t);
  return st;
}

ferry_status ferry_transfer_d2h(const ferry_tensor *inputs, size_t count, const ferry_transfer_options *options,
                                ferry_transfer **out_transfer) {
  return submit(inputs, count, options, out_transfer, false);
}

ferry_status ferry_transfer_h2d(const ferry_tensor *inputs, size_t count, const ferry_transfer_options *options,
                                ferry_transfer **out_transfer) {
  return submit(inputs, count, options, out_transfer, true);
}

/* ---- the ticket's life ----------------------------------------------------------------------------------- */

ferry_status ferry_transfer_wait(ferry_transfer *t) {
  if (!t) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_transfer_wait: transfer is NULL");
  /* Once the fence has settled this costs no driver call, and a failure is reported (and recorded on this
   * thread) by every wait, not only the first. */
  ferry_status st = ferry__fence_wait(t->fence);
  if (st == FERRY_OK) ferry_slab_release(atomic_exchange(&t->staging, NULL)); /* not needed once copies are done */
  return st;
}

ferry_status ferry_transfer_query(ferry_transfer *t) {
  if (!t) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_transfer_query: transfer is NULL");
  if (!ferry__fence_done(t->fence)) return FERRY_NOT_READY;
  return ferry_transfer_wait(t); /* settled: collects the result without blocking */
}

size_t ferry_transfer_count(const ferry_transfer *t) { return t ? t->count : 0; }
const ferry_tensor *ferry_transfer_outputs(const ferry_transfer *t) { return t ? t->outputs : NULL; }
int ferry_transfer_output_copied(const ferry_transfer *t, size_t i) { return t && i < t->count && t->copied[i]; }
int ferry_transfer_device(const ferry_transfer *t) { return t ? t->device : -1; }
ferry_slab *ferry_transfer_slab(const ferry_transfer *t) { return t ? t->slab : NULL; }

void ferry_transfer_release(ferry_transfer *t) {
  if (!t) return;
  ferry_slab_release(t->slab);
  ferry_slab_release(atomic_load(&t->staging));
  ferry__fence_unref(t->fence);
  free(t);
}
