/* batch.c — walks a nested batch into a flat tape, and rebuilds the batch from the tape.
 *
 * The walk visits the batch once, in order (list and tuple items, dict values in insertion order, dataclass
 * fields in definition order), records every node with strong references, and reads each tensor on the source
 * side, copying its descriptor (shape and strides too) into the tape at once: Python code runs again before ferry
 * plans the copies (other tensors' __dlpack__, properties, other threads at release points), and may change the
 * producer's arrays. The rebuild reads only the tape, never the caller's containers, so it sees the batch as it
 * was when it was walked.
 *
 * Identity: a node whose subtree holds no copied tensor comes back as the very same object; only containers on
 * the way to a copied tensor are new. A container met twice (a sub-batch shared by two parents) is walked and
 * copied once, and its rebuilt form is shared the same way, as copy.deepcopy keeps it: a shared structure costs
 * its size, not the number of its paths. A tensor that views memory an earlier tensor of the batch views the same
 * way (one tensor in two places, a weight tied under two names: same first byte, dtype, shape, strides, device,
 * type and lazy bits) is copied once, and both places get the one output: the outputs share memory where the
 * inputs do, and a state dict with tied weights costs its distinct bytes. Containers are rebuilt with their own
 * type:
 *   list, tuple, dict             new list / tuple / dict (dict keys and order kept)
 *   namedtuple                    cls(*items)
 *   other tuple / list subclass   cls(items)
 *   defaultdict (and subclasses)  cls(original.default_factory, items_dict)
 *   other dict subclass, Mapping  cls(items_dict)              (OrderedDict keeps its order)
 *   dataclass instance            cls.__new__(cls), the original's __dict__ copied, then every field set with
 *                                 object.__setattr__: __init__ and __post_init__ are not run again, frozen
 *                                 dataclasses work, and init=False fields and extra attributes are kept. (With
 *                                 slots=True, only the fields are carried over.)
 * Depth is limited to FERRY_PY_MAX_DEPTH containers (RecursionError beyond, and Python's recursion limit applies
 * too); a container that contains itself raises ValueError, a dict or list that changes size while it is walked
 * RuntimeError.
 */
#include "ferry_py.h"

#include <string.h>

#define NO_DIMS UINT32_MAX
static int64_t has_strides_mark;
#define HAS_STRIDES (&has_strides_mark) /* a pending descriptor's strides, until its pointers are set */

/* ---- an open-addressing table from an address to indices ---------------------------------------------------------
 * Two of them: containers walked, by object, to their first node; leaves, by the address of their first byte, to
 * their index (several leaves may view one address in different ways, so a key may repeat). */

struct ferry_py_addrmap {
  size_t cap, used; /* cap is a power of two; at most half full */
  struct addr_slot { uintptr_t key; uint32_t value; } slots[];
};

/* Fibonacci hashing: the product's HIGH bits, which depend on every bit of the address (the low bits of addresses
 * repeat with the allocator's strides, and taking the product's low bits would pile them into few slots). */
static size_t addr_hash(uintptr_t key, size_t cap) {
  return (size_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> (64 - __builtin_ctzll((uint64_t)cap)));
}

/* The values of `key` one by one: *cursor starts at SIZE_MAX; -1 when there are no more. Key 0 is never stored. */
static int64_t addrmap_next(const ferry_py_addrmap *m, uintptr_t key, size_t *cursor) {
  if (!m || !key) return -1;
  size_t i = *cursor == SIZE_MAX ? addr_hash(key, m->cap) : (*cursor + 1) & (m->cap - 1);
  for (;; i = (i + 1) & (m->cap - 1)) {
    if (!m->slots[i].key) return -1;
    if (m->slots[i].key == key) {
      *cursor = i;
      return m->slots[i].value;
    }
  }
}

/* Makes room for `used` entries in all (at most half full), rehashing into a larger table. Raw allocator, no
 * exception, GIL not needed: 0, or -1 when out of memory (the map is unchanged). */
static int addrmap_reserve(ferry_py_addrmap **mp, size_t used) {
  ferry_py_addrmap *m = *mp;
  size_t cap = m ? m->cap : 0;
  if (used <= cap / 2) return 0;
  if (!cap) cap = 256;
  while (used > cap / 2) cap *= 2;
  ferry_py_addrmap *t = PyMem_RawCalloc(1, sizeof *t + cap * sizeof t->slots[0]);
  if (!t) return -1;
  t->cap = cap;
  for (size_t i = 0; m && i < m->cap; i++) {
    if (!m->slots[i].key) continue;
    size_t j = addr_hash(m->slots[i].key, cap);
    while (t->slots[j].key) j = (j + 1) & (cap - 1);
    t->slots[j] = m->slots[i];
  }
  t->used = m ? m->used : 0;
  PyMem_RawFree(m);
  *mp = t;
  return 0;
}

static size_t addrmap_used(const ferry_py_addrmap *m) { return m ? m->used : 0; }

static int addrmap_add(ferry_py_addrmap **mp, uintptr_t key, size_t value) {
  if (value > UINT32_MAX - 1) {
    PyErr_SetString(PyExc_OverflowError, "the batch has more than 2^32 containers or tensors");
    return -1;
  }
  if (addrmap_reserve(mp, addrmap_used(*mp) + 1) < 0) {
    PyErr_NoMemory();
    return -1;
  }
  ferry_py_addrmap *m = *mp;
  size_t i = addr_hash(key, m->cap);
  while (m->slots[i].key) i = (i + 1) & (m->cap - 1);
  m->slots[i].key = key;
  m->slots[i].value = (uint32_t)value;
  m->used++;
  return 0;
}

/* ---- room in the tape ------------------------------------------------------------------------------------------
 *
 * The tape's arrays and maps grow by doubling, and a doubling of a tape of thousands of tensors moves and faults
 * in a megabyte (~0.2 ms). So the walk keeps room for AHEAD more items and makes it between items, where it may
 * release the GIL (tick); an item that finds no room (a chain of containers nested deeper than AHEAD) grows the
 * tape where it stands, with the GIL held. One function grows everything, with the raw allocator, which needs no
 * GIL. */

#define AHEAD 256
#define AHEAD_DIMS (AHEAD * 2 * 4) /* shapes and strides of AHEAD tensors of rank 4 */

typedef struct room {
  size_t nodes, leaves, dims, seen, views; /* entries wanted in all */
} room;

static bool fits(const ferry_py_batch *b, const room *r) {
  return r->nodes <= b->cap_nodes && r->leaves <= b->cap_leaves && r->dims <= b->cap_dims &&
         r->seen <= (b->seen ? b->seen->cap / 2 : 0) && r->views <= (b->views ? b->views->cap / 2 : 0);
}

/* Doubles `*cap` until it holds `need` elements. No exception: 0, or -1 with the array unchanged. */
static int grow_raw(void **array, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t cap2 = *cap ? *cap * 2 : 64;
  while (cap2 < need) cap2 *= 2;
  void *p = PyMem_RawRealloc(*array, cap2 * elem);
  if (!p) return -1;
  *array = p;
  *cap = cap2;
  return 0;
}

/* Grows the tape to room `r`. The GIL is not needed (nothing Python is touched). 0, or -1 when out of memory
 * (what did grow stays grown; the tape stays consistent). */
static int make_room(ferry_py_batch *b, const room *r) {
  if (grow_raw((void **)&b->nodes, &b->cap_nodes, r->nodes, sizeof *b->nodes) < 0 ||
      grow_raw((void **)&b->dims, &b->cap_dims, r->dims, sizeof *b->dims) < 0 ||
      addrmap_reserve(&b->seen, r->seen) < 0 || addrmap_reserve(&b->views, r->views) < 0)
    return -1;
  if (r->leaves <= b->cap_leaves) return 0;
  /* leaves and tensors are parallel arrays of one capacity: both grow before it is raised */
  size_t cap = b->cap_leaves, cap2 = b->cap_leaves;
  if (grow_raw((void **)&b->leaves, &cap, r->leaves, sizeof *b->leaves) < 0 ||
      grow_raw((void **)&b->tensors, &cap2, r->leaves, sizeof *b->tensors) < 0)
    return -1;
  b->cap_leaves = cap;
  return 0;
}

/* Room `r` now, GIL held: 0, or -1 with MemoryError. */
static int room_now(ferry_py_batch *b, const room *r) {
  if (fits(b, r)) return 0;
  b->grown_holding++;
  if (make_room(b, r) == 0) return 0;
  PyErr_NoMemory();
  return -1;
}

/* The room the tape has in use, plus `more` of every kind. */
static room in_use_plus(const ferry_py_batch *b, size_t more, size_t more_dims) {
  return (room){b->n_nodes + more, b->n_leaves + more, b->n_dims + more_dims, addrmap_used(b->seen) + more,
                addrmap_used(b->views) + more};
}

/* Before the first item and between items: room for AHEAD more when less than a quarter of that is left, made
 * with the GIL released when the pace wants release points. 0 or -1 with MemoryError. */
static int keep_room(ferry_py_batch *b, ferry_py_pace *pace) {
  room ahead = in_use_plus(b, AHEAD / 4, AHEAD_DIMS / 4);
  if (fits(b, &ahead)) return 0;
  ahead = in_use_plus(b, AHEAD, AHEAD_DIMS);
  if (!pace || !pace->slice_ns) return room_now(b, &ahead);
  PyThreadState *ts = ferry_py_pace_unlock(pace);
  int rc = make_room(b, &ahead);
  ferry_py_pace_relock(pace, ts);
  if (rc < 0) PyErr_NoMemory();
  return rc;
}

static int tick(ferry_py_batch *b, ferry_py_pace *pace) {
  return keep_room(b, pace) < 0 ? -1 : ferry_py_pace_tick(pace);
}

/* ---- the walk -------------------------------------------------------------------------------------------------- */

typedef struct walker {
  ferry_py_batch *b;
  ferry_py_read_ctx *ctx;
  ferry_py_pace *pace;
  int (*leaf_walked)(void *arg);
  void *arg;
  int depth;
} walker;

/* Appends a node; returns its index or -1. */
static Py_ssize_t push_node(ferry_py_batch *b, PyObject *obj, PyObject *key, uint8_t kind, int32_t leaf) {
  if (b->n_nodes == b->cap_nodes && room_now(b, &(room){.nodes = b->n_nodes + 1}) < 0) return -1;
  ferry_py_node *n = &b->nodes[b->n_nodes];
  n->obj = Py_NewRef(obj);
  n->key = Py_XNewRef(key);
  n->count = 0;
  n->leaf = leaf;
  n->kind = kind;
  n->flags = 0;
  return (Py_ssize_t)b->n_nodes++;
}

static const char *kind_name(uint8_t kind) {
  switch (kind) {
  case FERRY_PY_LIST: case FERRY_PY_LIST_SUB: return "list";
  case FERRY_PY_TUPLE: case FERRY_PY_TUPLE_SUB: case FERRY_PY_NAMEDTUPLE: return "tuple";
  case FERRY_PY_DICT: case FERRY_PY_DEFAULTDICT: case FERRY_PY_MAPPING: return "mapping";
  case FERRY_PY_DATACLASS: return "dataclass";
  }
  return "container";
}

/* `obj` was walked before (its first node is `first`): a cycle if it is still being walked, else a repeat. */
static int push_repeat(walker *w, PyObject *obj, PyObject *key, int64_t first) {
  ferry_py_node *f = &w->b->nodes[first];
  if (f->flags & FERRY_PY_NODE_WALKING) {
    PyErr_Format(PyExc_ValueError, "the batch contains a reference cycle: a %s (%s) contains itself",
                 kind_name(f->kind), Py_TYPE(obj)->tp_name);
    return -1;
  }
  f->flags |= FERRY_PY_NODE_REPEATED;
  Py_ssize_t index = push_node(w->b, obj, key, FERRY_PY_SHARED, -1);
  if (index < 0) return -1;
  w->b->nodes[index].count = (uint32_t)first;
  return 0;
}

static int walk(walker *w, PyObject *obj, PyObject *key);

/* Walks one child, holding a reference to it meanwhile (walking may run Python code that drops it from its
 * container). Returns 0 or -1. */
static int walk_child(walker *w, PyObject *child, PyObject *key) {
  Py_INCREF(child);
  Py_XINCREF(key);
  int rc = walk(w, child, key);
  Py_XDECREF(key);
  Py_DECREF(child);
  if (rc == 0) rc = tick(w->b, w->pace);
  return rc;
}

static int changed_size(PyObject *obj, Py_ssize_t was, Py_ssize_t now) {
  PyErr_Format(PyExc_RuntimeError, "a %s in the batch changed size while ferry walked it (%zd entries, then %zd)",
               Py_TYPE(obj)->tp_name, was, now);
  return -1;
}

/* A dict in its storage order, which is its iteration order unless its type iterates otherwise. */
static int walk_dict(walker *w, PyObject *obj, uint32_t *count) {
  Py_ssize_t pos = 0, size = PyDict_GET_SIZE(obj);
  PyObject *k, *v;
  for (Py_ssize_t at = 0; PyDict_Next(obj, &pos, &k, &v); at = pos) {
    if (walk_child(w, v, k) < 0) return -1; /* its node holds `k`: the address below is still k's */
    /* A key removed before the one walked and another added keep the size and the walked key's place, but the
     * iteration then meets more entries than the dict holds. */
    if (++*count > (uint32_t)size) {
      PyErr_Format(PyExc_RuntimeError, "a %s in the batch changed its keys while ferry walked it (a key before %R "
                   "was removed and another added)", Py_TYPE(obj)->tp_name, k);
      return -1;
    }
    /* Python code ran (a __dlpack__, a property, another thread at a release point): the dict may have changed
     * under the iteration, which would skip or repeat entries without a word. A change of size shows it; a key
     * removed and another added keeps the size, but moves or removes the entry just walked. */
    if (PyDict_GET_SIZE(obj) != size) return changed_size(obj, size, PyDict_GET_SIZE(obj));
    Py_ssize_t again = at;
    PyObject *k_again;
    if (!PyDict_Next(obj, &again, &k_again, NULL) || k_again != k || again != pos) {
      PyErr_Format(PyExc_RuntimeError, "a %s in the batch changed its keys while ferry walked it (at key %R)",
                   Py_TYPE(obj)->tp_name, k);
      return -1;
    }
  }
  return 0;
}

/* A dict subclass with an order of its own (OrderedDict after move_to_end): its keys as it iterates them, each
 * value from the dict's storage, as PyDict_Next would give it. */
static int walk_dict_in_iteration_order(walker *w, PyObject *obj, uint32_t *count) {
  Py_ssize_t size = PyDict_GET_SIZE(obj);
  PyObject *keys = PyObject_GetIter(obj), *k;
  if (!keys) return -1;
  int rc = 0;
  while (rc == 0 && (k = PyIter_Next(keys))) {
    PyObject *v = PyDict_GetItemWithError(obj, k); /* borrowed; walk_child holds it */
    if (v) {
      rc = walk_child(w, v, k);
    } else {
      if (!PyErr_Occurred())
        PyErr_Format(PyExc_RuntimeError, "a %s in the batch iterated over key %R, which it does not hold",
                     Py_TYPE(obj)->tp_name, k);
      rc = -1;
    }
    Py_DECREF(k);
    if (rc == 0) (*count)++;
    if (rc == 0 && PyDict_GET_SIZE(obj) != size) rc = changed_size(obj, size, PyDict_GET_SIZE(obj));
  }
  Py_DECREF(keys);
  return rc == 0 && PyErr_Occurred() ? -1 : rc;
}

static int walk_children(walker *w, PyObject *obj, uint8_t kind, PyObject *fields, uint32_t *count) {
  switch (kind) {
  case FERRY_PY_LIST:
  case FERRY_PY_LIST_SUB:
    /* Python code runs during the walk and may change the list: a change of size would skip or repeat items. */
    for (Py_ssize_t i = 0, size = PyList_GET_SIZE(obj); i < PyList_GET_SIZE(obj); i++, (*count)++) {
      PyObject *child = PyList_GET_ITEM(obj, i);
      Py_INCREF(child); /* for the identity check below: the walk may drop it from the list */
      int rc = walk_child(w, child, NULL);
      bool moved = rc == 0 && PyList_GET_SIZE(obj) == size && PyList_GET_ITEM(obj, i) != child;
      Py_DECREF(child);
      if (rc < 0) return -1;
      if (PyList_GET_SIZE(obj) != size) return changed_size(obj, size, PyList_GET_SIZE(obj));
      /* Items removed and as many inserted keep the size but shift the items: the walk would skip or repeat
       * some. The item just walked is no longer where it was then. */
      if (moved) {
        PyErr_Format(PyExc_RuntimeError, "a %s in the batch changed while ferry walked it (item %zd was replaced "
                     "or moved)", Py_TYPE(obj)->tp_name, i);
        return -1;
      }
    }
    return 0;
  case FERRY_PY_TUPLE:
  case FERRY_PY_TUPLE_SUB:
  case FERRY_PY_NAMEDTUPLE:
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(obj); i++, (*count)++)
      if (walk_child(w, PyTuple_GET_ITEM(obj, i), NULL) < 0) return -1;
    return 0;
  case FERRY_PY_DICT:
  case FERRY_PY_DEFAULTDICT:
  case FERRY_PY_MAPPING:
    if (PyDict_Check(obj))
      return Py_TYPE(obj)->tp_iter == PyDict_Type.tp_iter ? walk_dict(w, obj, count)
                                                           : walk_dict_in_iteration_order(w, obj, count);
    {
      PyObject *items = PyMapping_Items(obj); /* a snapshot: safe whatever the mapping does meanwhile */
      if (!items) return -1;
      for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *kv = PyList_GET_ITEM(items, i);
        if (!PyTuple_Check(kv) || PyTuple_GET_SIZE(kv) != 2) {
          PyErr_Format(PyExc_TypeError, "%s.items() yielded %R, not a (key, value) pair", Py_TYPE(obj)->tp_name, kv);
          Py_DECREF(items);
          return -1;
        }
        if (walk_child(w, PyTuple_GET_ITEM(kv, 1), PyTuple_GET_ITEM(kv, 0)) < 0) {
          Py_DECREF(items);
          return -1;
        }
        (*count)++;
      }
      Py_DECREF(items);
      return 0;
    }
  case FERRY_PY_DATACLASS:
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(fields); i++) {
      PyObject *name = PyTuple_GET_ITEM(fields, i);
      PyObject *v = PyObject_GetAttr(obj, name);
      if (!v) {
        /* An init=False field never assigned: nothing to carry over. */
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
        PyErr_Clear();
        continue;
      }
      int rc = walk_child(w, v, name);
      Py_DECREF(v);
      if (rc < 0) return -1;
      (*count)++;
    }
    return 0;
  }
  return 0;
}

static int walk_container(walker *w, PyObject *obj, PyObject *key, uint8_t kind, PyObject *fields) {
  size_t cursor = SIZE_MAX;
  int64_t first = addrmap_next(w->b->seen, (uintptr_t)obj, &cursor);
  if (first >= 0) return push_repeat(w, obj, key, first);
  if (w->depth >= FERRY_PY_MAX_DEPTH) {
    PyErr_Format(PyExc_RecursionError, "the batch is nested deeper than %d containers (a %s at depth %d)",
                 FERRY_PY_MAX_DEPTH, kind_name(kind), w->depth);
    return -1;
  }
  if (Py_EnterRecursiveCall(" while walking a batch for ferry")) return -1;
  Py_ssize_t index = push_node(w->b, obj, key, kind, -1);
  int rc = -1;
  if (index >= 0 && addrmap_add(&w->b->seen, (uintptr_t)obj, (size_t)index) == 0) {
    uint32_t count = 0;
    w->depth++;
    w->b->nodes[index].flags |= FERRY_PY_NODE_WALKING;
    rc = walk_children(w, obj, kind, fields, &count);
    w->depth--;
    w->b->nodes[index].flags &= (uint8_t)~FERRY_PY_NODE_WALKING; /* by index: the array may have moved */
    w->b->nodes[index].count = count;
  }
  Py_LeaveRecursiveCall();
  return rc;
}

/* The bytes a leaf holds by its shape and dtype (0 for a shape ferry will refuse), for choosing part boundaries. */
static uint64_t leaf_bytes(const ferry_tensor *t) {
  uint64_t n = ((uint64_t)t->dtype.bits * t->dtype.lanes + 7) / 8;
  for (int32_t d = 0; d < t->ndim; d++) {
    if (t->shape[d] < 0) return 0;
    if (t->shape[d] > 0 && n > UINT64_MAX / (uint64_t)t->shape[d]) return UINT64_MAX;
    n *= (uint64_t)t->shape[d];
  }
  return n;
}

/* Whether a tensor just read has dimensions the tape keeps (others are rank 0, or refused by ferry later). */
static bool has_dims(const ferry_tensor *t) { return t->ndim > 0 && t->ndim <= FERRY_MAX_NDIM && t->shape; }

/* Copies the tensor's shape and strides into the tape's own memory and points the descriptor there. A rank the
 * C library would refuse is left for it to refuse (it reads no shape then). */
static int copy_dims(ferry_py_batch *b, ferry_py_leaf *leaf, ferry_tensor *t) {
  leaf->dims_at = NO_DIMS;
  if (!has_dims(t)) {
    t->shape = t->strides = NULL;
    return 0;
  }
  size_t nd = (size_t)t->ndim;
  if (b->n_dims + 2 * nd > UINT32_MAX) {
    PyErr_SetString(PyExc_OverflowError, "the batch's tensors have more than 2^32 dimensions in all");
    return -1;
  }
  if (b->n_dims + 2 * nd > b->cap_dims && room_now(b, &(room){.dims = b->n_dims + 2 * nd}) < 0) return -1;
  uint64_t bytes = leaf_bytes(t);
  b->pending_bytes = bytes > UINT64_MAX - b->pending_bytes ? UINT64_MAX : b->pending_bytes + bytes;
  int64_t *d = b->dims + b->n_dims;
  memcpy(d, t->shape, nd * sizeof *d);
  if (t->strides) memcpy(d + nd, t->strides, nd * sizeof *d);
  leaf->dims_at = (uint32_t)b->n_dims;
  b->n_dims += 2 * nd;
  /* The producer's arrays are not looked at again. The tape's own may move as it grows, so the pointers are set
   * when the leaf is handed to ferry (ferry_py_batch_take_pending); until then `strides` only says whether the
   * tensor has strides. */
  t->shape = NULL;
  t->strides = t->strides ? HAS_STRIDES : NULL;
  return 0;
}

static uintptr_t first_byte(const ferry_tensor *t) { return t->data ? (uintptr_t)t->data + t->byte_offset : 0; }

/* Whether leaf `j` of the tape and `t`, just read (its shape and strides still the producer's), view the same
 * memory the same way and come back the same way (type, lazy bits). Strides given and omitted compare unequal. */
static bool same_view(const ferry_py_batch *b, size_t j, const ferry_tensor *t, const ferry_py_leaf *leaf) {
  const ferry_tensor *u = &b->tensors[j];
  const ferry_py_leaf *l = &b->leaves[j];
  if (u->ndim != t->ndim || u->dtype.code != t->dtype.code || u->dtype.bits != t->dtype.bits ||
      u->dtype.lanes != t->dtype.lanes || u->device.device_type != t->device.device_type ||
      u->device.device_id != t->device.device_id || l->family != leaf->family || l->api != leaf->api ||
      l->math_bits != leaf->math_bits)
    return false;
  if (!has_dims(t) || l->dims_at == NO_DIMS) return !has_dims(t) && l->dims_at == NO_DIMS;
  if ((u->strides != NULL) != (t->strides != NULL)) return false;
  size_t nd = (size_t)t->ndim;
  const int64_t *dims = b->dims + l->dims_at;
  return memcmp(dims, t->shape, nd * sizeof *dims) == 0 &&
         (!t->strides || memcmp(dims + nd, t->strides, nd * sizeof *dims) == 0);
}

/* Views compared per first byte: beyond them a tensor is copied on its own rather than looked up, so that a batch
 * of thousands of different views of one address (as_strided windows, say) costs a bounded look-up per tensor
 * instead of one per earlier view. */
#define MAX_VIEWS_PER_ADDRESS 8

/* The leaf that `t` repeats (a tied weight under two names, one tensor in two places), or -1; *crowded when its
 * first byte has MAX_VIEWS_PER_ADDRESS views recorded already (it is then not recorded). */
static int64_t repeated_leaf(const ferry_py_batch *b, const ferry_tensor *t, const ferry_py_leaf *leaf,
                             bool *crowded) {
  size_t cursor = SIZE_MAX;
  int seen = 0;
  for (int64_t j; seen < MAX_VIEWS_PER_ADDRESS && (j = addrmap_next(b->views, first_byte(t), &cursor)) >= 0;) {
    if (same_view(b, (size_t)j, t, leaf)) return j;
    seen++;
  }
  *crowded = seen == MAX_VIEWS_PER_ADDRESS;
  return -1;
}

static int walk_tensor(walker *w, PyObject *obj, PyObject *key, const ferry_py_typeinfo *ti) {
  ferry_py_batch *b = w->b;
  if (w->ctx->pass_all) return push_node(b, obj, key, FERRY_PY_OTHER, -1) < 0 ? -1 : 0;
  if (b->n_leaves == b->cap_leaves && room_now(b, &(room){.leaves = b->n_leaves + 1}) < 0) return -1;
  ferry_py_leaf *leaf = &b->leaves[b->n_leaves];
  ferry_tensor *t = &b->tensors[b->n_leaves];
  int rc = ferry_py_read_tensor(w->ctx, obj, ti, t, leaf);
  if (rc < 0) return -1;
  if (rc == 0) return push_node(b, obj, key, FERRY_PY_OTHER, -1) < 0 ? -1 : 0;
  bool crowded = false;
  int64_t repeated = repeated_leaf(b, t, leaf, &crowded);
  if (repeated >= 0) { /* one copy, and one output object in both places, as the memory is one on the source side */
    ferry_py_leaf_release_input(leaf);
    return push_node(b, obj, key, FERRY_PY_OTHER, (int32_t)repeated) < 0 ? -1 : 0;
  }
  int32_t index = (int32_t)b->n_leaves++; /* counted first: a failed step below must still release what was read */
  if (first_byte(t) && !crowded && addrmap_add(&b->views, first_byte(t), (size_t)index) < 0) return -1;
  if (copy_dims(b, leaf, t) < 0) return -1;
  if (push_node(b, obj, key, FERRY_PY_OTHER, index) < 0) return -1;
  return w->leaf_walked ? w->leaf_walked(w->arg) : 0;
}

static int walk(walker *w, PyObject *obj, PyObject *key) {
  PyTypeObject *type = Py_TYPE(obj);
  /* The common leaves and containers are known without the type cache. */
  if (obj == Py_None || type == &PyLong_Type || type == &PyFloat_Type || type == &PyUnicode_Type ||
      type == &PyBool_Type || type == &PyBytes_Type)
    return push_node(w->b, obj, key, FERRY_PY_OTHER, -1) < 0 ? -1 : 0;
  if (type == &PyList_Type) return walk_container(w, obj, key, FERRY_PY_LIST, NULL);
  if (type == &PyTuple_Type) return walk_container(w, obj, key, FERRY_PY_TUPLE, NULL);
  if (type == &PyDict_Type) return walk_container(w, obj, key, FERRY_PY_DICT, NULL);

  const ferry_py_typeinfo *ti = ferry_py_typeinfo_of(type);
  if (!ti) return -1;
  switch (ti->kind) {
  case FERRY_PY_TENSOR_EXCHANGE:
  case FERRY_PY_TENSOR_PROTOCOL: {
    ferry_py_typeinfo copy = *ti; /* the cache may be reset by Python code the read runs */
    return walk_tensor(w, obj, key, &copy);
  }
  case FERRY_PY_OTHER:
    return push_node(w->b, obj, key, FERRY_PY_OTHER, -1) < 0 ? -1 : 0;
  default: {
    uint8_t kind = ti->kind;
    PyObject *fields = Py_XNewRef(ti->fields); /* held: the cache may be reset during the walk */
    int rc = walk_container(w, obj, key, kind, fields);
    Py_XDECREF(fields);
    return rc;
  }
  }
}

int ferry_py_batch_walk(ferry_py_batch *b, PyObject *root, ferry_py_read_ctx *ctx, ferry_py_pace *pace,
                        int (*leaf_walked)(void *arg), void *arg) {
  walker w = {b, ctx, pace, leaf_walked, arg, 0};
  return keep_room(b, pace) < 0 ? -1 : walk(&w, root, NULL);
}

const ferry_tensor *ferry_py_batch_take_pending(ferry_py_batch *b, size_t *first, size_t *count) {
  for (size_t i = b->pending; i < b->n_leaves; i++) {
    ferry_tensor *t = &b->tensors[i];
    uint32_t at = b->leaves[i].dims_at;
    if (at == NO_DIMS) continue;
    bool strided = t->strides == HAS_STRIDES;
    t->shape = b->dims + at;
    t->strides = strided ? t->shape + t->ndim : NULL;
  }
  *first = b->pending;
  *count = b->n_leaves - b->pending;
  b->pending = b->n_leaves;
  b->pending_bytes = 0;
  return b->tensors + *first;
}

/* From a megabyte on, freeing the tape unmaps it (with other threads about, a TLB shootdown each): worth doing
 * without the GIL. Below, a release would only offer the GIL to another thread at the end of every small call. */
#define GIL_FREE_BYTES ((size_t)1 << 20)

static size_t map_bytes(const ferry_py_addrmap *m) { return m ? sizeof *m + m->cap * sizeof m->slots[0] : 0; }

bool ferry_py_batch_large(const ferry_py_batch *b) {
  size_t bytes = b->cap_nodes * sizeof *b->nodes + b->cap_leaves * (sizeof *b->leaves + sizeof *b->tensors) +
                 b->cap_dims * sizeof *b->dims + map_bytes(b->seen) + map_bytes(b->views);
  return bytes >= GIL_FREE_BYTES;
}

void ferry_py_batch_clear(ferry_py_batch *b, ferry_py_pace *pace) {
  for (size_t i = 0; i < b->n_leaves; i++) {
    ferry_py_leaf_release_input(&b->leaves[i]);
    Py_CLEAR(b->leaves[i].output);
    ferry_py_pace_tick_quiet(pace);
  }
  for (size_t i = 0; i < b->n_nodes; i++) {
    Py_CLEAR(b->nodes[i].obj);
    Py_CLEAR(b->nodes[i].key);
    ferry_py_pace_tick_quiet(pace);
  }
  if (pace) pace->tape_grown_holding += b->grown_holding;
  bool gil_free = pace && pace->slice_ns && ferry_py_batch_large(b);
  ferry_py_batch memory = *b;
  memset(b, 0, sizeof *b);
  PyThreadState *ts = gil_free ? ferry_py_pace_unlock(pace) : NULL;
  PyMem_RawFree(memory.nodes);
  PyMem_RawFree(memory.leaves);
  PyMem_RawFree(memory.tensors);
  PyMem_RawFree(memory.dims);
  PyMem_RawFree(memory.seen);
  PyMem_RawFree(memory.views);
  if (ts) ferry_py_pace_relock(pace, ts);
}

/* ---- rebuild -------------------------------------------------------------------------------------------------- */

typedef struct rebuilder {
  ferry_py_batch *b;
  ferry_py_pace *pace;
  PyObject **memo; /* per node: the rebuilt form of a repeated container (strong), NULL until rebuilt */
  bool *memo_changed;
} rebuilder;

static PyObject *rebuild(rebuilder *r, size_t *pos, bool *changed);

/* A dataclass instance like `orig` with `values` (field name -> value) set, without running __init__. */
static PyObject *rebuild_dataclass(PyObject *orig, PyObject *values) {
  PyTypeObject *type = Py_TYPE(orig);
  PyObject *empty = PyTuple_New(0);
  if (!empty) return NULL;
  PyObject *obj = type->tp_new(type, empty, NULL);
  Py_DECREF(empty);
  if (!obj) return NULL;
  if (type->tp_dictoffset != 0) { /* instances have a __dict__: carry over every attribute */
    PyObject *src = PyObject_GenericGetDict(orig, NULL);
    PyObject *dst = src ? PyObject_GenericGetDict(obj, NULL) : NULL;
    int rc = dst ? PyDict_Update(dst, src) : -1;
    Py_XDECREF(src);
    Py_XDECREF(dst);
    if (rc < 0) {
      Py_DECREF(obj);
      return NULL;
    }
  }
  Py_ssize_t pos = 0;
  PyObject *name, *value;
  while (PyDict_Next(values, &pos, &name, &value))
    if (PyObject_GenericSetAttr(obj, name, value) < 0) {
      Py_DECREF(obj);
      return NULL;
    }
  return obj;
}

/* Rebuilds the `count` children of a keyed container (dict, Mapping, dataclass) into a new dict. */
static PyObject *rebuild_keyed(rebuilder *r, size_t *pos, uint32_t count, bool *any) {
  PyObject *d = PyDict_New();
  if (!d) return NULL;
  bool python_keys = false; /* a key of another type than str or int hashes and compares in Python code, also
                               against keys inserted after it: from the first one on, the collector is lent */
  for (uint32_t i = 0; i < count; i++) {
    PyObject *key = r->b->nodes[*pos].key;
    PyObject *v = rebuild(r, pos, any);
    python_keys = python_keys || !(PyUnicode_CheckExact(key) || PyLong_CheckExact(key));
    if (v && python_keys) ferry_py_gc_lend();
    int rc = v ? PyDict_SetItem(d, key, v) : -1;
    if (v && python_keys) ferry_py_gc_reclaim();
    if (rc == 0 && PyDict_GET_SIZE(d) != (Py_ssize_t)i + 1) {
      /* The key compared equal to an earlier one (its __eq__/__hash__ answer differently than when the batch was
       * built): the entry would replace another's, and the batch come back with entries lost. */
      PyErr_Format(PyExc_RuntimeError, "key %R of a mapping in the batch compared equal to another key while ferry "
                   "rebuilt it: its __hash__/__eq__ changed during the transfer", key);
      rc = -1;
    }
    if (rc < 0) {
      Py_XDECREF(v);
      Py_DECREF(d);
      return NULL;
    }
    Py_DECREF(v);
  }
  return d;
}

/* Rebuilds `count` children into a new list or tuple. */
static PyObject *rebuild_sequence(rebuilder *r, size_t *pos, uint32_t count, bool tuple, bool *any) {
  PyObject *seq = tuple ? PyTuple_New(count) : PyList_New(count);
  if (!seq) return NULL;
  for (uint32_t i = 0; i < count; i++) {
    PyObject *v = rebuild(r, pos, any);
    if (!v) {
      /* The unfilled slots are NULL, which both types' deallocators accept. */
      Py_DECREF(seq);
      return NULL;
    }
    if (tuple) PyTuple_SET_ITEM(seq, i, v);
    else PyList_SET_ITEM(seq, i, v);
  }
  return seq;
}

/* Adds a note to the exception a container's type raised while ferry rebuilt it, saying how it was called: the
 * traceback alone points into user code that ferry called (Python 3.11+; a no-op before add_note). */
static void note_rebuild_failure(PyObject *orig, uint8_t kind) {
  static const char *how[] = {[FERRY_PY_NAMEDTUPLE] = "cls(*items)", [FERRY_PY_LIST_SUB] = "cls(list_of_items)",
                              [FERRY_PY_TUPLE_SUB] = "cls(tuple_of_items)", [FERRY_PY_MAPPING] = "cls(dict_of_items)",
                              [FERRY_PY_DEFAULTDICT] = "cls(default_factory, dict_of_items)",
                              [FERRY_PY_DATACLASS] = "cls.__new__(cls), then each field set"};
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (tb && value) PyException_SetTraceback(value, tb);
  const char *call = kind < sizeof how / sizeof how[0] && how[kind] ? how[kind] : "cls(items)";
  PyObject *note = PyUnicode_FromFormat("while ferry rebuilt a %s of the batch with its copied tensors, as %s",
                                        Py_TYPE(orig)->tp_name, call);
  PyObject *added = note && value ? PyObject_CallMethod(value, "add_note", "O", note) : NULL;
  Py_XDECREF(added);
  Py_XDECREF(note);
  PyErr_Clear(); /* no add_note (before 3.11), or it failed: the original error stays as it was */
  PyErr_Restore(type, value, tb);
}

/* The rebuilt form of the container at node `index` (and its whole subtree) from scratch. */
static PyObject *rebuild_container(rebuilder *r, ferry_py_node *n, size_t *pos, bool *changed) {
  uint8_t kind = n->kind;
  uint32_t count = n->count;
  PyObject *orig = n->obj; /* held by the tape */
  bool any = false;
  PyObject *draft = NULL, *result = NULL;
  switch (kind) {
  case FERRY_PY_LIST:
  case FERRY_PY_LIST_SUB:
  case FERRY_PY_TUPLE:
  case FERRY_PY_TUPLE_SUB:
  case FERRY_PY_NAMEDTUPLE:
    draft = rebuild_sequence(r, pos, count, kind != FERRY_PY_LIST && kind != FERRY_PY_LIST_SUB, &any);
    break;
  default:
    draft = rebuild_keyed(r, pos, count, &any);
    break;
  }
  if (!draft) return NULL;
  if (!any) { /* nothing under here was copied: the same object */
    Py_DECREF(draft);
    return Py_NewRef(orig);
  }
  *changed = true;
  PyObject *cls = (PyObject *)Py_TYPE(orig);
  switch (kind) {
  case FERRY_PY_LIST:
  case FERRY_PY_TUPLE:
  case FERRY_PY_DICT:
    return draft;
  case FERRY_PY_NAMEDTUPLE:
    result = FERRY_PY_GC_LENT(PyObject_Call(cls, draft, NULL)); /* cls(*items) */
    break;
  case FERRY_PY_LIST_SUB:
  case FERRY_PY_TUPLE_SUB:
  case FERRY_PY_MAPPING:
    result = FERRY_PY_GC_LENT(PyObject_CallOneArg(cls, draft));
    break;
  case FERRY_PY_DEFAULTDICT: {
    PyObject *factory = FERRY_PY_GC_LENT(PyObject_GetAttrString(orig, "default_factory"));
    if (factory) result = FERRY_PY_GC_LENT(PyObject_CallFunctionObjArgs(cls, factory, draft, NULL));
    Py_XDECREF(factory);
    break;
  }
  case FERRY_PY_DATACLASS:
    result = FERRY_PY_GC_LENT(rebuild_dataclass(orig, draft)); /* __new__ and setters may be Python code */
    break;
  }
  Py_DECREF(draft);
  if (!result) note_rebuild_failure(orig, kind);
  return result;
}

/* Rebuilds the node at *pos and its subtree, advancing *pos past it; sets *changed when something under it was
 * copied. New reference or NULL. */
static PyObject *rebuild(rebuilder *r, size_t *pos, bool *changed) {
  size_t index = (*pos)++;
  ferry_py_node *n = &r->b->nodes[index];
  if (ferry_py_pace_tick(r->pace) < 0) return NULL;
  if (n->kind == FERRY_PY_SHARED) { /* the same result as the node it repeats, rebuilt before it in order */
    index = n->count;
    n = &r->b->nodes[index];
    if (n->leaf < 0) {
      if (r->memo_changed[index]) *changed = true;
      return Py_NewRef(r->memo[index]);
    }
  }
  if (n->leaf >= 0) {
    PyObject *out = r->b->leaves[n->leaf].output;
    if (out) {
      *changed = true;
      return Py_NewRef(out);
    }
    return Py_NewRef(n->obj);
  }
  if (n->kind == FERRY_PY_OTHER) return Py_NewRef(n->obj);
  bool mine = false;
  PyObject *result = rebuild_container(r, n, pos, &mine);
  if (mine) *changed = true;
  if (result && (r->b->nodes[index].flags & FERRY_PY_NODE_REPEATED)) {
    r->memo[index] = Py_NewRef(result);
    r->memo_changed[index] = mine;
  }
  return result;
}

bool ferry_py_batch_rebuild_is_plain(const ferry_py_batch *b) {
  for (size_t i = 0; i < b->n_leaves; i++) {
    const ferry_py_leaf *leaf = &b->leaves[i];
    if (!leaf->output && leaf->block && ferry_py_outputs_copied(leaf->block, leaf->local)) return false;
  }
  for (size_t i = 0; i < b->n_nodes; i++) {
    const ferry_py_node *n = &b->nodes[i];
    bool plain_kind = n->leaf >= 0 || n->kind == FERRY_PY_OTHER || n->kind == FERRY_PY_SHARED ||
                      n->kind == FERRY_PY_LIST || n->kind == FERRY_PY_TUPLE || n->kind == FERRY_PY_DICT;
    if (!plain_kind || (n->key && !PyUnicode_CheckExact(n->key) && !PyLong_CheckExact(n->key))) return false;
  }
  return true;
}

PyObject *ferry_py_batch_rebuild(ferry_py_batch *b, ferry_py_pace *pace) {
  if (b->n_nodes == 0) {
    PyErr_SetString(PyExc_SystemError, "ferry: rebuilding an empty tape");
    return NULL;
  }
  rebuilder r = {b, pace, NULL, NULL};
  bool repeats = false;
  for (size_t i = 0; i < b->n_nodes && !repeats; i++) repeats = b->nodes[i].kind == FERRY_PY_SHARED;
  if (repeats) {
    r.memo = PyMem_Calloc(b->n_nodes, sizeof *r.memo);
    r.memo_changed = PyMem_Calloc(b->n_nodes, sizeof *r.memo_changed);
    if (!r.memo || !r.memo_changed) {
      PyMem_Free(r.memo);
      PyMem_Free(r.memo_changed);
      return PyErr_NoMemory();
    }
  }
  size_t pos = 0;
  bool changed = false;
  PyObject *result = rebuild(&r, &pos, &changed);
  for (size_t i = 0; r.memo && i < b->n_nodes; i++) Py_XDECREF(r.memo[i]);
  PyMem_Free(r.memo);
  PyMem_Free(r.memo_changed);
  return result;
}
