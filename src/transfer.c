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
  ferry_slab *staging; /* H2D: pinned staging for packed inputs and the kernel's work list */
  ferry__fence *fence;
  ferry_status result; /* sticky result of waiting */
  int waited;
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

static ferry_transfer *ticket_new(const ferry_tensor *in, size_t count, scratch *sc) {
  size_t dims = 0;
  for (size_t i = 0; i < count; i++) dims += (size_t)(in[i].ndim > 0 ? in[i].ndim : 0) * 2;
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
    int32_t nd = in[i].ndim > 0 ? in[i].ndim : 0;
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

static ferry_status order_after_producer(const ferry_transfer_options *o, int device, CUstream stream) {
  ferry_status st = FERRY_OK;
  CUevent ev = NULL;
  if (o->producer_event) {
    FERRY_TRY_CU(("waiting for producer_event %p", o->producer_event), cuStreamWaitEvent, stream,
                 (CUevent)o->producer_event, 0);
    return FERRY_OK;
  }
  CUstream producer = o->producer_stream ? (CUstream)o->producer_stream : CU_STREAM_LEGACY;
  if (producer == stream) return FERRY_OK; /* same stream: already in order */
  FERRY_TRY(ferry__event_get(device, &ev));
  FERRY_TRY_CU(("recording the producer's readiness on stream %p", (void *)producer), cuEventRecord, ev, producer);
  FERRY_TRY_CU(("ordering the copy stream after the producer"), cuStreamWaitEvent, stream, ev, 0);
cleanup:
  /* The wait already captured the event's state, so the event can be reused at once. */
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

/* Uploads the kernel's work list from pinned memory (`host`) to device memory (`dev`) and launches it. */
static ferry_status launch_gather(int device, CUstream stream, char *host, CUdeviceptr dev, size_t n_items,
                                  size_t n_layouts) {
  ferry_status st = FERRY_OK;
  CUfunction fn;
  FERRY_TRY(ferry__gather_function(device, &fn));
  size_t bytes = n_items * sizeof(ferry__gather_item) + n_layouts * sizeof(ferry__gather_layout);
  FERRY_TRY_CU(("uploading the gather work list (%zu items)", n_items), cuMemcpyHtoDAsync, dev, host, bytes, stream);
  CUdeviceptr items = dev, layouts = dev + n_items * sizeof(ferry__gather_item);
  void *params[] = {&items, &layouts};
  if (n_items > 0x7fffffffu) return FERRY_ERR(FERRY_UNSUPPORTED, "%zu gather items exceed one grid", n_items);
  FERRY_TRY_CU(("launching the gather kernel (%zu blocks)", n_items), cuLaunchKernel, fn, (unsigned)n_items, 1, 1,
               256, 1, 1, 0, stream, params, NULL);
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
  t->waited = 1;
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
  CUstream stream = NULL;
  CUdeviceptr scratch_dev = 0;
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
  if (o.stream && o.device < 0)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "a stream was given without a device: pass the device the stream "
                     "belongs to");

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
    t->waited = 1;
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

  size_t work = worklist_bytes(plan.n_items, plan.n_layouts);
  size_t pack_bytes = (size_t)(plan.pack_end - plan.gather_bytes);
  char *slab_base;
  if (!h2d) {
    /* The pinned slab carries the gather work list in its tail, past the outputs. */
    FERRY_TRY(ferry__pool_take((size_t)plan.total + work, &slab));
  } else {
    if (pack_bytes || work) FERRY_TRY(ferry__pool_take(pack_bytes + work, &staging));
  }
  FERRY_TRY(order_after_producer(&o, device, stream));
  queued = true; /* from here on, queued work may touch what we hold */
  if (h2d) FERRY_TRY(ferry__devmem_slab(device, (size_t)plan.total, stream, &slab));
  slab_base = slab->data;

  if (plan.n_items) {
    size_t staging_dev_bytes = h2d ? 0 : (size_t)plan.gather_bytes;
    FERRY_TRY(ferry__devmem_alloc(device, staging_dev_bytes + work, stream, &scratch_dev));
    char *list_host = h2d ? (char *)staging->data + pack_bytes : slab_base + plan.total;
    ferry__gather_item *items = (ferry__gather_item *)list_host;
    ferry__gather_layout *layouts = (ferry__gather_layout *)(list_host + plan.n_items * sizeof(ferry__gather_item));
    size_t ni, nl;
    uint64_t dst = h2d ? (uint64_t)(uintptr_t)slab_base : (uint64_t)scratch_dev;
    FERRY_TRY(ferry__plan_gather_items(&pin, sc.entries, FERRY__GATHER, dst, items, layouts, &ni, &nl));
    FERRY_TRY(launch_gather(device, stream, list_host, scratch_dev + staging_dev_bytes, ni, nl));
    if (!h2d)
      FERRY_TRY_CU(("copying %llu gathered bytes to the host", (unsigned long long)plan.gather_bytes), cuMemcpyAsync,
                   (CUdeviceptr)(uintptr_t)slab_base, scratch_dev, (size_t)plan.gather_bytes, stream);
    /* Stream-ordered: freed after the kernel and the DMA. On failure the cleanup path tries once more. */
    FERRY_TRY_CU(("releasing the gather scratch"), cuMemFreeAsync, scratch_dev, stream);
    scratch_dev = 0;
  }
  if (plan.n_pack) {
    /* Pageable sources: the CPU reads them now, so it waits for the producer first. */
    if (o.producer_event) FERRY_TRY_CU(("waiting for producer_event before packing"), cuEventSynchronize,
                                       (CUevent)o.producer_event);
    ferry__gather_item *items = malloc(plan.n_pack_items * sizeof *items + plan.n_pack_layouts *
                                       sizeof(ferry__gather_layout) + 1);
    if (!items) {
      st = FERRY_ERR(FERRY_OUT_OF_HOST_MEMORY, "allocating the pack list (%zu items)", plan.n_pack_items);
      goto cleanup;
    }
    ferry__gather_layout *layouts = (ferry__gather_layout *)(items + plan.n_pack_items);
    size_t ni, nl;
    uint64_t dst = (uint64_t)(uintptr_t)staging->data - plan.gather_bytes;
    st = ferry__plan_gather_items(&pin, sc.entries, FERRY__PACK, dst, items, layouts, &ni, &nl);
    for (size_t k = 0; st == FERRY_OK && k < ni; k++) ferry__gather_item_run_host(&items[k], layouts);
    free(items);
    if (st != FERRY_OK) goto cleanup;
    FERRY_TRY_CU(("copying %zu packed bytes to the device", pack_bytes), cuMemcpyHtoDAsync,
                 (CUdeviceptr)(uintptr_t)(slab_base + plan.gather_bytes), staging->data, pack_bytes, stream);
  }
  FERRY_TRY(submit_dma(sc.entries, count, slab_base, stream, o.flags, &sc, h2d));
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
    t->staging = staging;
  }
  ferry__ctx_leave();
  if (o.flags & FERRY_TRANSFER_BLOCKING) {
    st = ferry_transfer_wait(t);
    if (st != FERRY_OK) {
      /* The copies failed: no ticket (and so no output) is handed back as if complete. The slabs' fence has
       * completed, so releasing returns their memory at once. */
      ferry_error saved = *ferry_last_error();
      ferry_transfer_release(t);
      *(ferry_error *)ferry_last_error() = saved;
      return st;
    }
  }
  *out = t;
  return FERRY_OK;

cleanup:
  if (scratch_dev) (void)FERRY_CU(cuMemFreeAsync, scratch_dev, stream);
  if (queued) {
    /* Copies may run into or out of what we hold: let the pools see them finish before reuse. */
    ferry__fence *f = NULL;
    ferry_error saved = *ferry_last_error();
    if (ferry__fence_record(device, stream, &f) != FERRY_OK) {
      (void)FERRY_CU(cuStreamSynchronize, stream);
      f = NULL;
    }
    if (slab) slab->fence = ferry__fence_ref(f);
    if (staging) staging->fence = ferry__fence_ref(f);
    ferry__fence_unref(f);
    *(ferry_error *)ferry_last_error() = saved;
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
  if (!t->waited) {
    t->result = ferry__fence_wait(t->fence);
    t->waited = 1;
    if (t->result == FERRY_OK && t->staging) { /* staging is no longer needed once the copies are done */
      ferry_slab_release(t->staging);
      t->staging = NULL;
    }
  }
  return t->result;
}

ferry_status ferry_transfer_query(ferry_transfer *t) {
  if (!t) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_transfer_query: transfer is NULL");
  if (t->waited) return t->result;
  if (!ferry__fence_done(t->fence)) return FERRY_NOT_READY;
  return ferry_transfer_wait(t); /* complete: collect the result without blocking */
}

size_t ferry_transfer_count(const ferry_transfer *t) { return t ? t->count : 0; }
const ferry_tensor *ferry_transfer_outputs(const ferry_transfer *t) { return t ? t->outputs : NULL; }
int ferry_transfer_output_copied(const ferry_transfer *t, size_t i) { return t && i < t->count && t->copied[i]; }
int ferry_transfer_device(const ferry_transfer *t) { return t ? t->device : -1; }
ferry_slab *ferry_transfer_slab(const ferry_transfer *t) { return t ? t->slab : NULL; }

void ferry_transfer_release(ferry_transfer *t) {
  if (!t) return;
  ferry_slab_release(t->slab);
  ferry_slab_release(t->staging);
  ferry__fence_unref(t->fence);
  free(t);
}
