/* batch.c — walks a nested batch into a flat tape, and rebuilds the batch from the tape.
 *
 * The walk visits the batch once, in order (list and tuple items, dict values in insertion order, dataclass
 * fields in definition order), records every node with strong references, and reads each tensor on the source
 * side into the flat array given to ferry. The rebuild reads only the tape, never the caller's containers, so it
 * sees the batch as it was when the transfer was submitted.
 *
 * Identity: a node whose subtree holds no copied tensor comes back as the very same object; only containers on
 * the way to a copied tensor are new. Containers are rebuilt with their own type:
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
 * too); a container that contains itself raises ValueError.
 */
#include "ferry_py.h"

#include <string.h>

typedef struct walker {
  ferry_py_batch *b;
  ferry_py_read_ctx *ctx;
  int depth;
  PyObject *path[FERRY_PY_MAX_DEPTH]; /* containers from the root to the current node (borrowed) */
} walker;

static int grow(void **array, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t cap2 = *cap ? *cap * 2 : 64;
  while (cap2 < need) cap2 *= 2;
  void *p = PyMem_Realloc(*array, cap2 * elem);
  if (!p) {
    PyErr_NoMemory();
    return -1;
  }
  *array = p;
  *cap = cap2;
  return 0;
}

/* Appends a node; returns its index or -1. */
static Py_ssize_t push_node(ferry_py_batch *b, PyObject *obj, PyObject *key, uint8_t kind, int32_t leaf) {
  if (grow((void **)&b->nodes, &b->cap_nodes, b->n_nodes + 1, sizeof *b->nodes) < 0) return -1;
  ferry_py_node *n = &b->nodes[b->n_nodes];
  n->obj = Py_NewRef(obj);
  n->key = Py_XNewRef(key);
  n->count = 0;
  n->leaf = leaf;
  n->kind = kind;
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

static int walk(walker *w, PyObject *obj, PyObject *key);

/* Walks one child, holding a reference to it meanwhile (walking may run Python code that drops it from its
 * container). Returns 0 or -1. */
static int walk_child(walker *w, PyObject *child, PyObject *key) {
  Py_INCREF(child);
  Py_XINCREF(key);
  int rc = walk(w, child, key);
  Py_XDECREF(key);
  Py_DECREF(child);
  return rc;
}

static int walk_children(walker *w, PyObject *obj, uint8_t kind, PyObject *fields, uint32_t *count) {
  switch (kind) {
  case FERRY_PY_LIST:
  case FERRY_PY_LIST_SUB:
    /* The size is read each time: a list may change while Python code runs during the walk. */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(obj); i++, (*count)++)
      if (walk_child(w, PyList_GET_ITEM(obj, i), NULL) < 0) return -1;
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
    if (PyDict_Check(obj)) {
      Py_ssize_t pos = 0;
      PyObject *k, *v;
      while (PyDict_Next(obj, &pos, &k, &v)) {
        if (walk_child(w, v, k) < 0) return -1;
        (*count)++;
      }
      return 0;
    } else {
      PyObject *items = PyMapping_Items(obj);
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
  for (int i = 0; i < w->depth; i++)
    if (w->path[i] == obj) {
      PyErr_Format(PyExc_ValueError, "the batch contains a reference cycle: a %s (%s) at depth %d contains itself "
                   "at depth %d", kind_name(kind), Py_TYPE(obj)->tp_name, i, w->depth);
      return -1;
    }
  if (w->depth >= FERRY_PY_MAX_DEPTH) {
    PyErr_Format(PyExc_RecursionError, "the batch is nested deeper than %d containers (a %s at depth %d)",
                 FERRY_PY_MAX_DEPTH, kind_name(kind), w->depth);
    return -1;
  }
  if (Py_EnterRecursiveCall(" while walking a batch for ferry")) return -1;
  Py_ssize_t index = push_node(w->b, obj, key, kind, -1);
  int rc = -1;
  if (index >= 0) {
    uint32_t count = 0;
    w->path[w->depth++] = obj;
    rc = walk_children(w, obj, kind, fields, &count);
    w->depth--;
    w->b->nodes[index].count = count; /* by index: the array may have moved */
  }
  Py_LeaveRecursiveCall();
  return rc;
}

static int walk_tensor(walker *w, PyObject *obj, PyObject *key, const ferry_py_typeinfo *ti) {
  ferry_py_batch *b = w->b;
  size_t old_cap = b->cap_leaves;
  if (grow((void **)&b->leaves, &b->cap_leaves, b->n_leaves + 1, sizeof *b->leaves) < 0) return -1;
  if (b->cap_leaves != old_cap) { /* the tensors array grows in step with leaves (same capacity) */
    void *p = PyMem_Realloc(b->tensors, b->cap_leaves * sizeof *b->tensors);
    if (!p) {
      b->cap_leaves = old_cap; /* keep the two arrays' capacity in step */
      PyErr_NoMemory();
      return -1;
    }
    b->tensors = p;
  }
  int rc = ferry_py_read_tensor(w->ctx, obj, ti, &b->tensors[b->n_leaves], &b->leaves[b->n_leaves]);
  if (rc < 0) return -1;
  if (rc == 0) return push_node(b, obj, key, FERRY_PY_OTHER, -1) < 0 ? -1 : 0;
  int32_t leaf = (int32_t)b->n_leaves++; /* counted first: a failed push must still release what was read */
  return push_node(b, obj, key, FERRY_PY_OTHER, leaf) < 0 ? -1 : 0;
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

int ferry_py_batch_walk(ferry_py_batch *b, PyObject *root, ferry_py_read_ctx *ctx) {
  walker *w = PyMem_Malloc(sizeof *w);
  if (!w) {
    PyErr_NoMemory();
    return -1;
  }
  w->b = b;
  w->ctx = ctx;
  w->depth = 0;
  int rc = walk(w, root, NULL);
  PyMem_Free(w);
  return rc;
}

void ferry_py_batch_clear(ferry_py_batch *b) {
  for (size_t i = 0; i < b->n_leaves; i++) {
    ferry_py_leaf_release_input(&b->leaves[i]);
    Py_CLEAR(b->leaves[i].output);
  }
  for (size_t i = 0; i < b->n_nodes; i++) {
    Py_CLEAR(b->nodes[i].obj);
    Py_CLEAR(b->nodes[i].key);
  }
  PyMem_Free(b->nodes);
  PyMem_Free(b->leaves);
  PyMem_Free(b->tensors);
  memset(b, 0, sizeof *b);
}

/* ---- rebuild -------------------------------------------------------------------------------------------------- */

static PyObject *rebuild(ferry_py_batch *b, size_t *pos, bool *changed);

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
static PyObject *rebuild_keyed(ferry_py_batch *b, size_t *pos, uint32_t count, bool *any) {
  PyObject *d = PyDict_New();
  if (!d) return NULL;
  for (uint32_t i = 0; i < count; i++) {
    PyObject *key = b->nodes[*pos].key;
    PyObject *v = rebuild(b, pos, any);
    if (!v || PyDict_SetItem(d, key, v) < 0) {
      Py_XDECREF(v);
      Py_DECREF(d);
      return NULL;
    }
    Py_DECREF(v);
  }
  return d;
}

/* Rebuilds `count` children into a new list or tuple. */
static PyObject *rebuild_sequence(ferry_py_batch *b, size_t *pos, uint32_t count, bool tuple, bool *any) {
  PyObject *seq = tuple ? PyTuple_New(count) : PyList_New(count);
  if (!seq) return NULL;
  for (uint32_t i = 0; i < count; i++) {
    PyObject *v = rebuild(b, pos, any);
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

/* Rebuilds the node at *pos and its subtree, advancing *pos past it; sets *changed when something under it was
 * copied. New reference or NULL. */
static PyObject *rebuild(ferry_py_batch *b, size_t *pos, bool *changed) {
  ferry_py_node *n = &b->nodes[(*pos)++];
  if (n->leaf >= 0) {
    PyObject *out = b->leaves[n->leaf].output;
    if (out) {
      *changed = true;
      return Py_NewRef(out);
    }
    return Py_NewRef(n->obj);
  }
  uint8_t kind = n->kind;
  uint32_t count = n->count;
  PyObject *orig = n->obj; /* held by the tape */
  bool any = false;
  PyObject *draft = NULL, *result = NULL;
  switch (kind) {
  case FERRY_PY_OTHER:
    return Py_NewRef(orig);
  case FERRY_PY_LIST:
  case FERRY_PY_LIST_SUB:
  case FERRY_PY_TUPLE:
  case FERRY_PY_TUPLE_SUB:
  case FERRY_PY_NAMEDTUPLE:
    draft = rebuild_sequence(b, pos, count, kind != FERRY_PY_LIST && kind != FERRY_PY_LIST_SUB, &any);
    break;
  default:
    draft = rebuild_keyed(b, pos, count, &any);
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
    result = PyObject_Call(cls, draft, NULL); /* cls(*items) */
    break;
  case FERRY_PY_LIST_SUB:
  case FERRY_PY_TUPLE_SUB:
  case FERRY_PY_MAPPING:
    result = PyObject_CallOneArg(cls, draft);
    break;
  case FERRY_PY_DEFAULTDICT: {
    PyObject *factory = PyObject_GetAttrString(orig, "default_factory");
    if (factory) result = PyObject_CallFunctionObjArgs(cls, factory, draft, NULL);
    Py_XDECREF(factory);
    break;
  }
  case FERRY_PY_DATACLASS:
    result = rebuild_dataclass(orig, draft);
    break;
  }
  Py_DECREF(draft);
  return result;
}

PyObject *ferry_py_batch_rebuild(ferry_py_batch *b) {
  size_t pos = 0;
  bool changed = false;
  if (b->n_nodes == 0) {
    PyErr_SetString(PyExc_SystemError, "ferry: rebuilding an empty tape");
    return NULL;
  }
  return rebuild(b, &pos, &changed);
}
