/* math_bits.c — torch's lazy conjugate and negative bits, which DLPack cannot carry.
 *
 * Tensor.conj() of a complex tensor and Tensor._neg_view() (and what builds on them, such as z.conj().imag) return
 * views whose values are the conjugate or the negation of the memory they view. torch's DLPack exports describe
 * that memory and drop the bits (its exchange API for both, __dlpack__ for the negative one), so a copy made from
 * the description alone holds other values. A transfer copies the memory and sets the bits again on its output; an
 * operator, which reads the memory in its kernel, refuses such an operand.
 */
#include "ferry_py.h"

static PyObject *is_conj_name, *is_neg_name, *conj_name, *neg_view_name;

static int intern_names(void) {
  if (neg_view_name) return 0;
  if (!(is_conj_name = PyUnicode_InternFromString("is_conj")) || !(is_neg_name = PyUnicode_InternFromString("is_neg"))
      || !(conj_name = PyUnicode_InternFromString("conj")) || !(neg_view_name = PyUnicode_InternFromString("_neg_view")))
    return -1;
  return 0;
}

/* obj.<name>() as 0 or 1; -1 with an exception set. */
static int ask(PyObject *obj, PyObject *name) {
  PyObject *answer = PyObject_VectorcallMethod(name, &obj, 1, NULL);
  if (!answer) return -1;
  int set = answer == Py_True ? 1 : answer == Py_False ? 0 : PyObject_IsTrue(answer);
  Py_DECREF(answer);
  return set;
}

int ferry_py_math_bits(PyObject *obj, bool ask_conj) {
  if (intern_names() < 0) return -1;
  int bits = 0;
  if (ask_conj) {
    int conj = ask(obj, is_conj_name);
    if (conj < 0) return -1;
    if (conj) bits |= FERRY_PY_MATH_CONJ;
  }
  int neg = ask(obj, is_neg_name);
  if (neg < 0) return -1;
  return neg ? bits | FERRY_PY_MATH_NEG : bits;
}

/* out.conj() and/or out._neg_view(): each flips its bit on a view of the same memory. */
PyObject *ferry_py_math_bits_flip(PyObject *out, int bits) {
  if (!out || !bits) return out;
  if (intern_names() < 0) {
    Py_DECREF(out);
    return NULL;
  }
  if (bits & FERRY_PY_MATH_CONJ) {
    PyObject *view = FERRY_PY_GC_LENT(PyObject_VectorcallMethod(conj_name, &out, 1, NULL));
    Py_DECREF(out);
    if (!(out = view)) return NULL;
  }
  if (bits & FERRY_PY_MATH_NEG) {
    PyObject *view = FERRY_PY_GC_LENT(PyObject_VectorcallMethod(neg_view_name, &out, 1, NULL));
    Py_DECREF(out);
    out = view;
  }
  return out;
}

int ferry_py_math_bits_refuse(PyObject *obj, const char *fn, const char *name) {
  int bits = ferry_py_math_bits(obj, false); /* a complex operand is refused for its dtype */
  if (bits <= 0) return bits;
  PyErr_Format(PyExc_ValueError, "%s: operand %s is a negative view (Tensor.is_neg()): its memory holds the negation "
               "of its values, and the kernel reads the memory; pass %s.resolve_neg()", fn, name, name);
  return -1;
}
