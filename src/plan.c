/* plan.c — routes each tensor of a batch and lays out the batch's slab; pure arithmetic, no driver calls.
 *
 * Layout of a slab: [gathered outputs][CPU-packed outputs][DMA outputs], each output on a 256-byte boundary.
 * Gathered outputs come first so the gather kernel's staging buffer mirrors a prefix of the slab and one DMA moves
 * all of them; packed outputs (H2D from pageable memory) likewise form one range for one DMA.
 */
#include "internal.h"

#include <stdio.h>
#include <string.h>

static bool mul_overflows(uint64_t a, uint64_t b, uint64_t *out) { return __builtin_mul_overflow(a, b, out); }

static uint64_t align_up(uint64_t n) { return (n + FERRY_SLAB_ALIGN - 1) & ~(uint64_t)(FERRY_SLAB_ALIGN - 1); }

ferry_status ferry_tensor_nbytes(const ferry_tensor *t, uint64_t *out_bytes) {
  if (!t) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_tensor_nbytes: tensor is NULL");
  if (!out_bytes) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ferry_tensor_nbytes: out_bytes is NULL");
  if (t->ndim < 0 || t->ndim > FERRY_MAX_NDIM)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "ndim is %d; ferry handles 0 to %d dimensions", (int)t->ndim,
                     FERRY_MAX_NDIM);
  if (t->ndim > 0 && !t->shape) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "shape is NULL with ndim %d", (int)t->ndim);
  uint64_t bits = (uint64_t)t->dtype.bits * t->dtype.lanes;
  if (bits == 0) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "dtype has zero width (bits=%u, lanes=%u)",
                                  (unsigned)t->dtype.bits, (unsigned)t->dtype.lanes);
  if (bits % 8 != 0)
    return FERRY_ERR(FERRY_UNSUPPORTED, "dtype of %u bits x %u lanes is not a whole number of bytes",
                     (unsigned)t->dtype.bits, (unsigned)t->dtype.lanes);
  uint64_t n = bits / 8;
  bool empty = false;
  for (int32_t d = 0; d < t->ndim; d++) {
    if (t->shape[d] < 0) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "dimension %d is negative (%lld)", (int)d,
                                          (long long)t->shape[d]);
    empty = empty || t->shape[d] == 0;
  }
  if (empty) { /* holds nothing, however large the other dimensions */
    *out_bytes = 0;
    return FERRY_OK;
  }
  for (int32_t d = 0; d < t->ndim; d++) {
    if (mul_overflows(n, (uint64_t)t->shape[d], &n))
      return FERRY_ERR(FERRY_OVERFLOW, "the tensor's size in bytes overflows 64 bits at dimension %d (%lld)", (int)d,
                       (long long)t->shape[d]);
  }
  if (n > ((uint64_t)1 << 62)) return FERRY_ERR(FERRY_OVERFLOW, "the tensor's size (%llu bytes) is absurd",
                                                (unsigned long long)n);
  *out_bytes = n;
  return FERRY_OK;
}

bool ferry__compact_strides(int32_t ndim, const int64_t *shape, int64_t *strides) {
  int64_t s = 1;
  bool fits = true;
  for (int32_t d = ndim - 1; d >= 0; d--) {
    strides[d] = fits ? s : INT64_MAX;
    /* The product past the outermost dimension is no stride: it may be as large as it likes. */
    if (d > 0 && fits && __builtin_mul_overflow(s, shape[d] > 0 ? shape[d] : 1, &s)) fits = false;
  }
  return fits;
}

bool ferry__tensor_is_compact(const ferry_tensor *t) {
  if (!t->strides) return true;
  for (int32_t d = 0; d < t->ndim; d++)
    if (t->shape[d] == 0) return true; /* empty: nothing to read */
  int64_t expect = 1;
  for (int32_t d = t->ndim - 1; d >= 0; d--) {
    if (t->shape[d] != 1 && t->strides[d] != expect) return false;
    if (d > 0 && __builtin_mul_overflow(expect, t->shape[d], &expect)) return false; /* no stride is that large */
  }
  return true;
}

/* The element width a strided tensor's items are cut in: its own, or single bytes past the layout's 8-bit field
 * (see ferry__gather_layout_of). */
static uint64_t strided_unit(const ferry_tensor *t) {
  uint64_t eb = (uint64_t)t->dtype.bits * t->dtype.lanes / 8;
  return eb > 0xff ? 1 : eb;
}

ferry_status ferry__gather_layout_of(const ferry_tensor *t, ferry__gather_layout *out) {
  int64_t eb = (int64_t)t->dtype.bits * t->dtype.lanes / 8;
  if (eb <= 0) return FERRY_ERR(FERRY_INVALID_ARGUMENT, "dtype has no whole-byte width (bits=%u, lanes=%u)",
                                (unsigned)t->dtype.bits, (unsigned)t->dtype.lanes);
  int64_t shape[FERRY_MAX_NDIM + 1], stride[FERRY_MAX_NDIM + 1];
  int64_t compact[FERRY_MAX_NDIM];
  const int64_t *strides = t->strides;
  if (!strides) {
    ferry__compact_strides(t->ndim, t->shape, compact);
    strides = compact;
  }
  int n = 0;
  /* Drop unit dimensions, then merge a dimension into the previous when the previous steps exactly over it (a
   * step that overflows int64 equals no stride, so such dimensions stay apart). */
  for (int32_t d = 0; d < t->ndim; d++) {
    if (t->shape[d] == 1) continue;
    int64_t s = strides[d], step, merged;
    if (n > 0 && !__builtin_mul_overflow(t->shape[d], s, &step) && stride[n - 1] == step &&
        !__builtin_mul_overflow(shape[n - 1], t->shape[d], &merged)) {
      shape[n - 1] = merged;
      stride[n - 1] = s;
      continue;
    }
    shape[n] = t->shape[d];
    stride[n] = s;
    n++;
  }
  /* The layout's element field has 8 bits: wider elements become an innermost dimension of single bytes. */
  int64_t unit = (int64_t)strided_unit(t);
  if (unit != eb) {
    shape[n] = eb;
    stride[n] = 1;
    n++;
    unit = 1;
  }
  if (n > FERRY_GATHER_MAX_DIMS)
    return FERRY_ERR(FERRY_UNSUPPORTED, "a strided tensor with %d non-mergeable dimensions exceeds the gather "
                     "kernel's %d", n, FERRY_GATHER_MAX_DIMS);
  memset(out, 0, sizeof *out);
  out->ndim = n;
  out->elem_bytes = (int32_t)unit;
  bool aligned = (((uintptr_t)t->data + t->byte_offset) % (uint64_t)unit) == 0;
  for (int i = 0; i < n; i++) {
    out->shape[i] = shape[i];
    bool byte_dim = unit != eb && i == n - 1; /* the strides of the others are in elements of eb bytes */
    if (!byte_dim && __builtin_mul_overflow(stride[i], eb, &out->stride_bytes[i]))
      return FERRY_ERR(FERRY_OVERFLOW, "a stride of %lld elements of %lld bytes overflows 64 bits",
                       (long long)stride[i], (long long)eb);
    if (byte_dim) out->stride_bytes[i] = 1;
    if (out->stride_bytes[i] % unit != 0) aligned = false;
  }
  if ((unit & (unit - 1)) != 0 || unit > 16) aligned = false;
  if (!aligned) out->elem_bytes |= 0x100; /* the kernel copies bytewise */
  return FERRY_OK;
}

size_t ferry__gather_items_for(uint64_t nbytes, uint64_t unit) {
  uint64_t chunk = FERRY_GATHER_CHUNK / unit * unit; /* as entry_items cuts them: whole elements */
  return (size_t)((nbytes + chunk - 1) / chunk);
}


/* Writes "[a, b, c]" of `n` values into buf (for error messages only). */
static const char *dims_text(const int64_t *v, int32_t n, char *buf, size_t size) {
  size_t used = 0;
  buf[0] = '\0';
  for (int32_t d = 0; d < n && used < size; d++)
    used += (size_t)snprintf(buf + used, size - used, "%s%lld", d ? ", " : "[", (long long)v[d]);
  if (used < size) snprintf(buf + used, size - used, "]");
  return buf;
}

/* The bytes a non-empty tensor's elements occupy must be addressable: data + byte_offset, and the lowest and the
 * highest byte its strides reach, may not wrap the address space. A descriptor that does would send the copy
 * engine or the gather kernel to a wild address, which on a GPU is a sticky error that ends the context. (Memory
 * that is merely not the caller's cannot be detected here; the caller vouches for it.) */
ferry__span ferry__tensor_span(const ferry_tensor *t, uint64_t nbytes, uint64_t *first, uint64_t *end) {
  uint64_t base;
  if (__builtin_add_overflow((uint64_t)(uintptr_t)t->data, t->byte_offset, &base)) return FERRY__SPAN_BASE_WRAPS;
  if (!t->strides) {
    *first = base;
    return __builtin_add_overflow(base, nbytes, end) ? FERRY__SPAN_END_WRAPS : FERRY__SPAN_OK;
  }
  int64_t eb = (int64_t)((uint64_t)t->dtype.bits * t->dtype.lanes / 8), lo = 0, hi = 0, reach;
  bool over = false;
  for (int32_t d = 0; d < t->ndim && !over; d++) /* every extent is >= 1: empty tensors never get here */
    over = __builtin_mul_overflow(t->shape[d] - 1, t->strides[d], &reach) ||
           __builtin_add_overflow(reach < 0 ? lo : hi, reach, reach < 0 ? &lo : &hi);
  over = over || __builtin_mul_overflow(lo, eb, &lo) || __builtin_mul_overflow(hi, eb, &hi) ||
         __builtin_add_overflow(hi, eb, &hi) || __builtin_add_overflow(base, (uint64_t)hi, end);
  if (over) return FERRY__SPAN_TOO_WIDE;
  *first = base - ((uint64_t)0 - (uint64_t)lo); /* wraps when below zero: base - *first still says how far */
  return lo < 0 && (uint64_t)0 - (uint64_t)lo > base ? FERRY__SPAN_BELOW_ZERO : FERRY__SPAN_OK;
}

static ferry_status check_extent(const ferry_tensor *t, size_t i, uint64_t nbytes) {
  uint64_t first = 0, end = 0, base = (uint64_t)(uintptr_t)t->data + t->byte_offset; /* as computed, for messages */
  char sh[200], st[200];
  switch (ferry__tensor_span(t, nbytes, &first, &end)) {
  case FERRY__SPAN_OK: return FERRY_OK;
  case FERRY__SPAN_BASE_WRAPS:
    return FERRY_ERR(FERRY_OVERFLOW, "tensor %zu: data %p + byte_offset %llu wraps the address space", i, t->data,
                     (unsigned long long)t->byte_offset);
  case FERRY__SPAN_END_WRAPS:
    return FERRY_ERR(FERRY_OVERFLOW, "tensor %zu: %llu bytes from address 0x%llx wrap the address space", i,
                     (unsigned long long)nbytes, (unsigned long long)base);
  case FERRY__SPAN_TOO_WIDE:
    return FERRY_ERR(FERRY_OVERFLOW, "tensor %zu: shape %s with strides %s (elements of %llu bytes) spans more than "
                     "the address space", i, dims_text(t->shape, t->ndim, sh, sizeof sh),
                     dims_text(t->strides, t->ndim, st, sizeof st),
                     (unsigned long long)t->dtype.bits * t->dtype.lanes / 8);
  case FERRY__SPAN_BELOW_ZERO:
    return FERRY_ERR(FERRY_OVERFLOW, "tensor %zu: strides %s reach %llu bytes below its first element at 0x%llx, "
                     "below address 0", i, dims_text(t->strides, t->ndim, st, sizeof st),
                     (unsigned long long)(base - first), (unsigned long long)base);
  }
  return FERRY_OK;
}

/* Fails early, naming the tensor, on a strided layout the gather items cannot describe. */
static ferry_status check_layout(const ferry_tensor *t, size_t i) {
  ferry__gather_layout L;
  ferry_status st = ferry__gather_layout_of(t, &L);
  if (st == FERRY_OK) return FERRY_OK;
  char msg[sizeof ferry_last_error()->message];
  memcpy(msg, ferry_last_error()->message, sizeof msg);
  return FERRY_ERR(st, "tensor %zu: %s", i, msg);
}

/* A batch's slab is bounded like a tensor (2^62 bytes), so the layout's sums cannot wrap. */
#define FERRY_SLAB_MAX ((uint64_t)1 << 62)

ferry_status ferry__plan_check_tensor(const ferry_tensor *t, size_t index, uint64_t *out_bytes) {
  uint64_t nb;
  ferry_status st = ferry_tensor_nbytes(t, &nb);
  if (st != FERRY_OK) {
    char msg[sizeof ferry_last_error()->message];
    memcpy(msg, ferry_last_error()->message, sizeof msg);
    return FERRY_ERR(st, "tensor %zu: %s", index, msg);
  }
  *out_bytes = nb;
  if (nb == 0) {
    /* Its output carries compact strides too, and an empty shape's may not fit int64 (a non-empty one's do). */
    int64_t strides[FERRY_MAX_NDIM];
    char sh[200];
    if (!ferry__compact_strides(t->ndim, t->shape, strides))
      return FERRY_ERR(FERRY_OVERFLOW, "tensor %zu: the compact strides of shape %s (empty) overflow 64 bits", index,
                       dims_text(t->shape, t->ndim, sh, sizeof sh));
    return FERRY_OK;
  }
  if (!t->data && t->byte_offset == 0)
    return FERRY_ERR(FERRY_INVALID_ARGUMENT, "tensor %zu: data is NULL but the tensor holds %llu bytes", index,
                     (unsigned long long)nb);
  return check_extent(t, index, nb);
}

ferry_status ferry__plan_make(const ferry__plan_input *in, ferry__plan_entry *e, ferry__plan *out) {
  ferry__plan p;
  memset(&p, 0, sizeof p);
  uint64_t gmax = in->gather_max_bytes ? in->gather_max_bytes : ((uint64_t)1 << 20);
  size_t small = 0;
  /* Pass 1: sizes, validation, layout kind, and how many small tensors could share the kernel. Everything later
   * passes need is kept in the entry, so each tensor descriptor is read once. */
  for (size_t i = 0; i < in->count; i++) {
    const ferry_tensor *t = &in->tensors[i];
    ferry__plan_entry *x = &e[i];
    x->route = FERRY__PASS;
    x->src_pinned = 0;
    x->compact = 1;
    x->nbytes = 0;
    x->offset = 0;
    x->src = NULL;
    if (!in->is_ours[i]) continue;
    uint64_t nb;
    ferry_status st = ferry__plan_check_tensor(t, in->first_index + i, &nb);
    if (st != FERRY_OK) return st;
    x->nbytes = nb;
    if (nb == 0) {
      x->route = FERRY__EMPTY;
      continue;
    }
    x->route = FERRY__DMA; /* provisional: pass 2 decides */
    x->src = (const char *)(uintptr_t)((uint64_t)(uintptr_t)t->data + t->byte_offset); /* data may be NULL */
    x->src_pinned = in->pinned ? in->pinned[i] : 1;
    x->compact = ferry__tensor_is_compact(t);
    if (x->compact && nb <= gmax) small++;
  }
  /* Pass 2: routes, and the aligned size of each route's region. */
  uint64_t region[3] = {0, 0, 0}; /* gather, pack, DMA */
  for (size_t i = 0; i < in->count; i++) {
    ferry__plan_entry *x = &e[i];
    if (x->route == FERRY__PASS) continue;
    if (x->route == FERRY__EMPTY) {
      p.n_copied++;
      continue;
    }
    bool batchable = x->compact && x->nbytes <= gmax && small >= 2;
    if (x->compact && !batchable) {
      x->route = FERRY__DMA;
    } else if (in->h2d && !x->src_pinned) {
      x->route = FERRY__PACK; /* the device cannot read pageable memory: the CPU packs it */
      if (!x->compact) {
        ferry_status st = check_layout(&in->tensors[i], in->first_index + i); /* the CPU walks the same layouts */
        if (st != FERRY_OK) return st;
        p.n_pack_layouts++;
      }
      p.n_pack_items += ferry__gather_items_for(x->nbytes, x->compact ? 1 : strided_unit(&in->tensors[i]));
    } else if (!in->gather_ok) {
      if (!x->compact)
        return FERRY_ERR(FERRY_UNSUPPORTED, "tensor %zu is strided and the gather kernel is %s", in->first_index + i,
                         ferry__gather_available() ? "disabled (FERRY_TRANSFER_NO_GATHER)" : "not in this build");
      x->route = FERRY__DMA;
    } else {
      x->route = FERRY__GATHER;
      if (!x->compact) {
        ferry_status st = check_layout(&in->tensors[i], in->first_index + i);
        if (st != FERRY_OK) return st;
        p.n_layouts++;
      }
      p.n_items += ferry__gather_items_for(x->nbytes, x->compact ? 1 : strided_unit(&in->tensors[i]));
    }
    int r = x->route == FERRY__GATHER ? 0 : x->route == FERRY__PACK ? 1 : 2;
    region[r] = align_up(region[r] + x->nbytes); /* no wrap: both terms are at most 2^62 */
    if (region[0] + region[1] + region[2] > FERRY_SLAB_MAX)
      return FERRY_ERR(FERRY_OVERFLOW, "tensor %zu (%llu bytes) takes the batch past 2^62 bytes", in->first_index + i,
                       (unsigned long long)x->nbytes);
    p.n_copied++;
    if (r == 0) p.n_gather++;
    else if (r == 1) p.n_pack++;
    else p.n_dma++;
  }
  /* Pass 3: offsets. The slab is [gathered][packed][DMA], so each region is one contiguous range (one DMA for
   * the gathered outputs, one for the packed ones); within a region, outputs keep the inputs' order. */
  uint64_t cursor[3] = {0, region[0], region[0] + region[1]};
  for (size_t i = 0; i < in->count; i++) {
    ferry__plan_entry *x = &e[i];
    int r = x->route == FERRY__GATHER ? 0 : x->route == FERRY__PACK ? 1 : x->route == FERRY__DMA ? 2 : -1;
    if (r < 0) continue;
    x->offset = cursor[r];
    cursor[r] = align_up(cursor[r] + x->nbytes);
  }
  p.gather_bytes = region[0];
  p.pack_end = region[0] + region[1];
  p.total = region[0] + region[1] + region[2];
  *out = p;
  return FERRY_OK;
}

/* For a gathered entry: its layout index (or FERRY_GATHER_CONTIGUOUS) and element width, appending the layout
 * of a strided tensor to `layouts` at *nl. */
static ferry_status entry_layout(const ferry_tensor *t, const ferry__plan_entry *e, ferry__gather_layout *layouts,
                                 size_t *nl, uint32_t *layout, uint64_t *eb) {
  *layout = FERRY_GATHER_CONTIGUOUS;
  *eb = 1;
  if (e->compact) return FERRY_OK;
  ferry_status st = ferry__gather_layout_of(t, &layouts[*nl]);
  if (st != FERRY_OK) return st;
  *eb = (uint64_t)(layouts[*nl].elem_bytes & 0xff);
  *layout = (uint32_t)(*nl)++;
  return FERRY_OK;
}

/* Appends the items of entry i (route already checked) from byte `from` on, up to `max_bytes` of output;
 * returns the bytes covered. `layout` is the entry's layout index, or FERRY_GATHER_CONTIGUOUS. */
static uint64_t entry_items(const ferry__plan_entry *e, uint32_t layout, uint64_t eb, uint64_t from, uint64_t max_bytes,
                            uint64_t dst_base, ferry__gather_item *items, size_t *ni) {
  /* Strided chunks hold a whole number of elements; contiguous chunks are plain byte ranges. */
  uint64_t chunk = FERRY_GATHER_CHUNK / eb * eb, done = from;
  while (done < e->nbytes && done - from < max_bytes) {
    uint64_t n = e->nbytes - done < chunk ? e->nbytes - done : chunk;
    ferry__gather_item *it = &items[(*ni)++];
    it->dst = dst_base + e->offset + done;
    it->nbytes = (uint32_t)n;
    it->layout = layout;
    if (layout == FERRY_GATHER_CONTIGUOUS) {
      it->src = (uint64_t)(uintptr_t)e->src + done;
      it->first_elem = 0;
    } else {
      it->src = (uint64_t)(uintptr_t)e->src;
      it->first_elem = done / eb;
    }
    done += n;
  }
  return done - from;
}

ferry_status ferry__plan_gather_items_chunk(const ferry__plan_input *in, const ferry__plan_entry *e,
                                            ferry__item_cursor *cur, uint64_t chunk_bytes, uint64_t dst_base,
                                            ferry__gather_item *items, ferry__gather_layout *layouts,
                                            size_t *out_items, size_t *out_layouts, uint64_t *out_end) {
  size_t ni = 0, nl = 0;
  uint64_t covered = 0, end = 0;
  for (; cur->entry < in->count && covered < chunk_bytes; cur->entry++, cur->done = 0) {
    size_t i = cur->entry;
    if (e[i].route != FERRY__GATHER) continue;
    uint32_t layout;
    uint64_t eb;
    ferry_status st = entry_layout(&in->tensors[i], &e[i], layouts, &nl, &layout, &eb);
    if (st != FERRY_OK) return st;
    uint64_t before = cur->done;
    cur->done += entry_items(&e[i], layout, eb, cur->done, chunk_bytes - covered, dst_base, items, &ni);
    covered += cur->done - before;
    end = e[i].offset + cur->done;
    if (cur->done < e[i].nbytes) break; /* the chunk is full inside this entry: resume here next time */
  }
  *out_items = ni;
  *out_layouts = nl;
  *out_end = end;
  return FERRY_OK;
}

ferry_status ferry__plan_gather_items(const ferry__plan_input *in, const ferry__plan_entry *e, uint8_t route,
                                      uint64_t dst_base, ferry__gather_item *items, ferry__gather_layout *layouts,
                                      size_t *out_items, size_t *out_layouts) {
  size_t ni = 0, nl = 0;
  for (size_t i = 0; i < in->count; i++) {
    if (e[i].route != route) continue;
    uint32_t layout;
    uint64_t eb;
    ferry_status st = entry_layout(&in->tensors[i], &e[i], layouts, &nl, &layout, &eb);
    if (st != FERRY_OK) return st;
    (void)entry_items(&e[i], layout, eb, 0, UINT64_MAX, dst_base, items, &ni);
  }
  *out_items = ni;
  *out_layouts = nl;
  return FERRY_OK;
}

void ferry__gather_item_run_host(const ferry__gather_item *it, const ferry__gather_layout *layouts) {
  const char *src = (const char *)(uintptr_t)it->src;
  char *dst = (char *)(uintptr_t)it->dst;
  if (it->layout == FERRY_GATHER_CONTIGUOUS) {
    memcpy(dst, src, it->nbytes);
    return;
  }
  const ferry__gather_layout *L = &layouts[it->layout];
  uint32_t eb = (uint32_t)L->elem_bytes & 0xffu;
  uint32_t n = it->nbytes / eb;
  for (uint32_t i = 0; i < n; i++) {
    uint64_t e = it->first_elem + i;
    int64_t off = 0;
    for (int d = L->ndim - 1; d >= 0; d--) {
      off += (int64_t)(e % (uint64_t)L->shape[d]) * L->stride_bytes[d];
      e /= (uint64_t)L->shape[d];
    }
    memcpy(dst + (uint64_t)i * eb, src + off, eb);
  }
}
