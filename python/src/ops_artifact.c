/* ops_artifact.c — ferry.ops.CompiledArtifact: one reference to a ferry_artifact (a cubin for one target and one
 * problem kind, loaded into the driver when the device is there), with save/load over ferry's artifact file
 * format (ferry_artifact_export / ferry_artifact_import: magic, version, key, lengths, a checksum; everything is
 * verified on load, and a damaged file is refused, never loaded).
 */
#include "ops_py.h"

PyObject *ferry_py_ops_artifact_new(ferry_artifact *art) {
  ferry_py_artifact *self = PyObject_New(ferry_py_artifact, &ferry_py_CompiledArtifact_Type);
  if (!self) {
    ferry_artifact_release(art);
    return NULL;
  }
  self->art = art;
  return (PyObject *)self;
}

int ferry_py_ops_artifact_arg(PyObject *obj, const char *fn, ferry_artifact **out) {
  if (!obj || obj == Py_None) {
    *out = NULL;
    return 0;
  }
  if (Py_TYPE(obj) == &ferry_py_CompiledArtifact_Type || PyObject_TypeCheck(obj, &ferry_py_CompiledArtifact_Type)) {
    *out = ((ferry_py_artifact *)obj)->art;
    return 0;
  }
  PyErr_Format(PyExc_TypeError, "%s(): compiled_artifact must be a ferry.ops.CompiledArtifact or None, got a %.200s",
               fn, Py_TYPE(obj)->tp_name);
  return -1;
}

static void artifact_dealloc(ferry_py_artifact *self) {
  ferry_artifact_release(self->art);
  PyObject_Free(self);
}

static PyObject *artifact_repr(ferry_py_artifact *self) {
  size_t size = 0;
  (void)ferry_artifact_cubin(self->art, &size);
  return PyUnicode_FromFormat("<ferry.ops.CompiledArtifact of %s for sm_%d, kind 0x%05x, %zu-byte cubin>",
                              ferry_op_info_get(ferry_artifact_op(self->art))->name,
                              ferry_artifact_target_sm(self->art), (unsigned)ferry_artifact_kind(self->art), size);
}

PyDoc_STRVAR(save_doc,
             "save($self, path, /)\n--\n\n"
             "Writes the artifact to `path` (str or os.PathLike) in ferry's artifact format, atomically (a\n"
             "temporary file beside it, flushed and renamed over `path`); created 0644 less the umask. The GIL is\n"
             "released meanwhile. Raises OSError naming the path and the system's reason.");

static PyObject *artifact_save(ferry_py_artifact *self, PyObject *arg) {
  PyObject *path = NULL;
  if (!PyUnicode_FSConverter(arg, &path)) return NULL;
  ferry_status st;
  Py_BEGIN_ALLOW_THREADS st = ferry_artifact_export(self->art, PyBytes_AS_STRING(path));
  Py_END_ALLOW_THREADS Py_DECREF(path);
  if (st != FERRY_OK) return ferry_py_raise(st);
  Py_RETURN_NONE;
}

PyDoc_STRVAR(load_doc,
             "load($type, path, /)\n--\n\n"
             "Reads an artifact written by save(), verifying everything (format, version, lengths, checksum, a\n"
             "cubin inside) and that an operator of the recorded name is registered with the same source; no NVRTC\n"
             "is needed. The checks find damage, not tampering: the file is GPU code you vouch for, as for a shared\n"
             "library. It is not memoised: pass it to runs (compile() and runs without an artifact never use it).\n"
             "Returns a new CompiledArtifact. Raises ferry.FerryError with status BAD_ARTIFACT saying what did not verify\n"
             "(nothing is loaded then), OSError when the file cannot be read.");

static PyObject *artifact_load(PyObject *cls, PyObject *arg) {
  PyObject *path = NULL;
  if (!PyUnicode_FSConverter(arg, &path)) return NULL;
  ferry_artifact *art = NULL;
  ferry_status st;
  Py_BEGIN_ALLOW_THREADS st = ferry_artifact_import(PyBytes_AS_STRING(path), &art);
  Py_END_ALLOW_THREADS Py_DECREF(path);
  if (st != FERRY_OK) return ferry_py_raise(st);
  return ferry_py_ops_artifact_new(art);
}

static PyObject *get_operator(ferry_py_artifact *self, void *unused) {
  return ferry_py_ops_operator(ferry_artifact_op(self->art));
}

static PyObject *get_target_sm(ferry_py_artifact *self, void *unused) {
  return PyLong_FromLong(ferry_artifact_target_sm(self->art));
}

static PyObject *get_kind(ferry_py_artifact *self, void *unused) {
  return PyLong_FromUnsignedLong(ferry_artifact_kind(self->art));
}

static PyObject *get_cubin(ferry_py_artifact *self, void *unused) {
  size_t size = 0;
  const void *bytes = ferry_artifact_cubin(self->art, &size);
  return PyBytes_FromStringAndSize(bytes, (Py_ssize_t)size);
}

static PyMethodDef artifact_methods[] = {
    {"save", (PyCFunction)artifact_save, METH_O, save_doc},
    {"load", (PyCFunction)artifact_load, METH_O | METH_CLASS, load_doc},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef artifact_getset[] = {
    {"operator", (getter)get_operator, NULL, "The Operator it was compiled from.", NULL},
    {"target_sm", (getter)get_target_sm, NULL, "The target it was compiled for (90 = sm_90).", NULL},
    {"kind", (getter)get_kind, NULL, "The problem kind it serves (operand types and majors, and the fused epilogue's "
     "bias mode and activation, packed).", NULL},
    {"cubin", (getter)get_cubin, NULL, "A copy of the cubin (ELF) bytes.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyDoc_STRVAR(artifact_doc,
             "A compiled operator: the cubin for one target and one problem kind (what Operator.compile returns and\n"
             "Operator.run / launcher / Graph.run take). Holds one reference to the C artifact, dropped when the\n"
             "object dies; launches already queued and graphs that captured it keep working. save(path) and\n"
             "CompiledArtifact.load(path) move it between processes and machines of the same target.");

PyTypeObject ferry_py_CompiledArtifact_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry.ops.CompiledArtifact",
    .tp_basicsize = sizeof(ferry_py_artifact),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = artifact_doc,
    .tp_dealloc = (destructor)artifact_dealloc,
    .tp_repr = (reprfunc)artifact_repr,
    .tp_methods = artifact_methods,
    .tp_getset = artifact_getset,
};
