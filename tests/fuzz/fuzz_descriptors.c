/* fuzz_descriptors.c — libFuzzer target over the transfer planner: random batches of tensor descriptors (ndim 0
 * to 17; dimensions 0, 1, small, huge, negative; strides NULL, zero, negative, huge; byte offsets near the top of
 * the address space; dtypes of odd bits and lanes; NULL data) go through ferry__plan_make, and what it answers is
 * checked against an oracle written here, in 128-bit arithmetic, without ferry's code:
 *   - a refused batch gets a status of the three the planner may give, recorded with a non-empty message, and
 *     has a reason the oracle can see (an invalid descriptor, or a strided tensor or a batch size that meets a
 *     documented limit);
 *   - an accepted batch has only descriptors the oracle finds valid; every entry's route, size and slab offset
 *     are consistent (256-byte aligned, disjoint, inside their region of [gathered][packed][DMA]);
 *   - when every copied tensor lies inside a real buffer (and the slab is small), the slab is filled the way the
 *     transfer path fills it — the gather and pack work items (ferry__plan_gather_items, and the chunked
 *     generator with a random chunk size) run by ferry__gather_item_run_host, the DMA entries copied as ranges —
 *     and every output must equal a naive element-by-element copy; so must the walk of each tensor's
 *     ferry__gather_layout_of.
 * Built with ASan and UBSan that halt on the first report (cmake -DFERRY_FUZZ=ON, clang), so any overflow or
 * out-of-bounds access in the planner's arithmetic is a finding. Seeds: tests/fuzz/corpus-descriptors. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_TENSORS = 8, ARENA = 1 << 16, SLAB_CAP = 1 << 20 };

/* The source buffer real descriptors point into: the middle, so negative strides stay inside too. */
static unsigned char arena[ARENA];

typedef struct reader {
  const uint8_t *p;
  size_t left;
} reader;

static uint64_t take(reader *r, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) {
    v |= (uint64_t)(r->left ? *r->p : 0) << (8 * i);
    if (r->left) r->p++, r->left--;
  }
  return v;
}

/* A dimension: mostly small, sometimes an edge. */
static int64_t pick_dim(reader *r) {
  uint8_t k = (uint8_t)take(r, 1);
  switch (k % 16) {
  case 0: return 0;
  case 1: return 1;
  case 2: return -1;
  case 3: return (int64_t)1 << 40;
  case 4: return (int64_t)1 << 62;
  case 5: return INT64_MAX;
  case 6: return INT64_MIN;
  case 7: return (int64_t)take(r, 8);
  case 8: return (int64_t)(take(r, 2) % 5000);
  default: return (int64_t)(k >> 4) + 1; /* 1 to 16 */
  }
}

/* A stride in elements: contiguous-ish, transposing, negative, zero, or an edge. */
static int64_t pick_stride(reader *r) {
  uint8_t k = (uint8_t)take(r, 1);
  switch (k % 16) {
  case 0: return 0;
  case 1: return 1;
  case 2: return -1;
  case 3: return (int64_t)1 << 62;
  case 4: return -((int64_t)1 << 62);
  case 5: return INT64_MAX;
  case 6: return INT64_MIN;
  case 7: return (int64_t)take(r, 8);
  case 8: return -(int64_t)(take(r, 1) % 64) - 1;
  default: return (int64_t)(take(r, 1) % 200);
  }
}

typedef struct batch {
  ferry_tensor t[MAX_TENSORS];
  int64_t shape[MAX_TENSORS][FERRY_MAX_NDIM + 1], strides[MAX_TENSORS][FERRY_MAX_NDIM + 1];
  uint8_t ours[MAX_TENSORS], pinned[MAX_TENSORS];
  size_t count;
  ferry__plan_input in;
} batch;

static void read_batch(reader *r, batch *b) {
  memset(b, 0, sizeof *b);
  uint8_t head = (uint8_t)take(r, 1);
  b->count = 1 + head % MAX_TENSORS;
  b->in.h2d = head & 0x10;
  b->in.gather_ok = !(head & 0x20);
  uint8_t g = (uint8_t)take(r, 1);
  b->in.gather_max_bytes = g < 128 ? 0 : g < 200 ? (uint64_t)(g - 127) * 64 : (uint64_t)take(r, 8);
  for (size_t i = 0; i < b->count; i++) {
    ferry_tensor *t = &b->t[i];
    uint8_t f = (uint8_t)take(r, 1);
    b->ours[i] = (f & 7) != 0;
    b->pinned[i] = (f >> 3) & 1;
    t->ndim = (int32_t)((f >> 4) % 4 == 0 ? take(r, 1) % 18 : (f >> 4) % 4); /* mostly 1 to 3 */
    if (take(r, 1) == 0xff) t->ndim = (int32_t)take(r, 4); /* any int32 */
    t->device = (ferry_device){FERRY_DEVICE_CUDA, 0};
    uint8_t dt = (uint8_t)take(r, 1);
    static const uint8_t bits[] = {8, 16, 32, 64, 8, 16, 24, 0, 4, 12};
    static const uint16_t lanes[] = {1, 1, 1, 2, 3, 4, 300, 0};
    t->dtype.code = FERRY_DTYPE_UINT;
    t->dtype.bits = dt < 200 ? bits[dt % 10] : (uint8_t)take(r, 1);
    t->dtype.lanes = dt < 200 ? lanes[(dt / 10) % 8] : (uint16_t)take(r, 2);
    int nd = t->ndim >= 0 && t->ndim <= FERRY_MAX_NDIM + 1 ? t->ndim : 0;
    uint8_t layout = (uint8_t)take(r, 1);
    t->shape = layout == 0xfe ? NULL : b->shape[i];
    for (int d = 0; d < nd; d++) b->shape[i][d] = pick_dim(r);
    if (layout & 1) {
      t->strides = b->strides[i];
      for (int d = 0; d < nd; d++) b->strides[i][d] = pick_stride(r);
    }
    uint8_t where = (uint8_t)take(r, 1);
    if (where % 8 == 0) t->data = NULL;
    else if (where % 8 == 1) t->data = (void *)(uintptr_t)take(r, 8); /* a wild address: planned, never read */
    else t->data = arena + ARENA / 2;
    uint8_t off = (uint8_t)take(r, 1);
    t->byte_offset = off < 200 ? off % 64 : off < 250 ? UINT64_MAX - (uint64_t)(off - 200) : take(r, 8);
    /* A tensor whose ndim is beyond what the arrays hold is planned for refusal only: keep its pointers valid. */
    if (t->ndim > FERRY_MAX_NDIM + 1 || t->ndim < 0) t->strides = NULL;
  }
  b->in.tensors = b->t;
  b->in.count = b->count;
  b->in.is_ours = b->ours;
  b->in.pinned = b->in.h2d ? b->pinned : NULL;
}

/* ---- the oracle ---------------------------------------------------------------------------------------------- */

typedef __int128 i128;

typedef struct verdict {
  int invalid;      /* a descriptor the planner must refuse */
  int limited;      /* a descriptor or batch that may meet a documented limit */
  uint64_t nbytes;  /* packed bytes (valid ones) */
  i128 lo, hi;      /* byte extent relative to the first element: [lo, hi) */
} verdict;

static verdict judge(const ferry_tensor *t) {
  verdict v = {0};
  if (t->ndim < 0 || t->ndim > FERRY_MAX_NDIM || (t->ndim > 0 && !t->shape)) return v.invalid = 1, v;
  i128 eb_bits = (i128)t->dtype.bits * t->dtype.lanes;
  if (eb_bits == 0 || eb_bits % 8) return v.invalid = 1, v;
  i128 eb = eb_bits / 8, elems = 1;
  int empty = 0;
  for (int d = 0; d < t->ndim; d++) {
    if (t->shape[d] < 0) return v.invalid = 1, v;
    if (t->shape[d] == 0) empty = 1;
  }
  for (int d = 0; d < t->ndim && !empty; d++) {
    elems *= t->shape[d];
    if (elems * eb > ((i128)1 << 62)) return v.invalid = 1, v;
  }
  if (empty) {
    /* The output's compact strides must fit int64. */
    i128 s = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
      if (s > INT64_MAX) return v.invalid = 1, v;
      s *= t->shape[d] > 0 ? t->shape[d] : 1;
    }
    return v;
  }
  v.nbytes = (uint64_t)(elems * eb);
  if (!t->data && t->byte_offset == 0) return v.invalid = 1, v;
  i128 base = (i128)(uintptr_t)t->data + t->byte_offset;
  if (base >= ((i128)1 << 64)) return v.invalid = 1, v;
  if (!t->strides) {
    v.lo = 0, v.hi = (i128)v.nbytes;
  } else {
    for (int d = 0; d < t->ndim; d++) {
      i128 reach = (i128)(t->shape[d] - 1) * t->strides[d] * eb;
      if (reach < 0) v.lo += reach;
      else v.hi += reach;
    }
    v.hi += eb;
    /* ferry keeps every extent in int64 (bytes below and above the first element). */
    if (v.hi > INT64_MAX || v.lo < INT64_MIN) return v.invalid = 1, v;
    v.limited = 1; /* strided: may exceed the gather kernel's dimensions, or meet a build without the kernel */
  }
  /* One past the last byte must be an address too (it may not wrap to 0), and the first may not go below 0. */
  if (base + v.hi >= ((i128)1 << 64) || base + v.lo < 0) return v.invalid = 1, v;
  return v;
}

/* The offset (in bytes from the first element) of element `e` in row-major order. */
static i128 element_offset(const ferry_tensor *t, uint64_t e, i128 eb) {
  i128 off = 0, stride = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    uint64_t n = (uint64_t)t->shape[d];
    i128 s = t->strides ? t->strides[d] : stride;
    off += (i128)(e % n) * s * eb;
    e /= n;
    stride *= n;
  }
  return off;
}

static const batch *current; /* for the report of a finding */

static void print_dims(const char *name, const int64_t *v, int32_t n) {
  fprintf(stderr, " %s", name);
  if (!v) { fprintf(stderr, " NULL"); return; }
  for (int32_t d = 0; d < n && d <= FERRY_MAX_NDIM; d++) fprintf(stderr, "%s%lld", d ? "," : " [", (long long)v[d]);
  fprintf(stderr, n > 0 ? "]" : " []");
}

/* Reports a finding with the batch it was found on, and stops (libFuzzer keeps the input). */
static void fail(const char *what, size_t i) {
  fprintf(stderr, "descriptor fuzz: tensor %zu: %s\n  last error: %s: %s\n", i, what,
          ferry_status_name(ferry_last_error()->status), ferry_last_error()->message);
  for (size_t k = 0; current && k < current->count; k++) {
    const ferry_tensor *t = &current->t[k];
    fprintf(stderr, "  tensor %zu: ours %d pinned %d data %p offset %llu ndim %d bits %u lanes %u", k,
            current->ours[k], current->pinned[k], t->data, (unsigned long long)t->byte_offset, (int)t->ndim,
            (unsigned)t->dtype.bits, (unsigned)t->dtype.lanes);
    int32_t nd = t->ndim >= 0 && t->ndim <= FERRY_MAX_NDIM + 1 ? t->ndim : 0;
    print_dims("shape", t->shape, nd);
    print_dims("strides", t->strides, nd);
    fprintf(stderr, "\n");
  }
  if (current)
    fprintf(stderr, "  h2d %d gather_ok %d gather_max_bytes %llu\n", (int)current->in.h2d, (int)current->in.gather_ok,
            (unsigned long long)current->in.gather_max_bytes);
  abort();
}

/* Output i of the slab equals the naive copy of its tensor. */
static void check_output(const ferry_tensor *t, size_t i, const unsigned char *out) {
  uint64_t eb = (uint64_t)t->dtype.bits * t->dtype.lanes / 8, elems = 1;
  for (int d = 0; d < t->ndim; d++) elems *= (uint64_t)t->shape[d];
  const unsigned char *first = (const unsigned char *)t->data + t->byte_offset;
  for (uint64_t e = 0; e < elems; e++)
    if (memcmp(out + e * eb, first + (ptrdiff_t)element_offset(t, e, (i128)eb), eb) != 0)
      fail("an output element differs from its source", i);
}

/* Walks a layout over its elements, into `out`. */
static void walk_layout(const ferry__gather_layout *L, const unsigned char *first, uint64_t nbytes,
                        unsigned char *out) {
  uint64_t eb = (uint64_t)(L->elem_bytes & 0xff);
  for (uint64_t e = 0; e < nbytes / eb; e++) {
    uint64_t k = e;
    int64_t off = 0;
    for (int d = L->ndim - 1; d >= 0; d--) {
      off += (int64_t)(k % (uint64_t)L->shape[d]) * L->stride_bytes[d];
      k /= (uint64_t)L->shape[d];
    }
    memcpy(out + e * eb, first + off, eb);
  }
}

/* Runs every work item of `route`, checking each lies inside its entry's output and that together they cover it
 * exactly once. */
static void run_items(const ferry__plan_input *in, const ferry__plan_entry *e, const ferry__plan *p, uint8_t route,
                      unsigned char *slab, unsigned char *cover) {
  size_t n_items = route == FERRY__GATHER ? p->n_items : p->n_pack_items;
  size_t n_layouts = route == FERRY__GATHER ? p->n_layouts : p->n_pack_layouts;
  ferry__gather_item *items = calloc(n_items + 1, sizeof *items);
  ferry__gather_layout *layouts = calloc(n_layouts + 1, sizeof *layouts);
  size_t ni = 0, nl = 0;
  if (ferry__plan_gather_items(in, e, route, (uint64_t)(uintptr_t)slab, items, layouts, &ni, &nl) != FERRY_OK)
    fail("the items of an accepted plan could not be generated", 0);
  if (ni != n_items || nl != n_layouts) fail("the plan's item or layout count is wrong", 0);
  for (size_t k = 0; k < ni; k++) {
    uint64_t at = items[k].dst - (uint64_t)(uintptr_t)slab;
    if (items[k].nbytes == 0 || items[k].nbytes > FERRY_GATHER_CHUNK || at + items[k].nbytes > p->total)
      fail("a work item is empty, too large or outside the slab", k);
    for (uint64_t b = at; b < at + items[k].nbytes; b++)
      if (cover[b]++) fail("two work items write the same byte", k);
    ferry__gather_item_run_host(&items[k], layouts);
  }
  free(items);
  free(layouts);
}

/* The chunked generator must produce the same bytes in the same places, chunk after chunk. */
static void run_chunks(const ferry__plan_input *in, const ferry__plan_entry *e, const ferry__plan *p,
                       uint64_t chunk, unsigned char *slab, const unsigned char *want) {
  ferry__gather_item *items = calloc(p->n_items + 1, sizeof *items);
  ferry__gather_layout *layouts = calloc(p->n_layouts + 1, sizeof *layouts);
  ferry__item_cursor cur = {0, 0};
  uint64_t last_end = 0;
  for (;;) {
    size_t ni = 0, nl = 0;
    uint64_t end = 0;
    if (ferry__plan_gather_items_chunk(in, e, &cur, chunk, (uint64_t)(uintptr_t)slab, items, layouts, &ni, &nl,
                                       &end) != FERRY_OK)
      fail("a chunk of an accepted plan could not be generated", 0);
    if (ni == 0) break;
    if (ni > p->n_items || nl > p->n_layouts || end < last_end || end > p->gather_bytes)
      fail("a chunk has too many items or layouts, or ends out of order", 0);
    last_end = end;
    for (size_t k = 0; k < ni; k++) ferry__gather_item_run_host(&items[k], layouts);
  }
  for (size_t i = 0; i < in->count; i++)
    if (e[i].route == FERRY__GATHER && memcmp(slab + e[i].offset, want + e[i].offset, e[i].nbytes) != 0)
      fail("the chunked items gathered other bytes than the whole list", i);
  free(items);
  free(layouts);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  reader r = {data, size};
  batch b;
  read_batch(&r, &b);
  current = &b;
  uint64_t chunk = 1 + take(&r, 2) * 16;
  static int seeded;
  if (!seeded) {
    for (size_t k = 0; k < ARENA; k++) arena[k] = (unsigned char)(k * 131 + (k >> 8));
    seeded = 1;
  }

  verdict v[MAX_TENSORS];
  int any_invalid = 0, any_limited = 0;
  i128 sum = 0;
  for (size_t i = 0; i < b.count; i++) {
    if (!b.ours[i]) continue;
    v[i] = judge(&b.t[i]);
    any_invalid |= v[i].invalid;
    any_limited |= v[i].limited;
    sum += (i128)v[i].nbytes + FERRY_SLAB_ALIGN;
  }
  if (sum > ((i128)1 << 62)) any_limited = 1; /* the batch's slab may pass 2^62 */

  /* ferry_tensor_nbytes agrees with the oracle on every descriptor it accepts. */
  for (size_t i = 0; i < b.count; i++) {
    uint64_t n = 0;
    if (b.ours[i] && !v[i].invalid && ferry_tensor_nbytes(&b.t[i], &n) == FERRY_OK && n != v[i].nbytes)
      fail("ferry_tensor_nbytes differs from the oracle", i);
  }

  ferry__plan_entry e[MAX_TENSORS];
  ferry__plan p;
  ferry_clear_error();
  ferry_status st = ferry__plan_make(&b.in, e, &p);
  if (st != FERRY_OK) {
    if (st != FERRY_INVALID_ARGUMENT && st != FERRY_OVERFLOW && st != FERRY_UNSUPPORTED)
      fail("refused with an unexpected status", 0);
    if (ferry_last_error()->status != st || !ferry_last_error()->message[0])
      fail("refused without recording the status and a message", 0);
    if (!any_invalid && !any_limited) fail("a batch the oracle finds valid was refused", 0);
    return 0;
  }
  for (size_t i = 0; i < b.count; i++)
    if (b.ours[i] && v[i].invalid) fail("an invalid descriptor was accepted", i);

  /* Routes, sizes and offsets. */
  size_t copied = 0, by_route[5] = {0};
  for (size_t i = 0; i < b.count; i++) {
    const ferry__plan_entry *x = &e[i];
    if (!b.ours[i]) {
      if (x->route != FERRY__PASS) fail("a tensor not ours was routed", i);
      continue;
    }
    if (x->nbytes != v[i].nbytes || (x->route == FERRY__EMPTY) != (v[i].nbytes == 0))
      fail("an entry's size or emptiness differs from the oracle", i);
    copied++;
    by_route[x->route]++;
    if (x->route == FERRY__EMPTY) continue;
    uint64_t lo = x->route == FERRY__GATHER ? 0 : x->route == FERRY__PACK ? p.gather_bytes : p.pack_end;
    uint64_t hi = x->route == FERRY__GATHER ? p.gather_bytes : x->route == FERRY__PACK ? p.pack_end : p.total;
    if (x->offset % FERRY_SLAB_ALIGN || x->offset < lo || x->offset + x->nbytes > hi)
      fail("an output is unaligned or outside its region of the slab", i);
    if (x->route == FERRY__PACK && !b.in.h2d) fail("a D2H entry was routed to the CPU pack", i);
    if ((uint64_t)(uintptr_t)x->src != (uint64_t)(uintptr_t)b.t[i].data + b.t[i].byte_offset)
      fail("an entry's source address is wrong", i);
    for (size_t j = 0; j < i; j++)
      if (e[j].route >= FERRY__DMA && x->offset < e[j].offset + e[j].nbytes && e[j].offset < x->offset + x->nbytes)
        fail("two outputs overlap in the slab", i);
  }
  if (p.n_copied != copied || p.n_gather != by_route[FERRY__GATHER] || p.n_pack != by_route[FERRY__PACK] ||
      p.n_dma != by_route[FERRY__DMA])
    fail("the plan's counts differ from its entries", 0);
  if (p.gather_bytes > p.pack_end || p.pack_end > p.total) fail("the slab's regions are out of order", 0);

  /* The bytes, when every copied tensor lies in the arena and the slab is small. */
  int real = p.total <= SLAB_CAP;
  for (size_t i = 0; i < b.count && real; i++) {
    if (!b.ours[i] || e[i].route == FERRY__EMPTY) continue;
    if (b.t[i].data != arena + ARENA / 2) real = 0;
    i128 first = (i128)(uintptr_t)b.t[i].data + b.t[i].byte_offset - (i128)(uintptr_t)arena;
    real = real && first + v[i].lo >= 0 && first + v[i].hi <= ARENA;
  }
  if (!real) return 0;
  unsigned char *slab = calloc(1, p.total + 1), *cover = calloc(1, p.total + 1), *want = calloc(1, p.total + 1);
  run_items(&b.in, e, &p, FERRY__GATHER, slab, cover);
  run_items(&b.in, e, &p, FERRY__PACK, slab, cover);
  for (size_t i = 0; i < b.count; i++) {
    if (!b.ours[i] || e[i].route == FERRY__EMPTY) continue;
    if (e[i].route == FERRY__DMA) {
      if (!e[i].compact) fail("a strided tensor was routed to a plain DMA", i);
      for (uint64_t k = e[i].offset; k < e[i].offset + e[i].nbytes; k++)
        if (cover[k]) fail("a work item writes into a DMA output", i);
      memcpy(slab + e[i].offset, e[i].src, e[i].nbytes);
    } else {
      for (uint64_t k = e[i].offset; k < e[i].offset + e[i].nbytes; k++)
        if (cover[k] != 1) fail("the work items do not cover an output exactly", i);
    }
    check_output(&b.t[i], i, slab + e[i].offset);
    /* Its gather layout, walked, gives the same bytes (or it has too many dimensions for the kernel). */
    ferry__gather_layout L;
    if (ferry__gather_layout_of(&b.t[i], &L) == FERRY_OK) {
      unsigned char *walked = malloc(e[i].nbytes);
      if ((uint64_t)(L.elem_bytes & 0xff) == 0 || e[i].nbytes % (uint64_t)(L.elem_bytes & 0xff))
        fail("a layout's element width does not divide the tensor's size", i);
      walk_layout(&L, (const unsigned char *)e[i].src, e[i].nbytes, walked);
      if (memcmp(walked, slab + e[i].offset, e[i].nbytes) != 0) fail("the gather layout walks other bytes", i);
      free(walked);
    } else if (ferry_last_error()->status != FERRY_UNSUPPORTED) {
      fail("a layout of an accepted tensor failed other than as unsupported", i);
    }
  }
  if (p.n_items) {
    memcpy(want, slab, p.total);
    memset(slab, 0, p.total);
    run_chunks(&b.in, e, &p, chunk, slab, want);
  }
  free(slab);
  free(cover);
  free(want);
  return 0;
}
