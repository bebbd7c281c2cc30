/* typeinfo.c — what a Python type is to ferry: a container kind to walk and rebuild, a tensor (through the DLPack
 * exchange API or the __dlpack__ protocol), or a leaf that passes through; and, for tensors, which framework it
 * comes from, which decides the framework of the output.
 *
 * Answering costs attribute look-ups and ABC checks, so the answer is cached per type object. The cache holds a
 * reference to each type, so a cached pointer can never be reused by another type; when it fills up it is emptied
 * and starts again (programs that make new classes forever still use bounded memory). A class changed after its
 * first transfer (a __dlpack__ added, Mapping.register called) keeps its first answer.
 */
#include "ferry_py.h"

#include <string.h>

#define CACHE_SLOTS 1024 /* power of two */
#define CACHE_MAX_USED (CACHE_SLOTS * 3 / 4)

typedef struct slot {
  PyTypeObject *type; /* strong, NULL when empty */
  ferry_py_typeinfo info;
} slot;

static slot cache[CACHE_SLOTS];
static size_t cache_used;

/* Imported on first need and kept for the life of the process. */
static PyObject *abc_mapping, *defaultdict_type, *dataclasses_fields;

void ferry_py_typeinfo_clear(void) {
  for (size_t i = 0; i < CACHE_SLOTS; i++) {
    if (!cache[i].type) continue;
    Py_CLEAR(cache[i].info.fields);
    Py_CLEAR(cache[i].type);
  }
  cache_used = 0;
}

static PyObject *import_attr(const char *module, const char *attr) {
  PyObject *m = PyImport_ImportModule(module);
  if (!m) return NULL;
  PyObject *a = PyObject_GetAttrString(m, attr);
  Py_DECREF(m);
  return a;
}

/* 1 if the type (or a base) defines `name`, 0 if not, -1 on error. */
static int type_has(PyTypeObject *type, const char *name) {
  PyObject *v = PyObject_GetAttrString((PyObject *)type, name);
  if (v) {
    Py_DECREF(v);
    return 1;
  }
  if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
  PyErr_Clear();
  return 0;
}

/* The framework a tensor type comes from, by the top-level package of its module. */
static uint8_t family_of(PyTypeObject *type) {
  PyObject *module = PyObject_GetAttrString((PyObject *)type, "__module__");
  uint8_t family = FERRY_PY_FAMILY_OTHER;
  if (!module) {
    PyErr_Clear();
    return family;
  }
  const char *m = PyUnicode_Check(module) ? PyUnicode_AsUTF8(module) : NULL;
  if (!m) PyErr_Clear();
  else if (strncmp(m, "torch", 5) == 0) family = FERRY_PY_FAMILY_TORCH;
  else if (strncmp(m, "numpy", 5) == 0) family = FERRY_PY_FAMILY_NUMPY;
  else if (strncmp(m, "cupy", 4) == 0) family = FERRY_PY_FAMILY_CUPY;
  else if (strncmp(m, "jax", 3) == 0) family = FERRY_PY_FAMILY_JAX; /* jax and jaxlib */
  else if (strncmp(m, "ferry", 5) == 0) family = FERRY_PY_FAMILY_FERRY;
  Py_DECREF(module);
  return family;
}

/* The type's DLPack exchange table, if it has one ferry can use: a capsule "dlpack_exchange_api" on the type
 * (torch >= 2.10 names it __dlpack_c_exchange_api__; earlier producers __c_dlpack_exchange_api__), of major
 * version 1 (walking the chain of older tables if the first is newer), with every function ferry calls. */
static const DLPackExchangeAPI *exchange_api_of(PyTypeObject *type) {
  static const char *names[] = {"__dlpack_c_exchange_api__", "__c_dlpack_exchange_api__"};
  for (size_t n = 0; n < sizeof names / sizeof names[0]; n++) {
    PyObject *capsule = PyObject_GetAttrString((PyObject *)type, names[n]);
    if (!capsule) {
      PyErr_Clear();
      continue;
    }
    const DLPackExchangeAPI *api = NULL;
    if (PyCapsule_IsValid(capsule, "dlpack_exchange_api"))
      api = (const DLPackExchangeAPI *)PyCapsule_GetPointer(capsule, "dlpack_exchange_api");
    Py_DECREF(capsule); /* the table is static in the framework; the capsule only carries the pointer */
    PyErr_Clear();
    const DLPackExchangeAPIHeader *h = api ? &api->header : NULL;
    while (h && h->version.major > DLPACK_MAJOR_VERSION) h = h->prev_api;
    api = (const DLPackExchangeAPI *)h;
    if (api && api->header.version.major == DLPACK_MAJOR_VERSION && api->dltensor_from_py_object_no_sync &&
        api->managed_tensor_to_py_object_no_sync && api->current_work_stream)
      return api;
  }
  return NULL;
}

/* Field names of a dataclass type, in definition order (dataclasses.fields: instance fields only, not ClassVar
 * or InitVar pseudo-fields). */
static PyObject *dataclass_field_names(PyTypeObject *type) {
  if (!dataclasses_fields && !(dataclasses_fields = import_attr("dataclasses", "fields"))) return NULL;
  PyObject *fields = PyObject_CallOneArg(dataclasses_fields, (PyObject *)type);
  if (!fields) return NULL;
  PyObject *seq = PySequence_Fast(fields, "dataclasses.fields() did not return a sequence");
  Py_DECREF(fields);
  if (!seq) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject *names = PyTuple_New(n);
  for (Py_ssize_t i = 0; names && i < n; i++) {
    PyObject *name = PyObject_GetAttrString(PySequence_Fast_GET_ITEM(seq, i), "name");
    if (!name) Py_CLEAR(names);
    else {
      PyUnicode_InternInPlace(&name);
      PyTuple_SET_ITEM(names, i, name);
    }
  }
  Py_DECREF(seq);
  return names;
}

/* Works out the info for a type not in the cache. Returns 0 or -1 with an exception set. */
static int classify(PyTypeObject *type, ferry_py_typeinfo *info) {
  memset(info, 0, sizeof *info);
  if (type == &PyList_Type) info->kind = FERRY_PY_LIST;
  else if (type == &PyTuple_Type) info->kind = FERRY_PY_TUPLE;
  else if (type == &PyDict_Type) info->kind = FERRY_PY_DICT;
  if (info->kind) return 0;

  /* Tensors first: a tensor type that also looks like a container is still a tensor. */
  if ((info->api = exchange_api_of(type))) {
    info->kind = FERRY_PY_TENSOR_EXCHANGE;
    info->family = family_of(type);
    return 0;
  }
  int has_dlpack = type_has(type, "__dlpack__");
  if (has_dlpack < 0) return -1;
  if (has_dlpack) {
    int has_device = type_has(type, "__dlpack_device__");
    if (has_device < 0) return -1;
    if (has_device) {
      info->kind = FERRY_PY_TENSOR_PROTOCOL;
      info->family = family_of(type);
      return 0;
    }
  }

  if (PyType_IsSubtype(type, &PyTuple_Type)) {
    int fields = type_has(type, "_fields"), make = fields > 0 ? type_has(type, "_make") : 0;
    if (fields < 0 || make < 0) return -1;
    info->kind = fields && make ? FERRY_PY_NAMEDTUPLE : FERRY_PY_TUPLE_SUB;
    return 0;
  }
  if (PyType_IsSubtype(type, &PyList_Type)) {
    info->kind = FERRY_PY_LIST_SUB;
    return 0;
  }
  if (PyType_IsSubtype(type, &PyDict_Type)) {
    if (!defaultdict_type && !(defaultdict_type = import_attr("collections", "defaultdict"))) return -1;
    int dd = PyObject_IsSubclass((PyObject *)type, defaultdict_type);
    if (dd < 0) return -1;
    info->kind = dd ? FERRY_PY_DEFAULTDICT : FERRY_PY_MAPPING;
    return 0;
  }
  /* Strings, numbers and bytes are never containers; skip the ABC machinery for them. */
  if (!PyType_IsSubtype(type, &PyUnicode_Type) && !PyType_IsSubtype(type, &PyLong_Type) &&
      !PyType_IsSubtype(type, &PyFloat_Type) && !PyType_IsSubtype(type, &PyBytes_Type)) {
    if (!abc_mapping && !(abc_mapping = import_attr("collections.abc", "Mapping"))) return -1;
    int mapping = PyObject_IsSubclass((PyObject *)type, abc_mapping);
    if (mapping < 0) return -1;
    if (mapping) {
      info->kind = FERRY_PY_MAPPING;
      return 0;
    }
  }
  int dc = type_has(type, "__dataclass_fields__");
  if (dc < 0) return -1;
  /* A dataclass's metaclass is `type`, so instances of `type` (dataclass classes themselves) never get here. */
  if (dc) {
    if (!(info->fields = dataclass_field_names(type))) return -1;
    info->kind = FERRY_PY_DATACLASS;
    return 0;
  }
  info->kind = FERRY_PY_OTHER;
  return 0;
}

const ferry_py_typeinfo *ferry_py_typeinfo_of(PyTypeObject *type) {
  size_t i = ((uintptr_t)type >> 4) & (CACHE_SLOTS - 1);
  for (; cache[i].type; i = (i + 1) & (CACHE_SLOTS - 1))
    if (cache[i].type == type) return &cache[i].info;

  ferry_py_typeinfo info;
  if (classify(type, &info) < 0) return NULL;
  if (cache_used >= CACHE_MAX_USED) {
    ferry_py_typeinfo_clear();
    i = ((uintptr_t)type >> 4) & (CACHE_SLOTS - 1);
  }
  /* classify() may have run Python code (ABC hooks) that classified this type already. */
  for (; cache[i].type; i = (i + 1) & (CACHE_SLOTS - 1))
    if (cache[i].type == type) {
      Py_XDECREF(info.fields);
      return &cache[i].info;
    }
  Py_INCREF(type);
  cache[i].type = type;
  cache[i].info = info;
  cache_used++;
  return &cache[i].info;
}
