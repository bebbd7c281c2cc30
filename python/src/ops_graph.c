/* ops_graph.c — ferry.ops.Graph: ferry's own CUDA graphs of operator runs (ferry_graph_*): capture runs on a
 * stream, instantiate, replay, and give a captured run new operands in the instantiated graph without capturing
 * again (cuGraphExecKernelNodeSetParams under the hood).
 *
 *     with ferry.ops.Graph(stream) as g:        # capturing `stream` from here
 *         for i in range(20):
 *             g.run(op, args[i], compiled_artifact=art, assume_supported_args=True)
 *     g.replay()                               # on the captured stream; replay(stream) for another
 *     g.update(3, other_args)                  # run 3 now reads other operands
 *
 * Ownership: the graph keeps a reference to the GemmArguments of every recorded run (so the tensors a replay
 * reads stay alive) and to the stream object; update() swaps the reference of that run. The C graph holds its
 * own references to the artifacts. Dropping the graph while a replay still runs is safe for the graph itself
 * (replays already submitted finish), but the operands' memory is then the tensors' owners' business: synchronise
 * first, as with torch.cuda.CUDAGraph.
 */
#include "ops_py.h"

enum { GRAPH_CAPTURING = 1, GRAPH_READY = 2, GRAPH_BROKEN = 3, GRAPH_CLOSED = 4 };

typedef struct {
  PyObject_HEAD
  ferry_graph *graph;
  int state;
  PyObject *stream_obj;  /* strong */
  PyObject *runs;        /* list: the GemmArguments of each recorded run (strong) */
  int device;            /* the device of the first run, -1 before */
} graph_object;

static const char *state_text(int state) {
  switch (state) {
  case GRAPH_CAPTURING: return "capturing";
  case GRAPH_READY: return "ready";
  case GRAPH_BROKEN: return "broken (a capture or instantiation failed; make a new one)";
  default: return "closed";
  }
}

static int need_state(graph_object *g, int state, const char *fn) {
  if (g->state == state) return 0;
  const char *hint = g->state == GRAPH_BROKEN || g->state == GRAPH_CLOSED ? "capture a new Graph" /* no way back */
                     : state == GRAPH_CAPTURING ? "runs are recorded between Graph(stream) and end()"
                                                : "replay and update need end() first";
  PyErr_Format(PyExc_ValueError, "Graph.%s(): the graph is %s; %s", fn, state_text(g->state), hint);
  return -1;
}

static PyObject *graph_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
  static char *keywords[] = {"stream", NULL};
  PyObject *stream_obj;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:Graph", keywords, &stream_obj)) return NULL;
  if (stream_obj == Py_None) {
    PyErr_SetString(PyExc_ValueError, "Graph(stream): capture needs a stream of your own (torch.cuda.Stream(), "
                    "a CuPy stream, or a CUstream int); the legacy default stream cannot be captured");
    return NULL;
  }
  void *stream;
  int stream_device;
  if (ferry_py_stream_from_object(stream_obj, &stream, &stream_device) < 0) return NULL;
  if (stream == (void *)(uintptr_t)1) {
    PyErr_Format(PyExc_ValueError, "Graph(stream): %R is the legacy default stream, which cannot be captured; use "
                 "a stream of your own", stream_obj);
    return NULL;
  }
  graph_object *g = (graph_object *)type->tp_alloc(type, 0);
  if (!g) return NULL;
  g->device = -1;
  g->stream_obj = Py_NewRef(stream_obj);
  if (!(g->runs = PyList_New(0))) {
    Py_DECREF(g);
    return NULL;
  }
  ferry_status st = ferry_graph_begin(stream, &g->graph);
  if (st != FERRY_OK) {
    PyObject *r = ferry_py_raise(st); /* before the object goes: its stream object's release runs code */
    Py_DECREF(g);
    return r;
  }
  g->state = GRAPH_CAPTURING;
  return (PyObject *)g;
}

static void graph_release(graph_object *g) {
  ferry_graph_destroy(g->graph); /* ends a capture still running, so the stream is not left capturing */
  g->graph = NULL;
  g->state = GRAPH_CLOSED;
}

static int graph_traverse(graph_object *g, visitproc visit, void *arg) {
  Py_VISIT(g->stream_obj);
  Py_VISIT(g->runs);
  return 0;
}

static int graph_clear(graph_object *g) {
  Py_CLEAR(g->stream_obj);
  Py_CLEAR(g->runs);
  return 0;
}

static void graph_dealloc(graph_object *g) {
  PyObject_GC_UnTrack(g);
  graph_release(g);
  graph_clear(g);
  Py_TYPE(g)->tp_free((PyObject *)g);
}

PyDoc_STRVAR(run_doc,
             "run($self, /, op, args, compiled_artifact=None, assume_supported_args=False)\n--\n\n"
             "Records a run of Operator `op` on `args` into the capture (as op.run on the graph's stream) and\n"
             "returns its index for update(). Compile before capturing: without an artifact the memo's is used\n"
             "(compiled first, outside the stream, when missing). The graph keeps `args` alive.");

static ferry_py_sig run_sig = {"Graph.run", 4, 2, 4, {"op", "args", "compiled_artifact", "assume_supported_args"},
                               {0}};

static PyObject *graph_run(graph_object *g, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  PyObject *a[4];
  if (ferry_py_ops_parse(&run_sig, args, nargs, kwnames, a) < 0) return NULL;
  if (Py_TYPE(a[0]) != &ferry_py_Operator_Type) {
    PyErr_Format(PyExc_TypeError, "Graph.run(): op must be a ferry.ops.Operator, got a %.200s",
                 Py_TYPE(a[0])->tp_name);
    return NULL;
  }
  ferry_py_operator *op = (ferry_py_operator *)a[0];
  ferry_py_gemm_args *ga = ferry_py_ops_args_check(a[1], "Graph.run");
  ferry_artifact *art;
  if (!ga || ferry_py_ops_artifact_arg(a[2], "Graph.run", &art) < 0) return NULL;
  int assume = ferry_py_ops_truth(a[3]);
  if (assume < 0 || need_state(g, GRAPH_CAPTURING, "run") < 0) return NULL;
  size_t index = 0;
  ferry_status st = ferry_graph_run(g->graph, op->op, &ga->args, art, assume ? FERRY_RUN_ASSUME_SUPPORTED : 0, &index);
  if (st != FERRY_OK) return ferry_py_raise(st);
  if (PyList_Append(g->runs, a[1]) < 0) return NULL;
  if (g->device < 0) g->device = ga->args.problem.device;
  return PyLong_FromSize_t(index);
}

PyDoc_STRVAR(end_doc,
             "end($self, /)\n--\n\n"
             "Ends the capture and instantiates the graph (also what leaving the `with` block does). On failure the\n"
             "graph is broken (ferry.FerryError says why) and the stream is no longer capturing.");

static PyObject *graph_end(graph_object *g, PyObject *unused) {
  if (need_state(g, GRAPH_CAPTURING, "end") < 0) return NULL;
  ferry_status st = ferry_graph_end(g->graph);
  if (st != FERRY_OK) {
    PyObject *r = ferry_py_raise(st);
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    graph_release(g);
    g->state = GRAPH_BROKEN;
    PyErr_Restore(type, value, tb);
    return r;
  }
  g->state = GRAPH_READY;
  Py_RETURN_NONE;
}

PyDoc_STRVAR(replay_doc,
             "replay($self, /, stream=None)\n--\n\n"
             "Launches the instantiated graph on `stream` (None: the stream it was captured on; or a torch/CuPy\n"
             "stream or an int CUstream of the same device). Returns at once; synchronise the stream to wait.");

static ferry_py_sig replay_sig = {"Graph.replay", 1, 0, 1, {"stream"}, {0}};

static PyObject *graph_replay(graph_object *g, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  PyObject *a[1];
  if (ferry_py_ops_parse(&replay_sig, args, nargs, kwnames, a) < 0) return NULL;
  if (need_state(g, GRAPH_READY, "replay") < 0) return NULL;
  void *stream = NULL;
  if (a[0] && a[0] != Py_None && ferry_py_ops_stream(a[0], NULL, g->device < 0 ? 0 : g->device, &stream) < 0)
    return NULL;
  ferry_status st = ferry_graph_replay(g->graph, stream);
  if (st != FERRY_OK) return ferry_py_raise(st);
  Py_RETURN_NONE;
}

PyDoc_STRVAR(update_doc,
             "update($self, index, args, /)\n--\n\n"
             "Gives recorded run `index` new arguments (other operands, alpha/beta, sizes) in the instantiated\n"
             "graph, in place: the next replay uses them, nothing is captured again. `args` must be supported by\n"
             "that run's operator and be of the kind of its artifact, on the same device. The graph drops its\n"
             "reference to the run's old arguments and keeps `args`. Not while a replay is being submitted from\n"
             "another thread.");

static PyObject *graph_update(graph_object *g, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_Format(PyExc_TypeError, "Graph.update() takes 2 arguments (index, args), %zd given", nargs);
    return NULL;
  }
  Py_ssize_t index = PyNumber_AsSsize_t(args[0], PyExc_IndexError);
  if (index == -1 && PyErr_Occurred()) return NULL;
  ferry_py_gemm_args *ga = ferry_py_ops_args_check(args[1], "Graph.update");
  if (!ga || need_state(g, GRAPH_READY, "update") < 0) return NULL;
  if (index < 0 || index >= PyList_GET_SIZE(g->runs)) {
    PyErr_Format(PyExc_IndexError, "Graph.update(): run %zd does not exist (the graph has %zd)", index,
                 PyList_GET_SIZE(g->runs));
    return NULL;
  }
  ferry_status st = ferry_graph_update(g->graph, (size_t)index, &ga->args);
  if (st != FERRY_OK) return ferry_py_raise(st);
  if (PyList_SetItem(g->runs, index, Py_NewRef(args[1])) < 0) return NULL;
  Py_RETURN_NONE;
}

PyDoc_STRVAR(close_doc,
             "close($self, /)\n--\n\n"
             "Destroys the graph now (a capture still running is ended and discarded) and drops the references it\n"
             "holds. Also done when the object dies. Synchronise replays first if their operands may be freed.");

static PyObject *graph_close(graph_object *g, PyObject *unused) {
  graph_release(g);
  Py_CLEAR(g->runs);
  if (!(g->runs = PyList_New(0))) return NULL;
  Py_RETURN_NONE;
}

static PyObject *graph_enter(graph_object *g, PyObject *unused) { return Py_NewRef((PyObject *)g); }

static PyObject *graph_exit(graph_object *g, PyObject *const *args, Py_ssize_t nargs) {
  if (g->state != GRAPH_CAPTURING) Py_RETURN_FALSE;
  if (nargs >= 1 && args[0] != Py_None) { /* an exception inside the block: discard the capture */
    graph_release(g);
    g->state = GRAPH_BROKEN;
    Py_RETURN_FALSE;
  }
  PyObject *r = graph_end(g, NULL);
  if (!r) return NULL;
  Py_DECREF(r);
  Py_RETURN_FALSE;
}

static Py_ssize_t graph_len(graph_object *g) { return g->runs ? PyList_GET_SIZE(g->runs) : 0; }

static PyObject *graph_repr(graph_object *g) {
  return PyUnicode_FromFormat("<ferry.ops.Graph of %zd run%s, %s>", graph_len(g), graph_len(g) == 1 ? "" : "s",
                              state_text(g->state));
}

static PyObject *get_runs(graph_object *g, void *unused) {
  return g->runs ? PyList_AsTuple(g->runs) : PyTuple_New(0);
}

static PyObject *get_state(graph_object *g, void *unused) {
  static const char *names[] = {"", "capturing", "ready", "broken", "closed"};
  return PyUnicode_FromString(names[g->state]);
}

static PyMethodDef graph_methods[] = {
    {"run", (PyCFunction)(void (*)(void))graph_run, METH_FASTCALL | METH_KEYWORDS, run_doc},
    {"end", (PyCFunction)graph_end, METH_NOARGS, end_doc},
    {"replay", (PyCFunction)(void (*)(void))graph_replay, METH_FASTCALL | METH_KEYWORDS, replay_doc},
    {"update", (PyCFunction)(void (*)(void))graph_update, METH_FASTCALL, update_doc},
    {"close", (PyCFunction)graph_close, METH_NOARGS, close_doc},
    {"__enter__", (PyCFunction)graph_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))graph_exit, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef graph_getset[] = {
    {"runs", (getter)get_runs, NULL, "The GemmArguments of each recorded run, by index (a tuple).", NULL},
    {"state", (getter)get_state, NULL, "\"capturing\", \"ready\", \"broken\" or \"closed\".", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PySequenceMethods graph_sequence = {.sq_length = (lenfunc)graph_len};

PyDoc_STRVAR(graph_doc,
             "Graph(stream)\n--\n\n"
             "A CUDA graph of operator runs, captured on `stream` (a torch.cuda.Stream, a CuPy stream or an int\n"
             "CUstream; not the legacy default stream) from construction until end() or the end of a `with` block:\n"
             "record runs with run(op, args, ...), then replay(), and update(index, args) to point a run at new\n"
             "operands without capturing again. Capture mode is thread-local: other threads may keep using CUDA.\n"
             "Work you queue on `stream` meanwhile is captured too. len(graph) is the number of recorded runs.\n\n"
             "Ownership: keeps each run's GemmArguments (so its tensors) and the stream object alive; the C graph\n"
             "holds the artifacts. close() or the object's death destroys it.");

PyTypeObject ferry_py_Graph_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry.ops.Graph",
    .tp_basicsize = sizeof(graph_object),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = graph_doc,
    .tp_new = graph_new,
    .tp_dealloc = (destructor)graph_dealloc,
    .tp_traverse = (traverseproc)graph_traverse,
    .tp_clear = (inquiry)graph_clear,
    .tp_repr = (reprfunc)graph_repr,
    .tp_methods = graph_methods,
    .tp_getset = graph_getset,
    .tp_as_sequence = &graph_sequence,
};
